//! The file system's operations as the kernel asks for them: each maps one kernel request to
//! one `tally-fs` call and returns a typed answer (an entry, attributes, data, an open
//! handle, …) or an errno. Two transports carry requests and answers: fuser's `/dev/fuse`
//! loop (`adapter/fuser_glue.rs`) and FUSE over io_uring (`ring.rs`); neither holds any logic
//! of its own beyond encoding.
//!
//! Invariants:
//! - the adapter keeps no file-system state of its own: no inode table, no lookup counts, no
//!   buffered data (only a hint about the kernel's page cache, [`TallyFuse::patchy`]). Inode
//!   numbers are the file system's; a file handle is a number unique for the mount (it names
//!   the owner of a transaction, `txns.rs`), and an open handle is a pin ([`Fs::open`])
//!   released by `release`/`releasedir`;
//! - the kernel may cache what it is given for a day, so it is never left believing what the
//!   file system no longer holds: every change it does not make itself through a request (an
//!   abort; a write dropping a set-user-ID bit) is invalidated before the request that made
//!   it returns;
//! - every changing request runs in the caller's transaction when it is bound to one
//!   ([`TallyFuse::change`]), and as a plain operation otherwise;
//! - every failure reaches the kernel through [`errno`], the one mapping;
//! - every request is counted once, under its opcode, by the operation that serves it, whichever
//!   transport brought it (`requests.rs`);
//! - no request can panic the daemon: each call into the file system runs under
//!   `catch_unwind`; a panic (a bug) answers `EIO` and stops the adapter (fail-stop: every later
//!   request gets `EIO`, and unmount writes no snapshot, so the next mount replays the log);
//! - permission checks are the kernel's (`default_permissions` is always on); the adapter passes
//!   the caller's uid and gid as the owner of what it creates.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, INodeNo, InitFlags, KernelConfig, Notifier,
    RenameFlags, TimeOrNow,
};
use tally_client::ioctl;
use tally_fs::{
    Attr, FallocFlags, Fs, FsError, Maintenance, Owner, SetAttr, SnapshotOutcome, Txn, XattrSet,
};

use crate::attr::{absent_attr, file_attr, file_type, mknod_kind, perm, set_time, timespec};
use crate::errno::{errno, Failure};
use crate::privs::truncate_drops_bits;
use crate::requests::{Opcode, RequestCounts};
use crate::session::MountConfig;
use crate::txns::{End, FuseMutant, Txns};

mod f2fs;
pub(crate) mod fuser_glue;

/// How the last unmount of the file system went.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unmounted {
    /// Everything durable and the snapshot written: the next mount reads it.
    Clean,
    /// Made durable where possible but no snapshot written (no room for it, the adapter
    /// stopped after a panic, or a reference to the file system was still held); the next
    /// mount replays the log.
    WithoutSnapshot(String),
    /// The file system's unmount failed (I/O error, read-only after an earlier error).
    Failed(String),
}

/// Where the outcome of `destroy` is left for whoever runs the session.
pub(crate) type OutcomeSlot = Arc<Mutex<Option<Unmounted>>>;

/// `FALLOC_FL_KEEP_SIZE`, `FALLOC_FL_PUNCH_HOLE`, `FALLOC_FL_ZERO_RANGE`: the fallocate modes
/// the file system has (collapse-range, insert-range and unshare-range get `EOPNOTSUPP`:
/// shifting a file's blocks is not one of its operations, and no block is ever shared).
const FALLOC_KEEP_SIZE: i32 = 0x01;
const FALLOC_PUNCH_HOLE: i32 = 0x02;
const FALLOC_ZERO_RANGE: i32 = 0x10;

/// How regular files are opened: `close` sends no `FLUSH` (there is nothing to flush: every
/// write is a transaction when it returns, and a transaction an open file owns ends at
/// `RELEASE`, which the kernel still sends) — except for a file open for writing that may own
/// an atomic write ([`TallyFuse::file_open_flags`]) — and their pages stay cached from one
/// open to the next (the kernel sees every change to them, and an abort drops them itself) —
/// unless the file is [`TallyFuse::patchy`].
const FILE_OPEN_FLAGS: FopenFlags = FopenFlags::FOPEN_KEEP_CACHE.union(FopenFlags::FOPEN_NOFLUSH);

/// How directories are opened: the kernel may keep their listings (dropped when the
/// directory changes through the mount, or by an abort's invalidation).
const DIR_OPEN_FLAGS: FopenFlags = FopenFlags::FOPEN_KEEP_CACHE.union(FopenFlags::FOPEN_CACHE_DIR);

/// The largest write asked for at `INIT` (as fuser asks by default: its buffers take 16 MiB);
/// the kernel still caps each request at `fs.fuse.max_pages_limit` pages.
const MAX_WRITE: u32 = 16 << 20;

/// Who sent a request: the owner of what it creates, the process its transaction is found by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// A name's entry: its attributes and how long the kernel may keep each (a negative entry has
/// inode 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub attr: FileAttr,
    pub attr_ttl: Duration,
    pub entry_ttl: Duration,
}

/// Attributes and how long the kernel may keep them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AttrOut {
    pub attr: FileAttr,
    pub ttl: Duration,
}

/// An open file or directory: its handle and how the kernel treats it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Opened {
    pub fh: FileHandle,
    pub flags: FopenFlags,
}

/// The answer to `statfs`, as the kernel's `struct fuse_kstatfs` has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StatfsOut {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

/// The answer to `getxattr`/`listxattr`: the size the caller asked for (buffer size 0), or the
/// bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum XattrOut {
    Size(u32),
    Data(Vec<u8>),
}

/// One name of a directory listing; `offset` is the cookie of the name after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DirEntryOut {
    pub ino: u64,
    pub offset: u64,
    pub kind: FileType,
    pub name: Vec<u8>,
}

/// What `setattr` asks to change.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SetattrIn {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeOrNow>,
    pub mtime: Option<TimeOrNow>,
    pub ctime: Option<SystemTime>,
    pub fh: Option<FileHandle>,
}

/// The file system as the kernel sees it, shared by every request thread of both transports.
pub struct TallyFuse {
    /// `None` once unmounted ([`TallyFuse::destroy`]).
    fs: RwLock<Option<Arc<Fs>>>,
    /// Background durability and cleaning while mounted; stopped before unmount.
    maintenance: Mutex<Option<Maintenance>>,
    /// How long the kernel may cache attributes.
    attr_timeout: Duration,
    /// How long the kernel may cache names.
    entry_timeout: Duration,
    /// How long the kernel may remember absent names (zero: `ENOENT`, not remembered).
    negative_timeout: Duration,
    /// The kernel leaves the dropping of set-user-ID bits and capabilities to the file system
    /// (`FUSE_HANDLE_KILLPRIV_V2`, set at `init`).
    drops_privs: AtomicBool,
    /// The kernel offered FUSE over io_uring at `init` (it does when its `fuse` module has
    /// `enable_uring` on), and the adapter asked for it ([`TallyFuse::want_ring`]).
    ring_accepted: AtomicBool,
    /// Ask for FUSE over io_uring at `init` if the kernel offers it.
    want_ring: bool,
    /// The largest write the kernel may send ([`MAX_WRITE`] or fuser's cap), set at `init`:
    /// ring entries need a payload buffer as large.
    max_write: AtomicU32,
    /// Set once the session exists: how the adapter tells the kernel what it changed behind
    /// its back.
    notifier: Arc<OnceLock<Notifier>>,
    /// Set after a panic inside the file system: every later request fails with `EIO`.
    stopped: AtomicBool,
    /// Set by the first [`TallyFuse::destroy`].
    destroyed: AtomicBool,
    outcome: OutcomeSlot,
    /// Explicit transactions begun by ioctl.
    txns: Txns,
    /// The next file handle (0 is never handed out).
    next_fh: AtomicU64,
    /// Requests received, by opcode.
    requests: Arc<RequestCounts>,
    /// Files the kernel's cache holds with gaps: written in pieces that split a page, which
    /// the kernel then keeps out of date (it never reads a page in to write part of it). Read
    /// from a cache it keeps, such a file costs a 4 KiB READ per gap; the next open of it
    /// drops its pages instead, so it is read whole in large READs. An inode leaves the set at
    /// that open, or when the kernel forgets it (its pages go with it).
    patchy: Mutex<HashSet<u64>>,
    /// The kernel's page size.
    page_size: u64,
    /// A deliberately broken variant, if any (`mutants` feature).
    mutant: Option<FuseMutant>,
    /// F2FS's atomic-write ioctls are answered ([`MountConfig::atomic_writes`]).
    atomic_writes: bool,
}

impl TallyFuse {
    /// Serve `fs` as `cfg` says: its cache timeouts, its maintenance interval, and how long a
    /// plain request waits for a transaction holding what it changes before it gets `EBUSY`.
    pub(crate) fn new(
        fs: Fs,
        cfg: &MountConfig,
        txns: Txns,
        outcome: OutcomeSlot,
        requests: Arc<RequestCounts>,
        notifier: Arc<OnceLock<Notifier>>,
    ) -> TallyFuse {
        // A request waiting for a transaction holds one of a few request threads; unbounded,
        // enough of them would leave none for the transaction's own requests, and its commit.
        fs.set_txn_wait_max(Some(cfg.txn_wait));
        let fs = Arc::new(fs);
        let maintenance = Some(Maintenance::spawn(&fs, cfg.maintenance_interval));
        TallyFuse {
            fs: RwLock::new(Some(fs)),
            maintenance: Mutex::new(maintenance),
            attr_timeout: cfg.attr_timeout,
            entry_timeout: cfg.entry_timeout,
            negative_timeout: cfg.negative_timeout,
            drops_privs: AtomicBool::new(false),
            ring_accepted: AtomicBool::new(false),
            want_ring: cfg.io_uring != crate::session::IoUring::Off,
            max_write: AtomicU32::new(MAX_WRITE),
            notifier,
            stopped: AtomicBool::new(false),
            destroyed: AtomicBool::new(false),
            outcome,
            txns,
            next_fh: AtomicU64::new(1),
            requests,
            patchy: Mutex::default(),
            page_size: page_size(),
            mutant: cfg.mutant,
            atomic_writes: cfg.atomic_writes,
        }
    }

    /// Whether the kernel took FUSE over io_uring at `init`.
    pub(crate) fn ring_accepted(&self) -> bool {
        self.ring_accepted.load(Ordering::Acquire)
    }

    /// The requests counted so far.
    pub(crate) fn requests(&self) -> &RequestCounts {
        &self.requests
    }

    /// The largest write the kernel sends, as answered at `INIT`.
    pub(crate) fn max_write(&self) -> u32 {
        self.max_write.load(Ordering::Relaxed)
    }

    fn drops_privs(&self) -> bool {
        self.drops_privs.load(Ordering::Relaxed)
    }

    /// Run a changing request, inside the caller's transaction when it is bound to one;
    /// `inodes` and `entries` are what it may change (dropped from the kernel's caches if the
    /// transaction aborts).
    fn change<T>(
        &self,
        who: Caller,
        op: &'static str,
        inodes: &[u64],
        entries: &[(u64, &[u8])],
        f: impl FnOnce(&Fs, Option<&Txn>) -> Result<T, Failure>,
    ) -> Result<T, Errno> {
        let bound = self.txns.route(who.pid);
        let guard = bound.as_ref().map(|b| b.read());
        let txn = guard.as_ref().and_then(|g| g.as_ref());
        if let (Some(b), Some(_)) = (&bound, txn) {
            let entries: Vec<(u64, &OsStr)> =
                entries.iter().map(|&(d, n)| (d, OsStr::from_bytes(n))).collect();
            b.touch(inodes, &entries);
        }
        self.call(op, |fs| f(fs, txn))
    }

    fn patchy(&self) -> std::sync::MutexGuard<'_, HashSet<u64>> {
        self.patchy.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new file handle: its low bit says whether it was opened for writing, the next
    /// whether the kernel sends `FLUSH` when it is closed (whether it may own an atomic write).
    fn fh(&self, writable: bool, flushed: bool) -> FileHandle {
        let n = self.next_fh.fetch_add(1, Ordering::Relaxed);
        FileHandle(n << 2 | u64::from(flushed) << 1 | u64::from(writable))
    }

    /// Whether handle `fh` was opened for writing.
    fn writable(fh: FileHandle) -> bool {
        fh.0 & 1 == 1
    }

    /// Whether the kernel sends `FLUSH` when handle `fh` is closed (files opened with
    /// `FOPEN_NOFLUSH` get none, so an atomic write cannot start through them).
    fn flushed(fh: FileHandle) -> bool {
        fh.0 & 2 == 2
    }

    /// How a regular file opened with `flags` is opened, and its handle's two bits (writable,
    /// flushed). One open for writing gets `FLUSH` at close, where an atomic write it owns is
    /// aborted if its process is dying, before the kernel drops the process's POSIX locks
    /// (`txns.rs`) — unless it was opened with `O_EXCL`, `O_TRUNC` or `O_APPEND`: none is how
    /// a program opens a file to rewrite it in place with F2FS's atomic writes (SQLite opens its
    /// databases `O_RDWR`, `O_CREAT` at most), so such a handle may start none
    /// (`adapter/f2fs.rs`) and its `close` costs no round trip (tar, git, cp, compilers, shell
    /// redirections, appenders). The kernel keeps `O_EXCL` and `O_TRUNC` only in `CREATE`.
    ///
    /// Such a file opened for writing only also gets `FOPEN_DIRECT_IO` when `direct` (the file
    /// system drops privileges itself, `FUSE_HANDLE_KILLPRIV_V2`): its writes bypass the
    /// kernel's page cache, so each `write` reaches the daemon as one `WRITE` whatever its
    /// alignment (through the page cache the kernel ends a `WRITE` at a page it holds only in
    /// part: tar's 10 KiB records cost four `WRITE`s in three), and the kernel does not ask
    /// `getxattr("security.capability")` before the first one (it leaves the dropping to the
    /// file system, saying when the writer lacks `CAP_FSETID`). Nothing is lost: a handle open
    /// for writing only can be neither read nor mapped, the kernel drops other handles' cached
    /// pages of what it writes, and the file's next open reads it in large `READ`s.
    fn file_open_flags(flags: i32, direct: bool) -> (bool, bool, FopenFlags) {
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let not_in_place = flags & (libc::O_EXCL | libc::O_TRUNC | libc::O_APPEND) != 0;
        let flushed = writable && !not_in_place;
        let mut open = FILE_OPEN_FLAGS;
        if flushed {
            open.remove(FopenFlags::FOPEN_NOFLUSH);
        }
        if direct && not_in_place && flags & libc::O_ACCMODE == libc::O_WRONLY {
            open.insert(FopenFlags::FOPEN_DIRECT_IO);
        }
        (writable, flushed, open)
    }

    /// [`TallyFuse::change`] for a request through handle `fh`: into the atomic write `fh`
    /// owns if any, else as `change` routes it.
    fn change_through<T>(
        &self,
        who: Caller,
        fh: Option<FileHandle>,
        op: &'static str,
        inodes: &[u64],
        f: impl FnOnce(&Fs, Option<&Txn>) -> Result<T, Failure>,
    ) -> Result<T, Errno> {
        let Some(bound) = fh.and_then(|fh| self.txns.route_handle(fh.0)) else {
            return self.change(who, op, inodes, &[], f);
        };
        let guard = bound.read();
        let txn = guard.as_ref();
        if txn.is_some() {
            bound.touch(inodes, &[]);
        }
        self.call(op, |fs| f(fs, txn))
    }

    /// A handle is closed for good: abort the transaction it owns, if any.
    fn abort_owned(&self, fh: FileHandle) {
        if !self.txns.owns(fh.0) {
            return;
        }
        match self.call("release", |fs| self.txns.end(fs, fh.0, End::Abort)) {
            Ok(()) => tracing::info!(fh = fh.0, "transaction aborted: its open file was closed"),
            Err(e) => tracing::warn!(fh = fh.0, "abort at close: {e:?}"),
        }
    }

    /// Run `f` on the file system, catching a panic (fail-stop) and mapping a failure to its
    /// errno.
    fn call<T>(
        &self,
        op: &'static str,
        f: impl FnOnce(&Fs) -> Result<T, Failure>,
    ) -> Result<T, Errno> {
        // A clone, so unmount (which takes the file system out) never waits for a request.
        let fs = self.fs.read().unwrap_or_else(PoisonError::into_inner).clone();
        let fs = match fs {
            Some(fs) if !self.stopped.load(Ordering::Acquire) => fs,
            _ => return Err(errno(&Failure::Stopped)),
        };
        match catch_unwind(AssertUnwindSafe(|| f(&fs))) {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(failure)) => {
                match &failure {
                    Failure::Fs(
                        e @ (FsError::Io { .. }
                        | FsError::ReadOnly { .. }
                        | FsError::Corrupted { .. }),
                    ) => tracing::error!(op, "{e}"),
                    Failure::Fs(e) => tracing::debug!(op, "{e}"),
                    Failure::Unsupported(what) => tracing::debug!(op, "not supported: {what}"),
                    Failure::Stopped | Failure::NotWritable | Failure::NotOwner => {}
                }
                Err(errno(&failure))
            }
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                self.stopped.store(true, Ordering::Release);
                tracing::error!(
                    op,
                    "the file system panicked ({what}); every later request fails with EIO \
                     until remount, and unmount writes no snapshot"
                );
                Err(errno(&Failure::Stopped))
            }
        }
    }

    /// The kernel's attributes of `a`, with its allocated blocks.
    fn attr_of(fs: &Fs, a: &Attr) -> FileAttr {
        // Only ENOENT can fail here, when the inode went away since `a` was read: it holds
        // nothing then.
        let allocated = fs.allocated_blocks(a.ino).unwrap_or(0);
        file_attr(a, allocated, fs.block_size())
    }

    fn entry(&self, attr: FileAttr) -> Entry {
        Entry { attr, attr_ttl: self.attr_timeout, entry_ttl: self.entry_timeout }
    }

    /// An entry whose attributes and name share one timeout (`create`, `readdirplus`).
    fn entry_one_ttl(&self, attr: FileAttr) -> Entry {
        let ttl = self.attr_timeout.min(self.entry_timeout);
        Entry { attr, attr_ttl: ttl, entry_ttl: ttl }
    }

    fn attr_out(&self, attr: FileAttr) -> AttrOut {
        AttrOut { attr, ttl: self.attr_timeout }
    }

    /// Tell the kernel that `ino`'s attributes changed behind its back (its pages are left).
    fn attributes_changed(&self, ino: u64) {
        if self.mutant == Some(FuseMutant::KeepCachedMode) {
            return;
        }
        let Some(notifier) = self.notifier.get() else { return };
        // A negative offset: the attributes only. Safe inside a request: it takes no lock
        // the request's caller may hold (pages are not touched).
        if let Err(e) = notifier.inval_inode(INodeNo(ino), -1, 0) {
            tracing::warn!(ino, "invalidating attributes: {e}");
        }
    }

    /// Unmount the file system once (later calls do nothing): log the request counts, stop
    /// maintenance, write the snapshot, and leave the outcome for whoever runs the session.
    pub(crate) fn destroy(&self) {
        if self.destroyed.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::info!("FUSE requests since mount: {}", self.requests.snapshot());
        let outcome = self.unmount();
        match &outcome {
            Unmounted::Clean => tracing::info!("unmounted cleanly, snapshot written"),
            Unmounted::WithoutSnapshot(why) => tracing::warn!("unmounted without snapshot: {why}"),
            Unmounted::Failed(why) => tracing::error!("unmount failed: {why}"),
        }
        *self.outcome.lock().unwrap_or_else(PoisonError::into_inner) = Some(outcome);
    }

    /// Unmount the file system: stop maintenance, then write the snapshot.
    fn unmount(&self) -> Unmounted {
        drop(self.maintenance.lock().unwrap_or_else(PoisonError::into_inner).take());
        let taken = self.fs.write().unwrap_or_else(PoisonError::into_inner).take();
        let Some(fs) = taken else {
            return Unmounted::WithoutSnapshot("already unmounted".into());
        };
        // Open handles (and so transactions) outlive a lazy unmount; nobody can commit them now.
        if catch_unwind(AssertUnwindSafe(|| self.txns.abort_all(&fs))).is_err() {
            self.stopped.store(true, Ordering::Release);
        }
        let stopped = self.stopped.load(Ordering::Acquire);
        match Arc::try_unwrap(fs) {
            Ok(fs) if !stopped => match fs.unmount() {
                Ok(SnapshotOutcome::Written) => Unmounted::Clean,
                Ok(SnapshotOutcome::NotWritten(why)) => Unmounted::WithoutSnapshot(why),
                Ok(other) => Unmounted::WithoutSnapshot(format!("{other:?}")),
                Err(e) => Unmounted::Failed(e.to_string()),
            },
            Ok(fs) => {
                let reason = "the adapter stopped after a panic".to_owned();
                match catch_unwind(AssertUnwindSafe(|| fs.sync())) {
                    Ok(Ok(())) => Unmounted::WithoutSnapshot(reason),
                    Ok(Err(e)) => Unmounted::Failed(format!("{reason}; sync: {e}")),
                    Err(_) => Unmounted::Failed(format!("{reason}; sync panicked")),
                }
            }
            Err(fs) => match fs.sync() {
                Ok(()) => Unmounted::WithoutSnapshot("the file system was still referenced".into()),
                Err(e) => Unmounted::Failed(e.to_string()),
            },
        }
    }
}

/// The kernel's page size (4 KiB where it cannot be read).
fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|&s| s > 0).unwrap_or(4096)
}

/// The caller, as the owner of what it creates.
fn owner(who: Caller) -> Owner {
    Owner { uid: who.uid, gid: who.gid }
}

/// The operations, one per request kind the adapter serves.
impl TallyFuse {
    /// Choose what to ask of the kernel at `INIT` (the `/dev/fuse` handshake, fuser's).
    pub(crate) fn init(&self, config: &mut KernelConfig) {
        // Each is asked for alone: an older kernel without one is served all the same.
        let wanted = [
            // Lookups and creates in one directory may run in parallel: the file system
            // orders them itself.
            (InitFlags::FUSE_PARALLEL_DIROPS, "directory operations serialised"),
            // A listing carries every entry's attributes: no LOOKUP per name after it. Auto:
            // the kernel asks for them while it is also looking names up.
            (InitFlags::FUSE_DO_READDIRPLUS, "a lookup per listed name"),
            (InitFlags::FUSE_READDIRPLUS_AUTO, "every listing carries attributes"),
            // The file system drops set-user-ID bits and capabilities on write, truncate and
            // chown; the kernel then marks inodes S_NOSEC and stops asking
            // getxattr("security.capability") before each write.
            (InitFlags::FUSE_HANDLE_KILLPRIV_V2, "a getxattr before writes"),
            // Symlink targets never change: the kernel may keep them.
            (InitFlags::FUSE_CACHE_SYMLINKS, "a readlink per symlink resolution"),
        ];
        // The NoKillPriv mutant leaves privileges to the kernel, and every write asks first.
        let killpriv = self.mutant != Some(FuseMutant::NoKillPriv);
        for (flag, without) in wanted {
            if flag == InitFlags::FUSE_HANDLE_KILLPRIV_V2 && !killpriv {
                continue;
            }
            if config.add_capabilities(flag).is_err() {
                tracing::info!("the kernel does not offer {flag:?}: {without}");
            }
        }
        let drops_privs =
            killpriv && config.add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2).is_ok();
        self.drops_privs.store(drops_privs, Ordering::Relaxed);
        // The kernel offers it only while its `fuse` module has `enable_uring` on; taken, the
        // kernel still sends requests through /dev/fuse until every queue has ring entries
        // (`ring/`), and FORGET and INTERRUPT always.
        let ring = self.want_ring && config.add_capabilities(InitFlags::FUSE_OVER_IO_URING).is_ok();
        self.ring_accepted.store(ring, Ordering::Release);
        let max_write = match config.set_max_write(MAX_WRITE) {
            Ok(_) => MAX_WRITE,
            Err(cap) => {
                let _ = config.set_max_write(cap);
                cap
            }
        };
        self.max_write.store(max_write, Ordering::Relaxed);
        // fuser asks for the largest writes its buffers take (16 MiB) and for FUSE_MAX_PAGES;
        // the kernel caps every request at fs.fuse.max_pages_limit pages (root may raise it).
        let limit = std::fs::read_to_string("/proc/sys/fs/fuse/max_pages_limit")
            .map_or_else(|_| "?".to_owned(), |s| s.trim().to_owned());
        tracing::info!(
            drops_privs,
            io_uring = ring,
            "FUSE ABI {:?}; requests up to fs.fuse.max_pages_limit = {limit} pages",
            config.kernel_abi()
        );
    }

    pub(crate) fn lookup(&self, parent: u64, name: &[u8]) -> Result<Entry, Errno> {
        self.requests.count(Opcode::Lookup);
        let r = self.call("lookup", |fs| Ok(Self::attr_of(fs, &fs.lookup(parent, name)?)));
        match r {
            // An entry for inode 0 is the kernel's negative entry: "no such name", remembered
            // for its timeout (an ENOENT error is not remembered at all).
            Err(e) if e.code() == libc::ENOENT && !self.negative_timeout.is_zero() => Ok(Entry {
                attr: absent_attr(),
                attr_ttl: Duration::ZERO,
                entry_ttl: self.negative_timeout,
            }),
            r => r.map(|attr| self.entry(attr)),
        }
    }

    pub(crate) fn forget(&self, ino: u64) {
        // The file system keeps no lookup counts: inode numbers stay valid while it lives.
        self.requests.count(Opcode::Forget);
        self.patchy().remove(&ino);
    }

    pub(crate) fn getattr(&self, ino: u64) -> Result<AttrOut, Errno> {
        self.requests.count(Opcode::Getattr);
        let attr = self.call("getattr", |fs| Ok(Self::attr_of(fs, &fs.getattr(ino)?)))?;
        Ok(self.attr_out(attr))
    }

    pub(crate) fn setattr(&self, who: Caller, ino: u64, s: &SetattrIn) -> Result<AttrOut, Errno> {
        self.requests.count(Opcode::Setattr);
        let set = SetAttr {
            perm: s.mode.map(perm),
            uid: s.uid,
            gid: s.gid,
            size: s.size,
            atime: s.atime.map(set_time),
            mtime: s.mtime.map(set_time),
            ctime: s.ctime.map(timespec),
        };
        let attr = self.change_through(who, s.fh, "setattr", &[ino], |fs, tx| {
            let a = if self.drops_privs()
                && (s.uid.is_some() || s.gid.is_some() || s.size.is_some())
            {
                // A truncate drops the bits only for a caller without CAP_FSETID (the kernel
                // says so in FATTR_KILL_SUIDGID, which fuser does not pass on); a chown
                // drops them whoever asks.
                let bits = s.size.is_some() && truncate_drops_bits(fs.getattr(ino)?.perm, who.pid);
                fs.setattr_dropping_privs(tx, ino, &set, bits)?
            } else {
                fs.setattr(tx, ino, &set)?
            };
            Ok(Self::attr_of(fs, &a))
        })?;
        Ok(self.attr_out(attr))
    }

    pub(crate) fn readlink(&self, ino: u64) -> Result<Vec<u8>, Errno> {
        self.requests.count(Opcode::Readlink);
        self.call("readlink", |fs| Ok(fs.readlink(ino)?))
    }

    pub(crate) fn mknod(
        &self,
        who: Caller,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u32,
    ) -> Result<Entry, Errno> {
        self.requests.count(Opcode::Mknod);
        let attr = self.change(who, "mknod", &[], &[(parent, name)], |fs, tx| {
            let kind = mknod_kind(mode)
                .ok_or(FsError::Invalid("mknod makes files, fifos, sockets and device nodes"))?;
            let a = fs.mknod(tx, parent, name, kind, perm(mode), u64::from(rdev), owner(who))?;
            Ok(Self::attr_of(fs, &a))
        })?;
        Ok(self.entry(attr))
    }

    pub(crate) fn mkdir(
        &self,
        who: Caller,
        parent: u64,
        name: &[u8],
        mode: u32,
    ) -> Result<Entry, Errno> {
        self.requests.count(Opcode::Mkdir);
        let attr = self.change(who, "mkdir", &[], &[(parent, name)], |fs, tx| {
            Ok(Self::attr_of(fs, &fs.mkdir(tx, parent, name, perm(mode), owner(who))?))
        })?;
        Ok(self.entry(attr))
    }

    pub(crate) fn unlink(&self, who: Caller, parent: u64, name: &[u8]) -> Result<(), Errno> {
        self.requests.count(Opcode::Unlink);
        let inodes = self.child_of(parent, name);
        self.change(who, "unlink", &inodes, &[(parent, name)], |fs, tx| {
            Ok(fs.unlink(tx, parent, name)?)
        })
    }

    pub(crate) fn rmdir(&self, who: Caller, parent: u64, name: &[u8]) -> Result<(), Errno> {
        self.requests.count(Opcode::Rmdir);
        let inodes = self.child_of(parent, name);
        self.change(who, "rmdir", &inodes, &[(parent, name)], |fs, tx| {
            Ok(fs.rmdir(tx, parent, name)?)
        })
    }

    pub(crate) fn symlink(
        &self,
        who: Caller,
        parent: u64,
        link_name: &[u8],
        target: &[u8],
    ) -> Result<Entry, Errno> {
        self.requests.count(Opcode::Symlink);
        let attr = self.change(who, "symlink", &[], &[(parent, link_name)], |fs, tx| {
            Ok(Self::attr_of(fs, &fs.symlink(tx, parent, link_name, target, owner(who))?))
        })?;
        Ok(self.entry(attr))
    }

    pub(crate) fn rename(
        &self,
        who: Caller,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        self.requests.count(Opcode::Rename);
        let mut inodes = self.child_of(parent, name);
        inodes.extend(self.child_of(newparent, newname));
        let entries = [(parent, name), (newparent, newname)];
        self.change(who, "rename", &inodes, &entries, |fs, tx| {
            let known = RenameFlags::RENAME_NOREPLACE | RenameFlags::RENAME_EXCHANGE;
            if flags.contains(RenameFlags::RENAME_WHITEOUT) {
                return Err(Failure::Unsupported("RENAME_WHITEOUT"));
            }
            if !known.contains(flags) {
                return Err(FsError::Invalid("unknown rename flags").into());
            }
            let how = tally_fs::RenameFlags {
                noreplace: flags.contains(RenameFlags::RENAME_NOREPLACE),
                exchange: flags.contains(RenameFlags::RENAME_EXCHANGE),
            };
            Ok(fs.rename(tx, parent, name, newparent, newname, how)?)
        })
    }

    pub(crate) fn link(
        &self,
        who: Caller,
        ino: u64,
        newparent: u64,
        newname: &[u8],
    ) -> Result<Entry, Errno> {
        self.requests.count(Opcode::Link);
        let attr = self.change(who, "link", &[ino], &[(newparent, newname)], |fs, tx| {
            Ok(Self::attr_of(fs, &fs.link(tx, ino, newparent, newname)?))
        })?;
        Ok(self.entry(attr))
    }

    pub(crate) fn open(&self, ino: u64, open_flags: i32) -> Result<Opened, Errno> {
        self.requests.count(Opcode::Open);
        self.call("open", |fs| Ok(fs.open(ino)?))?;
        let (writable, flushed, mut flags) = Self::file_open_flags(open_flags, self.drops_privs());
        if self.patchy().remove(&ino) {
            flags.remove(FopenFlags::FOPEN_KEEP_CACHE);
        }
        Ok(Opened { fh: self.fh(writable, flushed), flags })
    }

    pub(crate) fn read(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        self.requests.count(Opcode::Read);
        let len = usize::try_from(size).unwrap_or(usize::MAX);
        self.call("read", |fs| Ok(fs.read(ino, offset, len)?))
    }

    /// `kill_suidgid`: the kernel's `FUSE_WRITE_KILL_SUIDGID`, set when the writer lacks
    /// `CAP_FSETID`. Returns the bytes written.
    pub(crate) fn write(
        &self,
        who: Caller,
        ino: u64,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        kill_suidgid: bool,
    ) -> Result<u32, Errno> {
        self.requests.count(Opcode::Write);
        if !offset.is_multiple_of(self.page_size) {
            // The page at `offset` is written in two pieces (this one and an earlier one, or
            // none: a hole): the kernel keeps it out of date.
            self.patchy().insert(ino);
        }
        let (n, perm_dropped) = self.change_through(who, Some(fh), "write", &[ino], |fs, tx| {
            if self.drops_privs() {
                Ok(fs.write_dropping_privs(tx, ino, offset, data, kill_suidgid)?)
            } else {
                Ok((fs.write(tx, ino, offset, data)?, false))
            }
        })?;
        // The kernel keeps the mode it cached (it drops only sizes and times after a write)
        // and checks permissions, exec's set-user-ID included, against it.
        if perm_dropped {
            self.attributes_changed(ino);
        }
        // A write is at most the kernel's max_write (far below 4 GiB).
        Ok(u32::try_from(n).unwrap_or(u32::MAX))
    }

    pub(crate) fn flush(&self, who: Caller, fh: FileHandle) -> Result<(), Errno> {
        self.requests.count(Opcode::Flush);
        // Nothing is buffered here: every write is already a committed transaction. close()
        // does not make data durable on Tally, as on ext4; fsync does. Sent for files open
        // for writing (and by kernels that ignore FOPEN_NOFLUSH): the kernel drops the
        // caller's POSIX locks after this returns, so an atomic write its dying process left
        // open ends here, before another process can lock the file and read it.
        let r = self.call("flush", |fs| self.txns.abort_if_exiting(fs, fh.0, who.pid));
        if r == Ok(true) {
            tracing::info!(fh = fh.0, "atomic write aborted: its process died with it open");
        }
        r.map(|_| ())
    }

    pub(crate) fn release(&self, ino: u64, fh: FileHandle) -> Result<(), Errno> {
        self.requests.count(Opcode::Release);
        self.abort_owned(fh);
        self.call("release", |fs| Ok(fs.release(ino)?))
    }

    pub(crate) fn fsync(&self, ino: u64, datasync: bool) -> Result<(), Errno> {
        self.requests.count(Opcode::Fsync);
        self.call("fsync", |fs| {
            if datasync { fs.fdatasync(ino) } else { fs.fsync(ino) }.map_err(Into::into)
        })
    }

    pub(crate) fn opendir(&self, ino: u64) -> Result<Opened, Errno> {
        self.requests.count(Opcode::Opendir);
        self.call("opendir", |fs| Ok(fs.open(ino)?))?;
        Ok(Opened { fh: self.fh(false, false), flags: DIR_OPEN_FLAGS })
    }

    /// The names of directory `ino` from cookie `offset` on (the transport sends as many as
    /// the kernel's buffer takes).
    pub(crate) fn readdir(
        &self,
        ino: u64,
        offset: u64,
        count_max: usize,
    ) -> Result<Vec<DirEntryOut>, Errno> {
        self.requests.count(Opcode::Readdir);
        // The library's offsets are the cookies: 1 is ".", 2 is "..", entries from 3 on, stable
        // across other entries coming and going.
        let entries = self.call("readdir", |fs| Ok(fs.readdir_page(ino, offset, count_max)?))?;
        Ok(entries
            .into_iter()
            .map(|e| DirEntryOut {
                ino: e.ino,
                offset: e.offset,
                kind: file_type(e.kind),
                name: e.name,
            })
            .collect())
    }

    /// As [`TallyFuse::readdir`], with each name's entry.
    pub(crate) fn readdirplus(
        &self,
        ino: u64,
        offset: u64,
        count_max: usize,
    ) -> Result<Vec<(DirEntryOut, Entry)>, Errno> {
        self.requests.count(Opcode::Readdirplus);
        // As readdir, with each entry's attributes (one page under one lock): the kernel makes
        // an entry of each ("." and ".." excepted), so no LOOKUP follows for a listed name.
        let (listed, bs) = self.call("readdirplus", |fs| {
            Ok((fs.readdir_plus(ino, offset, count_max)?, fs.block_size()))
        })?;
        Ok(listed
            .into_iter()
            .map(|(e, a, blocks)| (e, file_attr(&a, blocks, bs)))
            .map(|(e, attr)| {
                let d = DirEntryOut {
                    ino: e.ino,
                    offset: e.offset,
                    kind: file_type(e.kind),
                    name: e.name,
                };
                (d, self.entry_one_ttl(attr))
            })
            .collect())
    }

    pub(crate) fn releasedir(&self, ino: u64, fh: FileHandle) -> Result<(), Errno> {
        self.requests.count(Opcode::Releasedir);
        self.abort_owned(fh);
        self.call("releasedir", |fs| Ok(fs.release(ino)?))
    }

    pub(crate) fn fsyncdir(&self, ino: u64) -> Result<(), Errno> {
        self.requests.count(Opcode::Fsyncdir);
        self.call("fsyncdir", |fs| Ok(fs.fsync(ino)?))
    }

    /// `SYNCFS`: everything committed, by anyone, made durable (one flush round).
    pub(crate) fn syncfs(&self) -> Result<(), Errno> {
        self.requests.count(Opcode::Syncfs);
        self.call("syncfs", |fs| Ok(fs.sync()?))
    }

    pub(crate) fn statfs(&self) -> Result<StatfsOut, Errno> {
        self.requests.count(Opcode::Statfs);
        let s = self.call("statfs", |fs| Ok(fs.statfs()))?;
        Ok(StatfsOut {
            blocks: s.blocks,
            bfree: s.blocks_free,
            bavail: s.blocks_free,
            files: s.files.saturating_add(s.files_free),
            ffree: s.files_free,
            bsize: s.block_size,
            namelen: s.name_max,
            frsize: s.block_size,
        })
    }

    pub(crate) fn setxattr(
        &self,
        who: Caller,
        ino: u64,
        name: &[u8],
        value: &[u8],
        flags: i32,
        position: u32,
    ) -> Result<(), Errno> {
        self.requests.count(Opcode::Setxattr);
        self.change(who, "setxattr", &[ino], &[], |fs, tx| {
            if position != 0 {
                return Err(FsError::Invalid("xattr position (macOS resource forks)").into());
            }
            let how = match flags {
                0 => XattrSet::Any,
                libc::XATTR_CREATE => XattrSet::Create,
                libc::XATTR_REPLACE => XattrSet::Replace,
                _ => return Err(FsError::Invalid("setxattr flags").into()),
            };
            Ok(fs.setxattr(tx, ino, name, value, how)?)
        })
    }

    pub(crate) fn getxattr(&self, ino: u64, name: &[u8], size: u32) -> Result<XattrOut, Errno> {
        self.requests.count(Opcode::Getxattr);
        let value = self.call("getxattr", |fs| Ok(fs.getxattr(ino, name)?))?;
        sized(size, value)
    }

    pub(crate) fn listxattr(&self, ino: u64, size: u32) -> Result<XattrOut, Errno> {
        self.requests.count(Opcode::Listxattr);
        let names = self.call("listxattr", |fs| Ok(fs.listxattr(ino)?))?;
        let mut list = Vec::new();
        for n in names {
            list.extend_from_slice(&n);
            list.push(0);
        }
        sized(size, list)
    }

    pub(crate) fn removexattr(&self, who: Caller, ino: u64, name: &[u8]) -> Result<(), Errno> {
        self.requests.count(Opcode::Removexattr);
        self.change(who, "removexattr", &[ino], &[], |fs, tx| Ok(fs.removexattr(tx, ino, name)?))
    }

    pub(crate) fn access(&self, ino: u64) -> Result<(), Errno> {
        self.requests.count(Opcode::Access);
        // Only sent without default_permissions, which the adapter always sets: the kernel
        // checks permissions. Existence is all there is to check.
        self.call("access", |fs| fs.getattr(ino).map(|_| ()).map_err(Into::into))
    }

    pub(crate) fn create(
        &self,
        who: Caller,
        parent: u64,
        name: &[u8],
        mode: u32,
        open_flags: i32,
    ) -> Result<(Entry, Opened), Errno> {
        self.requests.count(Opcode::Create);
        let attr = self.change(who, "create", &[], &[(parent, name)], |fs, tx| {
            let a = fs.create(tx, parent, name, perm(mode), owner(who))?;
            fs.open(a.ino)?;
            Ok(Self::attr_of(fs, &a))
        })?;
        // One timeout for the entry and the attributes here.
        let (writable, flushed, flags) = Self::file_open_flags(open_flags, self.drops_privs());
        Ok((self.entry_one_ttl(attr), Opened { fh: self.fh(writable, flushed), flags }))
    }

    /// An ioctl on a file or directory (the kernel sends `FUSE_IOCTL_DIR` for a directory);
    /// its reply data.
    pub(crate) fn ioctl(
        &self,
        who: Caller,
        ino: u64,
        fh: FileHandle,
        cmd: u32,
        out_size: u32,
    ) -> Result<Vec<u8>, Errno> {
        if let Some(op) = f2fs::f2fs_opcode(cmd) {
            self.requests.count(op);
            self.f2fs_ioctl(who, ino, fh, cmd, out_size)
        } else if cmd == ioctl::SYNC {
            // Any caller who can open a file of the mount may sync it, as sync(2) allows.
            self.requests.count(Opcode::SyncIoctl);
            self.call("sync", |fs| Ok(fs.sync()?)).map(|()| Vec::new())
        } else {
            self.requests.count(Opcode::Ioctl);
            self.transaction_ioctl(who, ino, fh, cmd, out_size)
        }
    }

    pub(crate) fn fallocate(
        &self,
        who: Caller,
        ino: u64,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<(), Errno> {
        self.requests.count(Opcode::Fallocate);
        self.change_through(who, Some(fh), "fallocate", &[ino], |fs, tx| {
            if mode & !(FALLOC_KEEP_SIZE | FALLOC_PUNCH_HOLE | FALLOC_ZERO_RANGE) != 0 {
                return Err(Failure::Unsupported("fallocate mode"));
            }
            let flags = FallocFlags {
                keep_size: mode & FALLOC_KEEP_SIZE != 0,
                punch_hole: mode & FALLOC_PUNCH_HOLE != 0,
                zero_range: mode & FALLOC_ZERO_RANGE != 0,
            };
            Ok(fs.fallocate(tx, ino, offset, length, flags)?)
        })
    }

    pub(crate) fn lseek(&self) -> Result<i64, Errno> {
        // The kernel seeks itself (SEEK_DATA and SEEK_HOLE as if the file had no holes) and
        // asks no more after this answer.
        self.requests.count(Opcode::Lseek);
        Err(Errno::from_i32(libc::ENOSYS))
    }

    /// Returns the bytes copied.
    #[expect(clippy::too_many_arguments, reason = "the kernel's request has them all")]
    pub(crate) fn copy_file_range(
        &self,
        who: Caller,
        ino_in: u64,
        offset_in: u64,
        ino_out: u64,
        offset_out: u64,
        len: u64,
        flags: u64,
    ) -> Result<u32, Errno> {
        self.requests.count(Opcode::CopyFileRange);
        let n = self.change(who, "copy_file_range", &[ino_out], &[], |fs, tx| {
            if flags != 0 {
                return Err(FsError::Invalid("copy_file_range flags").into());
            }
            // One transaction per request: the kernel returns a short count to the caller,
            // which asks again for the rest (a request carries at most 4 GiB anyway).
            let len = len.min(u64::from(u32::MAX));
            Ok(fs.copy_file_range(tx, ino_in, offset_in, ino_out, offset_out, len)?)
        })?;
        Ok(u32::try_from(n).unwrap_or(u32::MAX))
    }

    /// The events of `events` (poll bits) that are ready.
    pub(crate) fn poll(&self, ino: u64, events: u32) -> Result<u32, Errno> {
        self.requests.count(Opcode::Poll);
        // Files and directories are always ready, as on a disk file system: a read or write
        // never waits for another process, so no later readiness needs announcing.
        use fuser::PollEvents as P;
        let ready = (P::POLLIN | P::POLLOUT | P::POLLRDNORM | P::POLLWRNORM).bits();
        self.call("poll", |fs| fs.getattr(ino).map(|_| ()).map_err(Into::into))?;
        Ok(events & ready)
    }
}

impl TallyFuse {
    /// The inode `name` in `parent` names now, if any (its cached attributes are dropped too
    /// if a transaction that unlinks or renames it aborts).
    fn child_of(&self, parent: u64, name: &[u8]) -> Vec<u64> {
        if self.txns.is_idle() {
            return Vec::new();
        }
        self.call("lookup", |fs| Ok(fs.lookup(parent, name)?))
            .map_or_else(|_| Vec::new(), |a| vec![a.ino])
    }

    /// One of `tally-client`'s ioctls; its reply data (8 bytes for the `_IOR` ones).
    fn transaction_ioctl(
        &self,
        who: Caller,
        ino: u64,
        fh: FileHandle,
        cmd: u32,
        out_size: u32,
    ) -> Result<Vec<u8>, Errno> {
        let id_reply = |id: u64| {
            if out_size < 8 {
                return Err(errno(&Failure::Fs(FsError::Invalid("ioctl buffer under 8 bytes"))));
            }
            Ok(id.to_ne_bytes().to_vec())
        };
        match cmd {
            ioctl::BEGIN | ioctl::BEGIN_TREE => {
                let tree = cmd == ioctl::BEGIN_TREE;
                let id = self.call("begin", |fs| self.txns.begin(fs, fh.0, who.pid, tree))?;
                id_reply(id)
            }
            ioctl::COMMIT => {
                self.call("commit", |fs| self.txns.end(fs, fh.0, End::Commit)).map(|()| Vec::new())
            }
            ioctl::COMMIT_DURABLE => self
                .call("commit_durable", |fs| self.txns.end(fs, fh.0, End::CommitDurable))
                .map(|()| Vec::new()),
            ioctl::ABORT => {
                self.call("abort", |fs| self.txns.end(fs, fh.0, End::Abort)).map(|()| Vec::new())
            }
            ioctl::BARRIER => self.call("barrier", |fs| Ok(fs.barrier(ino)?)).map(|()| Vec::new()),
            ioctl::CURRENT => id_reply(self.txns.current(who.pid)),
            _ => Err(Errno::from_i32(libc::ENOTTY)),
        }
    }
}

/// Answer a `getxattr`/`listxattr`: with `size` 0 the caller asks how big the value is; a
/// buffer too small for it is `ERANGE`.
fn sized(size: u32, value: Vec<u8>) -> Result<XattrOut, Errno> {
    let len = u32::try_from(value.len()).unwrap_or(u32::MAX);
    if size == 0 {
        Ok(XattrOut::Size(len))
    } else if len > size {
        Err(errno(&Failure::Fs(FsError::Range)))
    } else {
        Ok(XattrOut::Data(value))
    }
}

#[cfg(test)]
impl TallyFuse {
    /// The adapter on a fresh file system in memory, with no kernel (unit tests of the
    /// operations and of the ring's encoding).
    pub(crate) fn for_tests() -> TallyFuse {
        use tally_fs::{MkfsOptions, MountOptions};
        use tally_media::{Device, MemDevice};
        let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, 16384).unwrap());
        Fs::mkfs(dev.clone(), &MkfsOptions::default()).unwrap();
        let fs = Fs::mount(dev, MountOptions::default()).unwrap();
        let cfg =
            MountConfig { maintenance_interval: Duration::from_secs(60), ..Default::default() };
        let (requests, notifier) = (Arc::default(), Arc::default());
        TallyFuse::new(fs, &cfg, Txns::default(), OutcomeSlot::default(), requests, notifier)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_fs::ROOT;

    fn adapter() -> TallyFuse {
        TallyFuse::for_tests()
    }

    #[test]
    fn failures_map_through_the_one_function() {
        let a = adapter();
        let e = a.call("lookup", |fs| Ok(fs.lookup(ROOT, b"missing")?)).unwrap_err();
        assert_eq!(e.code(), libc::ENOENT);
        let e = a.call("x", |_| -> Result<(), Failure> { Err(Failure::Unsupported("x")) });
        assert_eq!(e.unwrap_err().code(), libc::EOPNOTSUPP);
        assert_eq!(a.unmount(), Unmounted::Clean);
    }

    #[test]
    fn a_panic_answers_eio_and_stops_the_adapter() {
        let a = adapter();
        let e = a.call("boom", |_| -> Result<(), Failure> { panic!("deliberate") }).unwrap_err();
        assert_eq!(e.code(), libc::EIO);
        // Every later request fails too, even one that would succeed.
        let e = a.call("getattr", |fs| Ok(fs.getattr(ROOT)?)).unwrap_err();
        assert_eq!(e.code(), libc::EIO);
        assert!(matches!(a.unmount(), Unmounted::WithoutSnapshot(_)));
    }

    #[test]
    fn operations_answer_typed_results_without_a_kernel() {
        let a = adapter();
        let who = Caller { uid: 0, gid: 0, pid: std::process::id() };
        let (e, o) = a.create(who, ROOT, b"f", 0o644, libc::O_RDWR).unwrap();
        assert_eq!(e.attr.kind, FileType::RegularFile);
        assert!(!o.flags.contains(FopenFlags::FOPEN_NOFLUSH), "writable opens get FLUSH");
        assert_eq!(a.write(who, e.attr.ino.0, o.fh, 0, b"hello", false).unwrap(), 5);
        assert_eq!(a.read(e.attr.ino.0, 0, 100).unwrap(), b"hello");
        let names: Vec<_> =
            a.readdir(ROOT, 0, usize::MAX).unwrap().into_iter().map(|d| d.name).collect();
        assert!(names.contains(&b"f".to_vec()), "{names:?}");
        let absent = a.lookup(ROOT, b"nope").unwrap();
        assert_eq!((absent.attr.ino.0, absent.attr_ttl), (0, Duration::ZERO));
        assert_eq!(a.getxattr(e.attr.ino.0, b"user.x", 0).unwrap_err().code(), libc::ENODATA);
        a.setxattr(who, e.attr.ino.0, b"user.x", b"v", 0, 0).unwrap();
        assert_eq!(a.getxattr(e.attr.ino.0, b"user.x", 0).unwrap(), XattrOut::Size(1));
        assert_eq!(a.getxattr(e.attr.ino.0, b"user.x", 8).unwrap(), XattrOut::Data(b"v".to_vec()));
        a.release(e.attr.ino.0, o.fh).unwrap();
        assert_eq!(a.requests.get(Opcode::Create), 1);
        a.destroy();
        a.destroy();
        assert_eq!(a.outcome.lock().unwrap().clone(), Some(Unmounted::Clean));
    }

    #[test]
    fn only_opens_that_may_rewrite_in_place_get_flush_and_own_atomic_writes() {
        let a = adapter();
        let who = Caller { uid: 0, gid: 0, pid: std::process::id() };
        let flush = |o: &Opened| !o.flags.contains(FopenFlags::FOPEN_NOFLUSH);
        let start = |ino: u64, o: &Opened| {
            a.ioctl(who, ino, o.fh, f2fs::START_ATOMIC_WRITE, 0).map(|_| ()).map_err(|e| e.code())
        };
        // tar, git, cp: a new file with O_EXCL; File::create and `>`: O_TRUNC.
        let (e, o) = a.create(who, ROOT, b"x", 0o644, libc::O_WRONLY | libc::O_EXCL).unwrap();
        let x = e.attr.ino.0;
        assert!(!flush(&o), "O_EXCL create");
        assert_eq!(start(x, &o), Err(libc::EOPNOTSUPP), "no FLUSH, no atomic write");
        let (_, o) = a.create(who, ROOT, b"t", 0o644, libc::O_WRONLY | libc::O_TRUNC).unwrap();
        assert!(!flush(&o), "O_TRUNC create");
        let o = a.open(x, libc::O_WRONLY | libc::O_APPEND).unwrap();
        assert!(!flush(&o), "O_APPEND open");
        assert_eq!(start(x, &o), Err(libc::EOPNOTSUPP));
        let o = a.open(x, libc::O_RDONLY).unwrap();
        assert!(!flush(&o), "read-only open");
        assert_eq!(start(x, &o), Err(libc::EBADF), "as F2FS: not open for writing");
        // SQLite's database: O_RDWR (O_CREAT when new). FLUSH, and the atomic write starts.
        let (e, o) = a.create(who, ROOT, b"db", 0o644, libc::O_RDWR).unwrap();
        assert!(flush(&o), "O_RDWR create");
        assert_eq!(start(e.attr.ino.0, &o), Ok(()));
        a.release(e.attr.ino.0, o.fh).unwrap();
        let o = a.open(x, libc::O_RDWR).unwrap();
        assert!(flush(&o), "O_RDWR open");
        assert_eq!(start(x, &o), Ok(()));
        a.release(x, o.fh).unwrap();
        assert_eq!(a.requests.get(Opcode::F2fsStartAtomicWrite), 5);
        a.destroy();
        assert_eq!(a.outcome.lock().unwrap().clone(), Some(Unmounted::Clean));
    }

    #[test]
    fn only_write_only_opens_not_in_place_bypass_the_page_cache() {
        let direct = |flags: i32, drops_privs: bool| {
            TallyFuse::file_open_flags(flags, drops_privs).2.contains(FopenFlags::FOPEN_DIRECT_IO)
        };
        // tar, git checkout, cp: O_EXCL; File::create and `>`: O_TRUNC; appenders: O_APPEND.
        for flags in [
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
            libc::O_WRONLY | libc::O_TRUNC,
            libc::O_WRONLY | libc::O_APPEND,
        ] {
            assert!(direct(flags, true), "{flags:#o}");
            assert!(!direct(flags, false), "{flags:#o}: the kernel drops privileges itself");
        }
        // What may be read or mapped, or rewritten in place, keeps the page cache.
        for flags in [
            libc::O_RDWR | libc::O_TRUNC,
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL,
            libc::O_RDWR | libc::O_APPEND,
            libc::O_WRONLY,
            libc::O_RDWR,
            libc::O_RDONLY,
        ] {
            assert!(!direct(flags, true), "{flags:#o}");
            let keep = TallyFuse::file_open_flags(flags, true).2;
            assert!(keep.contains(FopenFlags::FOPEN_KEEP_CACHE), "{flags:#o}");
        }
    }
}

//! The FUSE request handlers: each maps one kernel request to one `tally-fs` call.
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
//! - no request can panic the daemon: each call into the file system runs under
//!   `catch_unwind`; a panic (a bug) answers `EIO` and stops the adapter (fail-stop: every later
//!   request gets `EIO`, and unmount writes no snapshot, so the next mount replays the log);
//! - permission checks are the kernel's (`default_permissions` is always on); the adapter passes
//!   the caller's uid and gid as the owner of what it creates.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    IoctlFlags, KernelConfig, LockOwner, Notifier, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
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
/// `RELEASE`, which the kernel still sends) — except for a file open for writing, which may
/// own an atomic write ([`TallyFuse::file_open_flags`]) — and their pages stay cached from one
/// open to the next (the kernel sees every change to them, and an abort drops them itself) —
/// unless the file is [`TallyFuse::patchy`].
const FILE_OPEN_FLAGS: FopenFlags = FopenFlags::FOPEN_KEEP_CACHE.union(FopenFlags::FOPEN_NOFLUSH);

/// How directories are opened: the kernel may keep their listings (dropped when the
/// directory changes through the mount, or by an abort's invalidation).
const DIR_OPEN_FLAGS: FopenFlags = FopenFlags::FOPEN_KEEP_CACHE.union(FopenFlags::FOPEN_CACHE_DIR);

/// The file system as the kernel sees it.
pub struct TallyFuse {
    /// `None` once `destroy` has unmounted it.
    fs: Option<Arc<Fs>>,
    /// Background durability and cleaning while mounted; stopped before unmount.
    maintenance: Option<Maintenance>,
    /// How long the kernel may cache attributes.
    attr_timeout: Duration,
    /// How long the kernel may cache names.
    entry_timeout: Duration,
    /// How long the kernel may remember absent names (zero: `ENOENT`, not remembered).
    negative_timeout: Duration,
    /// The kernel leaves the dropping of set-user-ID bits and capabilities to the file system
    /// (`FUSE_HANDLE_KILLPRIV_V2`, set at `init`).
    drops_privs: bool,
    /// Set once the session exists: how the adapter tells the kernel what it changed behind
    /// its back.
    notifier: Arc<OnceLock<Notifier>>,
    /// Set after a panic inside the file system: every later request fails with `EIO`.
    stopped: AtomicBool,
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
            fs: Some(fs),
            maintenance,
            attr_timeout: cfg.attr_timeout,
            entry_timeout: cfg.entry_timeout,
            negative_timeout: cfg.negative_timeout,
            drops_privs: false,
            notifier,
            stopped: AtomicBool::new(false),
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

    /// Run a changing request, inside the caller's transaction when it is bound to one;
    /// `inodes` and `entries` are what it may change (dropped from the kernel's caches if the
    /// transaction aborts).
    fn change<T>(
        &self,
        req: &Request,
        op: &'static str,
        inodes: &[u64],
        entries: &[(u64, &OsStr)],
        f: impl FnOnce(&Fs, Option<&Txn>) -> Result<T, Failure>,
    ) -> Result<T, Errno> {
        let bound = self.txns.route(req.pid());
        let guard = bound.as_ref().map(|b| b.read());
        let txn = guard.as_ref().and_then(|g| g.as_ref());
        if let (Some(b), Some(_)) = (&bound, txn) {
            b.touch(inodes, entries);
        }
        self.call(op, |fs| f(fs, txn))
    }

    fn patchy(&self) -> std::sync::MutexGuard<'_, HashSet<u64>> {
        self.patchy.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new file handle; its low bit says whether it was opened for writing.
    fn fh(&self, writable: bool) -> FileHandle {
        FileHandle(self.next_fh.fetch_add(1, Ordering::Relaxed) << 1 | u64::from(writable))
    }

    /// Whether handle `fh` was opened for writing.
    fn writable(fh: FileHandle) -> bool {
        fh.0 & 1 == 1
    }

    /// How a regular file opened with `flags` is opened: one open for writing gets `FLUSH` at
    /// close, where an atomic write it owns is aborted if its process is dying, before the
    /// kernel drops the process's POSIX locks (`txns.rs`).
    fn file_open_flags(flags: i32) -> (bool, FopenFlags) {
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let mut open = FILE_OPEN_FLAGS;
        if writable {
            open.remove(FopenFlags::FOPEN_NOFLUSH);
        }
        (writable, open)
    }

    /// [`TallyFuse::change`] for a request through handle `fh`: into the atomic write `fh`
    /// owns if any, else as `change` routes it.
    fn change_through<T>(
        &self,
        req: &Request,
        fh: Option<FileHandle>,
        op: &'static str,
        inodes: &[u64],
        f: impl FnOnce(&Fs, Option<&Txn>) -> Result<T, Failure>,
    ) -> Result<T, Errno> {
        let Some(bound) = fh.and_then(|fh| self.txns.route_handle(fh.0)) else {
            return self.change(req, op, inodes, &[], f);
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
        let fs = match &self.fs {
            Some(fs) if !self.stopped.load(Ordering::Acquire) => fs,
            _ => return Err(errno(&Failure::Stopped)),
        };
        match catch_unwind(AssertUnwindSafe(|| f(fs))) {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(failure)) => {
                match &failure {
                    Failure::Fs(
                        e @ (FsError::Io(_) | FsError::ReadOnly(_) | FsError::Corrupted(_)),
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

    fn reply_entry(&self, reply: ReplyEntry, result: Result<FileAttr, Errno>) {
        match result {
            Ok(attr) => {
                reply.entry_with_ttls(&self.attr_timeout, &self.entry_timeout, &attr, Generation(0))
            }
            Err(e) => reply.error(e),
        }
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

    fn reply_empty(reply: ReplyEmpty, result: Result<(), Errno>) {
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    /// Unmount the file system: stop maintenance, then write the snapshot.
    fn unmount(&mut self) -> Unmounted {
        drop(self.maintenance.take());
        let Some(fs) = self.fs.take() else {
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
fn owner(req: &Request) -> Owner {
    Owner { uid: req.uid(), gid: req.gid() }
}

fn name(n: &OsStr) -> &[u8] {
    n.as_bytes()
}

impl Filesystem for TallyFuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
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
        for (flag, without) in wanted {
            if config.add_capabilities(flag).is_err() {
                tracing::info!("the kernel does not offer {flag:?}: {without}");
            }
        }
        self.drops_privs = config.add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2).is_ok();
        // fuser asks for the largest writes its buffers take (16 MiB) and for FUSE_MAX_PAGES;
        // the kernel caps every request at fs.fuse.max_pages_limit pages (root may raise it).
        let limit = std::fs::read_to_string("/proc/sys/fs/fuse/max_pages_limit")
            .map_or_else(|_| "?".to_owned(), |s| s.trim().to_owned());
        tracing::info!(
            drops_privs = self.drops_privs,
            "FUSE ABI {:?}; requests up to fs.fuse.max_pages_limit = {limit} pages",
            config.kernel_abi()
        );
        Ok(())
    }

    fn destroy(&mut self) {
        tracing::info!("FUSE requests since mount: {}", self.requests.snapshot());
        let outcome = self.unmount();
        match &outcome {
            Unmounted::Clean => tracing::info!("unmounted cleanly, snapshot written"),
            Unmounted::WithoutSnapshot(why) => tracing::warn!("unmounted without snapshot: {why}"),
            Unmounted::Failed(why) => tracing::error!("unmount failed: {why}"),
        }
        *self.outcome.lock().unwrap_or_else(PoisonError::into_inner) = Some(outcome);
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEntry) {
        self.requests.count(Opcode::Lookup);
        let r = self.call("lookup", |fs| Ok(Self::attr_of(fs, &fs.lookup(parent.0, name(n))?)));
        match r {
            // An entry for inode 0 is the kernel's negative entry: "no such name", remembered
            // for its timeout (an ENOENT error is not remembered at all).
            Err(e) if e.code() == libc::ENOENT && !self.negative_timeout.is_zero() => reply
                .entry_with_ttls(
                    &Duration::ZERO,
                    &self.negative_timeout,
                    &absent_attr(),
                    Generation(0),
                ),
            r => self.reply_entry(reply, r),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, _nlookup: u64) {
        // The file system keeps no lookup counts: inode numbers stay valid while it lives.
        self.requests.count(Opcode::Forget);
        self.patchy().remove(&ino.0);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.requests.count(Opcode::Getattr);
        match self.call("getattr", |fs| Ok(Self::attr_of(fs, &fs.getattr(ino.0)?))) {
            Ok(attr) => reply.attr(&self.attr_timeout, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.requests.count(Opcode::Setattr);
        let set = SetAttr {
            perm: mode.map(perm),
            uid,
            gid,
            size,
            atime: atime.map(set_time),
            mtime: mtime.map(set_time),
            ctime: ctime.map(timespec),
        };
        let r = self.change_through(req, fh, "setattr", &[ino.0], |fs, tx| {
            let a = if self.drops_privs && (uid.is_some() || gid.is_some() || size.is_some()) {
                // A truncate drops the bits only for a caller without CAP_FSETID (the kernel
                // says so in FATTR_KILL_SUIDGID, which fuser does not pass on); a chown
                // drops them whoever asks.
                let bits =
                    size.is_some() && truncate_drops_bits(fs.getattr(ino.0)?.perm, req.pid());
                fs.setattr_dropping_privs(tx, ino.0, &set, bits)?
            } else {
                fs.setattr(tx, ino.0, &set)?
            };
            Ok(Self::attr_of(fs, &a))
        });
        match r {
            Ok(attr) => reply.attr(&self.attr_timeout, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.requests.count(Opcode::Readlink);
        match self.call("readlink", |fs| Ok(fs.readlink(ino.0)?)) {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.requests.count(Opcode::Mknod);
        let r = self.change(req, "mknod", &[], &[(parent.0, n)], |fs, tx| {
            let kind = mknod_kind(mode)
                .ok_or(FsError::Invalid("mknod makes files, fifos, sockets and device nodes"))?;
            let a =
                fs.mknod(tx, parent.0, name(n), kind, perm(mode), u64::from(rdev), owner(req))?;
            Ok(Self::attr_of(fs, &a))
        });
        self.reply_entry(reply, r);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        self.requests.count(Opcode::Mkdir);
        let r = self.change(req, "mkdir", &[], &[(parent.0, n)], |fs, tx| {
            Ok(Self::attr_of(fs, &fs.mkdir(tx, parent.0, name(n), perm(mode), owner(req))?))
        });
        self.reply_entry(reply, r);
    }

    fn unlink(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        self.requests.count(Opcode::Unlink);
        let inodes = self.child_of(parent, n);
        let r = self.change(req, "unlink", &inodes, &[(parent.0, n)], |fs, tx| {
            Ok(fs.unlink(tx, parent.0, name(n))?)
        });
        Self::reply_empty(reply, r);
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        self.requests.count(Opcode::Rmdir);
        let inodes = self.child_of(parent, n);
        let r = self.change(req, "rmdir", &inodes, &[(parent.0, n)], |fs, tx| {
            Ok(fs.rmdir(tx, parent.0, name(n))?)
        });
        Self::reply_empty(reply, r);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.requests.count(Opcode::Symlink);
        let r = self.change(req, "symlink", &[], &[(parent.0, link_name)], |fs, tx| {
            let target = target.as_os_str().as_bytes();
            Ok(Self::attr_of(fs, &fs.symlink(tx, parent.0, name(link_name), target, owner(req))?))
        });
        self.reply_entry(reply, r);
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.requests.count(Opcode::Rename);
        let mut inodes = self.child_of(parent, n);
        inodes.extend(self.child_of(newparent, newname));
        let entries = [(parent.0, n), (newparent.0, newname)];
        let r = self.change(req, "rename", &inodes, &entries, |fs, tx| {
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
            Ok(fs.rename(tx, parent.0, name(n), newparent.0, name(newname), how)?)
        });
        Self::reply_empty(reply, r);
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.requests.count(Opcode::Link);
        let r = self.change(req, "link", &[ino.0], &[(newparent.0, newname)], |fs, tx| {
            Ok(Self::attr_of(fs, &fs.link(tx, ino.0, newparent.0, name(newname))?))
        });
        self.reply_entry(reply, r);
    }

    fn open(&self, _req: &Request, ino: INodeNo, open_flags: OpenFlags, reply: ReplyOpen) {
        self.requests.count(Opcode::Open);
        match self.call("open", |fs| Ok(fs.open(ino.0)?)) {
            Ok(()) => {
                let (writable, mut flags) = Self::file_open_flags(open_flags.0);
                if self.patchy().remove(&ino.0) {
                    flags.remove(FopenFlags::FOPEN_KEEP_CACHE);
                }
                reply.opened(self.fh(writable), flags);
            }
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.requests.count(Opcode::Read);
        let len = usize::try_from(size).unwrap_or(usize::MAX);
        match self.call("read", |fs| Ok(fs.read(ino.0, offset, len)?)) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.requests.count(Opcode::Write);
        // Set by the kernel when the writer lacks CAP_FSETID.
        let bits = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        if !offset.is_multiple_of(self.page_size) {
            // The page at `offset` is written in two pieces (this one and an earlier one, or
            // none: a hole): the kernel keeps it out of date.
            self.patchy().insert(ino.0);
        }
        let r = self.change_through(req, Some(fh), "write", &[ino.0], |fs, tx| {
            if self.drops_privs {
                Ok(fs.write_dropping_privs(tx, ino.0, offset, data, bits)?)
            } else {
                Ok((fs.write(tx, ino.0, offset, data)?, false))
            }
        });
        match r {
            Ok((n, perm_dropped)) => {
                // The kernel keeps the mode it cached (it drops only sizes and times after a
                // write) and checks permissions, exec's set-user-ID included, against it.
                if perm_dropped {
                    self.attributes_changed(ino.0);
                }
                // A write is at most the kernel's max_write (far below 4 GiB).
                reply.written(u32::try_from(n).unwrap_or(u32::MAX));
            }
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.requests.count(Opcode::Flush);
        // Nothing is buffered here: every write is already a committed transaction. close()
        // does not make data durable on Tally, as on ext4; fsync does. Sent for files open
        // for writing (and by kernels that ignore FOPEN_NOFLUSH): the kernel drops the
        // caller's POSIX locks after this returns, so an atomic write its dying process left
        // open ends here, before another process can lock the file and read it.
        let r = self.call("flush", |fs| self.txns.abort_if_exiting(fs, fh.0, req.pid()));
        if r == Ok(true) {
            tracing::info!(fh = fh.0, "atomic write aborted: its process died with it open");
        }
        Self::reply_empty(reply, r.map(|_| ()));
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.requests.count(Opcode::Release);
        self.abort_owned(fh);
        Self::reply_empty(reply, self.call("release", |fs| Ok(fs.release(ino.0)?)));
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.requests.count(Opcode::Fsync);
        let r = self.call("fsync", |fs| {
            if datasync { fs.fdatasync(ino.0) } else { fs.fsync(ino.0) }.map_err(Into::into)
        });
        Self::reply_empty(reply, r);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.requests.count(Opcode::Opendir);
        match self.call("opendir", |fs| Ok(fs.open(ino.0)?)) {
            Ok(()) => reply.opened(self.fh(false), DIR_OPEN_FLAGS),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.requests.count(Opcode::Readdir);
        // The library's offsets are the cookies: 1 is ".", 2 is "..", entries from 3 on, stable
        // across other entries coming and going.
        match self.call("readdir", |fs| Ok(fs.readdir(ino.0, offset)?)) {
            Ok(entries) => {
                for e in entries {
                    let full = reply.add(
                        INodeNo(e.ino),
                        e.offset,
                        file_type(e.kind),
                        OsStr::from_bytes(&e.name),
                    );
                    if full {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        self.requests.count(Opcode::Readdirplus);
        // As readdir, with each entry's attributes: the kernel makes an entry of each ("." and
        // ".." excepted), so no LOOKUP follows for a listed name.
        let r = self.call("readdirplus", |fs| {
            let mut out = Vec::new();
            for e in fs.readdir(ino.0, offset)? {
                let attr = match e.name.as_slice() {
                    b"." | b".." => fs.lookup(ino.0, &e.name),
                    _ => fs.getattr(e.ino),
                };
                match attr {
                    Ok(a) => out.push((e, Self::attr_of(fs, &a))),
                    // Gone since the listing was taken: left out.
                    Err(FsError::NotFound) => {}
                    Err(other) => return Err(other.into()),
                }
            }
            Ok(out)
        });
        match r {
            Ok(entries) => {
                // One timeout for the entry and the attributes here.
                let ttl = self.attr_timeout.min(self.entry_timeout);
                for (e, attr) in entries {
                    let name = OsStr::from_bytes(&e.name);
                    if reply.add(INodeNo(e.ino), e.offset, name, &ttl, &attr, Generation(0)) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.requests.count(Opcode::Releasedir);
        self.abort_owned(fh);
        Self::reply_empty(reply, self.call("releasedir", |fs| Ok(fs.release(ino.0)?)));
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.requests.count(Opcode::Fsyncdir);
        Self::reply_empty(reply, self.call("fsyncdir", |fs| Ok(fs.fsync(ino.0)?)));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.requests.count(Opcode::Statfs);
        match self.call("statfs", |fs| Ok(fs.statfs())) {
            Ok(s) => {
                let files = s.files.saturating_add(s.files_free);
                reply.statfs(
                    s.blocks,
                    s.blocks_free,
                    s.blocks_free,
                    files,
                    s.files_free,
                    s.block_size,
                    s.name_max,
                    s.block_size,
                );
            }
            Err(e) => reply.error(e),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        n: &OsStr,
        value: &[u8],
        flags: i32,
        position: u32,
        reply: ReplyEmpty,
    ) {
        self.requests.count(Opcode::Setxattr);
        let r = self.change(req, "setxattr", &[ino.0], &[], |fs, tx| {
            if position != 0 {
                return Err(FsError::Invalid("xattr position (macOS resource forks)").into());
            }
            let how = match flags {
                0 => XattrSet::Any,
                libc::XATTR_CREATE => XattrSet::Create,
                libc::XATTR_REPLACE => XattrSet::Replace,
                _ => return Err(FsError::Invalid("setxattr flags").into()),
            };
            Ok(fs.setxattr(tx, ino.0, name(n), value, how)?)
        });
        Self::reply_empty(reply, r);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, n: &OsStr, size: u32, reply: ReplyXattr) {
        self.requests.count(Opcode::Getxattr);
        match self.call("getxattr", |fs| Ok(fs.getxattr(ino.0, name(n))?)) {
            Ok(value) => reply_sized(reply, size, &value),
            Err(e) => reply.error(e),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.requests.count(Opcode::Listxattr);
        match self.call("listxattr", |fs| Ok(fs.listxattr(ino.0)?)) {
            Ok(names) => {
                let mut list = Vec::new();
                for n in names {
                    list.extend_from_slice(&n);
                    list.push(0);
                }
                reply_sized(reply, size, &list);
            }
            Err(e) => reply.error(e),
        }
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        self.requests.count(Opcode::Removexattr);
        let r = self.change(req, "removexattr", &[ino.0], &[], |fs, tx| {
            Ok(fs.removexattr(tx, ino.0, name(n))?)
        });
        Self::reply_empty(reply, r);
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        self.requests.count(Opcode::Access);
        // Only sent without default_permissions, which the adapter always sets: the kernel
        // checks permissions. Existence is all there is to check.
        Self::reply_empty(
            reply,
            self.call("access", |fs| fs.getattr(ino.0).map(|_| ()).map_err(Into::into)),
        );
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        _umask: u32,
        open_flags: i32,
        reply: ReplyCreate,
    ) {
        self.requests.count(Opcode::Create);
        let r = self.change(req, "create", &[], &[(parent.0, n)], |fs, tx| {
            let a = fs.create(tx, parent.0, name(n), perm(mode), owner(req))?;
            fs.open(a.ino)?;
            Ok(Self::attr_of(fs, &a))
        });
        match r {
            Ok(attr) => {
                // One timeout for the entry and the attributes here.
                let ttl = self.attr_timeout.min(self.entry_timeout);
                let (writable, flags) = Self::file_open_flags(open_flags);
                reply.created(&ttl, &attr, Generation(0), self.fh(writable), flags)
            }
            Err(e) => reply.error(e),
        }
    }

    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        _in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        // Files and directories alike (the kernel sends FUSE_IOCTL_DIR for a directory).
        let r = if let Some(op) = f2fs::f2fs_opcode(cmd) {
            self.requests.count(op);
            self.f2fs_ioctl(req, ino, fh, cmd, out_size)
        } else {
            self.requests.count(Opcode::Ioctl);
            self.transaction_ioctl(req, ino, fh, cmd, out_size)
        };
        match r {
            Ok(data) => reply.ioctl(0, &data),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.requests.count(Opcode::Fallocate);
        let r = self.change_through(req, Some(fh), "fallocate", &[ino.0], |fs, tx| {
            if mode & !(FALLOC_KEEP_SIZE | FALLOC_PUNCH_HOLE | FALLOC_ZERO_RANGE) != 0 {
                return Err(Failure::Unsupported("fallocate mode"));
            }
            let flags = FallocFlags {
                keep_size: mode & FALLOC_KEEP_SIZE != 0,
                punch_hole: mode & FALLOC_PUNCH_HOLE != 0,
                zero_range: mode & FALLOC_ZERO_RANGE != 0,
            };
            Ok(fs.fallocate(tx, ino.0, offset, length, flags)?)
        });
        Self::reply_empty(reply, r);
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: i64,
        _whence: i32,
        reply: ReplyLseek,
    ) {
        // The kernel seeks itself (SEEK_DATA and SEEK_HOLE as if the file had no holes) and
        // asks no more after this answer.
        self.requests.count(Opcode::Lseek);
        reply.error(Errno::from_i32(libc::ENOSYS));
    }

    fn copy_file_range(
        &self,
        req: &Request,
        ino_in: INodeNo,
        _fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: fuser::CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        self.requests.count(Opcode::CopyFileRange);
        let r = self.change(req, "copy_file_range", &[ino_out.0], &[], |fs, tx| {
            if flags.bits() != 0 {
                return Err(FsError::Invalid("copy_file_range flags").into());
            }
            // One transaction per request: the kernel returns a short count to the caller,
            // which asks again for the rest (a request carries at most 4 GiB anyway).
            let len = len.min(u64::from(u32::MAX));
            Ok(fs.copy_file_range(tx, ino_in.0, offset_in, ino_out.0, offset_out, len)?)
        });
        match r {
            Ok(n) => reply.written(u32::try_from(n).unwrap_or(u32::MAX)),
            Err(e) => reply.error(e),
        }
    }

    fn poll(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _ph: fuser::PollNotifier,
        events: fuser::PollEvents,
        _flags: fuser::PollFlags,
        reply: fuser::ReplyPoll,
    ) {
        self.requests.count(Opcode::Poll);
        // Files and directories are always ready, as on a disk file system: a read or write
        // never waits for another process, so no later readiness needs announcing.
        use fuser::PollEvents as P;
        let ready = P::POLLIN | P::POLLOUT | P::POLLRDNORM | P::POLLWRNORM;
        match self.call("poll", |fs| fs.getattr(ino.0).map(|_| ()).map_err(Into::into)) {
            Ok(()) => reply.poll(events & ready),
            Err(e) => reply.error(e),
        }
    }
}

impl TallyFuse {
    /// The inode `name` in `parent` names now, if any (its cached attributes are dropped too
    /// if a transaction that unlinks or renames it aborts).
    fn child_of(&self, parent: INodeNo, n: &OsStr) -> Vec<u64> {
        if self.txns.is_idle() {
            return Vec::new();
        }
        self.call("lookup", |fs| Ok(fs.lookup(parent.0, name(n))?))
            .map_or_else(|_| Vec::new(), |a| vec![a.ino])
    }

    /// One of `tally-client`'s ioctls; its reply data (8 bytes for the `_IOR` ones).
    fn transaction_ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
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
                let id = self.call("begin", |fs| self.txns.begin(fs, fh.0, req.pid(), tree))?;
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
            ioctl::BARRIER => {
                self.call("barrier", |fs| Ok(fs.barrier(ino.0)?)).map(|()| Vec::new())
            }
            ioctl::CURRENT => id_reply(self.txns.current(req.pid())),
            _ => Err(Errno::from_i32(libc::ENOTTY)),
        }
    }
}

/// Answer a `getxattr`/`listxattr`: with `size` 0 the caller asks how big the value is; a
/// buffer too small for it is `ERANGE`.
fn reply_sized(reply: ReplyXattr, size: u32, value: &[u8]) {
    let len = u32::try_from(value.len()).unwrap_or(u32::MAX);
    if size == 0 {
        reply.size(len);
    } else if len > size {
        reply.error(errno(&Failure::Fs(FsError::Range)));
    } else {
        reply.data(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_fs::{MkfsOptions, MountOptions, ROOT};
    use tally_media::{Device, MemDevice};

    fn adapter() -> TallyFuse {
        let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, 16384).unwrap());
        Fs::mkfs(dev.clone(), &MkfsOptions::default()).unwrap();
        let fs = Fs::mount(dev, MountOptions::default()).unwrap();
        let cfg =
            MountConfig { maintenance_interval: Duration::from_secs(60), ..Default::default() };
        let (requests, notifier) = (Arc::default(), Arc::default());
        TallyFuse::new(fs, &cfg, Txns::default(), OutcomeSlot::default(), requests, notifier)
    }

    #[test]
    fn failures_map_through_the_one_function() {
        let a = adapter();
        let e = a.call("lookup", |fs| Ok(fs.lookup(ROOT, b"missing")?)).unwrap_err();
        assert_eq!(e.code(), libc::ENOENT);
        let e = a.call("x", |_| -> Result<(), Failure> { Err(Failure::Unsupported("x")) });
        assert_eq!(e.unwrap_err().code(), libc::EOPNOTSUPP);
        let mut a = a;
        assert_eq!(a.unmount(), Unmounted::Clean);
    }

    #[test]
    fn a_panic_answers_eio_and_stops_the_adapter() {
        let mut a = adapter();
        let e = a.call("boom", |_| -> Result<(), Failure> { panic!("deliberate") }).unwrap_err();
        assert_eq!(e.code(), libc::EIO);
        // Every later request fails too, even one that would succeed.
        let e = a.call("getattr", |fs| Ok(fs.getattr(ROOT)?)).unwrap_err();
        assert_eq!(e.code(), libc::EIO);
        assert!(matches!(a.unmount(), Unmounted::WithoutSnapshot(_)));
    }
}

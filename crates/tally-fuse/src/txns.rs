//! Explicit transactions for unmodified programs: the ioctls of `tally-client` (and
//! `include/tally.h`), which requests go into which transaction, and how one ends.
//!
//! Invariants:
//! - a transaction is **owned** by the open file (file handle) that began it: only an ioctl on
//!   that handle commits or aborts it, and its `release` (the last close of every copy of it,
//!   including a process's death) aborts it if still open. So every transaction ends;
//! - a transaction is **bound** to a thread group (`BEGIN`) or to a thread group and all its
//!   descendants (`BEGIN_TREE`, found by walking `PPid` in `/proc`). Every changing request from
//!   a bound caller runs with `Some(&txn)`; no other request does. A process bound both ways
//!   goes into its own process's transaction, else into its nearest tree root's;
//! - a request routed into a transaction holds the transaction's read lock while it runs, and
//!   ending it takes the write lock, so no routed request is half inside: it ran in the
//!   transaction before the end, or runs after it as a plain operation;
//! - after an abort (or a failed commit, which aborts) every inode and entry the transaction
//!   changed is invalidated in the kernel's caches before the ioctl returns, so `stat` and
//!   `read` show the old state at once;
//! - `/proc` is read only while a transaction is open; otherwise routing costs one atomic load.
//!   While one is open, a thread's verdict is reused for [`ROUTE_TTL`] unless a transaction
//!   began or ended meanwhile (reading `/proc/PID/status` for the caller and each ancestor took
//!   half the daemon's CPU inside `tally atomic -- tar -x`). Sound because a thread id cannot be
//!   reused that fast (`pid_max` creations would have to happen within it) and a thread's
//!   ancestry changes only when an ancestor dies (it is reparented): for at most [`ROUTE_TTL`]
//!   such a thread is still routed as a descendant of the tree it was started in;
//! - an **atomic write** (F2FS's ioctls, SQLite's batch-atomic commit) is a transaction owned by
//!   one open file of one regular file and bound to no process: the writes and truncates that
//!   come through that handle go into it, nothing else does. At most one handle has one on a
//!   file. It ends by commit (durable), abort, the handle's release, or — before the kernel drops
//!   the process's POSIX locks — the `FLUSH` of the handle by its starting process when that
//!   process is exiting ([`Txns::abort_if_exiting`]).

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use fuser::{INodeNo, Notifier};
use tally_fs::{Fs, FsError, Txn};

use crate::errno::Failure;

/// Deliberately broken variants of the adapter (selectable only with the `mutants` feature), so
/// the transaction tests are shown to catch what they claim to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FuseMutant {
    /// No request is ever routed into a transaction: begin and commit succeed, but every
    /// change is a plain operation, so abort undoes nothing.
    RouteNothing,
    /// Abort undoes the transaction but leaves the kernel's caches alone: attributes and pages
    /// cached before the abort are shown until they expire.
    NoInvalidation,
    /// A write that drops a file's set-user-ID bit leaves the kernel's cached mode alone: the
    /// kernel goes on checking permissions, and running the file, with the bit.
    KeepCachedMode,
    /// The adapter does not take `FUSE_HANDLE_KILLPRIV_V2` at `INIT`: the kernel drops
    /// privileges itself and asks `getxattr("security.capability")` before every write (no
    /// inode is ever marked `S_NOSEC`), so a written file costs a round trip per write more.
    NoKillPriv,
    /// `FLUSH` never aborts an atomic write: one whose process died is left to the owning
    /// file's `RELEASE`, which comes after the kernel has dropped the dead process's POSIX
    /// locks (or never, while another process holds a copy of the file).
    FlushKeepsAtomicWrite,
    /// `FLUSH` of the owning file aborts its atomic write whoever closes it, dying or not.
    FlushAbortsAlways,
}

/// How long a thread's routing verdict is reused while no transaction begins or ends.
pub(crate) const ROUTE_TTL: Duration = Duration::from_millis(250);

/// Verdicts cached past this many threads are swept of the expired ones.
const ROUTE_CACHE_MAX: usize = 4096;

/// Routing verdicts by thread id, valid for one `generation` of the open transactions.
#[derive(Default)]
struct RouteCache {
    generation: u64,
    verdicts: HashMap<u32, (Instant, Option<Arc<Bound>>)>,
}

/// Longest parent chain followed when looking for a tree's root (deeper callers are outside).
const LINEAGE_DEPTH_MAX: usize = 128;

/// Which callers a transaction takes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// One thread group.
    Process(u32),
    /// A thread group and every process below it.
    Tree(u32),
    /// An atomic write: the requests through the owning handle, on file `ino`; `starter` is
    /// the thread group that started it.
    Handle { ino: u64, starter: u32 },
}

/// What a transaction changed, for the kernel's caches after an abort.
#[derive(Debug, Default)]
struct Touched {
    inodes: HashSet<u64>,
    entries: HashSet<(u64, Vec<u8>)>,
}

/// An open transaction and what it is bound to.
pub(crate) struct Bound {
    id: u64,
    scope: Scope,
    /// `None` once ended; requests routed here after that run as plain operations.
    txn: RwLock<Option<Txn>>,
    touched: Mutex<Touched>,
}

impl Bound {
    /// The transaction for a request to run in, held until the guard drops.
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Option<Txn>> {
        self.txn.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Note what a request in this transaction changes.
    pub(crate) fn touch(&self, inodes: &[u64], entries: &[(u64, &OsStr)]) {
        let mut t = self.touched.lock().unwrap_or_else(PoisonError::into_inner);
        t.inodes.extend(inodes.iter().copied());
        for &(dir, name) in entries {
            t.inodes.insert(dir);
            t.entries.insert((dir, name.as_bytes().to_vec()));
        }
    }
}

/// How to end a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    Commit,
    CommitDurable,
    Abort,
}

/// Every open transaction of the mount.
#[derive(Default)]
pub(crate) struct Txns {
    by_owner: Mutex<HashMap<u64, Arc<Bound>>>,
    /// Open transactions; routing looks at `/proc` only when this is not 0.
    open_count: AtomicUsize,
    /// Bumped whenever a transaction begins or ends (under the owners' lock): cached routing
    /// verdicts of an older generation are not used.
    generation: AtomicU64,
    route_cache: Mutex<RouteCache>,
    /// Set once the session exists; `None` in unit tests without a kernel.
    notifier: Arc<OnceLock<Notifier>>,
    mutant: Option<FuseMutant>,
}

impl Txns {
    /// No transaction yet; invalidations go through `notifier` once it is set.
    pub(crate) fn new(notifier: Arc<OnceLock<Notifier>>, mutant: Option<FuseMutant>) -> Txns {
        Txns { notifier, mutant, ..Txns::default() }
    }

    fn owners(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Bound>>> {
        self.by_owner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The transaction a request from thread `pid` goes into, if any: a verdict cached for
    /// the thread (see the module's invariants), else from `/proc`.
    pub(crate) fn route(&self, pid: u32) -> Option<Arc<Bound>> {
        if self.open_count.load(Ordering::Acquire) == 0
            || self.mutant == Some(FuseMutant::RouteNothing)
        {
            return None;
        }
        let generation = self.generation.load(Ordering::Acquire);
        let now = Instant::now();
        {
            let cache = self.route_cache.lock().unwrap_or_else(PoisonError::into_inner);
            if cache.generation == generation {
                if let Some((at, verdict)) = cache.verdicts.get(&pid) {
                    if now.saturating_duration_since(*at) < ROUTE_TTL {
                        return verdict.clone();
                    }
                }
            }
        }
        let verdict = self.route_from_proc(pid);
        let mut cache = self.route_cache.lock().unwrap_or_else(PoisonError::into_inner);
        // A transaction that began or ended meanwhile may not be in this verdict: keep it only
        // if the generation it was computed in is still the current one.
        if self.generation.load(Ordering::Acquire) == generation {
            if cache.generation != generation {
                cache.verdicts.clear();
                cache.generation = generation;
            }
            if cache.verdicts.len() >= ROUTE_CACHE_MAX {
                cache.verdicts.retain(|_, (at, _)| now.saturating_duration_since(*at) < ROUTE_TTL);
            }
            cache.verdicts.insert(pid, (now, verdict.clone()));
        }
        verdict
    }

    /// [`Txns::route`] from `/proc`: the caller's thread group and, when a tree is open, its
    /// ancestors.
    fn route_from_proc(&self, pid: u32) -> Option<Arc<Bound>> {
        let bound: Vec<Arc<Bound>> = self.owners().values().cloned().collect();
        let trees = bound.iter().any(|b| matches!(b.scope, Scope::Tree(_)));
        let lineage = lineage(pid, if trees { LINEAGE_DEPTH_MAX } else { 1 });
        let me = *lineage.first()?;
        // Atomic writes (`Scope::Handle`) are bound to no process: no scope below matches them.
        if let Some(b) = bound.iter().find(|b| b.scope == Scope::Process(me)) {
            return Some(b.clone());
        }
        lineage.iter().find_map(|&p| bound.iter().find(|b| b.scope == Scope::Tree(p))).cloned()
    }

    /// Begin a transaction owned by handle `fh`, bound to the caller (`tree`: and its
    /// descendants). Returns its id.
    pub(crate) fn begin(&self, fs: &Fs, fh: u64, pid: u32, tree: bool) -> Result<u64, Failure> {
        let Some(&tgid) = lineage(pid, 1).first() else {
            return Err(Failure::Unsupported("a caller the mount's /proc does not show"));
        };
        if self.route(pid).is_some() {
            return Err(FsError::Busy.into());
        }
        let mut owners = self.owners();
        if owners.contains_key(&fh) {
            return Err(FsError::Busy.into());
        }
        let txn = fs.begin_detached()?;
        let id = txn.id();
        let scope = if tree { Scope::Tree(tgid) } else { Scope::Process(tgid) };
        let bound = Bound {
            id,
            scope,
            txn: RwLock::new(Some(txn)),
            touched: Mutex::new(Touched::default()),
        };
        owners.insert(fh, Arc::new(bound));
        self.open_count.fetch_add(1, Ordering::AcqRel);
        self.generation.fetch_add(1, Ordering::AcqRel);
        tracing::debug!(id, ?scope, fh, "transaction begun");
        Ok(id)
    }

    /// The atomic write handle `fh` owns, if any: the transaction its writes go into.
    pub(crate) fn route_handle(&self, fh: u64) -> Option<Arc<Bound>> {
        if self.open_count.load(Ordering::Acquire) == 0
            || self.mutant == Some(FuseMutant::RouteNothing)
        {
            return None;
        }
        self.owners().get(&fh).filter(|b| matches!(b.scope, Scope::Handle { .. })).cloned()
    }

    /// Whether handle `fh` owns an atomic write.
    pub(crate) fn owns_atomic(&self, fh: u64) -> bool {
        self.owners().get(&fh).is_some_and(|b| matches!(b.scope, Scope::Handle { .. }))
    }

    /// Start an atomic write on file `ino` owned by handle `fh`, for a request from thread
    /// `pid`. Starting it again on the same handle does nothing (as on F2FS).
    ///
    /// `EBUSY` when the handle owns a `BEGIN` transaction, the caller is inside one (they do
    /// not nest: SQLite then journals), or another handle has an atomic write on the file.
    pub(crate) fn begin_atomic(&self, fs: &Fs, fh: u64, ino: u64, pid: u32) -> Result<(), Failure> {
        if self.route(pid).is_some() {
            return Err(FsError::Busy.into());
        }
        let starter = lineage(pid, 1).first().copied().unwrap_or(0);
        let mut owners = self.owners();
        if let Some(b) = owners.get(&fh) {
            return match b.scope {
                Scope::Handle { .. } => Ok(()),
                _ => Err(FsError::Busy.into()),
            };
        }
        if owners.values().any(|b| matches!(b.scope, Scope::Handle { ino: i, .. } if i == ino)) {
            return Err(FsError::Busy.into());
        }
        let txn = fs.begin_detached()?;
        let id = txn.id();
        let scope = Scope::Handle { ino, starter };
        let bound = Bound {
            id,
            scope,
            txn: RwLock::new(Some(txn)),
            touched: Mutex::new(Touched::default()),
        };
        owners.insert(fh, Arc::new(bound));
        self.open_count.fetch_add(1, Ordering::AcqRel);
        self.generation.fetch_add(1, Ordering::AcqRel);
        tracing::debug!(id, ino, fh, starter, "atomic write started");
        Ok(())
    }

    /// `FLUSH` of handle `fh` by thread `pid` (a `close` of one of its descriptors, before the
    /// kernel drops the caller's POSIX locks): abort the atomic write `fh` owns if the caller
    /// is a thread of the process that started it and that process is exiting (killed, or
    /// `exit` with the write open) — F2FS's rule (`f2fs_file_flush`). Another process's close
    /// of an inherited copy, or the starter's own `close` while alive, leaves it to commit,
    /// abort or the handle's release. Returns whether it aborted.
    pub(crate) fn abort_if_exiting(&self, fs: &Fs, fh: u64, pid: u32) -> Result<bool, Failure> {
        let starter = match self.owners().get(&fh).map(|b| b.scope) {
            Some(Scope::Handle { starter, .. }) => starter,
            _ => return Ok(false),
        };
        match self.mutant {
            Some(FuseMutant::FlushKeepsAtomicWrite) => return Ok(false),
            Some(FuseMutant::FlushAbortsAlways) => {
                self.end(fs, fh, End::Abort)?;
                return Ok(true);
            }
            _ => {}
        }
        // A caller outside the mount's pid namespace comes as pid 0: it is the starter only if
        // the starter came so too (then nothing tells whether it is dying: taken as dying). A
        // thread whose /proc entry cannot be read is gone: its process is exiting.
        let (tgid, exiting) = match exit_status_of(pid) {
            Some(found) => found,
            None if pid == 0 => (0, true),
            None => (starter, true),
        };
        if tgid != starter || !exiting {
            return Ok(false);
        }
        self.end(fs, fh, End::Abort)?;
        Ok(true)
    }

    /// The id of the transaction a request from `pid` goes into, 0 when none.
    pub(crate) fn current(&self, pid: u32) -> u64 {
        self.route(pid).map_or(0, |b| b.id)
    }

    /// No transaction is open.
    pub(crate) fn is_idle(&self) -> bool {
        self.open_count.load(Ordering::Acquire) == 0
    }

    /// Whether handle `fh` owns a transaction.
    pub(crate) fn owns(&self, fh: u64) -> bool {
        self.owners().contains_key(&fh)
    }

    /// End the transaction handle `fh` owns.
    pub(crate) fn end(&self, fs: &Fs, fh: u64, how: End) -> Result<(), Failure> {
        let Some(bound) = self.owners().remove(&fh) else { return Err(FsError::NoTxn.into()) };
        self.open_count.fetch_sub(1, Ordering::AcqRel);
        self.generation.fetch_add(1, Ordering::AcqRel);
        // Waits for requests running inside it to finish.
        let taken = bound.txn.write().unwrap_or_else(PoisonError::into_inner).take();
        let Some(txn) = taken else { return Err(FsError::NoTxn.into()) };
        let result = match how {
            End::Commit => fs.commit(txn),
            End::CommitDurable => fs.commit_durable(txn),
            End::Abort => fs.abort(txn),
        };
        tracing::debug!(id = bound.id, ?how, ok = result.is_ok(), "transaction ended");
        // A failed commit undid the transaction in memory too (or failed the file system).
        if how == End::Abort || result.is_err() {
            self.invalidate(&bound);
        }
        Ok(result?)
    }

    /// Abort every open transaction (unmount; no kernel left to tell).
    pub(crate) fn abort_all(&self, fs: &Fs) {
        let all: Vec<(u64, Arc<Bound>)> = self.owners().drain().collect();
        self.generation.fetch_add(1, Ordering::AcqRel);
        for (_, bound) in all {
            self.open_count.fetch_sub(1, Ordering::AcqRel);
            let taken = bound.txn.write().unwrap_or_else(PoisonError::into_inner).take();
            if let Some(txn) = taken {
                if let Err(e) = fs.abort(txn) {
                    tracing::warn!(id = bound.id, "abort at unmount: {e}");
                }
            }
        }
    }

    /// Drop the kernel's cached attributes, pages and entries of what `bound` changed.
    fn invalidate(&self, bound: &Bound) {
        if self.mutant == Some(FuseMutant::NoInvalidation) {
            return;
        }
        let Some(notifier) = self.notifier.get() else { return };
        let touched =
            std::mem::take(&mut *bound.touched.lock().unwrap_or_else(PoisonError::into_inner));
        // Entries first: a name the transaction created must stop resolving to its inode.
        for (dir, name) in &touched.entries {
            if let Err(e) = notifier.inval_entry(INodeNo(*dir), OsStr::from_bytes(name)) {
                tracing::warn!(dir, "invalidating an entry after abort: {e}");
            }
        }
        for &ino in &touched.inodes {
            // Offset 0, length 0: the attributes and every cached page.
            if let Err(e) = notifier.inval_inode(INodeNo(ino), 0, 0) {
                tracing::warn!(ino, "invalidating an inode after abort: {e}");
            }
        }
    }
}

/// The text of `/proc/<pid>/status` (never `stat`: see [`exit_status_of`]).
fn status_text(pid: u32) -> Option<String> {
    #[cfg(test)]
    tests::STATUS_READS.fetch_add(1, Ordering::Relaxed);
    std::fs::read_to_string(format!("/proc/{pid}/status")).ok()
}

/// The number after `key` (`"Tgid:"`, …) in a `/proc/<pid>/status` text.
fn status_field(text: &str, key: &str) -> Option<u32> {
    text.lines().find_map(|l| l.strip_prefix(key)).and_then(|v| v.trim().parse().ok())
}

/// `Tgid` and `PPid` of `/proc/<pid>/status`.
fn status_of(pid: u32) -> Option<(u32, u32)> {
    let text = status_text(pid)?;
    Some((status_field(&text, "Tgid:")?, status_field(&text, "PPid:")?))
}

/// The thread group of thread `pid`, and whether it is exiting: in `do_exit`, past the point
/// where it let go of its memory (`exit_mm`, which comes before `exit_files` closes its files,
/// so before any `FLUSH` its death sends). `/proc/<pid>/status` then has no `VmSize` line
/// (a user task has one at every other moment; kernel threads, which have none, send no
/// `FLUSH` of a file they did not open, and their thread group is never a starter).
///
/// Not `PF_EXITING` from `/proc/<pid>/stat`: a read of `stat` waits while the task is in the
/// middle of `execve`, and `execve` closes the close-on-exec files, whose `FLUSH` waits for this
/// answer — a deadlock that hung a process starting a program while it held a file with an
/// atomic write open (`tests/sqlite_atomic.rs`). `status` is read without that wait.
fn exit_status_of(pid: u32) -> Option<(u32, bool)> {
    if pid == 0 {
        return None;
    }
    let text = status_text(pid)?;
    let has_memory = text.lines().any(|l| l.starts_with("VmSize:"));
    Some((status_field(&text, "Tgid:")?, !has_memory))
}

/// The thread group of thread `pid`, then its parent, grandparent, … (at most `depth` entries,
/// ending before pid 0). Empty when the thread is gone or `pid` is 0 (a request the kernel
/// makes on its own, or a caller outside the mount's pid namespace).
fn lineage(pid: u32, depth: usize) -> Vec<u32> {
    let mut out = Vec::new();
    if pid == 0 {
        return out;
    }
    let Some((tgid, mut parent)) = status_of(pid) else { return out };
    out.push(tgid);
    while out.len() < depth && parent != 0 {
        out.push(parent);
        match status_of(parent) {
            Some((_, p)) => parent = p,
            None => break,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tally_fs::{MkfsOptions, MountOptions, Owner, ROOT};
    use tally_media::{Device, MemDevice};

    fn fs() -> Fs {
        let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, 16384).unwrap());
        Fs::mkfs(dev.clone(), &MkfsOptions::default()).unwrap();
        Fs::mount(dev, MountOptions::default()).unwrap()
    }

    fn me() -> u32 {
        std::process::id()
    }

    /// `/proc/PID/status` reads by this process's tests (they run in parallel: compare
    /// deltas only where no other test of this module can read meanwhile, or bound them).
    pub(super) static STATUS_READS: std::sync::atomic::AtomicUsize =
        std::sync::atomic::AtomicUsize::new(0);

    #[test]
    fn a_verdict_is_reused_until_a_transaction_begins_or_ends_or_it_expires() {
        let fs = fs();
        let t = Txns::default();
        let id = t.begin(&fs, 1, me(), true).unwrap();
        assert_eq!(t.current(me()), id);
        let before = STATUS_READS.load(Ordering::Relaxed);
        for _ in 0..1000 {
            assert_eq!(t.current(me()), id);
        }
        // Without the cache each route reads the caller's and every ancestor's status (1000 x
        // the depth); other tests running meanwhile read a few hundred at most.
        let reads = STATUS_READS.load(Ordering::Relaxed) - before;
        assert!(reads < 500, "{reads} /proc reads for 1000 routes of one thread");
        // The end is seen at once, not after the verdict's time.
        t.end(&fs, 1, End::Commit).unwrap();
        assert_eq!(t.current(me()), 0);
        // A new transaction too (the cached verdict "none" is of an older generation).
        let id2 = t.begin(&fs, 2, me(), false).unwrap();
        assert_eq!(t.current(me()), id2);
        // An expired verdict is computed again.
        let before = STATUS_READS.load(Ordering::Relaxed);
        std::thread::sleep(ROUTE_TTL + Duration::from_millis(20));
        assert_eq!(t.current(me()), id2);
        assert!(STATUS_READS.load(Ordering::Relaxed) > before, "an expired verdict was reused");
        t.end(&fs, 2, End::Abort).unwrap();
    }

    #[test]
    fn lineage_walks_up_to_init() {
        let l = lineage(me(), LINEAGE_DEPTH_MAX);
        assert_eq!(l.first(), Some(&me()));
        // SAFETY: getppid has no preconditions.
        let parent = u32::try_from(unsafe { libc::getppid() }).unwrap();
        assert_eq!(l.get(1), Some(&parent));
        assert!(lineage(0, 8).is_empty());
    }

    #[test]
    fn the_owner_ends_it_and_the_caller_is_routed_meanwhile() {
        let fs = fs();
        let t = Txns::default();
        assert!(t.route(me()).is_none());
        let id = t.begin(&fs, 7, me(), false).unwrap();
        assert_eq!(t.current(me()), id);
        // A second begin by the same caller, or on the same handle, is refused.
        assert!(matches!(t.begin(&fs, 8, me(), false), Err(Failure::Fs(FsError::Busy))));
        // Another handle cannot end it.
        assert!(matches!(t.end(&fs, 8, End::Commit), Err(Failure::Fs(FsError::NoTxn))));
        let a = {
            let b = t.route(me()).unwrap();
            let g = b.read();
            fs.create(g.as_ref(), ROOT, b"a", 0o644, Owner { uid: 0, gid: 0 }).unwrap()
        };
        t.end(&fs, 7, End::Abort).unwrap();
        assert!(fs.getattr(a.ino).is_err(), "abort left the file");
        assert_eq!(t.current(me()), 0);
        assert!(matches!(t.end(&fs, 7, End::Abort), Err(Failure::Fs(FsError::NoTxn))));
    }

    #[test]
    fn a_tree_takes_in_the_callers_parent_chain_only_below_its_root() {
        let fs = fs();
        let t = Txns::default();
        // SAFETY: getppid has no preconditions.
        let parent = u32::try_from(unsafe { libc::getppid() }).unwrap();
        let id = t.begin(&fs, 1, me(), true).unwrap();
        assert_eq!(t.current(me()), id);
        assert_eq!(t.current(parent), 0, "the root's parent is outside the tree");
        t.end(&fs, 1, End::Commit).unwrap();
        assert_eq!(t.current(me()), 0);
    }

    #[test]
    fn an_atomic_write_belongs_to_its_handle_and_no_process() {
        let fs = fs();
        let t = Txns::default();
        let a = fs.create(None, ROOT, b"db", 0o644, Owner { uid: 0, gid: 0 }).unwrap();
        t.begin_atomic(&fs, 3, a.ino, me()).unwrap();
        // Again on the same handle: nothing (F2FS answers 0); on another handle of the same
        // file, or by a caller inside a transaction: EBUSY.
        t.begin_atomic(&fs, 3, a.ino, me()).unwrap();
        assert!(matches!(t.begin_atomic(&fs, 4, a.ino, me()), Err(Failure::Fs(FsError::Busy))));
        assert!(t.owns_atomic(3) && !t.owns_atomic(4));
        assert!(t.route_handle(3).is_some() && t.route_handle(4).is_none());
        assert_eq!(t.current(me()), 0, "the starter's other requests are not routed");
        // A flush by a live process (this one) keeps it, and so does one from outside the
        // mount's pid namespace (pid 0), which cannot be the starter.
        assert!(!t.abort_if_exiting(&fs, 3, me()).unwrap());
        assert!(!t.abort_if_exiting(&fs, 3, 0).unwrap(), "a caller with pid 0 aborted it");
        {
            let b = t.route_handle(3).unwrap();
            let g = b.read();
            fs.write(g.as_ref(), a.ino, 0, b"half").unwrap();
        }
        t.end(&fs, 3, End::Abort).unwrap();
        assert_eq!(fs.getattr(a.ino).unwrap().size, 0, "abort kept the write");
        assert!(!t.owns_atomic(3));
    }

    #[test]
    fn this_process_is_not_exiting() {
        assert_eq!(exit_status_of(me()), Some((me(), false)));
        assert_eq!(exit_status_of(0), None);
    }

    #[test]
    fn a_dead_child_is_exiting() {
        // SAFETY: the child only calls _exit (async-signal-safe).
        let child = unsafe { libc::fork() };
        if child == 0 {
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(0) };
        }
        assert!(child > 0, "fork: {}", std::io::Error::last_os_error());
        let pid = u32::try_from(child).unwrap();
        // A zombie until reaped: past exit_mm, as a process is when its dying FLUSH comes.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while exit_status_of(pid) != Some((pid, true)) {
            assert!(std::time::Instant::now() < deadline, "{:?}", exit_status_of(pid));
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let mut status = 0;
        // SAFETY: reaps the child forked above.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
    }

    #[test]
    fn route_nothing_mutant_routes_nothing() {
        let fs = fs();
        let t = Txns::new(Arc::default(), Some(FuseMutant::RouteNothing));
        t.begin(&fs, 1, me(), false).unwrap();
        assert_eq!(t.current(me()), 0);
        t.abort_all(&fs);
    }
}

//! The file system: operations shaped like the POSIX calls, each one atomic transaction on the
//! log; explicit transactions; fsync, barrier, sync.
//!
//! Invariants:
//! - the DRAM state changes only inside [`Fs::op`] (and at the end of an explicit transaction),
//!   under the state lock; every change is either in a log transaction placed before the lock is
//!   released, or rolled back from its pre-images (`txn.rs`);
//! - versions are handed out under the lock in the order changes take effect, and every record
//!   of one operation carries its version; two operations on one stream are placed in the log in
//!   the order they changed the state;
//! - a transaction touching an inode whose last change is on another stream and not durable
//!   depends on that change (`commit.rs`);
//! - a data block's bytes stay in memory until its transaction is durable, so a read never
//!   reaches the device before the write did.
//!
//! The operations live in `read.rs`, `namespace.rs`, `data.rs` and `transactions.rs`; how one
//! becomes log records in `commit.rs`.

use std::sync::Arc;

use crate::sync::{Condvar, Mutex, MutexGuard};

use tally_log::{Log, LogConfig, LogError, OpenOptions, Transaction};
use tally_media::Device;

use crate::mutant::FsMutant;
use crate::record::Record;
use crate::state::{fresh_attr, State};
use crate::txn::{Cx, OpResult, Stop, TxnId};
use crate::types::{Attr, FileKind, Ino, Timespec, ROOT};
use crate::{FsError, Result};

mod commit;
mod copy;
mod data;
mod large;
mod namespace;
mod read;
mod space;
mod transactions;

/// Shape of a new file system, given to [`Fs::mkfs`].
#[derive(Debug, Clone)]
pub struct MkfsOptions {
    /// Log streams (ordering domains). Operations on a file go to stream `ino % fresh`, with
    /// `fresh` the streams not kept for what survives cleaning (`clean.rs`, "Hot and cold").
    pub streams: u16,
    /// Blocks per log segment. One operation's transaction must fit in half a segment (larger
    /// writes are split); an explicit transaction is bounded by free space (`fs/large.rs`).
    pub segment_blocks: u32,
    /// Identity of the image; random when `None`.
    pub uuid: Option<[u8; 16]>,
}

impl Default for MkfsOptions {
    fn default() -> Self {
        MkfsOptions { streams: 4, segment_blocks: 1024, uuid: None }
    }
}

/// How operations are spread over the log's streams.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub enum StreamPolicy {
    /// Stream `ino % fresh` of the file written (the directory, for namespace operations):
    /// `fsync` of a file waits only for that stream's prefix, and operations on one file never
    /// need a cross-stream dependency.
    #[default]
    PerFile,
    /// Stream of the calling thread (threads numbered in order of first use): threads never
    /// share a stream's submission path, files touched by several threads gather dependencies.
    PerThread,
}

/// Options of [`Fs::mount`].
#[derive(Debug, Clone, Copy, Default)]
pub struct MountOptions {
    /// How operations are spread over streams.
    pub streams: StreamPolicy,
    /// A deliberately broken variant of the file system (needs the `mutants` feature).
    pub mutant: Option<FsMutant>,
    /// A deliberately broken variant of the log underneath.
    pub log_mutant: Option<tally_log::Mutant>,
    /// Mount even when the log proves a durable transaction damaged or missing, keeping the
    /// longest safe prefix ([`MountReport::damage`] says what was dropped). Without it such a
    /// log fails the mount with [`tally_log::LogError::DurableTransactionLost`]. Only for
    /// `tally fsck --salvage --force`.
    pub salvage: bool,
    /// Buffer committed changes in the log and write them out merged (at fsync, sync, past a
    /// size, after the commit interval; see [`tally_log::WriteBehind`]). `None` (the default)
    /// submits each change as it commits.
    pub write_behind: Option<tally_log::WriteBehind>,
    /// Bytes of log a crash may have to replay: once this much has been written since the
    /// last checkpoint snapshot, the next operation (or maintenance) writes a new one
    /// ([`Fs::checkpoint`]). `None`: [`REPLAY_BUDGET_DEFAULT`]; `Some(0)`: never.
    pub replay_budget: Option<u64>,
}

/// Default replay budget: 64 MiB of log, which a memory device scans in a few milliseconds
/// and an SSD in well under a second.
pub const REPLAY_BUDGET_DEFAULT: u64 = 64 << 20;

/// Data bytes held in memory until durable before the file system makes them durable itself
/// ([`Fs::cache_pays`]).
pub(crate) const CACHE_LIMIT: usize = 64 << 20;

/// Which streams an operation past [`CACHE_LIMIT`] writes out and waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CachePays {
    /// Its own stream, holding at least its share of the data held.
    Stream(usize),
    /// Every stream holding data (past twice the limit).
    All,
}

/// Marked inodes a checkpoint brings up to date per hold of the state lock before its own
/// (`Fs::refresh_kept_in_slices`): about a millisecond of encoding and merging (measured with
/// 200,000 files, 1,000 of them written: 256 small inodes took 0.8–1.2 ms to encode and their
/// record counts' groups as long again to merge, `examples/checkpoint_hold.rs`).
pub(crate) const SLICE_MARKS: usize = 128;

/// Passes of such slices per checkpoint, each over what was marked when it began (a writer
/// changing files as fast as the slices encode them leaves the rest to the checkpoint's own
/// hold).
const SLICE_PASSES: usize = 3;

/// Free log segments kept for deletes and cleaning: operations that add data or objects fail
/// with `ENOSPC` when no more than this many are free; deletes and truncates may use them.
pub(crate) const RESERVED_SEGMENTS: u32 = 2;

/// How many times an operation that finds no space while cleaning is due waits for cleaning
/// and runs again ([`Fs::op`]).
const SPACE_TRIES: u32 = 3;

/// What [`Fs::unmount`] left for the next mount (everything is durable either way).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SnapshotOutcome {
    /// The snapshot is written: the next mount reads it instead of scanning the log.
    Written,
    /// No snapshot (why): the next mount scans the log, as after a crash.
    NotWritten(String),
}

/// An open explicit transaction; pass it to operations, then to [`Fs::commit`],
/// [`Fs::commit_durable`] or [`Fs::abort`].
#[derive(Debug)]
#[must_use = "an explicit transaction holds locks until it is committed or aborted"]
pub struct Txn {
    pub(crate) id: TxnId,
}

impl Txn {
    /// Its number (for front ends that name transactions across calls, e.g. ioctls).
    #[must_use]
    pub fn id(&self) -> u64 {
        self.id
    }
}

/// A mounted file system. Every method takes `&self`; it can be shared between threads.
pub struct Fs {
    pub(crate) log: Log,
    pub(crate) state: Mutex<State>,
    /// Threads blocked taking the state lock at the start of an operation or an fsync
    /// ([`Fs::lock_waited`]); a thread that just held the lock long lets them go first
    /// ([`Fs::let_waiters_first`]).
    state_waiters: std::sync::atomic::AtomicUsize,
    /// Signalled when an explicit transaction ends (waiters retry).
    cv: Condvar,
    /// Held by the one thread cleaning because space is low ([`Fs::clean_for_space`]).
    cleaner: Mutex<()>,
    /// Per stream: a cleaning of it has committed its relocations and is making them durable
    /// with the state lock given up (`clean.rs`, `Fs::finish_clean_after`). Set under the
    /// state lock, cleared once the segment is freed (or the finish failed): until then the
    /// segment is still the stream's oldest, and another cleaning that finds the flag set
    /// under the lock leaves the stream alone instead of relocating it again.
    pub(crate) clean_finishing: Vec<std::sync::atomic::AtomicBool>,
    pub(crate) streams: u16,
    pub(crate) bs: u32,
    /// Most data blocks one operation's transaction carries.
    max_tx_blocks: u64,
    pub(crate) segment_blocks: u32,
    pub(crate) mutant: Option<FsMutant>,
    policy: StreamPolicy,
    report: MountReport,
    /// Longest wait of an operation outside transactions for one holding what it changes, in
    /// milliseconds; `u64::MAX`: until it ends ([`Fs::set_txn_wait_max`]).
    txn_wait_max_ms: std::sync::atomic::AtomicU64,
    /// `State::dead_blocks` when a pass of cleaning before an operation last left space low:
    /// until more dies, another pass would only move live data around (`u64::MAX`: none yet).
    futile_clean_at: std::sync::atomic::AtomicU64,
    /// The replay budget in blocks (`u64::MAX`: no online checkpoints).
    replay_budget_blocks: u64,
    /// After a due checkpoint snapshot did not fit the free segments: the log blocks since the
    /// last one at which to try again (0: none pending). Encoding the state costs time in
    /// proportion to it; trying after every operation made a full file system with 100,000
    /// files spend most of its time encoding snapshots it could not write.
    checkpoint_retry_at: std::sync::atomic::AtomicU64,
    /// Held while a checkpoint snapshot is taken and written (`checkpoint_with`): one at a
    /// time, the state lock given up while it is written. Taken before the state lock.
    checkpoint_turn: Mutex<()>,
    /// Per stream, the seq of the last transaction committed that is not a part of a large
    /// transaction (`fs/large.rs`): what a maintenance round makes durable. Parts alone wait
    /// for their close (one flush for the whole transaction).
    pub(crate) whole_committed: Vec<std::sync::atomic::AtomicU64>,
    /// The bell of the running [`crate::Maintenance`] thread, if any (dead once it stops): an
    /// operation past the replay budget rings it instead of taking the checkpoint itself
    /// ([`Fs::checkpoint_after_op`]).
    pub(crate) maintenance_bell: std::sync::Mutex<std::sync::Weak<crate::clean::Bell>>,
}

/// How a mount went.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct MountReport {
    /// The state came from a snapshot: a clean unmount's (no scan, no replay), or a checkpoint
    /// snapshot's, with what followed it replayed.
    pub from_snapshot: bool,
    /// The snapshot was a checkpoint snapshot ([`Fs::checkpoint`]).
    pub from_checkpoint: bool,
    /// Blocks read from the device: the snapshot's, or the scan's.
    pub blocks_read: u64,
    /// Log transactions whose records were replayed (0 from a snapshot).
    pub transactions_replayed: u64,
    /// Inodes after mount.
    pub inodes: u64,
    /// Files without links (open at their last unlink) freed by the mount.
    pub orphans_freed: u64,
    /// Time from the start of mount to the state being ready.
    #[serde(serialize_with = "crate::fs::secs")]
    pub time: std::time::Duration,
    /// Transactions proven durable that a salvage mount dropped (empty otherwise).
    pub damage: Vec<tally_log::Damage>,
}

fn secs<S: serde::Serializer>(
    d: &std::time::Duration,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// A small number per thread, in order of first use.
fn thread_slot() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    thread_local!(static SLOT: u64 = NEXT.fetch_add(1, Ordering::Relaxed));
    SLOT.with(|s| *s)
}

/// Take the state lock. Fail-stop, as redb: a panic while holding it (a bug) may have left the
/// state half changed, so from then on this fails with [`FsError::Poisoned`] for every caller —
/// operations, maintenance (which then stops) and unmount (which then writes no snapshot, so
/// the next mount rebuilds the state from the log).
pub(crate) fn lock(m: &Mutex<State>) -> Result<MutexGuard<'_, State>> {
    m.lock().map_err(|_| FsError::Poisoned)
}

/// How long a thread must have held the state lock in its last operation to let threads
/// waiting for it go first before it takes it again ([`Fs::let_waiters_first`]).
const LONG_HOLD: std::time::Duration = std::time::Duration::from_micros(500);
/// Longest a thread lets waiters go first.
const LET_FIRST_MAX: std::time::Duration = std::time::Duration::from_millis(2);

thread_local! {
    /// How long this thread's last operation held the state lock (from taking it to its end).
    static LAST_HOLD: std::cell::Cell<std::time::Duration> =
        const { std::cell::Cell::new(std::time::Duration::ZERO) };
}

/// Records in [`LAST_HOLD`], when dropped, how long since it was started.
struct HoldTimer(std::time::Instant);

impl HoldTimer {
    fn start() -> HoldTimer {
        HoldTimer(std::time::Instant::now())
    }
}

impl Drop for HoldTimer {
    fn drop(&mut self) {
        let held = self.0.elapsed();
        LAST_HOLD.with(|h| h.set(held));
    }
}

/// `ctime`/`mtime` to now.
pub(crate) fn touch_times(attr: &mut Attr, now: Timespec) {
    attr.mtime = now;
    attr.ctime = now;
}

impl Fs {
    /// Make a new, empty file system on `dev` (the log, then its first transaction: the
    /// file-system record and the root directory, durable before this returns).
    ///
    /// # Errors
    /// Bad options, I/O errors.
    pub fn mkfs(dev: Arc<dyn Device>, opts: &MkfsOptions) -> Result<()> {
        let mut cfg = LogConfig {
            streams: opts.streams,
            segment_blocks: opts.segment_blocks,
            ..LogConfig::default()
        };
        if let Some(uuid) = opts.uuid {
            cfg.uuid = uuid;
        }
        if opts.segment_blocks < 8 {
            return Err(FsError::Invalid("segments must hold at least 8 blocks"));
        }
        Log::format(&*dev, &cfg)?;
        let (log, _) = Log::open(dev.clone(), OpenOptions::default())?;
        let bs = dev.geometry().block_size;
        let now = Timespec::now();
        let root = fresh_attr(ROOT, FileKind::Dir, 0o755, 0, 0, now);
        let mut tx = Transaction::new(0);
        tx.record(Record::Fs { ver: 1, block_size: bs }.encode());
        tx.record(Record::Inode { ver: 2, attr: root, target: Vec::new() }.encode());
        log.commit_durable(tx)?;
        Ok(())
    }

    /// Mount the file system on `dev`: recover the log (after a crash: a parallel per-stream
    /// scan) and rebuild the DRAM state from the surviving records.
    ///
    /// # Errors
    /// Not a Tally file system, corrupted records, I/O errors, a mutant without the feature.
    pub fn mount(dev: Arc<dyn Device>, opts: MountOptions) -> Result<Fs> {
        if opts.mutant.is_some() && !crate::mutant::available() {
            return Err(FsError::Invalid("mutants need the `mutants` feature"));
        }
        let started = std::time::Instant::now();
        let log_opts = OpenOptions {
            mutant: opts.log_mutant,
            salvage: opts.salvage,
            write_behind: opts.write_behind,
            ..OpenOptions::default()
        };
        let (mut log, mut recovery) = Log::open(dev.clone(), log_opts)?;
        let mut report = MountReport::default();
        let mut from_snapshot = None;
        let mut base = None;
        if let Some(payload) = recovery.snapshot.take() {
            match crate::snapshot::decode(&payload) {
                Ok(st) if recovery.snapshot_is_checkpoint => base = Some(st),
                Ok(st) => from_snapshot = Some(st),
                Err(e) if recovery.snapshot_is_checkpoint => {
                    // The log vouched for its bytes: the state cannot be rebuilt without it.
                    return Err(FsError::corrupted("checkpoint snapshot", e.to_string()));
                }
                Err(e) => {
                    // The log still holds everything the snapshot described: scan it.
                    tracing::warn!("clean-unmount snapshot unusable ({e}); scanning the log");
                    drop(log);
                    (log, recovery) = Log::open(dev, log_opts)?;
                }
            }
        }
        report.blocks_read = recovery.blocks_scanned;
        report.damage = std::mem::take(&mut recovery.damage);
        let ignore_versions = opts.mutant == Some(FsMutant::ReplayInLogOrder);
        let mut st = match (from_snapshot, base) {
            (Some(st), _) => {
                report.from_snapshot = true;
                st
            }
            (None, Some(mut st)) => {
                report.from_snapshot = true;
                report.from_checkpoint = true;
                st.checkpoint_ver = Some(st.next_ver);
                let streams: Vec<_> = recovery.streams.into_iter().map(|s| s.txs).collect();
                report.transactions_replayed = streams.iter().map(|s| s.len() as u64).sum();
                State::replay_onto(st, &streams, ignore_versions)?
            }
            (None, None) => {
                let streams: Vec<_> = recovery.streams.into_iter().map(|s| s.txs).collect();
                report.transactions_replayed = streams.iter().map(|s| s.len() as u64).sum();
                State::replay(&streams, ignore_versions)?
            }
        };
        let orphans: Vec<Ino> = st
            .inodes
            .iter()
            .filter(|(_, i)| i.attr.nlink == 0 && i.dir.is_none())
            .map(|(&ino, _)| ino)
            .collect();
        let bs = log.device().geometry().block_size;
        if st.block_size != bs {
            return Err(FsError::corrupted(
                "block size",
                format!("made with {}-byte blocks, device has {bs}", st.block_size),
            ));
        }
        st.block_size = bs;
        let segment_blocks = log.segment_blocks();
        st.usage = crate::live::SegmentUsage::build(
            log.first_segment_block(),
            segment_blocks,
            log.segment_count(),
            st.inodes.values().map(|i| &**i),
        );
        let log_streams = log.stream_count();
        let mut fs = Fs {
            streams: log.stream_count(),
            bs,
            max_tx_blocks: u64::from(segment_blocks / 2).saturating_sub(2).max(1),
            segment_blocks,
            log,
            state: Mutex::new(st),
            state_waiters: std::sync::atomic::AtomicUsize::new(0),
            cv: Condvar::new(),
            cleaner: Mutex::new(()),
            clean_finishing: (0..log_streams)
                .map(|_| std::sync::atomic::AtomicBool::new(false))
                .collect(),
            mutant: opts.mutant,
            policy: opts.streams,
            report,
            txn_wait_max_ms: std::sync::atomic::AtomicU64::new(u64::MAX),
            futile_clean_at: std::sync::atomic::AtomicU64::new(u64::MAX),
            replay_budget_blocks: match opts.replay_budget.unwrap_or(REPLAY_BUDGET_DEFAULT) {
                0 => u64::MAX,
                bytes => bytes.div_ceil(u64::from(bs)).max(1),
            },
            checkpoint_retry_at: std::sync::atomic::AtomicU64::new(0),
            checkpoint_turn: Mutex::new(()),
            whole_committed: (0..log_streams)
                .map(|_| std::sync::atomic::AtomicU64::new(0))
                .collect(),
            maintenance_bell: std::sync::Mutex::new(std::sync::Weak::new()),
        };
        // Files that were open when their last link went, and then the crash (or an unmount
        // with handles still open): nobody can reach them any more.
        fs.report.orphans_freed = orphans.len() as u64;
        for ino in orphans {
            fs.free_orphan(ino)?;
        }
        fs.report.inodes = lock(&fs.state)?.inodes.len() as u64;
        // The record counts' groups, built whole here, where no operation waits on the state
        // lock yet: left to the first checkpoint, their sort and encoding held every operation
        // up for 0.22 s at 200,000 files (`examples/checkpoint_hold.rs`).
        crate::snapshot::refresh_counts(&mut *lock(&fs.state)?);
        fs.report.time = started.elapsed();
        // A long history behind this mount (a scan, or a clean unmount's snapshot over a long
        // log): checkpoint now, so the next crash replays only what follows.
        fs.checkpoint_if_due()?;
        Ok(fs)
    }

    /// Write a checkpoint snapshot of the state: after a crash, mount loads it and replays
    /// only what was committed after it (`docs/FS.md`, "Checkpoints"). Returns whether it was
    /// written: not while explicit transactions are open (their changes are in the state but
    /// not in the log), nor when it does not fit the free segments. Waits for a checkpoint
    /// another thread is writing, then writes its own.
    ///
    /// # Errors
    /// I/O errors; read-only after an earlier error.
    pub fn checkpoint(&self) -> Result<bool> {
        let turn = self.checkpoint_turn.lock().map_err(|_| FsError::Poisoned)?;
        self.refresh_kept_in_slices()?;
        let st = lock(&self.state)?;
        self.checkpoint_with(turn, st)
    }

    /// Encode the state and write it as a checkpoint snapshot. `_turn`: one checkpoint at a
    /// time (taken before the state lock, never while holding it). The state lock `st` is
    /// held to bring the kept pieces up to date, take the log's positions
    /// ([`tally_log::Log::checkpoint_snapshot_begin`]: no device I/O) and encode; it is given
    /// up while the log makes everything up to those positions durable, the snapshot is
    /// written and flushed and the superblock points at it (device I/O of about 60 bytes per
    /// data block stored: 27 MB at 1.8 GiB), so operations go on meanwhile;
    /// what they commit follows the positions taken, and a crash replays it on top. Taken
    /// again to record the new checkpoint's version: until then cleaning keeps judging
    /// tombstones by the older one, which keeps more of them. Under shuttle the lock is kept
    /// throughout: the log's own locks, which the begun checkpoint holds, are `std`'s and
    /// must not be waited on by a task there (`sync.rs`).
    fn checkpoint_with(
        &self,
        _turn: MutexGuard<'_, ()>,
        mut st: MutexGuard<'_, State>,
    ) -> Result<bool> {
        if let Some(e) = &st.failed {
            return Err(FsError::read_only(e));
        }
        if !st.txns.open.is_empty() {
            return Ok(false);
        }
        // Everything the state holds is committed (no transaction is open, and operations
        // commit under this lock): it is exactly what the log holds up to the positions
        // `checkpoint_snapshot_begin` takes, which `finish` makes durable before it writes
        // the snapshot, with this lock given up (until 28 Nov a flush under it: 20-30 ms on
        // an image file during which every operation waited; docs/FS-LOCKING.md). The state
        // lock is held: `fail` would take it again (a deadlock, seen when a flush failed at a
        // checkpoint due after an operation).
        // Only the inodes changed since the last checkpoint are encoded again; the others'
        // encodings are handed to the log as they are (`snapshot.rs`, `Chunks`).
        crate::snapshot::refresh_chunks(&mut st);
        // And only the record counts' groups that changed (`snapshot.rs`, `CountGroups`).
        crate::snapshot::refresh_counts(&mut st);
        // The space totals take the same changes in, so their marks do not pile up between
        // `statfs` calls (`live.rs`).
        crate::live::live_parts(&mut st);
        let start = self.log.checkpoint_snapshot_begin().map_err(|e| Self::fail_locked(&mut st, e));
        let Some(start) = start? else { return Ok(false) };
        let ver = st.next_ver;
        let tail = std::mem::take(&mut st.snapshot_buf);
        let taken = crate::snapshot::encode_parts(&st, tail);
        #[cfg(not(shuttle))]
        let kept: Option<MutexGuard<'_, State>> = {
            drop(st);
            None
        };
        #[cfg(shuttle)]
        let kept = Some(st);
        let parts = taken.seal();
        let written = self.log.checkpoint_snapshot_finish(start, &parts.slices());
        // The pieces taken are let go before the lock is taken again (the maps' nodes changed
        // since are freed with them).
        let tail = parts.into_tail();
        let mut st = match kept {
            Some(st) => st,
            None => lock(&self.state)?,
        };
        st.snapshot_buf = tail;
        let written = written.map_err(|e| Self::fail_locked(&mut st, e))?;
        if written {
            st.checkpoint_ver = Some(ver);
        }
        drop(st);
        // What the finish made durable leaves memory.
        self.prune_cache_in_slices(self.durable_upto(), true)?;
        Ok(written)
    }

    /// Checkpoint when more than the replay budget was written since the last checkpoint,
    /// with the long part of its durable wait outside the state lock: the log is made durable
    /// first without the lock (the device absorbing everything written since the last flush:
    /// up to the whole budget), then under the lock `checkpoint_with` syncs again, which
    /// now covers only what was committed meanwhile, and writes the snapshot (itself without
    /// the lock). Under the lock the whole wait stalled every other operation (issue 16's
    /// fsync isolation: a small file's fsync behind a streaming writer's checkpoint). Nothing
    /// to do while another thread writes one.
    pub(crate) fn checkpoint_if_due(&self) -> Result<()> {
        if !self.checkpoint_due() || !lock(&self.state)?.txns.open.is_empty() {
            return Ok(());
        }
        let turn = match self.checkpoint_turn.try_lock() {
            Ok(turn) => turn,
            Err(std::sync::TryLockError::WouldBlock) => return Ok(()),
            Err(std::sync::TryLockError::Poisoned(_)) => return Err(FsError::Poisoned),
        };
        self.log.sync().map_err(|e| self.fail(e))?;
        self.refresh_kept_in_slices()?;
        let st = lock(&self.state)?;
        self.checkpoint_due_locked(turn, st)
    }

    /// Before a checkpoint takes the state lock for its one long hold: bring the kept
    /// encodings and totals (`snapshot.rs` `Chunks` and `CountGroups`, `live.rs`
    /// `LiveTotals`) up to date in slices of about [`SLICE_MARKS`] marked inodes (and four
    /// times as many record keys, whole groups), the lock given up between them. Done at once
    /// under that hold, this was O(what changed since the last checkpoint): 40-110 ms for
    /// 10,000 changed files (`examples/checkpoint_hold.rs`), during which every operation
    /// waited. What changes meanwhile is marked again: up to [`SLICE_PASSES`] passes take what
    /// is marked, the checkpoint's own hold the rest.
    pub(crate) fn refresh_kept_in_slices(&self) -> Result<()> {
        for _ in 0..SLICE_PASSES {
            let mut marks = crate::snapshot::Marks::take(&mut *lock(&self.state)?);
            let last = marks.len() <= SLICE_MARKS;
            marks.sort();
            loop {
                let mut st = lock(&self.state)?;
                let done = marks.refresh_slice(&mut st, SLICE_MARKS);
                let live_left = crate::live::live_parts_some(&mut st, SLICE_MARKS);
                drop(st);
                if done && live_left <= SLICE_MARKS {
                    break;
                }
                self.yield_to_waiters();
            }
            if last {
                break;
            }
        }
        Ok(())
    }

    /// After an operation committed outside explicit transactions, a checkpoint if one is
    /// due. The state lock is held for all of it (encoding the whole state: milliseconds for
    /// a large tree), so it is left to the maintenance thread when one runs ([`Fs::maintain`]'s
    /// [`crate::Maintenance`]: the operation rings its bell and returns); the operation takes
    /// it itself when none runs, or once twice the budget has been written since the last
    /// one (a thread that cannot keep up). A crash replays at most twice the budget, plus
    /// what one operation writes (`docs/FS.md`, "Checkpoints and the replay budget").
    fn checkpoint_after_op(&self) {
        if !self.checkpoint_due() {
            return;
        }
        let since = self.log.blocks_since_checkpoint_snapshot();
        let inline_at = if self.mutant == Some(FsMutant::CheckpointLeftToMaintenance) {
            u64::MAX
        } else {
            self.replay_budget_blocks.saturating_mul(2)
        };
        if since < inline_at && self.ring_maintenance() {
            return;
        }
        // The operation is committed whatever happens here; a failed write has made the file
        // system read-only (fail-stop).
        if let Err(e) = self.checkpoint_if_due() {
            tracing::warn!("checkpoint after an operation: {e}");
        }
    }

    /// Ask the maintenance thread for a checkpoint; false when none runs.
    fn ring_maintenance(&self) -> bool {
        let bell = self
            .maintenance_bell
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .upgrade();
        bell.is_some_and(|b| {
            b.ring_checkpoint();
            true
        })
    }

    /// More than the replay budget was written since the last checkpoint snapshot, and no
    /// attempt that did not fit is waiting for more to be written.
    fn checkpoint_due(&self) -> bool {
        use std::sync::atomic::Ordering;
        let since = self.log.blocks_since_checkpoint_snapshot();
        since >= self.replay_budget_blocks
            && since >= self.checkpoint_retry_at.load(Ordering::Relaxed)
    }

    fn checkpoint_due_locked(
        &self,
        turn: MutexGuard<'_, ()>,
        st: MutexGuard<'_, State>,
    ) -> Result<()> {
        use std::sync::atomic::Ordering;
        if !self.checkpoint_due() || !st.txns.open.is_empty() {
            return Ok(());
        }
        if self.checkpoint_with(turn, st)? {
            self.checkpoint_retry_at.store(0, Ordering::Relaxed);
        } else {
            // No room: try again once another quarter of the budget is written (cleaning
            // frees segments meanwhile), not after every operation.
            let since = self.log.blocks_since_checkpoint_snapshot();
            let retry = since.saturating_add((self.replay_budget_blocks / 4).max(1));
            self.checkpoint_retry_at.store(retry, Ordering::Relaxed);
            tracing::debug!(since, retry, "checkpoint due but not written (no room)");
        }
        Ok(())
    }

    /// The replay budget in blocks (`None`: online checkpoints off).
    #[must_use]
    pub fn replay_budget_blocks(&self) -> Option<u64> {
        (self.replay_budget_blocks != u64::MAX).then_some(self.replay_budget_blocks)
    }

    /// Bytes of file data held in memory: blocks not yet durable, and blocks of open explicit
    /// transactions not yet written out in a part. A walk of every block map (O(blocks)): for
    /// tests and diagnostics, not for a hot path.
    #[must_use]
    pub fn data_bytes_in_memory(&self) -> u64 {
        let st = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let blocks = st.inodes.values().flat_map(|i| i.blocks.values());
        let held = blocks.filter(|b| b.data.is_some()).count() as u64;
        held.saturating_mul(u64::from(self.bs))
    }

    /// How the mount went (snapshot or scan, blocks read, time).
    #[must_use]
    pub fn mount_report(&self) -> MountReport {
        self.report.clone()
    }

    /// Make everything durable and unmount, writing a snapshot of the DRAM state so the next
    /// mount reads it instead of scanning the log. Says whether the snapshot was written: the
    /// segments it needs are kept from ordinary writes (`space.rs`), but a state grown by
    /// deletes' records into the last reserve may not fit; everything is durable all the same.
    ///
    /// # Errors
    /// I/O errors; read-only after an earlier error; open explicit transactions (they are
    /// aborted first, then reported).
    pub fn unmount(self) -> Result<SnapshotOutcome> {
        let open: Vec<TxnId> = lock(&self.state)?.txns.open.keys().copied().collect();
        for id in &open {
            self.abort(Txn { id: *id })?;
        }
        self.log.sync().map_err(|e| self.fail(e))?;
        let payload = {
            let mut st = lock(&self.state)?;
            if let Some(e) = &st.failed {
                return Err(FsError::read_only(e));
            }
            self.prune_cache(&mut st);
            crate::snapshot::encode(&st)
        };
        let free = self.log.free_segments();
        let seg_bytes = u64::from(self.segment_blocks) * u64::from(self.bs);
        let needed = (payload.len() as u64 + u64::from(self.bs)).div_ceil(seg_bytes);
        let Fs { log, .. } = self;
        let outcome = if log.close_clean(&payload)? {
            SnapshotOutcome::Written
        } else {
            SnapshotOutcome::NotWritten(format!(
                "no room for the snapshot ({} KiB, {needed} segment(s); {free} free): the \
                 next mount scans the log",
                payload.len() / 1024
            ))
        };
        if !open.is_empty() {
            return Err(FsError::Invalid(
                "explicit transactions were open at unmount and were aborted",
            ));
        }
        Ok(outcome)
    }

    /// Bound how long an operation outside transactions waits for an explicit transaction
    /// holding what it changes: after `max` it fails with `EBUSY` (`None`, the default: until
    /// the transaction ends). A front end whose callers may hold a transaction open across
    /// requests (the FUSE adapter) bounds it, so a waiting request never holds a request
    /// thread the transaction itself needs.
    pub fn set_txn_wait_max(&self, max: Option<std::time::Duration>) {
        let ms = max.map_or(u64::MAX, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX - 1));
        self.txn_wait_max_ms.store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    /// The log underneath (statistics, cleaning).
    #[must_use]
    pub fn log(&self) -> &Log {
        &self.log
    }

    /// Block size.
    #[must_use]
    pub fn block_size(&self) -> u32 {
        self.bs
    }

    /// Run one operation: `f` changes the DRAM state through `cx` (which keeps pre-images);
    /// then the changes are committed as one log transaction (or handed to the explicit
    /// transaction). Any failure rolls the DRAM state back exactly.
    ///
    /// No device I/O happens here under the state lock but the log's placement (and a due
    /// checkpoint snapshot): bytes of committed blocks the operation needs are read with the
    /// lock dropped and the operation retried ([`Stop::Fetch`]); cleaning when space is low
    /// runs before it, giving the lock up between segments ([`Fs::clean_for_space`]); the
    /// write-out of data held in memory past [`CACHE_LIMIT`] follows the commit, outside the
    /// lock, and cannot fail the operation, which is committed by then.
    pub(crate) fn op<T>(
        &self,
        txn: Option<&Txn>,
        primary: Ino,
        grows: bool,
        mut f: impl FnMut(&mut State, &mut Cx) -> OpResult<T>,
    ) -> Result<T> {
        self.let_waiters_first();
        let mut st = self.lock_waited()?;
        let _hold = HoldTimer::start();
        let mut waited_since: Option<std::time::Instant> = None;
        let mut fetched = std::collections::HashMap::new();
        let mut cleaned = false;
        // An operation that finds no space while cleaning is still due (it went on while
        // another thread cleaned, or others took what a pass it waited for freed) waits for
        // cleaning (or cleans) and runs again, a few times at most: `ENOSPC` only when a pass
        // finds nothing more to gain, or after those tries.
        let mut space_tries = 0u32;
        loop {
            if let Some(e) = &st.failed {
                return Err(FsError::read_only(e));
            }
            let id = txn.map(|t| t.id);
            if let Some(id) = id {
                if !st.txns.open.contains_key(&id) {
                    return Err(FsError::NoTxn);
                }
            }
            if !cleaned && self.cleaning_due(&mut st) {
                cleaned = true;
                // With room left above the reserve, an operation does not queue behind
                // another thread's cleaning pass: it goes on, and only waits when the room
                // is gone (back-pressure where space is not there).
                let kept = self.kept_segments(&mut st);
                let room = self.log.free_segments() > kept;
                drop(st);
                self.clean_for_space(room)?;
                st = lock(&self.state)?;
                continue;
            }
            let mut cx = Cx::new(id);
            cx.fetched = std::mem::take(&mut fetched);
            match f(&mut st, &mut cx) {
                Ok(v) => {
                    // Operations that add data or objects leave the reserves and the
                    // reservations whole (`space.rs`).
                    if let Err(e) = self.take_space(&mut st, &cx, grows) {
                        if matches!(e, FsError::NoSpace)
                            && space_tries < SPACE_TRIES
                            && self.cleaning_due(&mut st)
                        {
                            space_tries += 1;
                            st = self.clean_and_retry(st, cx, &mut fetched)?;
                            continue;
                        }
                        cx.rollback(&mut st);
                        return Err(e);
                    }
                    let stream = self.stream_of(primary);
                    match id {
                        Some(id) => {
                            // A large transaction sends its data ahead (`large.rs`).
                            let blocks = cx
                                .touched
                                .iter()
                                .filter(|k| matches!(k, crate::state::Key::Block(..)))
                                .count() as u64;
                            let due = match self.part_due(&mut st, id, blocks) {
                                Ok(due) => due,
                                Err(e) => {
                                    cx.rollback(&mut st);
                                    return Err(e);
                                }
                            };
                            cx.into_txn(&mut st, id, stream);
                            if let Some(t) = st.txns.open.get_mut(&id) {
                                t.unstreamed = t.unstreamed.saturating_add(blocks);
                            }
                            // Explicit transactions' commits and parts submit at once
                            // (`commit::Submit::Now`): nothing deferred to submit here.
                            if due && self.stream_txn_data(&mut st, id)? {
                                drop(st);
                                self.drop_written_cache();
                            }
                        }
                        None => {
                            self.commit_op(&mut st, cx, stream)?;
                            let pays = self.cache_pays(&st, stream);
                            drop(st);
                            self.submit_deferred_of(stream);
                            self.checkpoint_after_op();
                            if let Some(pays) = pays {
                                self.write_out_cache(pays);
                            }
                        }
                    }
                    return Ok(v);
                }
                Err(Stop::Err(FsError::NoSpace))
                    if space_tries < SPACE_TRIES && self.cleaning_due(&mut st) =>
                {
                    space_tries += 1;
                    st = self.clean_and_retry(st, cx, &mut fetched)?;
                }
                Err(Stop::Err(e)) => {
                    cx.rollback(&mut st);
                    return Err(e);
                }
                Err(Stop::Fetch(blocks)) => {
                    fetched = std::mem::take(&mut cx.fetched);
                    cx.rollback(&mut st);
                    drop(st);
                    for (ino, b, block) in blocks {
                        let bytes = self.fetch_block(ino, b, &block);
                        let (addr, ver, crc) = (block.addr, block.ver, block.crc);
                        fetched.insert((ino, b), crate::txn::Fetched { addr, ver, crc, bytes });
                    }
                    st = lock(&self.state)?;
                }
                Err(Stop::Wait) => {
                    cx.rollback(&mut st);
                    let bound = self.txn_wait_max_ms.load(std::sync::atomic::Ordering::Relaxed);
                    if bound == u64::MAX {
                        st = self.cv.wait(st).map_err(|_| FsError::Poisoned)?;
                        continue;
                    }
                    let limit = std::time::Duration::from_millis(bound);
                    let deadline =
                        *waited_since.get_or_insert_with(std::time::Instant::now) + limit;
                    let Some(left) = deadline.checked_duration_since(std::time::Instant::now())
                    else {
                        return Err(FsError::Busy);
                    };
                    st = crate::sync::wait_timeout(&self.cv, st, left).ok_or(FsError::Poisoned)?;
                }
            }
        }
    }

    /// An operation that found no space while cleaning is due, before it runs again: roll
    /// `cx` back (keeping the blocks it fetched), clean or wait for the cleaner, and take the
    /// state lock again.
    fn clean_and_retry<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        mut cx: Cx,
        fetched: &mut std::collections::HashMap<(Ino, u64), crate::txn::Fetched>,
    ) -> Result<MutexGuard<'a, State>> {
        *fetched = std::mem::take(&mut cx.fetched);
        cx.rollback(&mut st);
        drop(st);
        self.clean_for_space(false)?;
        lock(&self.state)
    }

    /// Make the data held in memory durable and drop it, after a commit took it past
    /// [`CACHE_LIMIT`]: outside the state lock (the calling operation waits for it, so writers
    /// cannot outrun the device: back-pressure), and never an error of the operation, which
    /// is committed: a failed flush makes the file system read-only (fail-stop), and the next
    /// operation says so.
    ///
    /// Only the streams [`Fs::cache_pays`] names are written out and waited for (each up to
    /// its newest block held, with the dependencies those transactions record), not every
    /// stream: another stream's fsync meanwhile runs its own flush round (issue 16, fsync
    /// isolation).
    pub(crate) fn write_out_cache(&self, pays: CachePays) {
        let wants: Vec<tally_log::TxId> = match lock(&self.state) {
            Ok(st) => st
                .cached
                .0
                .iter()
                .enumerate()
                .filter(|&(s, _)| pays == CachePays::All || pays == CachePays::Stream(s))
                .filter_map(|(_, q)| q.back().map(|c| c.tx))
                .collect(),
            Err(_) => return,
        };
        if let Err(e) = self.log.wait_durable_all(&wants) {
            let e = self.fail(e);
            tracing::error!("write-out of data held in memory failed: {e}");
            return;
        }
        // A poisoned lock is reported by the next operation.
        let _ = self.prune_cache_in_slices(self.durable_upto(), true);
    }

    /// Who pays for the data held in memory once a commit on `stream` leaves it past
    /// [`CACHE_LIMIT`]: the streams holding more than their share, not whoever happens to
    /// commit next. Past the limit, an operation whose stream holds at least the average of
    /// the streams holding data writes that stream out and waits for it; an operation on a
    /// lighter stream goes on. Past twice the limit, every operation writes everything out
    /// and waits (the bound on memory whatever the writers do). Before, any operation past
    /// the limit waited for all of it: a 4 KiB write beside a program streaming 1 MiB writes
    /// waited for the streamer's 64 MiB to reach the device (issue 16,
    /// `examples/small_beside_large.rs`). A stream whose writer stopped past the limit keeps
    /// its data until a durable wait, the maintenance thread or the hard bound writes it out.
    pub(crate) fn cache_pays(&self, st: &State, stream: u16) -> Option<CachePays> {
        if st.cached_bytes <= CACHE_LIMIT {
            return None;
        }
        if st.cached_bytes > 2 * CACHE_LIMIT {
            return Some(CachePays::All);
        }
        let held = |q: &std::collections::VecDeque<crate::state::Cached>| q.len();
        let total: usize = st.cached.0.iter().map(held).sum();
        let holding = st.cached.0.iter().filter(|q| !q.is_empty()).count();
        let s = usize::from(stream);
        let mine = st.cached.0.get(s).map_or(0, held);
        (mine > 0 && mine.saturating_mul(holding) >= total).then_some(CachePays::Stream(s))
    }

    /// Is space low enough that cleaning must run before an operation? Any operation asks
    /// (deletes need room for their records too). Not while explicit transactions are open,
    /// and not again after a pass that left space low until more data dies.
    fn cleaning_due(&self, st: &mut State) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        // The snapshot's segments are not free for operations either (`space.rs`).
        let kept = self.kept_segments(st);
        // A pass that left space low is tried again once more data died, or while what the
        // accounting calls free (`live.rs`) is at least a segment: that space is there, in
        // dead blocks and holes that cleaning has not reached yet, and statfs promised it.
        self.log.free_segments() <= kept + 1
            && st.txns.open.is_empty()
            && (self.futile_clean_at.load(Relaxed) != st.dead_blocks
                || self.space_usage(st).free_blocks >= u64::from(self.segment_blocks))
    }

    /// Clean while space is low: the oldest segment of the stream whose oldest segment is
    /// least live, whatever its share of live data, as long as that, packed, fits in a
    /// segment — cleaning never loses space, and moving a stream's live head on is what
    /// reaches the dead space behind it. Bounded by one pass over the log; a pass that leaves
    /// space low is not repeated until more data dies. Cleaning plans its relocations before
    /// writing, so it fails cleanly when even they do not fit.
    ///
    /// Called with the state lock not held: it is taken for one segment at a time, so
    /// operations that need no space go on meanwhile. One thread cleans at a time; others
    /// that found space low wait for it (back-pressure) and then find room, or clean on —
    /// unless `room` (free segments above the reserve are left), when they go on at once
    /// if another thread is cleaning. (Waiting for another's whole pass was the appenders'
    /// p99 beside a cleaner: docs/bench/fs.md, the mixed run.)
    pub(crate) fn clean_for_space(&self, room: bool) -> Result<()> {
        use std::sync::atomic::Ordering::Relaxed;
        let _cleaner = match self.cleaner.try_lock() {
            Ok(held) => held,
            Err(std::sync::TryLockError::WouldBlock) if room => return Ok(()),
            Err(std::sync::TryLockError::WouldBlock) => {
                self.cleaner.lock().map_err(|_| FsError::Poisoned)?
            }
            Err(std::sync::TryLockError::Poisoned(_)) => return Err(FsError::Poisoned),
        };
        let segments = self.log.device().geometry().block_count / u64::from(self.segment_blocks);
        let mut st = lock(&self.state)?;
        if let Some(e) = &st.failed {
            return Err(FsError::read_only(e));
        }
        for _ in 0..segments {
            if !self.cleaning_due(&mut st) {
                return Ok(());
            }
            // The segment's live blocks are read with the state lock given up (`clean.rs`).
            let (held, cleaned) = self.clean_some(st, 100)?;
            st = held;
            match cleaned {
                Ok(true) => {}
                Ok(false) | Err(FsError::NoSpace) => break,
                Err(e) => return Err(e),
            }
            drop(st);
            st = lock(&self.state)?;
        }
        if self.cleaning_due(&mut st) {
            self.futile_clean_at.store(st.dead_blocks, Relaxed);
        }
        Ok(())
    }

    /// Take the state lock, counted in `state_waiters` while blocked.
    pub(crate) fn lock_waited(&self) -> Result<MutexGuard<'_, State>> {
        use std::sync::atomic::Ordering::SeqCst;
        #[cfg(not(shuttle))]
        if let Ok(st) = self.state.try_lock() {
            return Ok(st);
        }
        self.state_waiters.fetch_add(1, SeqCst);
        let st = lock(&self.state);
        self.state_waiters.fetch_sub(1, SeqCst);
        st
    }

    /// Eventual fairness for the state lock. `std`'s lock is not fair: a thread that gives it
    /// up and takes it again at once (a program streaming 1 MiB writes, each holding the lock
    /// for its copy, crc and encoding) usually wins over one the kernel has to wake, which
    /// then waited 10-95 ms for an append of 4 KiB (issue 16's fsync isolation, measured
    /// beside such a streamer). A thread whose last operation held the lock at least
    /// [`LONG_HOLD`] therefore lets the threads blocked on it take it first (at most
    /// [`LET_FIRST_MAX`]) before it takes it again. Short operations never wait here, and
    /// neither does anyone while nobody waits.
    fn let_waiters_first(&self) {
        if LAST_HOLD.with(std::cell::Cell::get) >= LONG_HOLD {
            self.yield_to_waiters();
        }
    }

    /// Let the threads blocked on the state lock now take it first (at most
    /// [`LET_FIRST_MAX`]).
    fn yield_to_waiters(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        if cfg!(shuttle) {
            return;
        }
        let first = self.state_waiters.load(SeqCst);
        if first == 0 {
            return;
        }
        let since = std::time::Instant::now();
        while self.state_waiters.load(SeqCst) >= first && since.elapsed() < LET_FIRST_MAX {
            std::thread::yield_now();
        }
    }

    pub(crate) fn stream_of(&self, ino: Ino) -> u16 {
        // Not the streams kept for what survives cleaning (`clean.rs`, "Hot and cold").
        let n = u64::from(self.fresh_streams());
        match self.policy {
            StreamPolicy::PerFile => (ino % n) as u16,
            StreamPolicy::PerThread => (thread_slot() % n) as u16,
        }
    }

    /// Submit the log's write-outs that commits under the state lock left for later
    /// ([`tally_log::Log::commit_deferred`]): called with the lock given up, so no device
    /// submission happens under it. Never an error of the calling operation, which is
    /// committed: a failed submission fails the log (fail-stop), and the next operation or
    /// durable wait says so.
    pub(crate) fn submit_deferred(&self) {
        if let Err(e) = self.log.submit_deferred() {
            let _ = self.fail(e);
        }
    }

    /// [`Fs::submit_deferred`] for an operation that committed on `stream`: its own
    /// stream's write-out only (`Log::submit_deferred_of`).
    pub(crate) fn submit_deferred_of(&self, stream: u16) {
        if let Err(e) = self.log.submit_deferred_of(stream) {
            let _ = self.fail(e);
        }
    }

    /// [`Fs::fail`] with the state lock held.
    pub(crate) fn fail_locked(st: &mut State, e: LogError) -> FsError {
        let e = FsError::from(e);
        if let Some(first) = e.stops_writes() {
            st.failed.get_or_insert(first);
        }
        e
    }

    pub(crate) fn fail(&self, e: LogError) -> FsError {
        let e = FsError::from(e);
        if let Some(first) = e.stops_writes() {
            // Poisoned: already stopped harder than read-only.
            if let Ok(mut st) = lock(&self.state) {
                st.failed.get_or_insert(first);
            }
        }
        e
    }
}

#[cfg(test)]
mod tests {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    use std::time::{Duration, Instant};

    use tally_media::MemDevice;

    use super::*;
    use crate::types::{Owner, RenameFlags, ROOT};

    /// 256 KiB in 4 KiB blocks.
    const BUDGET_BLOCKS: u64 = 64;

    /// Past the cache limit, the streams holding at least the average pay, lighter ones go
    /// on; past twice the limit everyone pays; under it no one.
    #[test]
    fn the_heavy_streams_pay_for_the_cache() {
        let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, 16384).unwrap());
        Fs::mkfs(dev.clone(), &MkfsOptions::default()).unwrap();
        let fs = Fs::mount(dev, MountOptions::default()).unwrap();
        let mut st = lock(&fs.state).unwrap();
        let hold = |st: &mut State, stream: u16, blocks: u64| {
            let after = st.cached.0.get(usize::from(stream)).map_or(0, |q| q.len() as u64);
            for b in 0..blocks {
                let tx = tally_log::TxId { stream, seq: after + 1 + b };
                st.cached.push(crate::state::Cached { tx, ino: 9, block: b, ver: 1 });
            }
            st.cached_bytes += usize::try_from(blocks).unwrap() * 4096;
        };
        let limit_blocks = (CACHE_LIMIT / 4096) as u64;
        hold(&mut st, 0, limit_blocks - 10);
        hold(&mut st, 1, 5);
        assert_eq!(fs.cache_pays(&st, 0), None, "under the limit");
        hold(&mut st, 1, 6);
        assert_eq!(fs.cache_pays(&st, 0), Some(CachePays::Stream(0)), "the heavy stream");
        assert_eq!(fs.cache_pays(&st, 1), None, "a light stream goes on");
        assert_eq!(fs.cache_pays(&st, 2), None, "a stream holding nothing goes on");
        hold(&mut st, 2, limit_blocks);
        assert_eq!(fs.cache_pays(&st, 1), Some(CachePays::All), "past twice the limit");
    }

    /// Data made durable leaves memory a slice at a time: one slice lets go of exactly
    /// [`PRUNE_SLICE`](super::commit::PRUNE_SLICE) blocks and says more are left, the slices together let
    /// go of all of it, and the file reads the same from the device afterwards.
    #[test]
    fn durable_data_leaves_memory_in_slices() {
        // 256 MiB: room enough that no cleaning (which lets go of what it made durable) runs.
        let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, 65536).unwrap());
        Fs::mkfs(dev.clone(), &MkfsOptions::default()).unwrap();
        // And no checkpoint snapshot, which does too.
        let opts = MountOptions { replay_budget: Some(0), ..MountOptions::default() };
        let fs = Fs::mount(dev, opts).unwrap();
        let me = Owner { uid: 0, gid: 0 };
        let ino = fs.create(None, ROOT, b"f", 0o644, me).unwrap().ino;
        let slice = super::commit::PRUNE_SLICE;
        let blocks = 2 * slice + 100;
        let bytes: Vec<u8> = (0..blocks * 4096).map(|i| (i % 251) as u8).collect();
        for (i, chunk) in bytes.chunks(4096).enumerate() {
            fs.write(None, ino, (i * 4096) as u64, chunk).unwrap();
        }
        fs.log.sync().unwrap();
        {
            let mut st = lock(&fs.state).unwrap();
            assert_eq!(st.cached_bytes, blocks * 4096, "every block held until durable");
            let (gone, more) = fs.prune_some(&mut st, &fs.durable_upto(), slice);
            assert_eq!((gone.len(), more), (slice, true), "one slice");
            assert_eq!(st.cached_bytes, (blocks - slice) * 4096);
        }
        fs.prune_cache_in_slices(fs.durable_upto(), true).unwrap();
        {
            let st = lock(&fs.state).unwrap();
            assert_eq!(st.cached_bytes, 0, "the slices left bytes held");
            assert!(st.cached.0.iter().all(|q| q.is_empty()), "the slices left blocks held");
            let held = st.inodes[&ino].blocks.values().filter(|b| b.data.is_some()).count();
            assert_eq!(held, 0, "blocks still hold their bytes");
        }
        let back = fs.read(ino, 0, bytes.len()).unwrap();
        assert!(back == bytes, "the file reads otherwise from the device");
    }

    /// Writes 16 KiB at a time (5 blocks of log each, at most) with a maintenance bell that is
    /// never answered: returns the most log written since the last checkpoint snapshot seen
    /// after an operation, and whether an operation rang the bell.
    fn writes_with_a_deaf_maintenance_thread(mutant: Option<FsMutant>) -> (u64, bool) {
        let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, 16384).unwrap());
        Fs::mkfs(dev.clone(), &MkfsOptions::default()).unwrap();
        let opts = MountOptions {
            replay_budget: Some(BUDGET_BLOCKS * 4096),
            mutant,
            ..MountOptions::default()
        };
        let fs = Fs::mount(dev, opts).unwrap();
        let bell = Arc::new(crate::clean::Bell::default());
        *fs.maintenance_bell.lock().unwrap() = Arc::downgrade(&bell);
        let me = Owner { uid: 0, gid: 0 };
        let ino = fs.create(None, ROOT, b"f", 0o644, me).unwrap().ino;
        let mut most = 0;
        for i in 0..400u64 {
            fs.write(None, ino, (i % 64) * 16384, &[i as u8; 16384]).unwrap();
            most = most.max(fs.log.blocks_since_checkpoint_snapshot());
        }
        (most, bell.take_checkpoint_request())
    }

    /// An operation past the replay budget leaves the checkpoint to the maintenance thread,
    /// but takes it itself at twice the budget: a thread that never answers leaves the log a
    /// crash replays under twice the budget plus one operation.
    #[test]
    fn a_slow_maintenance_thread_leaves_replay_bounded() {
        let (most, rung) = writes_with_a_deaf_maintenance_thread(None);
        assert!(rung, "no operation left a checkpoint to the maintenance thread");
        assert!(most >= BUDGET_BLOCKS, "the budget was never passed: {most} blocks");
        assert!(most < 2 * BUDGET_BLOCKS + 8, "{most} blocks since the last checkpoint");
    }

    #[cfg_attr(not(feature = "mutants"), ignore = "needs the mutants feature")]
    #[test]
    fn the_checkpoint_left_to_maintenance_mutant_lets_replay_grow() {
        let (most, _) =
            writes_with_a_deaf_maintenance_thread(Some(FsMutant::CheckpointLeftToMaintenance));
        assert!(most >= 2 * BUDGET_BLOCKS + 8, "mutant not caught: {most} blocks at most");
    }

    /// Without a maintenance thread an operation takes the checkpoint as soon as the budget
    /// is passed, as before; with one, the thread takes it without another operation (its
    /// interval an hour: only the bell can wake it).
    #[test]
    fn the_maintenance_thread_takes_the_checkpoint_an_operation_left() {
        let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, 16384).unwrap());
        Fs::mkfs(dev.clone(), &MkfsOptions::default()).unwrap();
        let opts =
            MountOptions { replay_budget: Some(BUDGET_BLOCKS * 4096), ..MountOptions::default() };
        let fs = Arc::new(Fs::mount(dev, opts).unwrap());
        let me = Owner { uid: 0, gid: 0 };
        let ino = fs.create(None, ROOT, b"f", 0o644, me).unwrap().ino;
        let mut most = 0;
        for i in 0..100u64 {
            fs.write(None, ino, i * 16384, &[1; 16384]).unwrap();
            most = most.max(fs.log.blocks_since_checkpoint_snapshot());
        }
        assert!(most < BUDGET_BLOCKS + 8, "no thread: {most} blocks since the last checkpoint");

        let maintenance = crate::Maintenance::spawn(&fs, Duration::from_secs(3600));
        // Write until the operation that passes the budget rings the thread. The thread's
        // checkpoint brings the count down, perhaps before this thread looks again, so a
        // count lower than after the previous write shows it as well as a count seen past
        // the budget and then falling. (An operation takes a checkpoint itself only past
        // twice the budget; a write here adds 5 blocks.)
        let mut i = 0u64;
        let mut last = fs.log.blocks_since_checkpoint_snapshot();
        loop {
            fs.write(None, ino, i * 16384, &[2; 16384]).unwrap();
            i += 1;
            let now = fs.log.blocks_since_checkpoint_snapshot();
            if now < last {
                break;
            }
            if now >= BUDGET_BLOCKS {
                let deadline = Instant::now() + Duration::from_secs(10);
                while fs.log.blocks_since_checkpoint_snapshot() >= BUDGET_BLOCKS {
                    assert!(Instant::now() < deadline, "the maintenance thread took no checkpoint");
                    std::thread::sleep(Duration::from_millis(1));
                }
                break;
            }
            last = now;
            assert!(i < 100, "the budget was never passed");
        }
        assert!(!maintenance.is_stopped());
        drop(maintenance);
        assert!(fs.maintenance_bell.lock().unwrap().upgrade().is_none(), "bell outlives thread");
    }

    /// A bug that panics inside an operation, half way through its change and holding the
    /// state lock, stops the file system: every later call fails with `Poisoned`, maintenance
    /// stops, fsck says it cannot check, and unmount writes no snapshot — the next mount scans
    /// the log and finds what was committed before the panic, and nothing of the half change.
    #[test]
    fn a_panic_holding_the_state_lock_stops_the_file_system() {
        let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, 16384).unwrap());
        Fs::mkfs(dev.clone(), &MkfsOptions::default()).unwrap();
        let fs = Arc::new(Fs::mount(dev.clone(), MountOptions::default()).unwrap());
        let me = Owner { uid: 0, gid: 0 };
        let kept = fs.create(None, ROOT, b"kept", 0o644, me).unwrap().ino;
        fs.write(None, kept, 0, b"before").unwrap();
        let txn = fs.begin().unwrap();
        let maintenance = crate::Maintenance::spawn(&fs, Duration::from_millis(5));
        let panicked = catch_unwind(AssertUnwindSafe(|| {
            fs.op(None, kept, false, |st, cx| -> OpResult<()> {
                cx.inode(st, kept)?;
                st.inode_mut(kept)?.attr.size = 1 << 40;
                panic!("injected bug, half way through a change");
            })
        }));
        assert!(panicked.is_err());

        let poisoned = |what: &str, r: Result<()>| {
            assert!(matches!(r, Err(FsError::Poisoned)), "{what} after the panic: {r:?}");
        };
        poisoned("getattr", fs.getattr(kept).map(drop));
        poisoned("lookup", fs.lookup(ROOT, b"kept").map(drop));
        poisoned("read", fs.read(kept, 0, 10).map(drop));
        poisoned("readdir", fs.readdir(ROOT, 0).map(drop));
        poisoned("getxattr", fs.getxattr(kept, b"user.x").map(drop));
        poisoned("create", fs.create(None, ROOT, b"new", 0o644, me).map(drop));
        poisoned("write", fs.write(None, kept, 0, b"after").map(drop));
        poisoned("write in a transaction", fs.write(Some(&txn), kept, 0, b"after").map(drop));
        poisoned("rename", fs.rename(None, ROOT, b"kept", ROOT, b"k2", RenameFlags::default()));
        poisoned("open", fs.open(kept));
        poisoned("fsync", fs.fsync(kept));
        poisoned("sync", fs.sync());
        poisoned("barrier", fs.barrier(kept));
        poisoned("begin", fs.begin().map(drop));
        poisoned("commit", fs.commit(txn));
        poisoned("clean", fs.clean(0, 1).map(drop));
        poisoned("maintain", fs.maintain().map(drop));
        poisoned("segment_liveness", fs.segment_liveness().map(drop));
        let report = fs.fsck();
        assert!(report.problems.iter().any(|p| p.contains("panic")), "{:?}", report.problems);

        let deadline = Instant::now() + Duration::from_secs(10);
        while !maintenance.is_stopped() {
            assert!(Instant::now() < deadline, "maintenance keeps running after the panic");
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(maintenance);
        let fs = Arc::into_inner(fs).expect("the only reference");
        assert!(matches!(fs.unmount(), Err(FsError::Poisoned)));

        let fs = Fs::mount(dev, MountOptions::default()).unwrap();
        assert!(!fs.mount_report().from_snapshot, "unmount wrote a snapshot of a torn state");
        assert_eq!(fs.read(kept, 0, 100).unwrap(), b"before");
        assert_eq!(fs.getattr(kept).unwrap().size, 6);
        let report = fs.fsck();
        assert!(report.is_clean(), "{:?}", report.problems);
        fs.unmount().unwrap();
    }
}

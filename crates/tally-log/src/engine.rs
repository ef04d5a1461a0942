//! The running log: placing transactions in their stream's chain, submitting them (merged when
//! they queue up), and making prefixes durable with one flush for many waiters.
//!
//! Lock order, never reversed: superblock → one stream → space; the flush lock is never held
//! while a stream lock is being acquired by the same thread doing I/O, and no lock is held
//! across a device wait except the superblock lock.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use tally_media::{Device, DeviceStats, IoBuf, MediaError, Ticket, Write, WriteFlags};

use crate::writeback::{Buffered, Due, Flusher, InFlight, WriteBehind, Writer};

use crate::format::body::{Body, Run, RunRole, TxId};
use crate::format::superblock::{StreamRoot, Superblock, SB_BLOCKS};
use crate::format::unit::{payload_capacity, UnitHeader, UnitKind, FLAG_CLASSIC};
use crate::space::Space;
use crate::{LogError, Mutant, Result};

/// How a transaction is committed. The same engine serves all four, so they compare honestly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CommitMode {
    /// What jbd2 does: write the journal blocks, wait, flush, then a commit block with FUA.
    Classic,
    /// Count-based durable commit: units + data in one submission, then one (group) flush.
    Count,
    /// Ordered and atomic across a crash, returns before anything is durable.
    Ordered,
    /// No ordering machinery: each transaction submitted on its own. Benchmark upper bound.
    Orderless,
}

impl CommitMode {
    /// Every mode.
    pub const ALL: [CommitMode; 4] =
        [CommitMode::Classic, CommitMode::Count, CommitMode::Ordered, CommitMode::Orderless];

    /// Lower-case name.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            CommitMode::Classic => "classic",
            CommitMode::Count => "count",
            CommitMode::Ordered => "ordered",
            CommitMode::Orderless => "orderless",
        }
    }
}

impl std::str::FromStr for CommitMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        CommitMode::ALL.into_iter().find(|m| m.name() == s).ok_or_else(|| {
            format!("unknown commit mode {s:?} (classic, count, ordered, orderless)")
        })
    }
}

/// Shape of a new log, given to [`Log::format`].
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// Number of streams (at least 1; default 2).
    pub streams: u16,
    /// Blocks per segment (at least 4).
    pub segment_blocks: u32,
    /// Identity of the image; seeds every crc. Random by default.
    pub uuid: [u8; 16],
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig { streams: 2, segment_blocks: 256, uuid: random_uuid() }
    }
}

fn random_uuid() -> [u8; 16] {
    use std::hash::{BuildHasher, Hasher};
    let mut out = [0u8; 16];
    for half in out.chunks_exact_mut(8) {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        half.copy_from_slice(&h.finish().to_le_bytes());
    }
    out
}

/// Sequence numbers a stream reserves at a time (see `StreamRoot::seq_limit`): a run that
/// commits this many transactions on one stream writes one extra superblock.
pub const SEQ_RESERVE: u64 = 1 << 24;

/// Options of [`Log::open`].
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenOptions {
    /// A deliberately broken protocol variant (needs the `mutants` feature).
    pub mutant: Option<Mutant>,
    /// Open even when recovery finds that a transaction proven durable is damaged or missing:
    /// keep the longest safe prefix and report what was dropped in
    /// [`crate::Recovery::damage`] instead of failing with
    /// [`LogError::DurableTransactionLost`]. Loses data the log acknowledged: only for salvage.
    pub salvage: bool,
    /// Sequence numbers reserved at a time; 0 means [`SEQ_RESERVE`]. Small values let tests
    /// exercise the reservation's renewal.
    pub seq_reserve: u64,
    /// Buffer ordered commits and write them out merged (see [`WriteBehind`]); `None` (the
    /// default) submits each commit as it is placed.
    pub write_behind: Option<WriteBehind>,
}

impl OpenOptions {
    pub(crate) fn seq_reserve(&self) -> u64 {
        if self.seq_reserve == 0 {
            SEQ_RESERVE
        } else {
            self.seq_reserve
        }
    }
}

/// A transaction being built. Records are opaque to the log; data blocks are written out of
/// place after the units and checked by crc at recovery.
#[derive(Debug, Clone)]
pub struct Transaction {
    stream: u16,
    deps: Vec<TxId>,
    records: Vec<Vec<u8>>,
    data: Vec<Vec<u8>>,
    run: Option<RunAsk>,
}

/// What a transaction asks to be in a large transaction (see [`Transaction::run_part`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RunAsk {
    /// The first part of a new run (named by this transaction's sequence number).
    Begin,
    /// A further part of the open run named `seq`.
    Part(u64),
    /// The close of the open run named `seq`.
    Close(u64),
}

impl Transaction {
    /// An empty transaction for `stream`.
    #[must_use]
    pub fn new(stream: u16) -> Self {
        Transaction { stream, deps: Vec::new(), records: Vec::new(), data: Vec::new(), run: None }
    }

    /// Append a record.
    pub fn record(&mut self, bytes: impl Into<Vec<u8>>) -> &mut Self {
        self.records.push(bytes.into());
        self
    }

    /// Append one data block (at most one block; zero-padded). Returns its index: after commit
    /// it lives at `CommitInfo::data_start + index`.
    pub fn data(&mut self, bytes: impl Into<Vec<u8>>) -> u32 {
        self.data.push(bytes.into());
        self.data.len() as u32 - 1
    }

    /// Make this transaction depend on `on` (a transaction of any stream).
    pub fn depend_on(&mut self, on: TxId) -> &mut Self {
        self.deps.push(on);
        self
    }

    /// Make this transaction a *part* of a large transaction: it survives a crash only if the
    /// run's close ([`Transaction::run_close`]) does, with every part before it. `run: None`
    /// begins a new run, named by the sequence number this transaction gets
    /// (`CommitInfo::ticket.seq`); `Some(run)` continues the open run of that name on the same
    /// stream. Other transactions of the stream may be committed between parts; a run that is
    /// never closed ([`Log::abandon_run`], or a crash) leaves nothing.
    pub fn run_part(&mut self, run: Option<u64>) -> &mut Self {
        self.run = Some(run.map_or(RunAsk::Begin, RunAsk::Part));
        self
    }

    /// Make this transaction the close of the open run `run`: committing it commits every part.
    pub fn run_close(&mut self, run: u64) -> &mut Self {
        self.run = Some(RunAsk::Close(run));
        self
    }

    /// Move the transaction to `stream` (cleaning re-commits on the stream it cleans).
    pub(crate) fn retarget(&mut self, stream: u16) {
        self.stream = stream;
    }

    /// The stream it will be committed on.
    #[must_use]
    pub fn stream(&self) -> u16 {
        self.stream
    }
}

/// Where a committed transaction landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct CommitInfo {
    /// Names the transaction; pass it to [`Log::wait_durable`] or to `depend_on`.
    pub ticket: TxId,
    /// Block of the first data block.
    pub data_start: u64,
}

/// Counters of the log itself (the device counts its own I/O).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct LogStats {
    /// Transactions committed.
    pub commits: u64,
    /// Flush rounds run by the group flusher.
    pub flush_rounds: u64,
    /// Device submissions that wrote out committed transactions (merged batches).
    pub write_outs: u64,
    /// Bytes of committed transactions waiting in memory to be written out.
    pub buffered_bytes: u64,
    /// The device's counters.
    pub device: DeviceStats,
}

/// A committed transaction's place, kept until it is checkpointed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Placed {
    pub seq: u64,
    pub epoch: u32,
    /// Global commit order, for the flusher's consistent cut.
    pub clock: u64,
    /// Segment holding the span (spans never cross segments).
    pub end_segment: u32,
    pub end_offset: u32,
    pub next_segment: u32,
    /// Records the transaction carries.
    pub records: u32,
    /// Of those, records the layer above marked dead.
    pub dead: u32,
}

/// How full of live records one segment of a stream's chain is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SegmentUsage {
    /// The segment.
    pub segment: u32,
    /// Transactions in it since the checkpoint.
    pub transactions: u64,
    /// Records in it since the checkpoint.
    pub records: u64,
    /// Of those, records the layer above marked dead.
    pub dead_records: u64,
}

/// One stream's live state.
#[derive(Debug)]
pub(crate) struct Stream {
    pub epoch: u32,
    pub last_seq: u64,
    pub next_seq: u64,
    /// `next_seq` may not reach this before the superblock raises it (see
    /// `StreamRoot::seq_limit`).
    pub seq_limit: u64,
    pub segment: u32,
    pub offset: u32,
    pub next_segment: u32,
    /// Segments from the checkpoint segment through the current one.
    pub chain: VecDeque<u32>,
    /// Transactions committed since the checkpoint, in order.
    pub placed: VecDeque<Placed>,

    /// Placed transactions not yet submitted, in seq order (the write-behind buffer).
    pub pending: Vec<Buffered>,
    pub submitting: bool,
    /// Orderless commits between placement and having their ticket in `inflight`.
    pub direct_submits: u32,
    /// Submitted batches not yet known complete.
    pub inflight: Vec<InFlight>,
    /// Every transaction with seq <= durable is on stable media.
    pub durable: u64,
    /// Open large transactions: run name (its first part's seq) -> parts committed so far.
    pub runs: BTreeMap<u64, u32>,
    /// The last close of a large transaction committed since the open (0: none). A reader of
    /// the device that finds parts must see their close: it waits until this is durable.
    pub last_close: u64,
}

pub(crate) struct SbState {
    pub sb: Superblock,
    /// Which copy holds `sb`.
    pub slot: usize,
}

#[derive(Default)]
struct FlushState {
    flushing: bool,
}

/// An open log.
pub struct Log {
    pub(crate) dev: Arc<dyn Device>,
    pub(crate) uuid: [u8; 16],
    pub(crate) block_size: u32,
    pub(crate) segment_blocks: u32,
    pub(crate) first_segment_block: u64,
    pub(crate) streams: Arc<[Mutex<Stream>]>,
    pub(crate) stream_cv: Arc<[Condvar]>,
    pub(crate) space: Mutex<Space>,
    pub(crate) sb: Mutex<SbState>,
    flush: Mutex<FlushState>,
    flush_cv: Condvar,
    clock: AtomicU64,
    pub(crate) options: OpenOptions,
    commits: AtomicU64,
    flush_rounds: AtomicU64,
    /// Blocks placed in the streams since the checkpoint snapshot in force (or the open).
    pub(crate) placed_blocks: AtomicU64,
    /// Segments of the checkpoint snapshot the superblock points at (empty without one):
    /// held until a newer one is durable.
    pub(crate) checkpoint_snapshot: Mutex<Vec<u32>>,
    /// Writes out the streams' buffers; shared with the flusher thread.
    writer: Arc<Writer>,
    /// Writes out buffers older than the commit interval; stopped when the log is dropped.
    _flusher: Option<Flusher>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a log lock is a bug; the guard is still handed out (so the panic
    // is reported rather than a poison error, and a reader of counters still answers), but
    // the log fails stop: `check_failed` refuses every commit, flush, write-out and
    // checkpoint from then on (see `Log::poisoned`).
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What [`LogError::Failed`] says after a panic while a log lock was held.
pub(crate) const POISONED: &str = "a panic while holding a log lock (a bug) may have left the \
                                   log's state half changed";

impl Log {
    /// Write a fresh, empty log onto `dev` (both superblock copies, then a flush).
    ///
    /// # Errors
    /// A configuration the device cannot hold, or I/O errors.
    pub fn format(dev: &dyn Device, config: &LogConfig) -> Result<()> {
        let g = dev.geometry();
        let streams = usize::from(config.streams);
        if streams == 0 || streams > Superblock::stream_count_max(g.block_size) {
            let max = Superblock::stream_count_max(g.block_size);
            return Err(LogError::Invalid(format!(
                "{streams} streams; this block size allows 1..={max}"
            )));
        }
        if config.segment_blocks < 4 {
            return Err(LogError::Invalid("segments need at least 4 blocks".into()));
        }
        let first_segment_block = 2;
        let segment_count = (g.block_count.saturating_sub(first_segment_block)
            / u64::from(config.segment_blocks))
        .min(u64::from(u32::MAX - 1)) as u32;
        // Each stream holds two segments from the start, and needs room to move on.
        if (segment_count as usize) < 2 * streams + 1 {
            return Err(LogError::Invalid(format!(
                "device of {} blocks holds {segment_count} segments of {}; {streams} streams need at least {}",
                g.block_count,
                config.segment_blocks,
                2 * streams + 1
            )));
        }
        let roots = (0..streams as u32)
            .map(|i| StreamRoot {
                checkpoint_seq: 0,
                checkpoint_epoch: 1,
                checkpoint_segment: 2 * i,
                checkpoint_offset: 0,
                checkpoint_next_segment: 2 * i + 1,
                epoch: 1,
                base_seq: 0,
                resume_seq: 1,
                // Nothing written yet: the first open resumes at 1 and reserves from there.
                seq_limit: 1,
            })
            .collect();
        let sb = Superblock {
            generation: 1,
            uuid: config.uuid,
            block_size: g.block_size,
            block_count: g.block_count,
            segment_blocks: config.segment_blocks,
            segment_count,
            first_segment_block,
            streams: roots,
            snapshot: None,
            snapshot_generation: None,
        };
        let mut second = sb.clone();
        second.generation = 0;
        // Both copies valid; generation 1 in slot 0 wins.
        dev.write_sync(
            vec![
                Write::new(SB_BLOCKS[0], IoBuf::from_slice(&sb.encode())),
                Write::new(SB_BLOCKS[1], IoBuf::from_slice(&second.encode())),
            ],
            WriteFlags::NONE,
        )?;
        dev.flush()?;
        Ok(())
    }

    pub(crate) fn from_parts(
        dev: Arc<dyn Device>,
        sb: SbState,
        streams: Vec<Stream>,
        space: Space,
        options: OpenOptions,
    ) -> Log {
        let n = streams.len();
        let streams: Arc<[Mutex<Stream>]> = streams.into_iter().map(Mutex::new).collect();
        let stream_cv: Arc<[Condvar]> = (0..n).map(|_| Condvar::new()).collect();
        let writer = Arc::new(Writer::new(
            dev.clone(),
            streams.clone(),
            stream_cv.clone(),
            options.write_behind,
            options.mutant == Some(Mutant::WriteOutReordered),
        ));
        let flusher = options.write_behind.and_then(|w| w.interval).and_then(|interval| {
            Flusher::spawn(writer.clone(), interval)
                .inspect_err(|e| {
                    tracing::warn!(error = %e, "no flusher thread; buffers go out when full or synced");
                })
                .ok()
        });
        Log {
            uuid: sb.sb.uuid,
            block_size: sb.sb.block_size,
            segment_blocks: sb.sb.segment_blocks,
            first_segment_block: sb.sb.first_segment_block,
            dev,
            streams,
            stream_cv,
            space: Mutex::new(space),
            sb: Mutex::new(sb),
            flush: Mutex::new(FlushState::default()),
            flush_cv: Condvar::new(),
            clock: AtomicU64::new(1),
            options,
            commits: AtomicU64::new(0),
            flush_rounds: AtomicU64::new(0),
            placed_blocks: AtomicU64::new(0),
            checkpoint_snapshot: Mutex::new(Vec::new()),
            writer,
            _flusher: flusher,
        }
    }

    pub(crate) fn mutant(&self, m: Mutant) -> bool {
        self.options.mutant == Some(m)
    }

    /// Number of streams.
    #[must_use]
    pub fn stream_count(&self) -> u16 {
        self.streams.len() as u16
    }

    /// The device the log runs on.
    #[must_use]
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.dev
    }

    /// Counters.
    #[must_use]
    pub fn stats(&self) -> LogStats {
        LogStats {
            commits: self.commits.load(Ordering::Relaxed),
            flush_rounds: self.flush_rounds.load(Ordering::Relaxed),
            write_outs: self.writer.write_outs.load(Ordering::Relaxed),
            buffered_bytes: self.writer.buffered_bytes(),
            device: self.dev.stats(),
        }
    }

    /// Highest durable sequence number of `stream`.
    #[must_use]
    pub fn durable_seq(&self, stream: u16) -> u64 {
        self.streams.get(usize::from(stream)).map_or(0, |s| lock(s).durable)
    }

    /// Blocks per segment.
    #[must_use]
    pub fn segment_blocks(&self) -> u32 {
        self.segment_blocks
    }

    /// Free segments left.
    #[must_use]
    pub fn free_segments(&self) -> u32 {
        lock(&self.space).free_count()
    }

    fn check_failed(&self) -> Result<()> {
        if self.poisoned() {
            return Err(LogError::Failed { first_error: POISONED.into() });
        }
        self.writer.check_failed()
    }

    /// Whether a thread panicked while holding one of the log's own locks (the writer's are
    /// checked by [`Writer::check_failed`]): fail-stop, as after an I/O error.
    fn poisoned(&self) -> bool {
        self.space.is_poisoned()
            || self.sb.is_poisoned()
            || self.flush.is_poisoned()
            || self.checkpoint_snapshot.is_poisoned()
    }

    pub(crate) fn fail(&self, e: MediaError) -> LogError {
        let e = self.writer.fail(e);
        self.flush_cv.notify_all();
        e
    }

    /// Submit every committed transaction still buffered in memory (no wait, no flush): an
    /// explicit write-out point. Nothing becomes durable by it; see [`Log::wait_durable`].
    ///
    /// # Errors
    /// An earlier failure (fail-stop) and I/O errors (the log is then failed).
    pub fn write_out(&self) -> Result<()> {
        self.check_failed()?;
        self.writer.write_out_all()
    }

    /// Submit every committed transaction still buffered and wait until the device has
    /// completed those writes, without a flush: their blocks can be read back from the device
    /// (nothing is durable by it). Returns, per stream, the seq up to which every transaction
    /// is written and complete. For a writer that wants to drop its copies of data it
    /// committed ordered (a large transaction's parts) without paying a flush.
    ///
    /// # Errors
    /// An earlier failure (fail-stop) and I/O errors (the log is then failed).
    pub fn write_out_completed(&self) -> Result<Vec<u64>> {
        self.check_failed()?;
        self.writer.write_out_all()?;
        let mut out = Vec::with_capacity(self.streams.len());
        for s in 0..self.streams.len() {
            let (written, tickets) = {
                let mut st = lock(&self.streams[s]);
                while st.submitting || st.direct_submits > 0 {
                    self.check_failed()?;
                    st = self.stream_cv[s]
                        .wait(st)
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                }
                let tickets: Vec<Ticket> = st.inflight.iter().map(|b| b.ticket).collect();
                (self.writer.written(s).max(st.durable), tickets)
            };
            // Waiting again on a completed ticket is allowed (the flush round will).
            for t in tickets {
                self.dev.wait(t).map_err(|e| self.fail(e))?;
            }
            out.push(written);
        }
        Ok(out)
    }

    /// Read `buf.len()` bytes (whole blocks) starting at device block `block`, seeing every
    /// committed transaction: blocks placed but not yet written come from memory, blocks whose
    /// write is in flight are read once it completed.
    ///
    /// # Errors
    /// A length that is not whole blocks, I/O errors.
    pub fn read(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        self.writer.read(block, buf)
    }

    /// Commit `tx` ordered and atomic; returns before it is durable (`CommitMode::Ordered`).
    ///
    /// # Errors
    /// See [`Log::commit_with`].
    pub fn commit(&self, tx: Transaction) -> Result<CommitInfo> {
        self.commit_with(tx, CommitMode::Ordered)
    }

    /// Commit `tx` and return once it and everything it depends on are durable.
    ///
    /// # Errors
    /// See [`Log::commit_with`].
    pub fn commit_durable(&self, tx: Transaction) -> Result<CommitInfo> {
        self.commit_with(tx, CommitMode::Count)
    }

    /// Commit `tx` in `mode`.
    ///
    /// # Errors
    /// [`LogError::Failed`] after an earlier I/O error, [`LogError::NoSpace`],
    /// [`LogError::TooLarge`], [`LogError::Invalid`] for a bad stream or data block, and I/O
    /// errors (after which the log is failed).
    pub fn commit_with(&self, tx: Transaction, mode: CommitMode) -> Result<CommitInfo> {
        self.check_failed()?;
        let s = usize::from(tx.stream);
        if s >= self.streams.len() {
            return Err(LogError::Invalid(format!("no stream {}", tx.stream)));
        }
        let bs = self.block_size as usize;
        if let Some(d) = tx.data.iter().find(|d| d.len() > bs) {
            return Err(LogError::Invalid(format!(
                "data block of {} bytes > block size {bs}",
                d.len()
            )));
        }
        if tx.deps.len() > usize::from(u16::MAX)
            || tx.records.iter().any(|r| r.len() > u32::MAX as usize)
        {
            return Err(LogError::Invalid("too many dependencies or record too large".into()));
        }
        if tx.run.is_some() && !matches!(mode, CommitMode::Ordered | CommitMode::Count) {
            return Err(LogError::Invalid(format!(
                "a large transaction's parts are committed ordered or count, not {}",
                mode.name()
            )));
        }
        let deps = if mode == CommitMode::Orderless { Vec::new() } else { self.live_deps(&tx) };
        let data_crcs = tx.data.iter().map(|d| crc_padded(d, bs)).collect();
        let record_count = u32::try_from(tx.records.len())
            .map_err(|_| LogError::Invalid("more than 2^32 records".into()))?;
        // A run's place is known only under the stream lock; the placeholder has its size and
        // is filled in there (`Body::patch_run`).
        let placeholder = tx.run.map(|_| Run { role: RunRole::Part, seq: 0, index: 0 });
        let mut body = Body { deps, data_crcs, records: tx.records, run: placeholder }.encode();
        let cap = payload_capacity(self.block_size);
        let unit_count = body.len().div_ceil(cap).max(1) as u64;
        let classic = mode == CommitMode::Classic;
        let data_count = tx.data.len() as u64;
        let span = unit_count + data_count + u64::from(classic);
        if span > u64::from(self.segment_blocks) {
            return Err(LogError::TooLarge { blocks: span, segment_blocks: self.segment_blocks });
        }

        let mut st = lock(&self.streams[s]);
        self.check_failed()?;
        while st.next_seq >= st.seq_limit {
            drop(st);
            self.raise_seq_limit(s)?;
            st = lock(&self.streams[s]);
            self.check_failed()?;
        }
        if let Some(ask) = tx.run {
            Self::check_run(&st, ask, tx.stream)?;
        }
        if u64::from(st.offset) + span > u64::from(self.segment_blocks) {
            let next_next =
                lock(&self.space).alloc().ok_or(LogError::NoSpace { stream: tx.stream })?;
            st.segment = st.next_segment;
            st.next_segment = next_next;
            st.offset = 0;
            let seg = st.segment;
            st.chain.push_back(seg);
        }
        let header = UnitHeader {
            kind: UnitKind::Body,
            flags: if classic { FLAG_CLASSIC } else { 0 },
            stream: tx.stream,
            epoch: st.epoch,
            seq: st.next_seq,
            prev_seq: st.last_seq,
            unit_index: 0,
            unit_count: unit_count as u32,
            data_count: data_count as u32,
            next_segment: st.next_segment,
            durable_watermark: st.durable,
            payload_len: 0,
        };
        if let Some(ask) = tx.run {
            let seq = st.next_seq;
            let run = match ask {
                RunAsk::Begin => {
                    st.runs.insert(seq, 1);
                    Run { role: RunRole::Part, seq, index: 0 }
                }
                RunAsk::Part(run) => {
                    let n = st.runs.get_mut(&run).ok_or_else(|| Self::no_run(tx.stream, run))?;
                    let index = *n;
                    *n = n.saturating_add(1);
                    Run { role: RunRole::Part, seq: run, index }
                }
                RunAsk::Close(run) => {
                    let parts = st.runs.remove(&run).ok_or_else(|| Self::no_run(tx.stream, run))?;
                    st.last_close = seq;
                    Run { role: RunRole::Close, seq: run, index: parts }
                }
            };
            Body::patch_run(&mut body, run);
        }
        let start = self.segment_start(st.segment).saturating_add(u64::from(st.offset));
        let written = unit_count + data_count;
        let mut buf = IoBuf::zeroed(written as usize * bs);
        for (i, (chunk, block)) in body.chunks(cap).zip(buf.chunks_exact_mut(bs)).enumerate() {
            let h = UnitHeader { unit_index: i as u32, payload_len: chunk.len() as u32, ..header };
            h.encode_into(&self.uuid, chunk, block);
        }
        if body.is_empty() {
            header.encode_into(&self.uuid, &[], &mut buf[..bs]);
        }
        for (d, block) in tx.data.iter().zip(buf.chunks_exact_mut(bs).skip(unit_count as usize)) {
            block[..d.len()].copy_from_slice(d);
        }
        let seq = header.seq;
        st.offset += span as u32;
        st.last_seq = seq;
        st.next_seq = seq + 1;
        let placed = Placed {
            seq,
            epoch: st.epoch,
            clock: self.clock.fetch_add(1, Ordering::SeqCst),
            end_segment: st.segment,
            end_offset: st.offset,
            next_segment: st.next_segment,
            records: record_count,
            dead: 0,
        };
        st.placed.push_back(placed);
        let ticket = TxId { stream: tx.stream, seq };
        let info = CommitInfo { ticket, data_start: start + unit_count };
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.placed_blocks.fetch_add(span, Ordering::Relaxed);
        if mode == CommitMode::Orderless {
            // Submitted outside the lock; until its ticket is in `inflight`, `direct_submits`
            // keeps a flush round from declaring it durable.
            st.direct_submits += 1;
            drop(st);
            let writes = vec![Write::new(start, buf)];
            let result = self.dev.submit_stream(tx.stream, writes, WriteFlags::NONE);
            let mut st = lock(&self.streams[s]);
            st.direct_submits -= 1;
            self.stream_cv[s].notify_all();
            match result {
                Ok(ticket) => st.inflight.push(InFlight {
                    first: seq,
                    ticket,
                    ranges: vec![(start, written)],
                }),
                Err(e) => {
                    drop(st);
                    return Err(self.fail(e));
                }
            }
            return Ok(info);
        }
        let due = self.writer.buffer(s, &mut st, Buffered { start, buf, seq, at: Instant::now() });
        drop(st);
        match due {
            // A durable or classic commit is written out by its flush round.
            _ if self.options.write_behind.is_some() && mode != CommitMode::Ordered => {}
            Due::Nothing => {}
            Due::Stream => self.writer.drive(s, u64::MAX)?,
            Due::Every => self.writer.write_out_all()?,
        }
        match mode {
            CommitMode::Ordered | CommitMode::Orderless => {}
            CommitMode::Count => self.wait_durable(ticket)?,
            CommitMode::Classic => {
                self.wait_durable(ticket)?;
                let commit_block = self.encode_commit_block(&header);
                let at = start + unit_count + data_count;
                self.dev
                    .write_sync(vec![Write::new(at, commit_block)], WriteFlags::FUA)
                    .map_err(|e| self.fail(e))?;
            }
        }
        Ok(info)
    }

    /// Refuse a run request that names no open run of the stream (before anything is placed).
    fn check_run(st: &Stream, ask: RunAsk, stream: u16) -> Result<()> {
        match ask {
            RunAsk::Begin => Ok(()),
            RunAsk::Part(run) | RunAsk::Close(run) if st.runs.contains_key(&run) => Ok(()),
            RunAsk::Part(run) | RunAsk::Close(run) => Err(Self::no_run(stream, run)),
        }
    }

    fn no_run(stream: u16, run: u64) -> LogError {
        LogError::Invalid(format!("stream {stream} has no open large transaction {run}"))
    }

    /// Give up the open large transaction `run` of `stream`: it is never closed, so its parts
    /// are left out by every recovery (and by cleaning's reads), and checkpoints may pass
    /// them. Unknown runs are ignored.
    pub fn abandon_run(&self, stream: u16, run: u64) {
        if let Some(st) = self.streams.get(usize::from(stream)) {
            lock(st).runs.remove(&run);
        }
    }

    /// The first part of the oldest open large transaction of `stream`, if any: checkpoints
    /// and cleaning stop before it.
    pub(crate) fn first_open_run(&self, stream: usize) -> Option<u64> {
        self.streams.get(stream).and_then(|st| lock(st).runs.keys().next().copied())
    }

    fn encode_commit_block(&self, header: &UnitHeader) -> IoBuf {
        let mut block = IoBuf::zeroed(self.block_size as usize);
        let h = UnitHeader {
            kind: UnitKind::Commit,
            unit_index: header.unit_count,
            payload_len: 0,
            ..*header
        };
        h.encode_into(&self.uuid, &[], &mut block);
        block
    }

    /// Dependencies still worth recording: on other streams and not yet durable.
    fn live_deps(&self, tx: &Transaction) -> Vec<TxId> {
        let mut deps: Vec<TxId> = tx
            .deps
            .iter()
            .copied()
            .filter(|d| d.stream != tx.stream)
            .filter(|d| {
                self.streams.get(usize::from(d.stream)).is_some_and(|st| lock(st).durable < d.seq)
            })
            .collect();
        deps.sort_unstable();
        deps.dedup();
        deps
    }

    /// Blocks `tx` will take when committed in an ordered or count mode (an upper bound: every
    /// dependency counted, even those that will be dropped as already durable).
    pub(crate) fn planned_span(&self, tx: &Transaction) -> u64 {
        use crate::format::body::{BODY_HEADER_SIZE, DEP_SIZE, RECORD_LEN_SIZE};
        let body_len = BODY_HEADER_SIZE
            + if tx.run.is_some() { crate::format::body::RUN_SEQ_SIZE } else { 0 }
            + tx.deps.len() * DEP_SIZE
            + tx.data.len() * 4
            + tx.records.iter().map(|r| RECORD_LEN_SIZE + r.len()).sum::<usize>();
        let units = body_len.div_ceil(payload_capacity(self.block_size)).max(1);
        (units + tx.data.len()) as u64
    }

    /// Whether spans of `spans` blocks, committed in this order on stream `s` now, fit without
    /// running out of segments.
    pub(crate) fn room_for(&self, s: usize, spans: &[u64]) -> bool {
        let st = lock(&self.streams[s]);
        let free = u64::from(lock(&self.space).free_count());
        let seg = u64::from(self.segment_blocks);
        let mut at = u64::from(st.offset);
        let mut switches = 0;
        for &span in spans {
            if span > seg {
                return false;
            }
            if at + span > seg {
                switches += 1;
                at = 0;
            }
            at += span;
        }
        switches <= free
    }

    pub(crate) fn segment_start(&self, segment: u32) -> u64 {
        // Exact for every segment of the log (the superblock's `validate` checked that they all
        // fit the device); a segment past it (a bug, or a value from the device that escaped a
        // check) saturates to a block no device has, so I/O on it fails instead of wrapping.
        let offset = u64::from(segment).saturating_mul(u64::from(self.segment_blocks));
        self.first_segment_block.saturating_add(offset)
    }

    /// Block until transaction `t` (and so everything before it on its stream, and everything
    /// it depends on) is durable. One flush serves every waiter that arrived before it began.
    ///
    /// # Errors
    /// I/O errors (the log is then failed) and an unknown stream.
    pub fn wait_durable(&self, t: TxId) -> Result<()> {
        let st = self
            .streams
            .get(usize::from(t.stream))
            .ok_or_else(|| LogError::Invalid(format!("no stream {}", t.stream)))?;
        loop {
            if lock(st).durable >= t.seq {
                return Ok(());
            }
            self.check_failed()?;
            let mut f = lock(&self.flush);
            if f.flushing {
                let _f = self.flush_cv.wait(f).unwrap_or_else(std::sync::PoisonError::into_inner);
                continue;
            }
            if lock(st).durable >= t.seq {
                return Ok(());
            }
            f.flushing = true;
            drop(f);
            let result = self.flush_round();
            lock(&self.flush).flushing = false;
            self.flush_cv.notify_all();
            result?;
        }
    }

    /// Make everything committed so far durable.
    ///
    /// # Errors
    /// I/O errors.
    pub fn sync(&self) -> Result<()> {
        // Also when everything is durable already: a clean close or a snapshot after a
        // failure (or a panic) must not be written.
        self.check_failed()?;
        for s in 0..self.streams.len() {
            let last = lock(&self.streams[s]).last_seq;
            self.wait_durable(TxId { stream: s as u16, seq: last })?;
        }
        Ok(())
    }

    /// One group flush: take a consistent cut of everything committed (by the global commit
    /// clock, so a dependency is always inside the cut with its dependent), wait for those
    /// writes to complete, flush once, advance every stream's durable watermark.
    fn flush_round(&self) -> Result<()> {
        self.flush_rounds.fetch_add(1, Ordering::Relaxed);
        let cut = self.clock.load(Ordering::SeqCst);
        let mut targets = Vec::with_capacity(self.streams.len());
        for s in 0..self.streams.len() {
            let st = lock(&self.streams[s]);
            let target =
                st.placed.iter().rev().find(|p| p.clock < cut).map_or(st.durable, |p| p.seq);
            targets.push(target.max(st.durable));
        }
        for (s, &target) in targets.iter().enumerate() {
            self.wait_submitted(s, target)?;
            let tickets: Vec<Ticket> = {
                let mut st = lock(&self.streams[s]);
                let (due, rest): (Vec<_>, Vec<_>) =
                    st.inflight.drain(..).partition(|b| b.first <= target);
                st.inflight = rest;
                due.into_iter().map(|b| b.ticket).collect()
            };
            for t in tickets {
                self.dev.wait(t).map_err(|e| self.fail(e))?;
            }
        }
        if !self.mutant(Mutant::FlushSkipped) {
            self.dev.flush().map_err(|e| self.fail(e))?;
        }
        for (s, &target) in targets.iter().enumerate() {
            let mut st = lock(&self.streams[s]);
            st.durable = st.durable.max(target);
        }
        Ok(())
    }

    /// Wait until every transaction of stream `s` up to `target` has been submitted, writing
    /// out the stream's buffer up to it (and no further: later commits stay buffered).
    fn wait_submitted(&self, s: usize, target: u64) -> Result<()> {
        loop {
            self.writer.drive(s, target)?;
            let mut st = lock(&self.streams[s]);
            let untracked = self.mutant(Mutant::OrderlessSubmitUntracked);
            while st.submitting || (st.direct_submits > 0 && !untracked) {
                self.check_failed()?;
                st = self.stream_cv[s].wait(st).unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            // Write-outs go oldest first, so the watermark covers the prefix.
            if self.writer.written(s) >= target || st.pending.first().is_none_or(|p| p.seq > target)
            {
                return Ok(());
            }
        }
    }

    /// Declare every transaction of `stream` up to `seq` checkpointed: the layer above has what
    /// it needs of them elsewhere. Makes them durable first, then durably records the new
    /// starting point, then frees the segments before it.
    ///
    /// # Errors
    /// A `seq` that was never committed, and I/O errors.
    pub fn checkpoint(&self, stream: u16, seq: u64) -> Result<()> {
        let s = usize::from(stream);
        if s >= self.streams.len() {
            return Err(LogError::Invalid(format!("no stream {stream}")));
        }
        self.check_failed()?;
        self.wait_durable(TxId { stream, seq })?;
        let mut sbs = lock(&self.sb);
        let (root, freed) = {
            let mut st = lock(&self.streams[s]);
            let current = sbs.sb.streams[s];
            if seq <= current.checkpoint_seq {
                return Ok(());
            }
            // A run's parts are committed only by its close: a checkpoint past an open run's
            // first part would drop parts a later close needs.
            if let Some(&run) = st.runs.keys().next().filter(|&&run| run <= seq) {
                return Err(LogError::Invalid(format!(
                    "stream {stream}: checkpoint at {seq} would pass open large transaction {run}"
                )));
            }
            let Some(p) = st.placed.iter().find(|p| p.seq == seq).copied() else {
                return Err(LogError::Invalid(format!(
                    "stream {stream} has no transaction {seq} to checkpoint"
                )));
            };
            while st.placed.front().is_some_and(|q| q.seq <= seq) {
                st.placed.pop_front();
            }
            // If the checkpointed transaction is the last of its segment and the stream has
            // moved on, the chain resumes at the start of the next segment, and the
            // checkpointed one can be freed too.
            let last_of_segment = st.placed.front().is_none_or(|q| q.end_segment != p.end_segment)
                || self.mutant(Mutant::CheckpointSkipsSegmentTail);
            let moved_on = st
                .chain
                .iter()
                .position(|&seg| seg == p.end_segment)
                .filter(|&i| last_of_segment && i + 1 < st.chain.len());
            let (segment, offset, next) = match moved_on {
                Some(i) => {
                    let after = st.chain.get(i + 2).copied().unwrap_or(st.next_segment);
                    (st.chain[i + 1], 0, after)
                }
                None => (p.end_segment, p.end_offset, p.next_segment),
            };
            let root = StreamRoot {
                checkpoint_seq: p.seq,
                checkpoint_epoch: p.epoch,
                checkpoint_segment: segment,
                checkpoint_offset: offset,
                checkpoint_next_segment: next,
                ..current
            };
            let mut freed = Vec::new();
            while st.chain.front().is_some_and(|&seg| seg != segment) {
                freed.extend(st.chain.pop_front());
            }
            (root, freed)
        };
        let mut sb = sbs.sb.clone();
        sb.streams[s] = root;
        let durable = !self.mutant(Mutant::SegmentsReusedBeforeCheckpointDurable);
        self.write_superblock(&mut sbs, sb, durable)?;
        drop(sbs);
        let mut space = lock(&self.space);
        for seg in freed {
            space.release(seg);
        }
        Ok(())
    }

    /// Reserve the next range of sequence numbers for stream `s`, durably, before any of them is
    /// written (lock order: superblock, then the stream).
    fn raise_seq_limit(&self, s: usize) -> Result<()> {
        let mut sbs = lock(&self.sb);
        let st = lock(&self.streams[s]);
        if st.next_seq < st.seq_limit {
            return Ok(());
        }
        let limit = st.seq_limit.checked_add(self.options.seq_reserve()).ok_or_else(|| {
            LogError::Invalid(format!("stream {s} has used every sequence number"))
        })?;
        // Only this thread raises the limit while the superblock lock is held; the stream lock
        // is not held across the write.
        drop(st);
        let mut sb = sbs.sb.clone();
        sb.streams[s].seq_limit = limit;
        self.write_superblock(&mut sbs, sb, true)?;
        lock(&self.streams[s]).seq_limit = limit;
        Ok(())
    }

    /// Write `sb` into the copy not holding the current one, then (if `durable`) wait and flush.
    pub(crate) fn write_superblock(
        &self,
        state: &mut SbState,
        mut sb: Superblock,
        durable: bool,
    ) -> Result<()> {
        // Only a generation read from the device can be u64::MAX (2^64 updates cannot happen).
        sb.generation = state.sb.generation.checked_add(1).ok_or_else(|| LogError::Corrupted {
            what: "superblock",
            block: SB_BLOCKS.get(state.slot).copied().unwrap_or_default(),
            reason: "generation u64::MAX cannot be incremented".into(),
        })?;
        let slot = 1 - state.slot;
        let buf = IoBuf::from_slice(&sb.encode());
        let w = vec![Write::new(SB_BLOCKS[slot], buf)];
        if durable {
            self.dev.write_sync(w, WriteFlags::NONE).map_err(|e| self.fail(e))?;
            self.dev.flush().map_err(|e| self.fail(e))?;
        } else {
            self.dev.submit(w, WriteFlags::NONE).map_err(|e| self.fail(e))?;
        }
        state.sb = sb;
        state.slot = slot;
        Ok(())
    }
}

/// crc32c of `data` zero-padded to `block_size`.
pub(crate) fn crc_padded(data: &[u8], block_size: usize) -> u32 {
    let crc = crc32c::crc32c(data);
    if data.len() >= block_size {
        return crc;
    }
    let zeros = [0u8; 4096];
    let mut crc = crc;
    let mut left = block_size - data.len();
    while left > 0 {
        let n = left.min(zeros.len());
        crc = crc32c::crc32c_append(crc, &zeros[..n]);
        left -= n;
    }
    crc
}

#[cfg(test)]
mod poison_tests {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    use std::sync::Arc;

    use tally_media::{Device, MemDevice};

    use super::*;

    fn open() -> Log {
        let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, 4096).unwrap());
        Log::format(&*dev, &LogConfig { streams: 2, segment_blocks: 64, ..LogConfig::default() })
            .unwrap();
        Log::open(dev, OpenOptions::default()).unwrap().0
    }

    fn refused<T: std::fmt::Debug>(what: &str, r: Result<T>) {
        assert!(
            matches!(&r, Err(LogError::Failed { first_error }) if first_error == POISONED),
            "{what} after a panic holding a log lock: {r:?}"
        );
    }

    /// A panic while a stream's lock (or the log's own) is held leaves the log failed: every
    /// commit, sync, checkpoint and clean close is refused, as after an I/O error (was: the
    /// poison ignored and the half-changed state written on).
    #[test]
    fn a_panic_holding_a_log_lock_fails_the_log() {
        for which in ["stream", "space"] {
            let log = open();
            let mut tx = Transaction::new(0);
            tx.record(b"before".to_vec());
            let before = log.commit(tx).unwrap();
            let panicked = catch_unwind(AssertUnwindSafe(|| {
                let _held = (which == "stream").then(|| lock(&log.streams[1]));
                let _space = (which == "space").then(|| lock(&log.space));
                panic!("injected bug while holding the {which} lock");
            }));
            assert!(panicked.is_err());
            let mut tx = Transaction::new(0);
            tx.record(b"after".to_vec());
            refused("commit", log.commit(tx));
            refused("sync", log.sync());
            refused("checkpoint", log.checkpoint(0, before.ticket.seq));
            refused("write_out", log.write_out());
            refused("close_clean", log.close_clean(b"snapshot"));
        }
    }
}

//! The log's public types: how a transaction is built ([`Transaction`]) and committed
//! ([`CommitMode`], [`CommitInfo`]), how a log is made and opened ([`LogConfig`],
//! [`OpenOptions`]), and what it reports ([`LogStats`], [`SegmentUsage`]).

use tally_media::DeviceStats;

use crate::format::body::TxId;
use crate::writeback::WriteBehind;
use crate::Mutant;

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

pub(crate) fn random_uuid() -> [u8; 16] {
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
    pub(crate) stream: u16,
    pub(crate) deps: Vec<TxId>,
    pub(crate) records: Vec<Vec<u8>>,
    pub(crate) data: Vec<DataBytes>,
    /// Each data block's crc when the caller knew it (`data_with_crc`), else `None`.
    pub(crate) data_crcs: Vec<Option<u32>>,
    pub(crate) run: Option<RunAsk>,
}

/// A data block's bytes: the transaction's own, or shared with the caller, who keeps them too
/// (the file system's blocks held in memory until durable): not copied to be committed.
#[derive(Debug, Clone)]
pub(crate) enum DataBytes {
    Owned(Vec<u8>),
    Shared(std::sync::Arc<Vec<u8>>),
}

impl std::ops::Deref for DataBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            DataBytes::Owned(v) => v,
            DataBytes::Shared(v) => v,
        }
    }
}

/// What a transaction asks to be in a large transaction (see [`Transaction::run_part`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunAsk {
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
        Transaction {
            stream,
            deps: Vec::new(),
            records: Vec::new(),
            data: Vec::new(),
            data_crcs: Vec::new(),
            run: None,
        }
    }

    /// Append a record.
    pub fn record(&mut self, bytes: impl Into<Vec<u8>>) -> &mut Self {
        self.records.push(bytes.into());
        self
    }

    /// Append one data block (at most one block; zero-padded). Returns its index: after commit
    /// it lives at `CommitInfo::data_start + index`.
    pub fn data(&mut self, bytes: impl Into<Vec<u8>>) -> u32 {
        self.data.push(DataBytes::Owned(bytes.into()));
        self.data_crcs.push(None);
        self.data.len() as u32 - 1
    }

    /// [`Transaction::data`] with the crc32c of `bytes` already known, so the log does not
    /// compute it again (it extends it over the padding of a short block). A wrong crc is a bug in the caller:
    /// debug builds assert it; release builds write it and recovery then refuses the block.
    pub fn data_with_crc(&mut self, bytes: impl Into<Vec<u8>>, crc: u32) -> u32 {
        self.data.push(DataBytes::Owned(bytes.into()));
        self.data_crcs.push(Some(crc));
        self.data.len() as u32 - 1
    }

    /// [`Transaction::data_with_crc`] for bytes the caller keeps too: shared, not copied (they
    /// must not change until the commit returned; an `Arc` the caller does not mutate).
    pub fn data_shared(&mut self, bytes: std::sync::Arc<Vec<u8>>, crc: u32) -> u32 {
        self.data.push(DataBytes::Shared(bytes));
        self.data_crcs.push(Some(crc));
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
    /// Flush rounds whose start waited for more waiters to register (gathering).
    pub gathered_rounds: u64,
    /// Device submissions that wrote out committed transactions (merged batches).
    pub write_outs: u64,
    /// Bytes of committed transactions waiting in memory to be written out.
    pub buffered_bytes: u64,
    /// The device's counters.
    pub device: DeviceStats,
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

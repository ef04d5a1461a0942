//! The log's running state — its streams, the superblock in force, the `Log` handle with its
//! counters — and what touches all of it: formatting, failure (fail-stop), write-out and reads.
//! The work is in the modules beside it: `commit.rs` (placing a transaction), `durable.rs`
//! (group flushes), `checkpoint.rs` (checkpoints and superblock updates), `recover.rs`
//! (opening), `clean.rs`, `snapshot.rs`, `writeback.rs`; the public types are in `api.rs`.
//!
//! Lock order, never reversed: superblock → one stream → space; the flush lock is never held
//! while a stream lock is being acquired by the same thread doing I/O, and no lock is held
//! across a device wait except the superblock lock.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use tally_media::{Device, IoBuf, MediaError, Ticket, Write, WriteFlags};

use crate::writeback::{Buffered, Flusher, InFlight, Writer};

use crate::api::{LogConfig, LogStats, OpenOptions};
use crate::format::body::TxId;
use crate::format::superblock::{StreamRoot, Superblock, SB_BLOCKS};
use crate::space::Space;
use crate::{LogError, Mutant, Result};

/// A committed transaction's place, kept until it is checkpointed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Placed {
    pub seq: u64,
    pub epoch: u32,
    /// Segment holding the span (spans never cross segments).
    pub end_segment: u32,
    pub end_offset: u32,
    pub next_segment: u32,
    /// Records the transaction carries.
    pub records: u32,
    /// Of those, records the layer above marked dead.
    pub dead: u32,
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
    /// Placed transactions above `durable` that depend on other streams' transactions, by
    /// seq: the dependencies their body records (`Log::live_deps`). A flush round reads them
    /// to make a transaction's dependency closure durable with it without reading the device;
    /// dropped once the transaction is durable.
    pub waits_on: BTreeMap<u64, Vec<TxId>>,
}

pub(crate) struct SbState {
    pub sb: Superblock,
    /// Which copy holds `sb`.
    pub slot: usize,
}

pub(crate) struct FlushState {
    /// A waiter is gathering the waiters of the round it is about to run (`Log::gather`):
    /// others register and wait.
    pub gathering: bool,
    /// Per stream, whether a running round has claimed it (writes it out and flushes).
    pub busy: Vec<bool>,
    /// When each running round started.
    pub running: Vec<std::time::Instant>,
    /// Per stream, the highest seq a waiter asked to be durable since the round in progress
    /// (if any) began (0: none): what the next round makes durable, with its dependencies.
    pub needs: Vec<u64>,
    /// Rounds started so far; a waiter registered for round `started + 1` is counted once in
    /// `next_waiters`, however often it registers again.
    pub started: u64,
    /// Waiters registered for the next round.
    pub next_waiters: usize,
    /// The waiters of the last round and those that registered for the next one while it
    /// ran: how many callers wait for durability together (`durable.rs`, gathering).
    pub companions: usize,
    /// Moving average of a round's length (write-out and flush), in nanoseconds.
    pub round_ns: u64,
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
    pub(crate) flush: Mutex<FlushState>,
    pub(crate) flush_cv: Condvar,
    /// Wakes a round's claimant gathering its waiters when one registers.
    pub(crate) gather_cv: Condvar,
    /// Rounds whose start waited for more waiters to register.
    pub(crate) gathered_waits: AtomicU64,
    pub(crate) options: OpenOptions,
    pub(crate) commits: AtomicU64,
    pub(crate) flush_rounds: AtomicU64,
    /// Blocks placed in the streams since the checkpoint snapshot in force (or the open).
    pub(crate) placed_blocks: AtomicU64,
    /// Segments of the checkpoint snapshot the superblock points at (empty without one):
    /// held until a newer one is durable.
    pub(crate) checkpoint_snapshot: Mutex<Vec<u32>>,
    /// Writes out the streams' buffers; shared with the flusher thread.
    pub(crate) writer: Arc<Writer>,
    /// Streams whose write-out a [`Log::commit_deferred`] left to [`Log::submit_deferred`]
    /// (`usize::MAX`: every stream), and whether there are any.
    pub(crate) deferred: Mutex<Vec<usize>>,
    pub(crate) deferred_any: std::sync::atomic::AtomicBool,
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
            flush: Mutex::new(FlushState {
                gathering: false,
                busy: vec![false; n],
                running: Vec::new(),
                needs: vec![0; n],
                started: 0,
                next_waiters: 0,
                companions: 0,
                round_ns: 0,
            }),
            flush_cv: Condvar::new(),
            gather_cv: Condvar::new(),
            gathered_waits: AtomicU64::new(0),
            options,
            commits: AtomicU64::new(0),
            flush_rounds: AtomicU64::new(0),
            placed_blocks: AtomicU64::new(0),
            checkpoint_snapshot: Mutex::new(Vec::new()),
            writer,
            deferred: Mutex::new(Vec::new()),
            deferred_any: std::sync::atomic::AtomicBool::new(false),
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
            gathered_rounds: self.gathered_waits.load(Ordering::Relaxed),
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

    /// The device block segment 0 starts at: segment `s` holds the `segment_blocks` blocks
    /// from `first_segment_block + s × segment_blocks` ([`Log::segment_of`] the other way).
    #[must_use]
    pub fn first_segment_block(&self) -> u64 {
        self.first_segment_block
    }

    /// Free segments left.
    #[must_use]
    pub fn free_segments(&self) -> u32 {
        lock(&self.space).free_count()
    }

    pub(crate) fn check_failed(&self) -> Result<()> {
        if self.poisoned() {
            return Err(LogError::Failed { first_error: POISONED.into() });
        }
        self.writer.check_failed()
    }

    /// Whether a thread panicked while holding one of the log's own locks (the writer's are
    /// checked by [`Writer::check_failed`]): fail-stop, as after an I/O error.
    pub(crate) fn poisoned(&self) -> bool {
        self.space.is_poisoned()
            || self.sb.is_poisoned()
            || self.flush.is_poisoned()
            || self.checkpoint_snapshot.is_poisoned()
    }

    pub(crate) fn fail(&self, e: MediaError) -> LogError {
        let e = self.writer.fail(e);
        self.flush_cv.notify_all();
        self.gather_cv.notify_all();
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

    pub(crate) fn segment_start(&self, segment: u32) -> u64 {
        // Exact for every segment of the log (the superblock's `validate` checked that they all
        // fit the device); a segment past it (a bug, or a value from the device that escaped a
        // check) saturates to a block no device has, so I/O on it fails instead of wrapping.
        let offset = u64::from(segment).saturating_mul(u64::from(self.segment_blocks));
        self.first_segment_block.saturating_add(offset)
    }
}

/// crc32c of `data` zero-padded to `block_size`.
pub(crate) fn crc_padded(data: &[u8], block_size: usize) -> u32 {
    crc_pad(crc32c::crc32c(data), data.len(), block_size)
}

/// `crc` (of `len` bytes) extended over zeros up to `block_size`.
pub(crate) fn crc_pad(crc: u32, len: usize, block_size: usize) -> u32 {
    if len >= block_size {
        return crc;
    }
    crate::format::crc_zeros(crc, block_size - len)
}

#[cfg(test)]
mod poison_tests {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    use std::sync::Arc;

    use tally_media::{Device, MemDevice};

    use super::*;
    use crate::Transaction;

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

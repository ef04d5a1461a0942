//! Segment cleaning at the file-system level: decide which records of the oldest segments are
//! still live, re-commit those (with their data blocks) through [`tally_log::Log::clean`], and
//! let the checkpoint free the segments.
//!
//! A record is live when it is the current record of its object. A tombstone (removed name,
//! freed inode, hole) is live while any older record of the same object is still in the log:
//! dropping it earlier would let the older record come back at the next mount. Relocated
//! records keep their versions, so replay (which goes by version) is indifferent to where they
//! now sit in the log.
//!
//! Cleaning runs when the free segments run low (before an operation that needs space), and on
//! demand ([`Fs::clean`]). It is skipped while explicit transactions are open: their changes are
//! in memory only, and liveness must be judged against what is on media.
//!
//! Hot and cold. The log frees a stream's segments only from its head, so whatever survives
//! cleaning must not go back to the tail of a stream that takes fresh writes: it would be at
//! the head again a pass later, mostly still live, and be copied again (under LFS's 90/10
//! skew the hot blocks die where they were written, and the cold ones were copied on every
//! pass: the skew bought nothing). So, from four streams, the last two take no fresh writes
//! ([`cleaning_streams`]): what survives the cleaning of a fresh stream's head goes to the
//! warm stream, what survives the warm stream's goes to the cold one (and the cold stream's
//! onto itself); from three streams, everything relocated goes to the last; one or two
//! streams keep both for fresh writes and relocate onto the last. A fresh stream's head has
//! then had the whole chain's time to die, data that survived once but dies young (hot data
//! caught by cleaning) dies in the warm stream instead of diluting the cold one, and heads are
//! chosen by cost-benefit, whose age is that of the head's youngest live block in versions
//! (relocation keeps versions). The stream a file maps to is not on media (`Fs::stream_of`),
//! so an image made before this mounts as it is: its files' next writes go to the fresh
//! streams, and what it holds on the others is cleaned like the rest. Why recovery is
//! indifferent to the stream a copy lands on: `tally_log::clean` (durability, checkpoints,
//! dependencies, runs) and the versions above (an older version never replaces a newer one,
//! whichever stream or snapshot it comes from).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tally_log::{LogError, Transaction, TxId};

use crate::fs::lock;
use crate::mutant::FsMutant;
use crate::record::{Record, DATA_HOLE};
use crate::state::{Cached, Key, State};
use crate::sync::MutexGuard;
use crate::types::Ino;
use crate::{Fs, FsError, Result};

/// What [`Fs::clean`] did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct FsCleanReport {
    /// The log's report (segments freed, bytes written, …).
    pub log: tally_log::CleanReport,
    /// Records read from the cleaned segments.
    pub records_read: u64,
    /// Records re-committed because they are live.
    pub records_relocated: u64,
    /// Data blocks copied with them.
    pub data_blocks_relocated: u64,
}

/// A segment cleaned under the state lock: what was done, and the log's cleaning to finish
/// ([`Fs::finish_clean_after`]: the copies made durable, the segment freed).
pub(crate) struct Cleaned {
    stream: u16,
    report: FsCleanReport,
    pending: Option<tally_log::CleanPending>,
}

/// Blocks one packed relocation transaction takes at most (records and data), for segments of
/// at least `2 *` this many blocks plus two. Packs are cut to the blocks left in the segment
/// they land in (so a large pack wastes nothing at a segment's end), and a unit of records
/// holds some 80 extent records: packs of up to 128 blocks cost a unit per 80 data blocks at
/// most, as the file system's own large writes do (with 32-block packs, a segment filled by
/// large writes took more blocks once relocated than it had: cleaning it lost space).
const PACK_BLOCKS: u64 = 128;
/// Conservative bytes of the log's unit header, and of its body header per transaction and per
/// data block and record (the log's format; used only to size packs).
const UNIT_HEADER: u64 = 128;
const BODY_HEADER: u64 = 16;
const PER_DATA: u64 = 4;
const PER_RECORD: u64 = 4;

/// Streams of a log of `streams` kept for what survives cleaning (module documentation, "Hot
/// and cold"): two (a warm one for what survived one cleaning, a cold one for what survived
/// two) from four streams, one from three; none from one or two, which keep every stream for
/// fresh writes (and their cross-stream ordering) and relocate onto the last.
pub(crate) fn cleaning_streams(streams: u16) -> u16 {
    match streams {
        0..=2 => 0,
        3 => 1,
        _ => 2,
    }
}

/// Relocated keys of one pack and, for data, the block's index in it and its bytes (held in
/// memory once the block map points at the copy, until the copy is durable).
type Moved = Vec<(Key, Option<(u32, Arc<Vec<u8>>)>)>;

/// Packs, each with the last old transaction it carries records of.
type Packs = Vec<(TxId, Pack)>;

/// What the packs handed with each old transaction moved, in their order.
type MovedBy = HashMap<TxId, std::collections::VecDeque<Moved>>;

/// One packed relocation: the live records (and data blocks) of consecutive old transactions.
struct Pack {
    t: Transaction,
    /// The last old transaction whose records it carries.
    last: Option<TxId>,
    record_bytes: u64,
    /// Relocated keys and, for data, the block's index in the pack.
    moved: Moved,
}

impl Pack {
    fn new(stream: u16) -> Pack {
        Pack {
            t: Transaction::new(stream),
            last: None,
            record_bytes: BODY_HEADER,
            moved: Vec::new(),
        }
    }

    /// Blocks the pack would take with `data` more data blocks and `bytes` more record bytes.
    fn blocks_with(&self, bs: u64, data: u64, bytes: u64) -> u64 {
        let n = self.moved.iter().filter(|m| m.1.is_some()).count() as u64 + data;
        let body = self.record_bytes + bytes + n * PER_DATA;
        body.div_ceil(bs - UNIT_HEADER).max(1) + n
    }
}

/// Blocks left in the current segment after a pack of `blocks` is committed with `left` left
/// before it: it lands in the current segment if it fits, else at the start of the next.
fn pack_lands(left: u64, blocks: u64, seg_blocks: u64) -> u64 {
    let after = if blocks <= left { left - blocks } else { seg_blocks.saturating_sub(blocks) };
    // One block holds no pack with data: the next one starts the next segment.
    if after < 2 {
        seg_blocks
    } else {
        after
    }
}

/// What is live in an old transaction: each record (and data block, read) to relocate.
type LiveOf = Vec<(Key, Record, Option<Vec<u8>>)>;

/// Live data blocks of a segment about to be cleaned, read with the state lock given up: by
/// device block, the crc they were checked against and their bytes (`Fs::maintain`).
type PreRead = HashMap<u64, (u32, Vec<u8>)>;

/// Most data blocks cleaning reads in one request (1 MiB of 4 KiB blocks).
const READ_RUN_BLOCKS: usize = 256;

/// A live data block cleaning must read: where its bytes go in the [`LiveOf`], where it is
/// on the device, its crc, and whose it is (for the error).
struct Wanted {
    out: usize,
    at: u64,
    crc: u32,
    ino: Ino,
    block: u64,
}

impl Fs {
    /// Clean the `segments` oldest segments of `stream` (at most all but its current one, as
    /// they are when called), one at a time. As `Fs::maintain` does, the state lock is taken
    /// for one segment at a time, and given up while the segment's records and live data
    /// blocks are read and the log is made durable; operations go on meanwhile.
    ///
    /// # Errors
    /// `EBUSY` while explicit transactions are open (one opened between segments stops the
    /// cleaning there, the segments cleaned before it stay cleaned), `ENOSPC` when the live
    /// records do not fit (nothing changed by that segment), I/O errors, corrupted records.
    pub fn clean(&self, stream: u16, segments: usize) -> Result<FsCleanReport> {
        let old = {
            let st = lock(&self.state)?;
            self.cleanable(&st)?;
            self.log.chain(stream)?.len().saturating_sub(1)
        };
        let mut report = FsCleanReport::default();
        for _ in 0..segments.min(old) {
            let Some(ahead) = self.log.oldest_segment_transactions(stream)? else { break };
            let st = lock(&self.state)?;
            self.cleanable(&st)?;
            let (mut st, mut pre) = self.prepare_unlocked(st, &ahead.1)?;
            let cleaned = self.clean_one(&mut st, stream, ahead, &mut pre)?;
            let (st, r) = self.finish_clean_after(st, cleaned);
            drop(st);
            let r = r?;
            report.records_read += r.records_read;
            report.records_relocated += r.records_relocated;
            report.data_blocks_relocated += r.data_blocks_relocated;
            let (a, b) = (&mut report.log, r.log);
            a.checkpointed_seq = b.checkpointed_seq.or(a.checkpointed_seq);
            a.relocated.extend(b.relocated);
            a.transactions_read += b.transactions_read;
            a.transactions_relocated += b.transactions_relocated;
            a.segments_freed += b.segments_freed;
            a.bytes_written += b.bytes_written;
        }
        Ok(report)
    }

    /// May cleaning go on under `st`: no explicit transaction open (`EBUSY`), not read-only?
    fn cleanable(&self, st: &State) -> Result<()> {
        if !st.txns.open.is_empty() {
            return Err(FsError::Busy);
        }
        if let Some(e) = &st.failed {
            return Err(FsError::read_only(e));
        }
        Ok(())
    }

    /// When space is low: clean the oldest segment of the stream whose oldest segment scores
    /// best by cost-benefit, if relocating that frees space (`max_live_percent` of a segment at
    /// most is live). The lock is given up while the chosen head's records are read
    /// ([`Fs::choose_head`]) and while its live data blocks are read and the log is made
    /// durable, as `Fs::maintain` does (`prepare_unlocked`). Returns the lock taken again (or
    /// still held), and whether that freed a segment or gained blocks.
    pub(crate) fn clean_some<'a>(
        &'a self,
        st: MutexGuard<'a, State>,
        max_live_percent: u64,
    ) -> Result<(MutexGuard<'a, State>, Result<bool>)> {
        let (st, chosen) = self.choose_head(st, max_live_percent)?;
        let (stream, l) = match chosen {
            Ok(Some(chosen)) => chosen,
            Ok(None) => return Ok((st, Ok(false))),
            Err(e) => return Ok((st, Err(e))),
        };
        let (mut st, mut pre) = self.prepare_unlocked(st, &l.txs)?;
        if !st.txns.open.is_empty() {
            return Ok((st, Ok(false)));
        }
        let seg = u64::from(self.segment_blocks);
        let cleaned = match self.clean_one(&mut st, stream, (l.segment, l.txs), &mut pre) {
            Ok(cleaned) => cleaned,
            Err(e) => return Ok((st, Err(e))),
        };
        let (st, finished) = self.finish_clean_after(st, cleaned);
        let st = match st {
            Some(st) => st,
            None => lock(&self.state)?,
        };
        let gained = finished.map(|r| gained(&r, l.live_blocks, seg));
        Ok((st, gained))
    }

    /// The choice of [`Fs::clean_some`]: the stream whose oldest segment to clean, measured.
    /// The heads are ranked under the lock ([`Fs::heads_ranked`], which reads nothing); each
    /// head tried is read with the lock given up and measured under it again, if it is still
    /// its stream's oldest segment (else it is read again there, `Fs::measure_oldest_of`).
    /// Returns the lock taken again (or still held) and the choice (`None`: no head gains,
    /// or an explicit transaction is open).
    fn choose_head<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        max_live_percent: u64,
    ) -> Result<(MutexGuard<'a, State>, Result<Option<Chosen>>)> {
        let ranked = match self.heads_ranked(&st) {
            Ok(ranked) => ranked,
            Err(e) => return Ok((st, Err(e))),
        };
        for stream in ranked {
            drop(st);
            let ahead = self.log.oldest_segment_transactions(stream);
            st = lock(&self.state)?;
            if !st.txns.open.is_empty() {
                return Ok((st, Ok(None)));
            }
            let measured = ahead
                .map_err(FsError::from)
                .and_then(|ahead| self.measure_oldest_of(&st, stream, ahead))
                .and_then(|l| match l {
                    Some(l) => Ok(self.head_gains(&st, stream, &l, max_live_percent)?.then_some(l)),
                    None => Ok(None),
                });
            match measured {
                Ok(Some(l)) => return Ok((st, Ok(Some((stream, l))))),
                Ok(None) => {}
                Err(e) => return Ok((st, Err(e))),
            }
        }
        Ok((st, Ok(None)))
    }

    /// The streams whose oldest segment (not their current one) may be cleaned, best first by
    /// cost-benefit; nothing while explicit transactions are open. Reads nothing.
    fn heads_ranked(&self, st: &State) -> Result<Vec<u16>> {
        if !st.txns.open.is_empty() {
            return Ok(Vec::new());
        }
        let seg = u64::from(self.segment_blocks);
        // Cost-benefit (LFS): a head's benefit is the space it frees, (1 − u), weighed by
        // how long its data has been left to die (its age: the versions handed out since its
        // youngest live block was written; relocation keeps versions, so cold data stays old
        // wherever it was moved), against the cost of reading it and writing its live part,
        // (1 + u). `u` comes from the live data blocks counted from the block maps
        // (`live.rs`), so choosing reads nothing; the chosen head is then measured exactly
        // (its records too) before it is cleaned. Among equals (every head full of live data),
        // the longest chain: moving its head on is what reaches the dead space behind it.
        // The chain's length is not the age: the cold stream's chain is long because every
        // survivor lands there, not because its head has had time to die. The counts are
        // kept as the block maps change (`State::usage`): no walk of the block maps here.
        let mut ranked: Vec<(f64, usize, u16)> = Vec::new();
        for s in 0..self.streams {
            let chain = self.log.chain(s)?;
            let Some(&head) = chain.first().filter(|_| chain.len() > 1) else { continue };
            let l = st.usage.get(head);
            let u = (l.blocks as f64 / seg as f64).min(1.0);
            let age = st.next_ver.saturating_sub(l.youngest_ver).max(1) as f64;
            ranked.push(((1.0 - u) * age / (1.0 + u), chain.len(), s));
        }
        ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)));
        Ok(ranked.into_iter().map(|(_, _, s)| s).collect())
    }

    /// Does cleaning `stream`'s oldest segment, measured as `l`, gain space?
    fn head_gains(
        &self,
        st: &State,
        stream: u16,
        l: &Liveness,
        max_live_percent: u64,
    ) -> Result<bool> {
        let seg = u64::from(self.segment_blocks);
        // Packed, a live part no larger than the segment never needs more than one new
        // segment (packs fill the current segment's end, the rest fits a fresh one; packing
        // never makes records larger), so cleaning it never loses a segment, and moves the
        // stream's head on to the segments behind it, which may gain.
        if l.live_blocks > seg || l.live_blocks * 100 > seg * max_live_percent {
            return Ok(false);
        }
        // A head relocated onto its own stream (the cold one) goes to that stream's tail:
        // nearly full, that pays only to reach dead space behind it in the chain (at least a
        // segment's worth of blocks not holding live data between the head and the current
        // segment); without any, it would cycle (the same chain again, a segment written,
        // nothing freed), and the heads of the other streams would never be tried.
        let onto_itself = self.relocation_stream(stream) == stream;
        if onto_itself && l.live_blocks + seg / 8 > seg {
            let chain = self.log.chain(stream)?;
            let behind = chain.get(1..chain.len().saturating_sub(1)).unwrap_or_default();
            let dead: u64 =
                behind.iter().map(|&s| seg.saturating_sub(st.usage.get(s).blocks)).sum();
            return Ok(dead >= seg);
        }
        Ok(true)
    }

    /// Streams that take no fresh writes (`Fs::stream_of` maps files and threads to the
    /// others): what survives cleaning goes there (`Fs::relocation_stream`).
    pub(crate) fn fresh_streams(&self) -> u16 {
        self.streams.saturating_sub(cleaning_streams(self.streams)).max(1)
    }

    /// The stream the live records of `stream`'s cleaned head are relocated to (module
    /// documentation, "Hot and cold").
    pub(crate) fn relocation_stream(&self, stream: u16) -> u16 {
        let last = self.streams.saturating_sub(1);
        match cleaning_streams(self.streams) {
            2 if stream < last - 1 => last - 1,
            _ => last,
        }
    }

    pub(crate) fn pack_blocks(&self) -> u64 {
        PACK_BLOCKS.min((u64::from(self.segment_blocks) / 2).saturating_sub(2)).max(2)
    }

    /// Clean `stream`'s oldest segment, `read` as [`Fs::clean_oldest`] takes it; the caller
    /// finishes the cleaning ([`Fs::finish_clean_after`]). Nothing is cleaned while a cleaning
    /// of `stream` is finishing with the state lock given up: its segment is still the
    /// stream's oldest, and would be relocated again.
    fn clean_one(
        &self,
        st: &mut State,
        stream: u16,
        read: (u32, Vec<tally_log::RecoveredTx>),
        pre: &mut PreRead,
    ) -> Result<Cleaned> {
        self.cleanable(st)?;
        let finishing = self
            .clean_finishing
            .get(usize::from(stream))
            .is_some_and(|f| f.load(Ordering::Acquire));
        if finishing || self.log.chain(stream)?.len() < 2 {
            return Ok(Cleaned { stream, report: FsCleanReport::default(), pending: None });
        }
        self.clean_oldest(st, stream, Some(read), pre)
    }

    /// The log's end of a cleaning (`Log::clean_finish`): the relocations made durable (a
    /// flush) and the segment freed by the log's checkpoint (a superblock write and its
    /// flush); the stream's finishing mark cleared, whatever the outcome. On an error the
    /// segment stays, and the caller stops the file system.
    fn finish_log(&self, cleaned: Cleaned) -> std::result::Result<FsCleanReport, LogError> {
        let Cleaned { stream, mut report, pending } = cleaned;
        if let Some(pending) = pending {
            let finished = self.log.clean_finish(pending);
            if let Some(f) = self.clean_finishing.get(usize::from(stream)) {
                f.store(false, Ordering::Release);
            }
            report.log = finished?;
        }
        Ok(report)
    }

    /// Finish `cleaned` after [`Fs::clean_one`] under `st` ([`Fs::finish_log`], then the
    /// moved blocks' bytes, held in memory until durable, let go). While at least
    /// [`CLEAN_BELOW_FREE_PERCENT`] of the segments is free, with the lock given up (returns
    /// `None` for it): the stream is marked finishing first, under the lock the relocations
    /// were committed under, so a cleaning that takes it meanwhile leaves the stream alone
    /// (`clean_one`); operations go on, reading the moved blocks from memory; the bytes are
    /// let go if the lock is free then (else by the next durable wait or maintenance round).
    /// While space is low, under the lock, as all cleaning was until 28 Nov, and the lock is
    /// returned: cleaning is then what the operations are waiting for, and several cleaners
    /// (the maintenance thread, operations short of space) clean side by side. A first
    /// version gave the lock up there too and kept each stream's cleanings apart with a lock
    /// held from the live blocks' read to the segment's freeing: in issue 16's mixed run (a
    /// 90 %-full image) the appenders' p99 beside the cleaner was about 1.5x higher
    /// (docs/bench/fs.md, 28 Nov). A failure stops the file system (read-only).
    fn finish_clean_after<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        cleaned: Cleaned,
    ) -> (Option<MutexGuard<'a, State>>, Result<FsCleanReport>) {
        let seg = u64::from(self.segment_blocks);
        let total = self.log.device().geometry().block_count / seg.max(1);
        let low = u64::from(self.log.free_segments()) * 100 < total * CLEAN_BELOW_FREE_PERCENT;
        let moved = cleaned.pending.is_some();
        if low {
            let finished = self.finish_log(cleaned).map_err(|e| Fs::fail_locked(&mut st, e));
            if moved && finished.is_ok() {
                self.prune_cache(&mut st);
            }
            return (Some(st), finished);
        }
        if moved {
            if let Some(f) = self.clean_finishing.get(usize::from(cleaned.stream)) {
                f.store(true, Ordering::Release);
            }
        }
        drop(st);
        let finished = self.finish_log(cleaned).map_err(|e| self.fail(e));
        if moved && finished.is_ok() {
            // Only tried, as before: cleaning is background work. A poisoned lock is
            // reported by the next operation.
            let _ = self.prune_cache_in_slices(self.durable_upto(), false);
        }
        (None, finished)
    }

    /// Clean `stream`'s oldest segment: its live records are packed into as few transactions
    /// as fit [`PACK_BLOCKS`], re-committed on the stream, and the log's checkpoint frees it.
    /// `read`: the segment and its transactions as read before (with the state lock given up,
    /// or by measuring), so they are not read a second time; used only while that segment is
    /// still the stream's oldest (a full segment's transactions never change), and the log
    /// cleans only if they are exactly its own ([`tally_log::Log::clean_read_to`]; if not,
    /// nothing is written and the segment is read again here, under the lock).
    fn clean_oldest(
        &self,
        st: &mut State,
        stream: u16,
        read: Option<(u32, Vec<tally_log::RecoveredTx>)>,
        pre: &mut PreRead,
    ) -> Result<Cleaned> {
        let mut read = read;
        // Twice at most: a read under the lock is the log's own (nothing changes it meanwhile).
        for _ in 0..2 {
            let mut report = FsCleanReport::default();
            let Some(txs) = self.oldest_transactions(stream, read.take(), pre)? else {
                return Ok(Cleaned { stream, report, pending: None });
            };
            let (packs, seen) = self.pack_live(st, stream, &txs, pre, &mut report)?;
            let Some((pending, moved)) = self.relocate_packs(st, stream, &txs, packs)? else {
                // Not the log's transactions (the segment changed since they were read):
                // nothing was written; read the oldest segment again, under the lock.
                pre.clear();
                continue;
            };
            self.account_relocations(st, seen, pending.relocated(), moved, &mut report);
            return Ok(Cleaned { stream, report, pending: Some(pending) });
        }
        Err(FsError::corrupted(
            "log cleaning",
            format!("stream {stream}: the log refused the transactions it had just read"),
        ))
    }

    /// Step 1 of [`Fs::clean_oldest`]: the transactions of `stream`'s oldest segment — `read`
    /// when it is still that segment's, else read again; `None` when the chain holds only the
    /// current segment. Blocks read ahead (`pre`) are of `read`'s segment: forgotten when it
    /// is not used.
    fn oldest_transactions(
        &self,
        stream: u16,
        read: Option<(u32, Vec<tally_log::RecoveredTx>)>,
        pre: &mut PreRead,
    ) -> Result<Option<Vec<tally_log::RecoveredTx>>> {
        let oldest = self.log.chain(stream)?.first().copied();
        Ok(match read {
            Some((segment, txs)) if Some(segment) == oldest => Some(txs),
            _ => {
                pre.clear();
                self.log.oldest_segment_transactions(stream)?.map(|(_, txs)| txs)
            }
        })
    }

    /// Step 2 of [`Fs::clean_oldest`]: the live records of `txs` packed into transactions of
    /// at most [`PACK_BLOCKS`], each cut to the blocks left in the segment it will land in,
    /// each with the last old transaction it carries records of; and every key read.
    fn pack_live(
        &self,
        st: &mut State,
        stream: u16,
        txs: &[tally_log::RecoveredTx],
        pre: &mut PreRead,
        report: &mut FsCleanReport,
    ) -> Result<(Packs, Vec<Key>)> {
        let bs = u64::from(self.bs);
        let limit = self.pack_blocks();
        let seg_blocks = u64::from(self.segment_blocks);
        let to = self.relocation_stream(stream);
        let mut left = u64::from(self.log.blocks_left_in_segment(to)?);
        let tombstones_kept = self.mutant != Some(FsMutant::TombstoneDroppedEarly);
        // The mutant forgets the checkpoint snapshot while judging tombstones.
        let checkpoint_ver = st.checkpoint_ver;
        if self.mutant == Some(FsMutant::CheckpointTombstoneDropped) {
            st.checkpoint_ver = None;
        }
        let mut seen: Vec<Key> = Vec::new();
        // Each pack is handed to the log with the last old transaction it carries records of;
        // an old transaction's records may be cut across packs (`Log::clean_split`).
        let mut packs: Vec<(TxId, Pack)> = Vec::new();
        let mut open = Pack::new(to);
        for rtx in txs {
            let live = self.live_of(st, rtx, tombstones_kept, &mut seen, pre, report)?;
            for (key, rec, block) in live {
                let bytes = PER_RECORD + rec.encode().len() as u64;
                // A pack is cut to the blocks left in the segment it will land in, so packs
                // fill segments to their ends instead of leaving a hole wherever the next one
                // did not fit (a hole is never reused: the log only appends).
                let fits = limit.min(left.max(2));
                let grown = open.blocks_with(bs, u64::from(block.is_some()), bytes);
                if !open.moved.is_empty() && grown > fits {
                    let blocks = open.blocks_with(bs, 0, 0);
                    let last = open.last.unwrap_or(rtx.id);
                    packs.push((last, std::mem::replace(&mut open, Pack::new(to))));
                    left = pack_lands(left, blocks, seg_blocks);
                }
                let rec = match (rec, block) {
                    (Record::Extent { ver, ino, block, crc, .. }, Some(buf)) => {
                        // The bytes were checked against `crc` when read.
                        let buf = Arc::new(buf);
                        let idx = open.t.data_shared(buf.clone(), crc);
                        open.moved.push((key, Some((idx, buf))));
                        Record::Extent { ver, ino, block, data: idx, crc }
                    }
                    (rec, _) => {
                        open.moved.push((key, None));
                        rec
                    }
                };
                let bytes = rec.encode();
                open.record_bytes += PER_RECORD + bytes.len() as u64;
                open.t.record(bytes);
                open.last = Some(rtx.id);
            }
        }
        st.checkpoint_ver = checkpoint_ver;
        if let Some(last) = open.last {
            packs.push((last, open));
        }
        Ok((packs, seen))
    }

    /// Step 3 of [`Fs::clean_oldest`]: the packs handed to the log, which checks that `txs`
    /// are its oldest segment's transactions (`None`, nothing written, when they are not) and
    /// re-commits the packs; with what each pack moved, by the old transaction it was handed
    /// with. Making them durable and freeing the segment is left to
    /// [`Fs::finish_clean_after`]. The log must clean exactly `txs`: if it handed fewer to
    /// relocate, the file system stops (read-only) and the segment is not freed.
    fn relocate_packs(
        &self,
        st: &mut State,
        stream: u16,
        txs: &[tally_log::RecoveredTx],
        packs: Packs,
    ) -> Result<Option<(tally_log::CleanPending, MovedBy)>> {
        let expected: Vec<TxId> = txs.iter().map(|t| t.id).collect();
        let mut handed: HashMap<TxId, Vec<Transaction>> = HashMap::new();
        let mut moved: MovedBy = HashMap::new();
        for (at, p) in packs {
            handed.entry(at).or_default().push(p.t);
            moved.entry(at).or_default().push_back(p.moved);
        }
        let mut i = 0;
        let to = self.relocation_stream(stream);
        let pending = self.log.clean_read_to_deferred(stream, txs, to, |rtx| {
            // The log cleans the transactions handed; anything else would leave a pack out.
            if expected.get(i) != Some(&rtx.id) {
                return Err(LogError::Invalid(format!(
                    "cleaning planned transaction {:?}, the log cleaned {:?}",
                    expected.get(i),
                    rtx.id
                )));
            }
            i += 1;
            Ok(handed.remove(&rtx.id).unwrap_or_default())
        })?;
        let Some(pending) = pending else { return Ok(None) };
        if i != expected.len() {
            // Some relocations are missing: stop before the segment is freed (the pending
            // cleaning is dropped unfinished) or anything else is written.
            drop(pending);
            let e = || {
                let n = expected.len();
                FsError::corrupted(
                    "log cleaning",
                    format!("stream {stream}: the log cleaned {i} of {n} transactions"),
                )
            };
            st.failed.get_or_insert_with(|| std::sync::Arc::new(e()));
            return Err(e());
        }
        Ok(Some((pending, moved)))
    }

    /// Step 4 of [`Fs::clean_oldest`]: the DRAM state follows the move — every key read is
    /// counted again where it now is (relocated data blocks get their new address and
    /// transaction, and their bytes are held in memory until the copy is durable, as a
    /// write's are: reads meanwhile must not go to the device), and tombstones of keys no
    /// longer in the log are forgotten.
    fn account_relocations(
        &self,
        st: &mut State,
        seen: Vec<Key>,
        relocated: &[(TxId, tally_log::CommitInfo)],
        mut moved: MovedBy,
        report: &mut FsCleanReport,
    ) {
        for k in &seen {
            st.uncount(k);
        }
        for (old, info) in relocated {
            let pack = moved.get_mut(old).and_then(std::collections::VecDeque::pop_front);
            for (key, data) in pack.unwrap_or_default() {
                st.count(&key);
                report.records_relocated += 1;
                if let (Key::Block(ino, b), Some((idx, bytes))) = (&key, data) {
                    report.data_blocks_relocated += 1;
                    let Some(block) = st.inodes.get_mut(ino).and_then(|i| i.blocks.get_mut(b))
                    else {
                        continue;
                    };
                    st.usage.remove(block);
                    block.addr = info.data_start + u64::from(idx);
                    block.tx = Some(info.ticket);
                    st.usage.add(block);
                    if self.mutant != Some(FsMutant::RelocatedReadEarly) {
                        block.data = Some(bytes);
                        let c = Cached { tx: info.ticket, ino: *ino, block: *b, ver: block.ver };
                        st.cached.push(c);
                        st.cached_bytes += self.bs as usize;
                    }
                }
            }
        }
        for k in seen {
            if !st.in_log(&k) {
                st.tombs.remove(&k);
                if let Key::Inode(ino) = k {
                    st.freed.remove(&ino);
                }
            }
        }
    }

    /// The live records of `rtx`, with the data blocks of live extents read (and checked).
    fn live_of(
        &self,
        st: &State,
        rtx: &tally_log::RecoveredTx,
        tombstones_kept: bool,
        seen: &mut Vec<Key>,
        pre: &mut PreRead,
        report: &mut FsCleanReport,
    ) -> Result<LiveOf> {
        let mut out = Vec::new();
        let mut wanted = Vec::new();
        for bytes in &rtx.records {
            let rec = Record::decode(bytes).map_err(|e| LogError::Corrupted {
                what: "file-system record",
                block: rtx.data_start,
                reason: e.to_string(),
            })?;
            let key = Key::of(&rec);
            seen.push(key.clone());
            report.records_read += 1;
            if !live(st, &rec, &key, tombstones_kept) {
                continue;
            }
            if let Record::Extent { ino, block, data, crc, .. } = rec {
                if data != DATA_HOLE {
                    let at = rtx.data_start + u64::from(data);
                    // Read with the lock given up (`Fs::maintain`): the block of this record
                    // in a segment not freed since, its crc checked when read.
                    if let Some((_, bytes)) = pre.remove(&at).filter(|(c, _)| *c == crc) {
                        out.push((key, rec, Some(bytes)));
                        continue;
                    }
                    wanted.push(Wanted { out: out.len(), at, crc, ino, block });
                }
            }
            out.push((key, rec, None));
        }
        self.read_live_blocks(&mut wanted, &mut out)?;
        Ok(out)
    }

    /// Read the live data blocks `wanted` into `out`, each run of adjacent blocks (at most
    /// [`READ_RUN_BLOCKS`]) in one request, and check each block's crc. One request per block
    /// made cleaning a segment of small files some thousands of 4 KiB reads (issue 16's mixed
    /// run).
    fn read_live_blocks(&self, wanted: &mut [Wanted], out: &mut LiveOf) -> Result<()> {
        self.read_runs(wanted, |w, bytes| {
            if crc32c::crc32c(bytes) != w.crc {
                return Err(LogError::Corrupted {
                    what: "data block",
                    block: w.at,
                    reason: format!("checksum mismatch (block {} of inode {})", w.block, w.ino),
                }
                .into());
            }
            if let Some(slot) = out.get_mut(w.out) {
                slot.2 = Some(bytes.to_vec());
            }
            Ok(())
        })
    }

    /// Call `each` with every block of `wanted` as read, in runs of adjacent blocks.
    fn read_runs(
        &self,
        wanted: &mut [Wanted],
        mut each: impl FnMut(&Wanted, &[u8]) -> Result<()>,
    ) -> Result<()> {
        wanted.sort_unstable_by_key(|w| w.at);
        let bs = self.bs as usize;
        let mut rest: &[Wanted] = wanted;
        while let Some(first) = rest.first() {
            let run = rest
                .iter()
                .zip(first.at..)
                .take(READ_RUN_BLOCKS)
                .take_while(|(w, at)| w.at == *at)
                .count();
            let (now, later) = rest.split_at(run);
            rest = later;
            let mut buf = vec![0u8; run * bs];
            self.log.device().read(first.at, &mut buf).map_err(LogError::from)?;
            for (w, bytes) in now.iter().zip(buf.chunks_exact(bs)) {
                each(w, bytes)?;
            }
        }
        Ok(())
    }

    /// The data blocks of `txs` live now (judged under the state lock), to read once it is
    /// given up ([`Fs::read_ahead_unlocked`]).
    fn live_blocks_wanted(st: &State, txs: &[tally_log::RecoveredTx]) -> Vec<Wanted> {
        let mut wanted = Vec::new();
        for rtx in txs {
            for bytes in &rtx.records {
                // A record that does not decode is reported by the cleaning itself.
                let Ok(rec) = Record::decode(bytes) else { continue };
                let Record::Extent { ino, block, data, crc, .. } = rec else { continue };
                if data == DATA_HOLE || !live(st, &rec, &Key::of(&rec), true) {
                    continue;
                }
                let at = rtx.data_start + u64::from(data);
                wanted.push(Wanted { out: 0, at, crc, ino, block });
            }
        }
        wanted
    }

    /// Read `wanted` with no file-system lock held. Why that is sound: the blocks lie in a
    /// segment not yet cleaned, and a segment's blocks never change until it is freed; the
    /// cleaning that uses them runs under the state lock on transactions read before
    /// (`oldest_transactions` checks the segment is still the stream's oldest, and the log
    /// cleans only if they are exactly its own, whose ids are never reused), judges
    /// each record live again, and takes a block read here only for a record still live, at the
    /// same device block and with the same crc (checked here against the bytes). A block not
    /// read here (an error, a crc mismatch, a record live again after an abort) is read under
    /// the lock as before, and reported there.
    fn read_ahead_unlocked(&self, wanted: &mut [Wanted]) -> PreRead {
        let mut pre = PreRead::new();
        let _ = self.read_runs(wanted, |w, bytes| {
            if crc32c::crc32c(bytes) == w.crc {
                pre.insert(w.at, (w.crc, bytes.to_vec()));
            }
            Ok(())
        });
        pre
    }

    /// Before cleaning the segment of `txs` (chosen under `st`): give the state lock up, make
    /// the log durable (so the flush that finishes the cleaning covers only the relocations
    /// and what is committed meanwhile) and read the live data blocks, then take the lock
    /// again.
    fn prepare_unlocked<'a>(
        &'a self,
        st: MutexGuard<'a, State>,
        txs: &[tally_log::RecoveredTx],
    ) -> Result<(MutexGuard<'a, State>, PreRead)> {
        let mut wanted = Self::live_blocks_wanted(&st, txs);
        drop(st);
        self.log.sync().map_err(|e| self.fail(e))?;
        let pre = self.read_ahead_unlocked(&mut wanted);
        Ok((lock(&self.state)?, pre))
    }
}

/// Did the cleaning reported in `r`, of a head measured at `live_blocks` of a segment's `seg`,
/// gain space? It did if it freed a segment, or moved a head less than full (the free part
/// of the segment it left is gained once the chain reaches it). Not if it read nothing: the
/// head was gone, or another cleaning of its stream was finishing (`Fs::clean_one`), and a
/// caller that took that for a gain would read and measure again at once.
fn gained(r: &FsCleanReport, live_blocks: u64, seg: u64) -> bool {
    r.log.segments_freed > 0 || (r.records_read > 0 && live_blocks < seg)
}

/// Is `rec` the record that still defines its object?
pub(crate) fn live(st: &State, rec: &Record, key: &Key, tombstones_kept: bool) -> bool {
    let ver = rec.ver();
    let owner = key.owner();
    // A tombstone written after the checkpoint snapshot in force is needed as long as that
    // snapshot is: a crash recovers the snapshot (which may hold the object) and replays what
    // follows it, so the tombstone must be among what follows.
    let after_checkpoint = st.checkpoint_ver.is_some_and(|c| ver >= c);
    if let (Some(&freed), Record::Free { .. }) = (st.freed.get(&owner), rec) {
        // The free is needed while anything older of the inode is still in the log.
        return freed == ver
            && tombstones_kept
            && (after_checkpoint || st.ino_count.get(&owner).is_some_and(|&c| c > 1));
    }
    if !matches!(key, Key::Fs) && !st.inodes.contains_key(&owner) {
        return false; // freed: everything of it is dead
    }
    let tomb_needed = || {
        tombstones_kept
            && st.tombs.get(key) == Some(&ver)
            && (after_checkpoint || st.key_count.get(key).is_some_and(|&c| c > 1))
    };
    match rec {
        Record::Fs { .. } => ver == st.fs_ver,
        Record::Inode { .. } => st.inodes.get(&owner).is_some_and(|i| i.ver == ver),
        Record::Free { .. } => false,
        Record::Dentry { dir, name, ino, .. } => {
            if *ino == 0 {
                return tomb_needed();
            }
            st.inodes
                .get(dir)
                .and_then(|i| i.dir.as_ref())
                .and_then(|d| d.entries().get(name))
                .is_some_and(|d| d.ver == ver)
        }
        Record::Extent { ino, block, data, .. } => {
            if *data == DATA_HOLE {
                return tomb_needed();
            }
            st.inodes.get(ino).and_then(|i| i.blocks.get(block)).is_some_and(|b| b.ver == ver)
        }
        Record::Xattr { ino, name, value, .. } => {
            if value.is_none() {
                return tomb_needed();
            }
            st.inodes.get(ino).and_then(|i| i.xattrs.get(name)).is_some_and(|x| x.ver == ver)
        }
    }
}

/// What one [`Fs::maintain`] round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct MaintainReport {
    /// Committed changes were made durable (data was held in memory, or a flush was due).
    pub synced: bool,
    /// Segments cleaning returned to the free pool.
    pub segments_freed: u32,
    /// Of the segments cleaned, those cleaned because less than half of them was live.
    pub mostly_dead_cleaned: u32,
}

/// Cleaning starts when fewer than this fraction (in percent) of the segments are free.
const CLEAN_BELOW_FREE_PERCENT: u64 = 25;
/// ... but `maintain` cleans ahead of need only segments at most this live (in percent): on a
/// fuller file system the free quarter cannot be had, and moving fuller segments early only
/// costs writes. Operations clean any segment whose cleaning gains space when they need it.
const MAINTAIN_MAX_LIVE_PERCENT: u64 = 75;

impl Fs {
    /// The start of every maintenance round: make committed changes durable when something
    /// committed is waiting (other than parts of an open large transaction, flushed with its
    /// close, not every round), or else release from memory the data that became durable by
    /// other means (fsyncs, commits). True when it synced.
    pub(crate) fn make_durable(&self) -> Result<bool> {
        let dirty = (0..self.streams).any(|s| {
            self.whole_committed
                .get(usize::from(s))
                .is_some_and(|last| last.load(Ordering::Relaxed) > self.log.durable_seq(s))
        });
        if dirty {
            self.sync()?;
        } else {
            self.prune_cache_in_slices(self.durable_upto(), true)?;
        }
        Ok(dirty)
    }

    /// One round of background work: make committed changes durable (bounding what a crash can
    /// lose to one round, as ext4's commit interval does, and releasing the data held in memory
    /// until durable); clean each stream's oldest segment while less than half of it is live
    /// (thorough cleaning: what is live moves, the segment is freed); then clean the oldest
    /// segments while less than a quarter of the log is free. Skips cleaning while explicit
    /// transactions are open.
    ///
    /// # Errors
    /// I/O errors (the file system is then read-only).
    pub fn maintain(&self) -> Result<MaintainReport> {
        self.submit_deferred();
        let mut report =
            MaintainReport { synced: self.make_durable()?, ..MaintainReport::default() };
        let seg = u64::from(self.segment_blocks);
        let total = self.log.device().geometry().block_count / seg;
        // The state lock is taken for one segment at a time and given up between segments (as
        // many calls of `Fs::clean` would): a round may clean hundreds of segments after a
        // burst of overwrites (each read, checked and its live part moved), and operations
        // waiting for the lock meanwhile would stall for all of it (seconds, under SQLite).
        // Given up for a while, not just unlocked: the lock is not fair, and this thread would
        // take it again before a waiter woke. A fifth of the round goes to waiting operations.
        let mut held = std::time::Duration::ZERO;
        let step = |held: &mut std::time::Duration| -> Result<MutexGuard<'_, State>> {
            std::thread::sleep(*held / 4 + std::time::Duration::from_micros(100));
            *held = std::time::Duration::ZERO;
            lock(&self.state)
        };
        // Thorough cleaning: a stream's oldest segment less than half live is worth moving.
        for stream in 0..self.streams {
            for _ in 0..total {
                let st = step(&mut held)?;
                let taken = std::time::Instant::now();
                if !st.txns.open.is_empty() || !self.measure_due(&st, stream)? {
                    break;
                }
                held = taken.elapsed();
                // The segment's records are read with the lock given up too (measuring checks
                // it is still the stream's oldest, else reads it again).
                drop(st);
                let Some(ahead) = self.log.oldest_segment_transactions(stream)? else { break };
                let mut st = lock(&self.state)?;
                let taken = std::time::Instant::now();
                if !st.txns.open.is_empty() {
                    break;
                }
                let measured = self.measure_oldest(&mut st, stream, Some(ahead));
                held += taken.elapsed();
                let Some(read) = measured? else { break };
                let (mut st, mut pre) = self.prepare_unlocked(st, &read.1)?;
                // A transaction opened while the lock was given up: cleaning waits for a round
                // without one (`clean_one` would say `EBUSY`).
                if !st.txns.open.is_empty() {
                    break;
                }
                let taken = std::time::Instant::now();
                let before = self.log.free_segments();
                let cleaned = self.clean_one(&mut st, stream, read, &mut pre);
                let (st, cleaned) = match cleaned {
                    Ok(c) => self.finish_clean_after(st, c),
                    Err(e) => (Some(st), Err(e)),
                };
                drop(st);
                held += taken.elapsed();
                match cleaned {
                    Ok(_) => {
                        report.mostly_dead_cleaned += 1;
                        report.segments_freed += self.log.free_segments().saturating_sub(before);
                    }
                    Err(FsError::NoSpace) => break,
                    Err(e) => return Err(e),
                }
            }
        }
        for _ in 0..total {
            let st = step(&mut held)?;
            let taken = std::time::Instant::now();
            let free = u64::from(self.log.free_segments());
            if free * 100 >= total * CLEAN_BELOW_FREE_PERCENT {
                break;
            }
            held = taken.elapsed();
            // The head's records are read with the lock given up (`Fs::choose_head`).
            let (st, chosen) = self.choose_head(st, MAINTAIN_MAX_LIVE_PERCENT)?;
            let Some((stream, l)) = chosen? else { break };
            let (mut st, mut pre) = self.prepare_unlocked(st, &l.txs)?;
            if !st.txns.open.is_empty() {
                break;
            }
            let taken = std::time::Instant::now();
            let before = self.log.free_segments();
            let cleaned = self.clean_one(&mut st, stream, (l.segment, l.txs), &mut pre);
            let (st, cleaned) = match cleaned {
                Ok(c) => self.finish_clean_after(st, c),
                Err(e) => (Some(st), Err(e)),
            };
            drop(st);
            held += taken.elapsed();
            match cleaned {
                Ok(r) if gained(&r, l.live_blocks, seg) => {
                    report.segments_freed += self.log.free_segments().saturating_sub(before)
                }
                Ok(_) | Err(FsError::NoSpace) => break,
                Err(e) => return Err(e),
            }
        }
        // Explicit transactions' commits, and anything else past the replay budget: the long
        // part of the durable wait without the state lock, as after an operation.
        self.checkpoint_if_due()?;
        Ok(report)
    }
}

impl Fs {
    /// Is `stream`'s oldest segment worth measuring ([`Fs::measure_oldest`])? Not measured again
    /// for the same segment until data blocks amounting to half a segment have died since
    /// (records only ever die).
    fn measure_due(&self, st: &State, stream: u16) -> Result<bool> {
        let Some(&(segment, dead_then)) = st.liveness_checked.get(&stream) else {
            return Ok(true);
        };
        let current = self.log.chain(stream)?.first().copied();
        let died = st.dead_blocks.saturating_sub(dead_then);
        Ok(current != Some(segment) || died >= u64::from(self.segment_blocks / 2))
    }

    /// Is less than half of `stream`'s oldest segment (bytes of records and data blocks) live?
    /// Measured on `ahead` (its transactions as `Fs::maintain` read them with the lock given
    /// up) while that is still the stream's oldest segment, else on the segment read now.
    /// Returns the segment and its transactions when it is.
    fn measure_oldest(
        &self,
        st: &mut State,
        stream: u16,
        ahead: Option<(u32, Vec<tally_log::RecoveredTx>)>,
    ) -> Result<Option<(u32, Vec<tally_log::RecoveredTx>)>> {
        let Some(l) = self.measure_oldest_of(st, stream, ahead)? else { return Ok(None) };
        let mostly_dead = l.alive_bytes * 2 < l.total_bytes;
        if !mostly_dead {
            st.liveness_checked.insert(stream, (l.segment, st.dead_blocks));
            return Ok(None);
        }
        Ok(Some((l.segment, l.txs)))
    }

    /// How much of `stream`'s oldest segment is live, read from the device (or `ahead`, if that
    /// is still the oldest segment's: a segment's transactions never change until it is
    /// freed, and the cleaning that follows checks their ids against the log's); `None` when
    /// the stream has only its current segment.
    fn measure_oldest_of(
        &self,
        st: &State,
        stream: u16,
        ahead: Option<(u32, Vec<tally_log::RecoveredTx>)>,
    ) -> Result<Option<Liveness>> {
        let chain = self.log.chain(stream)?;
        let oldest = chain.first().filter(|_| chain.len() > 1).copied();
        let read = match ahead {
            Some((segment, txs)) if Some(segment) == oldest => Some((segment, txs)),
            _ => self.log.oldest_segment_transactions(stream)?,
        };
        let Some((segment, txs)) = read else {
            return Ok(None);
        };
        let bs = u64::from(self.bs);
        let mut l =
            Liveness { segment, total_bytes: 0, alive_bytes: 0, live_blocks: 0, txs: Vec::new() };
        let (mut data, mut record_bytes) = (0u64, BODY_HEADER);
        for tx in &txs {
            l.total_bytes += u64::from(tx.data_count) * bs;
            for bytes in &tx.records {
                let rec = Record::decode(bytes)?;
                let key = Key::of(&rec);
                let is_data = matches!(rec, Record::Extent { data, .. } if data != DATA_HOLE);
                l.total_bytes += bytes.len() as u64;
                if live(st, &rec, &key, true) {
                    l.alive_bytes += bytes.len() as u64 + if is_data { bs } else { 0 };
                    data += u64::from(is_data);
                    record_bytes += PER_RECORD + PER_DATA + bytes.len() as u64;
                }
            }
        }
        // Packed: one unit of records per pack, at most.
        let packs = data.div_ceil(self.pack_blocks().saturating_sub(1).max(1)).max(1);
        l.live_blocks = data + record_bytes.div_ceil(bs - UNIT_HEADER).max(packs);
        if data == 0 && l.alive_bytes == 0 {
            l.live_blocks = 0;
        }
        l.txs = txs;
        Ok(Some(l))
    }
}

/// A stream whose oldest segment to clean, and that segment measured ([`Fs::choose_head`]).
type Chosen = (u16, Liveness);

/// How much of a stream's oldest segment is live.
struct Liveness {
    segment: u32,
    /// Its transactions as read (for cleaning it next without reading them again).
    txs: Vec<tally_log::RecoveredTx>,
    /// Bytes of records and data blocks in it.
    total_bytes: u64,
    /// Of those, live.
    alive_bytes: u64,
    /// Blocks the live part takes once relocated in packs.
    live_blocks: u64,
}

/// What a [`Maintenance`] thread waits on between rounds: its stop, and a checkpoint an
/// operation past the replay budget left to it ([`Fs::checkpoint_after_op`]). A std lock, not
/// `crate::sync`'s: held only to flip a flag, never across a wait for anything else.
#[derive(Debug, Default)]
pub(crate) struct Bell {
    rung: std::sync::Mutex<Rung>,
    cv: std::sync::Condvar,
}

#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Rung {
    stop: bool,
    checkpoint: bool,
}

impl Bell {
    fn rung(&self) -> std::sync::MutexGuard<'_, Rung> {
        self.rung.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Ask for a checkpoint (once: ringing again before it is taken changes nothing).
    pub(crate) fn ring_checkpoint(&self) {
        let mut r = self.rung();
        if !r.checkpoint {
            r.checkpoint = true;
            self.cv.notify_all();
        }
    }

    /// Whether a checkpoint was asked for (and no longer is).
    #[cfg(test)]
    pub(crate) fn take_checkpoint_request(&self) -> bool {
        std::mem::take(&mut self.rung().checkpoint)
    }

    fn ring_stop(&self) {
        self.rung().stop = true;
        self.cv.notify_all();
    }

    /// Wait until rung or `until`; takes the checkpoint request.
    fn wait(&self, until: std::time::Instant) -> Rung {
        let guard = self.rung();
        let timeout = until.saturating_duration_since(std::time::Instant::now());
        let (mut guard, _) = self
            .cv
            .wait_timeout_while(guard, timeout, |r| !r.stop && !r.checkpoint)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let rung = *guard;
        guard.checkpoint = false;
        rung
    }
}

/// A thread running [`Fs::maintain`] every interval, and a checkpoint as soon as an operation
/// passes the replay budget (between rounds; the operation no longer takes it itself, see
/// [`Fs::checkpoint_after_op`]); stops (and is joined) when dropped, or by itself once the
/// file system is dropped.
pub struct Maintenance {
    /// The thread holds the only strong reference: the file system's copy dies with it.
    bell: std::sync::Weak<Bell>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Maintenance {
    /// Start the thread. It holds only a weak reference to the file system.
    #[must_use]
    pub fn spawn(fs: &std::sync::Arc<Fs>, every: std::time::Duration) -> Maintenance {
        let weak = std::sync::Arc::downgrade(fs);
        let bell = std::sync::Arc::new(Bell::default());
        let weak_bell = std::sync::Arc::downgrade(&bell);
        *fs.maintenance_bell.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
            weak_bell.clone();
        let thread = std::thread::Builder::new()
            .name("tally-fs-maintain".into())
            .spawn(move || {
                let mut round_at = std::time::Instant::now() + every;
                loop {
                    let rung = bell.wait(round_at);
                    if rung.stop {
                        return;
                    }
                    let Some(fs) = weak.upgrade() else { return };
                    let done = if std::time::Instant::now() >= round_at {
                        // A round ends with a checkpoint if one is due.
                        let done = fs.maintain().map(drop);
                        round_at = std::time::Instant::now() + every;
                        done
                    } else if rung.checkpoint {
                        fs.checkpoint_if_due()
                    } else {
                        Ok(())
                    };
                    if let Err(e) = done {
                        tracing::error!("background maintenance failed: {e}");
                        return;
                    }
                }
            })
            .ok();
        Maintenance { bell: weak_bell, thread }
    }

    /// Whether the thread has stopped: after [`Fs::maintain`] failed (an I/O error, or a panic
    /// that stopped the file system), or once the file system is dropped.
    #[must_use]
    pub fn is_stopped(&self) -> bool {
        self.thread.as_ref().is_none_or(std::thread::JoinHandle::is_finished)
    }
}

impl Drop for Maintenance {
    fn drop(&mut self) {
        if let Some(bell) = self.bell.upgrade() {
            bell.ring_stop();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tally_media::{Device, MemDevice};

    use super::cleaning_streams;
    use crate::{Fs, FsError, MkfsOptions, MountOptions, Owner, ROOT};

    const ME: Owner = Owner { uid: 1000, gid: 1000 };

    /// A memory device that holds, once armed, the first read of `block` (of any block when
    /// armed with [`ANY_BLOCK`]) until released; and, once told the file system, counts the
    /// reads made while its state lock is held (by anyone: only meaningful while one thread
    /// uses the file system).
    struct Gate {
        inner: MemDevice,
        block: std::sync::atomic::AtomicU64,
        /// (a read is held, released)
        state: std::sync::Mutex<(bool, bool)>,
        cv: std::sync::Condvar,
        fs: std::sync::OnceLock<std::sync::Weak<Fs>>,
        locked_reads: std::sync::atomic::AtomicU64,
        /// Once set (and watching a file system): writes submitted while its state lock is
        /// held stay in flight — a read of their blocks sees what was there before — and the
        /// next flush is held (as an armed read is) until released, then lands them.
        slow_writes: std::sync::atomic::AtomicBool,
        in_flight: std::sync::Mutex<std::collections::HashSet<u64>>,
    }

    impl Gate {
        /// A memory device of `blocks` blocks, no read armed.
        fn new(blocks: u64) -> Arc<Gate> {
            Arc::new(Gate {
                inner: MemDevice::new(4096, blocks).unwrap(),
                block: std::sync::atomic::AtomicU64::new(u64::MAX),
                state: std::sync::Mutex::new((false, false)),
                cv: std::sync::Condvar::new(),
                fs: std::sync::OnceLock::new(),
                locked_reads: std::sync::atomic::AtomicU64::new(0),
                slow_writes: std::sync::atomic::AtomicBool::new(false),
                in_flight: std::sync::Mutex::new(std::collections::HashSet::new()),
            })
        }

        /// Wait up to `secs` seconds until the armed read is held at the device.
        fn wait_held(&self, secs: u64, what: &str) {
            let g = self.state.lock().unwrap();
            let (g, t) = self
                .cv
                .wait_timeout_while(g, std::time::Duration::from_secs(secs), |s| !s.0)
                .unwrap();
            assert!(!t.timed_out() && g.0, "{what}");
        }

        /// Let the held read (and any later one) go.
        fn release(&self) {
            *self.state.lock().unwrap() = (true, true);
            self.cv.notify_all();
        }

        /// Count from now on the reads made while `fs`'s state lock is held.
        fn watch(&self, fs: &Arc<Fs>) {
            let _ = self.fs.set(Arc::downgrade(fs));
            self.locked_reads.store(0, SeqCst);
        }
    }

    impl Device for Gate {
        fn geometry(&self) -> tally_media::Geometry {
            self.inner.geometry()
        }
        fn read(&self, block: u64, buf: &mut [u8]) -> tally_media::Result<()> {
            let bs = self.inner.geometry().block_size as usize;
            let blocks = (buf.len() / bs.max(1)) as u64;
            let landed = {
                let f = self.in_flight.lock().unwrap();
                (block..block + blocks).all(|b| !f.contains(&b))
            };
            if !landed {
                // What the block held before the write in flight: never written here.
                buf.fill(0);
                return Ok(());
            }
            if let Some(fs) = self.fs.get().and_then(std::sync::Weak::upgrade) {
                if matches!(fs.state.try_lock(), Err(std::sync::TryLockError::WouldBlock)) {
                    self.locked_reads.fetch_add(1, SeqCst);
                }
            }
            let armed = self.block.load(std::sync::atomic::Ordering::SeqCst);
            if (block == armed || armed == ANY_BLOCK)
                && self.block.compare_exchange(armed, u64::MAX, SeqCst, SeqCst).is_ok()
            {
                let mut g = self.state.lock().unwrap();
                g.0 = true;
                self.cv.notify_all();
                while !g.1 {
                    g = self.cv.wait(g).unwrap();
                }
            }
            self.inner.read(block, buf)
        }
        fn submit(
            &self,
            writes: Vec<tally_media::Write>,
            flags: tally_media::WriteFlags,
        ) -> tally_media::Result<tally_media::Ticket> {
            if self.slow_writes.load(SeqCst) {
                if let Some(fs) = self.fs.get().and_then(std::sync::Weak::upgrade) {
                    if matches!(fs.state.try_lock(), Err(std::sync::TryLockError::WouldBlock)) {
                        let bs = u64::from(self.inner.geometry().block_size);
                        let mut f = self.in_flight.lock().unwrap();
                        for w in &writes {
                            let n = (w.data.len() as u64).div_ceil(bs);
                            f.extend(w.block..w.block + n);
                        }
                    }
                }
            }
            self.inner.submit(writes, flags)
        }
        fn wait(&self, ticket: tally_media::Ticket) -> tally_media::Result<()> {
            self.inner.wait(ticket)
        }
        fn flush(&self) -> tally_media::Result<()> {
            if !self.in_flight.lock().unwrap().is_empty() {
                let mut g = self.state.lock().unwrap();
                g.0 = true;
                self.cv.notify_all();
                while !g.1 {
                    g = self.cv.wait(g).unwrap();
                }
                drop(g);
                self.in_flight.lock().unwrap().clear();
            }
            self.inner.flush()
        }
        fn stats(&self) -> tally_media::DeviceStats {
            self.inner.stats()
        }
    }

    use std::sync::atomic::Ordering::SeqCst;

    /// [`Gate`] armed for the next read, whatever block it reads.
    const ANY_BLOCK: u64 = u64::MAX - 1;

    /// `Fs::maintain` reads a live data block of the segment it cleans with the state lock
    /// given up: while that read is held, other operations go on (before, it was read under
    /// the lock, and they waited). Then, with `overwrite`, the block is overwritten while it is
    /// read: the cleaning, under the lock again, finds its record dead and does not relocate
    /// the stale bytes read ahead (the file reads the new bytes, before and after a remount).
    /// With `segment`, the read held is `maintain`'s first, that of the oldest segment's
    /// records to measure it (the operations meanwhile read nothing).
    fn maintain_reads_ahead_unlocked(overwrite: bool, segment: bool) {
        let gate = Gate::new(4096);
        let dev: Arc<dyn Device> = gate.clone();
        Fs::mkfs(dev.clone(), &MkfsOptions { streams: 1, segment_blocks: 64, uuid: None }).unwrap();
        let fs = Arc::new(Fs::mount(dev.clone(), MountOptions::default()).unwrap());
        let a = fs.create(None, ROOT, b"a", 0o644, ME).unwrap().ino;
        fs.write(None, a, 0, &[1; 40 * 4096]).unwrap();
        let b = fs.create(None, ROOT, b"b", 0o644, ME).unwrap().ino;
        fs.write(None, b, 0, &[2; 40 * 4096]).unwrap();
        // All of `a` but its first block dies: the oldest segment is mostly dead.
        fs.write(None, a, 4096, &[3; 39 * 4096]).unwrap();
        fs.sync().unwrap();
        let at = {
            let st = crate::fs::lock(&fs.state).unwrap();
            st.inodes.get(&a).and_then(|i| i.blocks.get(&0)).unwrap().addr
        };
        gate.block.store(if segment { ANY_BLOCK } else { at }, SeqCst);
        let cleaner = {
            let fs = fs.clone();
            std::thread::spawn(move || fs.maintain().unwrap())
        };
        gate.wait_held(5, "maintain did not read the live block");
        let (tx, rx) = std::sync::mpsc::channel();
        let other = fs.clone();
        std::thread::spawn(move || {
            let c = other.create(None, ROOT, b"c", 0o644, ME).unwrap().ino;
            other.write(None, c, 0, &[4; 4096]).unwrap();
            if overwrite {
                other.write(None, a, 0, &[5; 4096]).unwrap();
            }
            let _ = tx.send(());
        });
        let prompt = rx.recv_timeout(std::time::Duration::from_secs(5));
        gate.release();
        assert!(prompt.is_ok(), "operations waited for a read maintain made under the lock");
        let report = cleaner.join().unwrap();
        assert!(report.mostly_dead_cleaned >= 1, "{report:?}");
        let first = if overwrite { 5 } else { 1 };
        let want: Vec<u8> = [vec![first; 4096], vec![3; 39 * 4096]].concat();
        assert_eq!(fs.read(a, 0, 40 * 4096).unwrap(), want, "before the remount");
        assert_eq!(fs.read(b, 0, 40 * 4096).unwrap(), vec![2; 40 * 4096]);
        fs.sync().unwrap();
        assert!(fs.fsck().is_clean());
        drop(fs);
        let fs = Fs::mount(dev, MountOptions::default()).unwrap();
        assert_eq!(fs.read(a, 0, 40 * 4096).unwrap(), want, "after the remount");
        assert_eq!(fs.read(b, 0, 40 * 4096).unwrap(), vec![2; 40 * 4096]);
        assert!(fs.fsck().is_clean());
    }

    /// Cleaning when space is low, before a write (`Fs::clean_for_space`), reads the live
    /// blocks of the segment it cleans (with `records`, the first read it makes: the chosen
    /// head's records, to measure it) with the state lock given up: while that read is held,
    /// operations that need no device I/O (a lookup, a getattr) go on — and with `writes`, a
    /// create and a write that need space too: with room left above the reserve they do not
    /// queue behind the cleaning pass. Once they are done, the cleaning the writer makes
    /// (alone) reads nothing under the state lock.
    fn low_space_cleaning_reads_without_the_state_lock(records: bool, writes: bool) {
        let gate = Gate::new(1024);
        let dev: Arc<dyn Device> = gate.clone();
        Fs::mkfs(dev.clone(), &MkfsOptions { streams: 1, segment_blocks: 64, uuid: None }).unwrap();
        let fs = Arc::new(Fs::mount(dev.clone(), MountOptions::default()).unwrap());
        // A cold file at the head of the only stream, then a hot one overwritten until space
        // runs low: the head, cleaned first, holds the cold file's live blocks.
        let cold = fs.create(None, ROOT, b"cold", 0o644, ME).unwrap().ino;
        fs.write(None, cold, 0, &[1; 20 * 4096]).unwrap();
        fs.sync().unwrap();
        let at = {
            let st = crate::fs::lock(&fs.state).unwrap();
            st.inodes.get(&cold).and_then(|i| i.blocks.get(&0)).unwrap().addr
        };
        let hot = fs.create(None, ROOT, b"hot", 0o644, ME).unwrap().ino;
        // The writer's writes cover whole blocks and read nothing: the first read is cleaning's.
        gate.block.store(if records { ANY_BLOCK } else { at }, SeqCst);
        let writer = {
            let fs = fs.clone();
            std::thread::spawn(move || {
                for round in 0..2000u32 {
                    fs.write(None, hot, 0, &[round as u8; 8 * 4096]).unwrap();
                    fs.fsync(hot).unwrap();
                }
            })
        };
        gate.wait_held(10, "cleaning did not read the cold file's block");
        let (tx, rx) = std::sync::mpsc::channel();
        let other = fs.clone();
        let looker = std::thread::spawn(move || {
            let _ = other.lookup(ROOT, b"cold").unwrap();
            let _ = other.getattr(hot).unwrap();
            if writes {
                let new = other.create(None, ROOT, b"new", 0o644, ME).unwrap().ino;
                other.write(None, new, 0, &[7; 4096]).unwrap();
            }
            let _ = tx.send(());
        });
        let prompt = rx.recv_timeout(std::time::Duration::from_secs(5));
        if prompt.is_ok() {
            looker.join().unwrap();
            gate.watch(&fs); // the writer is alone now
        }
        gate.release();
        assert!(prompt.is_ok(), "operations waited for a read cleaning made under the lock");
        writer.join().unwrap();
        assert_eq!(gate.locked_reads.load(SeqCst), 0, "device reads under the state lock");
        assert_eq!(fs.read(cold, 0, 20 * 4096).unwrap(), vec![1; 20 * 4096]);
        fs.sync().unwrap();
        assert!(fs.fsck().is_clean());
        drop(fs);
        let fs = Fs::mount(dev, MountOptions::default()).unwrap();
        assert_eq!(fs.read(cold, 0, 20 * 4096).unwrap(), vec![1; 20 * 4096]);
        if writes {
            let new = fs.lookup(ROOT, b"new").unwrap().ino;
            assert_eq!(fs.read(new, 0, 4096).unwrap(), vec![7; 4096]);
        }
        assert!(fs.fsck().is_clean());
    }

    /// Cleaning when space is low ranks the streams' heads by the live data blocks kept per
    /// segment (`State::usage`), without walking every block map: it walked them for every
    /// segment cleaned, under the state lock, which made operations on a nearly full file
    /// system of many files cost a walk of all of them (`live.rs`). 300 small cold files and a
    /// hot file rewritten 16 times the device's size over two streams: no walk while the
    /// writes clean for space; the kept counts equal a walk's (`fsck`), before and after a
    /// remount.
    #[test]
    fn low_space_cleaning_ranks_heads_without_walking_the_block_maps() {
        let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, 2048).unwrap());
        Fs::mkfs(dev.clone(), &MkfsOptions { streams: 2, segment_blocks: 64, uuid: None }).unwrap();
        let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
        for i in 0..300u32 {
            let ino = fs.create(None, ROOT, format!("cold{i}").as_bytes(), 0o644, ME).unwrap().ino;
            fs.write(None, ino, 0, &i.to_le_bytes()).unwrap();
        }
        let hot = fs.create(None, ROOT, b"hot", 0o644, ME).unwrap().ino;
        fs.sync().unwrap();
        // 32,000 blocks written to a device of 2,048: the writes clean for space throughout
        // (no maintenance thread runs here).
        let walks = crate::live::LIVE_WALKS.with(std::cell::Cell::get);
        for round in 0..4000u32 {
            fs.write(None, hot, 0, &[round as u8; 8 * 4096]).unwrap();
            if round % 8 == 0 {
                fs.fsync(hot).unwrap();
            }
        }
        assert_eq!(
            crate::live::LIVE_WALKS.with(std::cell::Cell::get),
            walks,
            "walks while cleaning"
        );
        let r = fs.fsck();
        assert!(r.is_clean(), "{:?}", r.problems);
        drop(fs);
        let fs = Fs::mount(dev, MountOptions::default()).unwrap();
        assert_eq!(fs.read(hot, 0, 4096).unwrap(), vec![3999u32 as u8; 4096]);
        for i in [0u32, 150, 299] {
            let ino = fs.lookup(ROOT, format!("cold{i}").as_bytes()).unwrap().ino;
            assert_eq!(fs.read(ino, 0, 4).unwrap(), i.to_le_bytes());
        }
        let r = fs.fsck();
        assert!(r.is_clean(), "{:?}", r.problems);
    }

    /// A mostly dead oldest segment on `gate` (one stream): a file of 40 blocks all but the
    /// first of which are overwritten, and another of 40 blocks; both files' inodes.
    fn mostly_dead_head(gate: &Arc<Gate>) -> (Arc<Fs>, u64, u64) {
        mostly_dead_head_with(gate, None)
    }

    /// [`mostly_dead_head`] mounted with `mutant`.
    fn mostly_dead_head_with(
        gate: &Arc<Gate>,
        mutant: Option<crate::FsMutant>,
    ) -> (Arc<Fs>, u64, u64) {
        let dev: Arc<dyn Device> = gate.clone();
        Fs::mkfs(dev.clone(), &MkfsOptions { streams: 1, segment_blocks: 64, uuid: None }).unwrap();
        let opts = MountOptions { mutant, ..MountOptions::default() };
        let fs = Arc::new(Fs::mount(dev, opts).unwrap());
        let a = fs.create(None, ROOT, b"a", 0o644, ME).unwrap().ino;
        fs.write(None, a, 0, &[1; 40 * 4096]).unwrap();
        let b = fs.create(None, ROOT, b"b", 0o644, ME).unwrap().ino;
        fs.write(None, b, 0, &[2; 40 * 4096]).unwrap();
        fs.write(None, a, 4096, &[3; 39 * 4096]).unwrap();
        fs.sync().unwrap();
        (fs, a, b)
    }

    /// After the mostly dead head of [`mostly_dead_head`] was cleaned: both files read as
    /// written, before and after a remount, and fsck is clean both times.
    fn files_of_mostly_dead_head_intact(fs: Arc<Fs>, a: u64, b: u64) {
        let want_a: Vec<u8> = [vec![1; 4096], vec![3; 39 * 4096]].concat();
        assert_eq!(fs.read(a, 0, 40 * 4096).unwrap(), want_a, "before the remount");
        assert_eq!(fs.read(b, 0, 40 * 4096).unwrap(), vec![2; 40 * 4096]);
        fs.sync().unwrap();
        assert!(fs.fsck().is_clean());
        let dev = fs.log.device().clone();
        drop(fs);
        let fs = Fs::mount(dev, MountOptions::default()).unwrap();
        assert_eq!(fs.read(a, 0, 40 * 4096).unwrap(), want_a, "after the remount");
        assert_eq!(fs.read(b, 0, 40 * 4096).unwrap(), vec![2; 40 * 4096]);
        assert!(fs.fsck().is_clean());
    }

    /// `Fs::maintain` cleaning a segment reads nothing from the device under the state lock:
    /// not the segment's records (measured on what was read with the lock given up, and handed
    /// to the log, which checks their ids instead of reading them again), not its live blocks.
    #[test]
    fn maintain_cleans_with_no_read_under_the_state_lock() {
        let gate = Gate::new(4096);
        let (fs, a, b) = mostly_dead_head(&gate);
        gate.watch(&fs);
        let report = fs.maintain().unwrap();
        assert!(report.mostly_dead_cleaned >= 1, "{report:?}");
        assert_eq!(gate.locked_reads.load(SeqCst), 0, "device reads under the state lock");
        let want: Vec<u8> = [vec![1; 4096], vec![3; 39 * 4096]].concat();
        assert_eq!(fs.read(a, 0, 40 * 4096).unwrap(), want);
        assert_eq!(fs.read(b, 0, 40 * 4096).unwrap(), vec![2; 40 * 4096]);
        assert!(fs.fsck().is_clean());
    }

    #[test]
    fn low_space_cleaning_reads_live_blocks_without_the_state_lock() {
        low_space_cleaning_reads_without_the_state_lock(false, false);
    }

    #[test]
    fn a_writer_with_room_does_not_queue_behind_low_space_cleaning() {
        low_space_cleaning_reads_without_the_state_lock(false, true);
    }

    #[test]
    fn low_space_cleaning_reads_the_head_it_measures_without_the_state_lock() {
        low_space_cleaning_reads_without_the_state_lock(true, false);
    }

    /// `Fs::clean` (on demand, `tally clean`) gives the state lock up while it reads: while
    /// its first read (the oldest segment's records) is held, a create and a write go on;
    /// the segment is cleaned, and the files read back the same before and after a remount.
    /// Cleaning on demand of a segment with `mutant`, its flush held at the device (and its
    /// relocations' writes in flight) while the moved blocks are read and another file is
    /// written: `Err` says what went wrong.
    fn clean_with_its_flush_held(mutant: Option<crate::FsMutant>) -> Result<(), String> {
        let gate = Gate::new(4096);
        let (fs, a, b) = mostly_dead_head_with(&gate, mutant);
        let want_a: Vec<u8> = [vec![1; 4096], vec![3; 39 * 4096]].concat();
        gate.watch(&fs);
        gate.slow_writes.store(true, SeqCst);
        let cleaner = {
            let fs = fs.clone();
            std::thread::spawn(move || fs.clean(0, 1))
        };
        gate.wait_held(5, "cleaning made no flush with its relocations in flight");
        let (tx, rx) = std::sync::mpsc::channel();
        let other = fs.clone();
        std::thread::spawn(move || {
            let read = (other.read(a, 0, 40 * 4096), other.read(b, 0, 40 * 4096));
            let c = other.create(None, ROOT, b"c", 0o644, ME).unwrap().ino;
            other.write(None, c, 0, &[4; 4096]).unwrap();
            // The segment being finished is still the stream's oldest: a cleaning that takes
            // the lock now (as `maintain` or low-space cleaning would, once past their device
            // reads, which wait for the held flush here) must not relocate it again.
            let again =
                other.log.oldest_segment_transactions(0).map_err(FsError::from).and_then(|ahead| {
                    let ahead = ahead.ok_or(FsError::Invalid("no oldest segment"))?;
                    let mut st = other.state.lock().unwrap();
                    let mut pre = super::PreRead::new();
                    let again = other.clean_one(&mut st, 0, ahead, &mut pre)?;
                    Ok((again.report.records_relocated, again.pending.is_some()))
                });
            let _ = tx.send((read, again));
        });
        let meanwhile = rx.recv_timeout(std::time::Duration::from_secs(5));
        gate.release();
        let report = cleaner.join().unwrap().map_err(|e| format!("cleaning failed: {e}"))?;
        if report.log.segments_freed == 0 || report.data_blocks_relocated == 0 {
            return Err(format!("nothing moved or freed: {report:?}"));
        }
        let ((ra, rb), again) = meanwhile.map_err(|_| "operations waited for cleaning's flush")?;
        if !matches!(again, Ok((0, false))) {
            return Err(format!("a second cleaning meanwhile relocated {again:?} records"));
        }
        if !(ra.as_ref().is_ok_and(|r| *r == want_a)
            && rb.as_ref().is_ok_and(|r| *r == [2; 40 * 4096]))
        {
            let show = |r: &crate::Result<Vec<u8>>| match r {
                Ok(v) => format!("{} bytes, first {:?}", v.len(), v.first()),
                Err(e) => e.to_string(),
            };
            return Err(format!("moved blocks read meanwhile: a {}, b {}", show(&ra), show(&rb)));
        }
        gate.slow_writes.store(false, SeqCst);
        files_of_mostly_dead_head_intact(fs, a, b);
        Ok(())
    }

    /// Cleaning's flush and the log's checkpoint that frees the segment happen with the state
    /// lock given up while space is not low (`Fs::finish_clean_after`): while they are held at
    /// the device, the blocks just moved read right (from memory: their copies' writes have
    /// not landed), another file is created and written, and a second cleaning of the stream
    /// relocates nothing. Fails with the flush under the lock (operations wait), without the
    /// stream marked finishing (the segment relocated twice), and with
    /// [`crate::FsMutant::RelocatedReadEarly`] (the moved blocks read from the device).
    #[test]
    fn a_cleanings_flush_holds_no_one_up() {
        clean_with_its_flush_held(None).unwrap();
    }

    #[cfg_attr(not(feature = "mutants"), ignore = "needs the mutants feature")]
    #[test]
    fn the_relocated_read_early_mutant_is_caught() {
        let e = clean_with_its_flush_held(Some(crate::FsMutant::RelocatedReadEarly));
        assert!(e.is_err(), "mutant not caught");
    }

    #[test]
    fn clean_on_demand_reads_without_the_state_lock() {
        let gate = Gate::new(4096);
        let (fs, a, b) = mostly_dead_head(&gate);
        gate.block.store(ANY_BLOCK, SeqCst);
        let cleaner = {
            let fs = fs.clone();
            std::thread::spawn(move || fs.clean(0, usize::MAX).unwrap())
        };
        gate.wait_held(5, "clean did not read");
        let (tx, rx) = std::sync::mpsc::channel();
        let other = fs.clone();
        std::thread::spawn(move || {
            let c = other.create(None, ROOT, b"c", 0o644, ME).unwrap().ino;
            other.write(None, c, 0, &[4; 4096]).unwrap();
            let _ = tx.send(());
        });
        let prompt = rx.recv_timeout(std::time::Duration::from_secs(5));
        gate.release();
        assert!(prompt.is_ok(), "operations waited for a read clean made under the lock");
        let report = cleaner.join().unwrap();
        assert!(report.log.segments_freed >= 1, "{report:?}");
        files_of_mostly_dead_head_intact(fs, a, b);
    }

    /// `Fs::clean` alone, of every segment but the current one, reads nothing from the device
    /// under the state lock.
    #[test]
    fn clean_on_demand_reads_nothing_under_the_state_lock() {
        let gate = Gate::new(4096);
        let (fs, a, _) = mostly_dead_head(&gate);
        gate.watch(&fs);
        let report = fs.clean(0, usize::MAX).unwrap();
        assert!(report.log.segments_freed >= 1, "{report:?}");
        assert_eq!(gate.locked_reads.load(SeqCst), 0, "device reads under the state lock");
        let want: Vec<u8> = [vec![1; 4096], vec![3; 39 * 4096]].concat();
        assert_eq!(fs.read(a, 0, 40 * 4096).unwrap(), want);
        assert!(fs.fsck().is_clean());
    }

    #[test]
    fn maintain_reads_live_blocks_without_the_state_lock() {
        maintain_reads_ahead_unlocked(false, false);
    }

    #[test]
    fn maintain_reads_the_segment_it_measures_without_the_state_lock() {
        maintain_reads_ahead_unlocked(false, true);
    }

    #[test]
    fn a_block_overwritten_while_read_ahead_is_not_relocated() {
        maintain_reads_ahead_unlocked(true, false);
    }

    #[test]
    fn streams_kept_for_cleaning_are_none_up_to_two_one_of_three_two_from_four() {
        let kept: Vec<u16> = (1..=8).map(cleaning_streams).collect();
        assert_eq!(kept, [0, 0, 1, 2, 2, 2, 2, 2]);
    }

    /// From four streams: files map to streams 0 and 1 only; what survives cleaning a fresh
    /// stream's head lands on the warm stream (2), the warm stream's on the cold one (3), the
    /// cold one's on itself; and everything reads back the same after a remount.
    #[test]
    fn survivors_move_fresh_to_warm_to_cold() {
        let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, 4096).unwrap());
        Fs::mkfs(dev.clone(), &MkfsOptions { streams: 4, segment_blocks: 64, uuid: None }).unwrap();
        let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
        let mut files = Vec::new();
        for n in 0..8u8 {
            let f = fs.create(None, ROOT, format!("f{n}").as_bytes(), 0o644, ME).unwrap();
            assert!(fs.stream_of(f.ino) < 2, "file {n} on stream {}", fs.stream_of(f.ino));
            // Several segments per file: its first ones are no longer its stream's current.
            for round in 0..4u8 {
                fs.write(None, f.ino, 0, &[n * 16 + round; 40 * 4096]).unwrap();
            }
            files.push(f.ino);
        }
        fs.sync().unwrap();
        let on = |r: &super::FsCleanReport| -> Vec<u16> {
            r.log.relocated.iter().map(|(_, info)| info.ticket.stream).collect()
        };
        let mut landed = Vec::new();
        for (from, to) in [(0u16, 2u16), (1, 2), (2, 3), (3, 3)] {
            // Every segment but the current one: the last writes of four files (160 live
            // blocks) fill more than two segments of the stream they land on.
            let r = fs.clean(from, usize::MAX).unwrap();
            assert!(on(&r).iter().all(|&s| s == to), "{from} -> {:?}", on(&r));
            if !r.log.relocated.is_empty() {
                landed.push((from, to));
            }
        }
        assert_eq!(landed, [(0, 2), (1, 2), (2, 3), (3, 3)]);
        let read = |fs: &Fs| -> Vec<Vec<u8>> {
            files.iter().map(|&ino| fs.read(ino, 0, 40 * 4096).unwrap()).collect()
        };
        let before = read(&fs);
        for (n, bytes) in before.iter().enumerate() {
            assert!(bytes.iter().all(|&b| usize::from(b) == n * 16 + 3), "file {n}");
        }
        fs.sync().unwrap();
        drop(fs);
        let fs = Fs::mount(dev, MountOptions::default()).unwrap();
        assert_eq!(read(&fs), before);
        assert!(fs.fsck().is_clean());
    }
}

//! Space: the layer above marks records dead; segments are freed by checkpoints; cleaning
//! relocates the live records of a stream's oldest segments so a checkpoint can free them.
//!
//! Relocation changes the order of records in the log: a relocated record is written after
//! records that were committed later than it. The layer above must therefore carry a
//! per-object version in its records and never apply an older version over a newer one
//! (DESIGN.md §3.2, "order of updates to one object across streams and GC").
//!
//! Relocations may go to another stream than the one cleaned ([`Log::clean_split_to`]): the
//! layer above keeps its surviving (cold) records on a stream of their own, so that the heads
//! of the streams taking fresh writes are mostly dead when cleaning reaches them, instead of
//! holding the same cold records again on every pass (LFS's hot/cold separation; a chain is
//! freed only from its head). What keeps recovery correct, whichever stream they land on:
//! - the relocations are durable on every stream (a full `sync`, not only the cleaned
//!   stream's) before the superblock that moves the cleaned stream's checkpoint is written,
//!   so no crash image has the old segments gone and the copies missing
//!   ([`Mutant::RelocationNotDurable`] waits only for the cleaned stream, and is caught);
//! - a relocated transaction has no dependencies of its own, and is durable before cleaning
//!   returns ([`Log::clean_finish`] for a cleaning in two steps; so a later dependency on it
//!   is met at once, or is an ordinary one meanwhile); a dependency on a cleaned
//!   transaction is met by the checkpoint (it is at or below it), as before;
//! - a checkpoint of the cleaned stream covers its transactions up to `upto`, nothing on the
//!   target: the copies are ordinary transactions of the target's prefix, replayed (by
//!   version) until the target's own cleaning moves or drops them;
//! - an open large transaction is never cleaned into, and a copy is a transaction of its
//!   own, never a part of a run on the target.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::api::SegmentUsage;
use crate::engine::{lock, Stream};
use crate::recover::read_transactions;
use crate::{CommitInfo, Log, LogError, Mutant, RecoveredTx, Result, Transaction, TxId};

/// What [`Log::clean`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct CleanReport {
    /// The last transaction checkpointed by the cleaning (everything up to it is gone from the
    /// log), if anything was cleaned.
    pub checkpointed_seq: Option<u64>,
    /// Each relocated transaction and where the transaction that now carries its records
    /// landed (its data blocks are at `data_start + index` of the hook's new transaction).
    pub relocated: Vec<(TxId, CommitInfo)>,
    /// Transactions read from the cleaned segments.
    pub transactions_read: u64,
    /// Transactions the hook asked to re-commit.
    pub transactions_relocated: u64,
    /// Segments returned to the free pool.
    pub segments_freed: u32,
    /// Bytes the device wrote while cleaning (relocations, flushes' superblock): the cost side
    /// of write amplification.
    pub bytes_written: u64,
}

/// A cleaning whose relocations are committed but not yet made durable, nor the cleaned
/// segments freed ([`Log::clean_read_to_deferred`]); [`Log::clean_finish`] ends it. Until
/// then the cleaned segments stay in the log, so a crash recovers the records from them (or
/// from the copies, by version). The copies are written like any commit, but a reader must
/// not take them from the device before they are durable.
#[derive(Debug)]
#[must_use = "a cleaning frees nothing until clean_finish"]
pub struct CleanPending {
    stream: u16,
    upto: u64,
    before: tally_media::DeviceStats,
    report: CleanReport,
}

impl CleanPending {
    /// Each relocated transaction and where the transaction carrying its records landed, as
    /// [`CleanReport::relocated`].
    pub fn relocated(&self) -> &[(TxId, CommitInfo)] {
        &self.report.relocated
    }
}

/// The transactions of `placed` (a stream's, since its checkpoint, in order) that end in its
/// oldest segment `segment`, below sequence number `below`. They come first: the stream fills
/// its chain's segments in order, so the transactions ending in the oldest are a prefix of
/// `placed`. Taken from the front, so the cost is theirs, not the whole list's (a stream of
/// small transactions can hold hundreds of thousands; scanning all of them from the back, on
/// every look at the oldest segment, was a third of the maintenance thread's time beside a
/// program streaming 1 MiB writes, 28 Nov).
fn oldest_run(
    placed: &std::collections::VecDeque<crate::engine::Placed>,
    segment: u32,
    below: u64,
) -> impl Iterator<Item = &crate::engine::Placed> {
    debug_assert!(
        placed.iter().skip_while(|p| p.end_segment == segment).all(|p| p.end_segment != segment),
        "transactions ending in the oldest segment {segment} are not a prefix of the stream's"
    );
    placed.iter().take_while(move |p| p.end_segment == segment && p.seq < below)
}

impl Log {
    /// What must be durable before stream `stream`'s transactions up to `upto` are read back
    /// from the device: `upto`, or a later close of a large transaction (a part read must be
    /// judged by its run's close, `recover::settle_runs`).
    fn read_horizon(&self, stream: u16, upto: u64) -> u64 {
        self.streams.get(usize::from(stream)).map_or(upto, |st| upto.max(lock(st).last_close))
    }

    /// Mark `records` records of transaction `tx` dead (superseded or deleted by the layer
    /// above). Only used to choose what to clean; a transaction already checkpointed is ignored.
    ///
    /// # Errors
    /// An unknown stream.
    pub fn mark_dead(&self, tx: TxId, records: u32) -> Result<()> {
        let st = self
            .streams
            .get(usize::from(tx.stream))
            .ok_or_else(|| LogError::Invalid(format!("no stream {}", tx.stream)))?;
        let mut st = lock(st);
        if let Ok(i) = st.placed.binary_search_by_key(&tx.seq, |p| p.seq) {
            let p = &mut st.placed[i];
            p.dead = p.dead.saturating_add(records).min(p.records);
        }
        Ok(())
    }

    /// The segment holding device block `block`; `None` for the superblocks and for blocks past
    /// the last segment. For checkers that match the layer above's block addresses against the
    /// segments the log holds.
    #[must_use]
    pub fn segment_of(&self, block: u64) -> Option<u32> {
        let segment = block.checked_sub(self.first_segment_block)? / u64::from(self.segment_blocks);
        let segment_count = lock(&self.sb).sb.segment_count;
        u32::try_from(segment).ok().filter(|&s| s < segment_count)
    }

    /// Blocks left in `stream`'s current segment: a transaction of at most this many blocks
    /// committed next on the stream lands in it; a larger one starts the next segment and
    /// leaves these blocks unused for good (the log only appends). For the layer above to size
    /// what it writes in bulk (cleaning's packs) so that segments are filled, not left with
    /// holes at their ends.
    ///
    /// # Errors
    /// An unknown stream.
    pub fn blocks_left_in_segment(&self, stream: u16) -> Result<u32> {
        let st = self
            .streams
            .get(usize::from(stream))
            .ok_or_else(|| LogError::Invalid(format!("no stream {stream}")))?;
        Ok(self.segment_blocks.saturating_sub(lock(st).offset))
    }

    /// Segments of the log (free or not).
    #[must_use]
    pub fn segment_count(&self) -> u32 {
        lock(&self.sb).sb.segment_count
    }

    /// Usage of each segment of `stream`'s chain since its checkpoint, oldest first.
    ///
    /// # Errors
    /// An unknown stream.
    pub fn segment_usage(&self, stream: u16) -> Result<Vec<SegmentUsage>> {
        let st = self
            .streams
            .get(usize::from(stream))
            .ok_or_else(|| LogError::Invalid(format!("no stream {stream}")))?;
        let st = lock(st);
        let mut out: Vec<SegmentUsage> = st
            .chain
            .iter()
            .map(|&segment| SegmentUsage { segment, ..SegmentUsage::default() })
            .collect();
        // One pass over the placed transactions (tens of thousands after an untar), each
        // found in the chain by its segment: a search of the chain per transaction made this
        // quadratic, and it runs with the stream's lock held.
        let at: HashMap<u32, usize> = st.chain.iter().enumerate().map(|(i, &s)| (s, i)).collect();
        for p in &st.placed {
            if let Some(u) = at.get(&p.end_segment).and_then(|&i| out.get_mut(i)) {
                u.transactions += 1;
                u.records += u64::from(p.records);
                u.dead_records += u64::from(p.dead);
            }
        }
        Ok(out)
    }

    /// The segments of `stream`'s chain since its checkpoint, oldest first: what
    /// [`Log::segment_usage`] gives without counting the transactions in each.
    ///
    /// # Errors
    /// An unknown stream.
    pub fn chain(&self, stream: u16) -> Result<Vec<u32>> {
        let st = self
            .streams
            .get(usize::from(stream))
            .ok_or_else(|| LogError::Invalid(format!("no stream {stream}")))?;
        Ok(lock(st).chain.iter().copied().collect())
    }

    /// Every transaction of `stream` since its checkpoint, read from the device, oldest first,
    /// each with the segment its span ends in. For the layer above to measure how live each
    /// segment of the chain is (it alone knows which records are current).
    ///
    /// # Errors
    /// An unknown stream, I/O errors.
    pub fn stream_transactions(&self, stream: u16) -> Result<Vec<(u32, RecoveredTx)>> {
        let st = self
            .streams
            .get(usize::from(stream))
            .ok_or_else(|| LogError::Invalid(format!("no stream {stream}")))?;
        let (segments, upto): (HashMap<u64, u32>, Option<u64>) = {
            let st = lock(st);
            (
                st.placed.iter().map(|p| (p.seq, p.end_segment)).collect(),
                st.placed.back().map(|p| p.seq),
            )
        };
        let Some(upto) = upto else { return Ok(Vec::new()) };
        self.wait_durable(TxId { stream, seq: self.read_horizon(stream, upto) })?;
        let sb = lock(&self.sb).sb.clone();
        let txs = read_transactions(&*self.dev, &sb, self.options, stream, upto)?;
        Ok(txs.into_iter().filter_map(|t| segments.get(&t.id.seq).map(|&s| (s, t))).collect())
    }

    /// The transactions whose spans end in the oldest segment of `stream`'s chain, read from
    /// the device, with that segment; `None` when the chain holds only the current segment
    /// (nothing to clean). For the layer above to judge how much of the segment is live before
    /// cleaning it.
    ///
    /// # Errors
    /// An unknown stream, I/O errors.
    pub fn oldest_segment_transactions(
        &self,
        stream: u16,
    ) -> Result<Option<(u32, Vec<RecoveredTx>)>> {
        let st = self
            .streams
            .get(usize::from(stream))
            .ok_or_else(|| LogError::Invalid(format!("no stream {stream}")))?;
        let (segment, first, upto) = {
            let st = lock(st);
            let Some(&segment) = st.chain.front().filter(|_| st.chain.len() > 1) else {
                return Ok(None);
            };
            let mut in_it = oldest_run(&st.placed, segment, u64::MAX);
            let Some(first) = in_it.next().map(|p| p.seq) else {
                return Ok(Some((segment, Vec::new())));
            };
            (segment, first, in_it.last().map_or(first, |p| p.seq))
        };
        self.wait_durable(TxId { stream, seq: self.read_horizon(stream, upto) })?;
        let sb = lock(&self.sb).sb.clone();
        let txs = read_transactions(&*self.dev, &sb, self.options, stream, upto)?;
        Ok(Some((segment, txs.into_iter().filter(|t| t.id.seq >= first).collect())))
    }

    /// Clean the `segments` oldest segments of `stream`'s chain (never its current one): read
    /// every transaction in them, let `relocate` say what to re-commit (`None`: nothing of it is
    /// live; an error stops the cleaning before anything is written), re-commit that on the same stream, make it durable, then checkpoint past the
    /// cleaned transactions so their segments are freed.
    ///
    /// # Errors
    /// I/O errors, [`LogError::NoSpace`] when the relocated records do not fit (checked before
    /// anything is written, so the log is unchanged; a concurrent committer on the same log can
    /// still take the space in between), and errors the commits of the relocations return.
    pub fn clean<F>(&self, stream: u16, segments: usize, mut relocate: F) -> Result<CleanReport>
    where
        F: FnMut(&RecoveredTx) -> Result<Option<Transaction>>,
    {
        self.clean_split(stream, segments, |tx| Ok(relocate(tx)?.into_iter().collect()))
    }

    /// [`Log::clean`] where the records of one cleaned transaction may be re-committed as
    /// several transactions (`relocate` returns them in order; empty: nothing of it is live),
    /// so that the layer above can cut what it relocates to the space left in segments. The
    /// report's `relocated` holds one entry per new transaction, in commit order, each with
    /// the old transaction it carries records of.
    ///
    /// # Errors
    /// As [`Log::clean`].
    pub fn clean_split<F>(&self, stream: u16, segments: usize, relocate: F) -> Result<CleanReport>
    where
        F: FnMut(&RecoveredTx) -> Result<Vec<Transaction>>,
    {
        self.clean_split_to(stream, segments, stream, relocate)
    }

    /// [`Log::clean_split`] whose relocations are committed on stream `target` (which may be
    /// `stream`): the layer above keeps what survives cleaning apart from fresh writes (the
    /// module's documentation says why recovery stays correct). The report's `relocated`
    /// tickets are on `target`.
    ///
    /// # Errors
    /// As [`Log::clean`]; [`LogError::NoSpace`] names `target`, an unknown `target` is
    /// [`LogError::Invalid`].
    pub fn clean_split_to<F>(
        &self,
        stream: u16,
        segments: usize,
        target: u16,
        relocate: F,
    ) -> Result<CleanReport>
    where
        F: FnMut(&RecoveredTx) -> Result<Vec<Transaction>>,
    {
        let st = self.cleaned_stream(stream, target)?;
        let before = self.dev.stats();
        let upto = {
            let st = lock(st);
            let cleaned: Vec<u32> = st
                .chain
                .iter()
                .take(segments.min(st.chain.len().saturating_sub(1)))
                .copied()
                .collect();
            // Never into an open large transaction: its parts wait for its close.
            let open_run = st.runs.keys().next().copied().unwrap_or(u64::MAX);
            st.placed
                .iter()
                .rev()
                .find(|p| cleaned.contains(&p.end_segment) && p.seq < open_run)
                .map(|p| p.seq)
        };
        let Some(upto) = upto else { return Ok(CleanReport::default()) };
        self.wait_durable(TxId { stream, seq: self.read_horizon(stream, upto) })?;
        let sb = lock(&self.sb).sb.clone();
        let txs = read_transactions(&*self.dev, &sb, self.options, stream, upto)?;
        self.relocate_and_checkpoint(stream, target, upto, &txs, relocate, before)
    }

    /// The stream `stream` to clean onto `target`, both checked to exist.
    fn cleaned_stream(&self, stream: u16, target: u16) -> Result<&Mutex<Stream>> {
        let st = self
            .streams
            .get(usize::from(stream))
            .ok_or_else(|| LogError::Invalid(format!("no stream {stream}")))?;
        if usize::from(target) >= self.streams.len() {
            return Err(LogError::Invalid(format!("no stream {target} to relocate to")));
        }
        Ok(st)
    }

    /// [`Log::clean_split_to`] of `stream`'s oldest segment, on `read`: that segment's
    /// transactions as the caller read them ([`Log::oldest_segment_transactions`]), perhaps
    /// with no lock of its own held and a while ago, instead of reading them again. Returns
    /// `None`, having written nothing, unless `read` holds exactly the transactions this
    /// call would read — those of `stream` since its checkpoint, up to the last one ending in
    /// its oldest segment (never into an open large transaction) — in order: a segment's
    /// transactions never change until it is freed, and transaction ids are never reused, so a
    /// segment cleaned (or checkpointed) since the read shows as other ids
    /// ([`Mutant::CleanReadUnchecked`] does not check, and is caught).
    ///
    /// # Errors
    /// As [`Log::clean_split_to`].
    pub fn clean_read_to<F>(
        &self,
        stream: u16,
        read: &[RecoveredTx],
        target: u16,
        relocate: F,
    ) -> Result<Option<CleanReport>>
    where
        F: FnMut(&RecoveredTx) -> Result<Vec<Transaction>>,
    {
        match self.clean_read_to_deferred(stream, read, target, relocate)? {
            Some(pending) => self.clean_finish(pending).map(Some),
            None => Ok(None),
        }
    }

    /// [`Log::clean_read_to`] in two steps: this one checks `read` and commits the
    /// relocations (their writes submitted, not waited for); [`Log::clean_finish`] makes them
    /// durable and frees the segment. The caller can switch its index to the copies between
    /// the two, with its own locks held, and wait for the device in the second with them
    /// given up, as long as it keeps reading the copies from memory until `clean_finish`
    /// returns and starts no other cleaning of `stream` meanwhile (the segment is still the
    /// stream's oldest, and would be relocated twice).
    ///
    /// # Errors
    /// As [`Log::clean_split_to`]; on an error nothing is left to finish.
    pub fn clean_read_to_deferred<F>(
        &self,
        stream: u16,
        read: &[RecoveredTx],
        target: u16,
        relocate: F,
    ) -> Result<Option<CleanPending>>
    where
        F: FnMut(&RecoveredTx) -> Result<Vec<Transaction>>,
    {
        let st = self.cleaned_stream(stream, target)?;
        let before = self.dev.stats();
        let placed: Vec<u64> = {
            let st = lock(st);
            let Some(&segment) = st.chain.front().filter(|_| st.chain.len() > 1) else {
                return Ok(None);
            };
            let open_run = st.runs.keys().next().copied().unwrap_or(u64::MAX);
            let Some(upto) = oldest_run(&st.placed, segment, open_run).last().map(|p| p.seq) else {
                return Ok(None);
            };
            st.placed.iter().map(|p| p.seq).take_while(|&seq| seq <= upto).collect()
        };
        let Some(&upto) = placed.last() else { return Ok(None) };
        let same = read.len() == placed.len()
            && read.iter().zip(&placed).all(|(t, &seq)| t.id == TxId { stream, seq });
        if !same && !self.mutant(Mutant::CleanReadUnchecked) {
            return Ok(None);
        }
        self.relocate(stream, target, upto, read, relocate, before).map(Some)
    }

    /// The common tail of [`Log::clean_split_to`] and [`Log::clean_read_to`]: `txs` (stream
    /// `stream`'s transactions since its checkpoint up to `upto`) relocated onto `target` as
    /// `relocate` says, made durable, and `upto` checkpointed. `before`: the device's counters
    /// when the cleaning began.
    fn relocate_and_checkpoint<F>(
        &self,
        stream: u16,
        target: u16,
        upto: u64,
        txs: &[RecoveredTx],
        relocate: F,
        before: tally_media::DeviceStats,
    ) -> Result<CleanReport>
    where
        F: FnMut(&RecoveredTx) -> Result<Vec<Transaction>>,
    {
        let pending = self.relocate(stream, target, upto, txs, relocate, before)?;
        self.clean_finish(pending)
    }

    /// The first step of [`Log::relocate_and_checkpoint`]: the relocations planned and
    /// committed (all or none: `NoSpace` with nothing written when they do not fit).
    fn relocate<F>(
        &self,
        stream: u16,
        target: u16,
        upto: u64,
        txs: &[RecoveredTx],
        mut relocate: F,
        before: tally_media::DeviceStats,
    ) -> Result<CleanPending>
    where
        F: FnMut(&RecoveredTx) -> Result<Vec<Transaction>>,
    {
        let to = usize::from(target);
        let mut report =
            CleanReport { transactions_read: txs.len() as u64, ..CleanReport::default() };
        // Plan every relocation first: either all of them fit, or nothing is written and the
        // caller gets NoSpace with the log as it was (no half-relocated duplicates).
        let mut moved: Vec<(TxId, Transaction)> = Vec::new();
        for tx in txs {
            for mut t in relocate(tx)? {
                t.retarget(target);
                moved.push((tx.id, t));
            }
        }
        let spans: Vec<u64> = moved.iter().map(|(_, t)| self.planned_span(t)).collect();
        if !self.room_for(to, &spans) {
            return Err(LogError::NoSpace { stream: target });
        }
        for (old, t) in moved {
            let info = self.commit(t)?;
            report.relocated.push((old, info));
            report.transactions_relocated += 1;
        }
        Ok(CleanPending { stream, upto, before, report })
    }

    /// The second step of a cleaning ([`Log::clean_read_to_deferred`]): the relocations made
    /// durable — on every stream, with whatever else was committed meanwhile — and the cleaned
    /// stream checkpointed at the last transaction cleaned, which frees its segments (a
    /// stream checkpoint already at or past it is left as it is, as [`Log::checkpoint`] does).
    ///
    /// # Errors
    /// I/O errors (the log has failed: the cleaned segments stay, the copies may be lost, and
    /// recovery finds the records in one or the other).
    pub fn clean_finish(&self, pending: CleanPending) -> Result<CleanReport> {
        let CleanPending { stream, upto, before, mut report } = pending;
        let free_before = self.free_segments();
        if self.mutant(Mutant::RelocationNotDurable) {
            // The mutant makes only the cleaned stream durable, as if the copies were on it.
            let last = self.streams.get(usize::from(stream)).map_or(upto, |st| lock(st).last_seq);
            self.wait_durable(TxId { stream, seq: last })?;
        } else {
            // Every stream: the copies are on `target`, the checkpoint frees `stream`'s
            // segments, and the superblock moving it must not reach the media before them.
            self.sync()?;
        }
        self.checkpoint(stream, upto)?;
        report.checkpointed_seq = Some(upto);
        report.segments_freed = self.free_segments().saturating_sub(free_before);
        report.bytes_written = (self.dev.stats() - before).bytes_written;
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tally_media::{Device, MemDevice};

    use crate::{Log, LogConfig, LogError, Mutant, OpenOptions, Recovery, Transaction};

    fn reopen(dev: &Arc<MemDevice>) -> (Log, Recovery) {
        Log::open(dev.clone(), OpenOptions::default()).unwrap()
    }

    fn records(r: &Recovery, stream: usize) -> Vec<String> {
        r.streams[stream]
            .txs
            .iter()
            .flat_map(|t| t.records.iter().map(|r| String::from_utf8_lossy(r).into_owned()))
            .collect()
    }

    fn tx(stream: u16, tag: &str) -> Transaction {
        let mut t = Transaction::new(stream);
        t.record(tag.as_bytes().to_vec());
        t
    }

    /// Cleaning stream 0 onto stream 1: the copies land after stream 1's own transactions,
    /// stream 0's cleaned segment is freed, and a reopen finds each record once, where it now
    /// is; a target that does not exist changes nothing.
    #[test]
    fn cleaning_onto_another_stream_moves_the_live_records_there() {
        let dev = Arc::new(MemDevice::new(512, 2 + 12 * 8).unwrap());
        Log::format(&*dev, &LogConfig { streams: 2, segment_blocks: 8, uuid: [7; 16] }).unwrap();
        let (log, _) = reopen(&dev);
        log.commit_durable(tx(1, "s1")).unwrap();
        for i in 0..12 {
            log.commit_durable(tx(0, &format!("r{i}"))).unwrap();
        }
        let keep = |t: &crate::RecoveredTx| {
            let name = String::from_utf8_lossy(&t.records[0]).into_owned();
            let mut moved = Transaction::new(0); // retargeted by the log
            moved.record(t.records[0].clone());
            Ok(if name == "r3" || name == "r5" { vec![moved] } else { Vec::new() })
        };
        let bad = log.clean_split_to(0, 1, 2, keep);
        assert!(matches!(bad, Err(LogError::Invalid(_))), "{bad:?}");
        let free_before = log.free_segments();
        let report = log.clean_split_to(0, 1, 1, keep).unwrap();
        assert_eq!((report.transactions_read, report.transactions_relocated), (8, 2));
        assert!(report
            .relocated
            .iter()
            .all(|(old, new)| old.stream == 0 && new.ticket.stream == 1));
        // Stream 0's head is freed; the copies took no new segment (stream 1's has room).
        assert_eq!(log.free_segments(), free_before + 1);
        drop(log);
        let (_log, r) = reopen(&dev);
        assert_eq!(records(&r, 0), ["r8", "r9", "r10", "r11"]);
        assert_eq!(records(&r, 1), ["s1", "r3", "r5"]);
    }

    /// What `clean_read_to` does with a read made stale — the segment read was cleaned since
    /// and the next one is now the stream's head — and then with a fresh read; `Err` says
    /// what went wrong. Refused, nothing written; then cleaned; each record once after a
    /// reopen.
    fn clean_on_a_stale_read(mutant: Option<Mutant>) -> Result<(), String> {
        let dev = Arc::new(MemDevice::new(512, 2 + 12 * 8).unwrap());
        Log::format(&*dev, &LogConfig { streams: 1, segment_blocks: 8, uuid: [9; 16] }).unwrap();
        let (log, _) = Log::open(dev.clone(), OpenOptions { mutant, ..OpenOptions::default() })
            .map_err(|e| e.to_string())?;
        let mut want: Vec<String> = (0..20).map(|i| format!("r{i}")).collect();
        for tag in &want {
            log.commit_durable(tx(0, tag)).unwrap();
        }
        let keep = |t: &crate::RecoveredTx| {
            let mut moved = Transaction::new(0);
            moved.record(t.records[0].clone());
            Ok(vec![moved])
        };
        let (_, stale) = log.oldest_segment_transactions(0).unwrap().unwrap();
        let first = log.clean_split_to(0, 1, 0, keep).unwrap();
        assert_eq!(first.transactions_read, stale.len() as u64);
        let written = dev.stats().bytes_written;
        let refused = log.clean_read_to(0, &stale, 0, keep).map_err(|e| e.to_string())?;
        if refused.is_some() || dev.stats().bytes_written != written {
            return Err(format!("a stale read was cleaned: {refused:?}"));
        }
        let (_, fresh) = log.oldest_segment_transactions(0).unwrap().unwrap();
        let report = log.clean_read_to(0, &fresh, 0, keep).unwrap().ok_or("fresh read refused")?;
        assert_eq!(report.transactions_read, fresh.len() as u64);
        assert_eq!(report.transactions_relocated, fresh.len() as u64);
        drop(log);
        let (_log, r) = reopen(&dev);
        let mut got = records(&r, 0);
        got.sort();
        want.sort();
        if got != want {
            return Err(format!("after a reopen: {got:?}"));
        }
        Ok(())
    }

    /// `Log::clean_read_to` refuses transactions that are not the log's own (read before their
    /// segment was cleaned), before anything is written; with the log's own, it cleans.
    #[test]
    fn a_stale_read_is_refused_before_anything_is_written() {
        clean_on_a_stale_read(None).unwrap();
    }

    /// The mutant that does not check the read relocates stale records and frees the head's.
    #[test]
    #[cfg_attr(not(feature = "mutants"), ignore = "needs the mutants feature")]
    fn clean_read_unchecked_is_caught() {
        let caught = clean_on_a_stale_read(Some(Mutant::CleanReadUnchecked));
        assert!(caught.is_err(), "the clean-read-unchecked mutant was not caught");
    }
}

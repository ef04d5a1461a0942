//! `PmemLog`: format, open (recovery), commit, release.
//!
//! Invariants kept here (checked by the assertions below and by `tests/crash.rs`):
//! - `head <= tail` and `tail - head <= unit_count`: live units never overwrite each other;
//! - `live` holds every transaction in `head..tail`, in order, lsn-contiguous, the oldest
//!   starting at `head`; it is never empty once a transaction was committed (the newest one is
//!   kept as the anchor that tells recovery the next sequence number);
//! - a commit writes only slots of `tail..tail + count`, never a live one;
//! - after the first failed store, flush or crc-protected read, every commit and release is
//!   refused ([`PmemLogError::Failed`]).

use std::collections::VecDeque;

use tally_media::Pmem;

use crate::copy::{LogStats, Persister};
use crate::format::{
    decode_records, encode_records, CommitMode, RegionHeader, UnitHeader, COMMIT_OFF, EPOCH_OFF,
    HEADER_OFF, HEADER_SIZE, HEAD_OFF, UNITS_OFF, UNIT_HEADER_SIZE,
};
use crate::mutant::{self, Mutant};
use crate::PmemLogError;

/// What `format` fixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogConfig {
    /// Bytes per log unit: a multiple of 64 (default 256, four cache lines).
    pub unit_size: u32,
    /// How transactions commit.
    pub mode: CommitMode,
    /// Identity of this format (seeds the units' crcs); any value, e.g. random.
    pub uuid: u64,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            unit_size: crate::format::UNIT_SIZE_DEFAULT,
            mode: CommitMode::Count,
            uuid: 0x7a11_7a11_0000_0001,
        }
    }
}

/// Per-open choices that are not persisted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// Transactions of at least this many encoded bytes are copied non-temporally; smaller ones
    /// with cached stores and line flushes. `0`: always non-temporal.
    pub nt_copy_min: u32,
    /// Benchmark only: no flush and no fence at commit, so nothing is ordered or durable. The
    /// upper bound that ordering overhead is measured against.
    pub unordered: bool,
    /// A deliberately broken protocol (needs the `mutants` feature).
    pub mutant: Option<Mutant>,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning { nt_copy_min: 1024, unordered: false, mutant: None }
    }
}

/// A transaction found by recovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveredTx {
    /// Its sequence number.
    pub seq: u64,
    /// Its records, as committed.
    pub records: Vec<Vec<u8>>,
}

#[derive(Debug, Clone, Copy)]
struct LiveTx {
    seq: u64,
    lsn: u64,
    count: u64,
}

/// A log on persistent memory. See the crate documentation for the protocol.
pub struct PmemLog<'a> {
    io: Persister<'a>,
    header: RegionHeader,
    tuning: Tuning,
    /// Session number stamped on every unit written by this open.
    epoch: u32,
    head: u64,
    tail: u64,
    next_seq: u64,
    live: VecDeque<LiveTx>,
    failed: Option<String>,
    unit_buf: Vec<u8>,
}

impl<'a> PmemLog<'a> {
    /// Write an empty log over `pm` and open it.
    ///
    /// The words are made durable before the header, so a crash during format leaves either no
    /// header (not formatted) or a complete empty log.
    ///
    /// # Errors
    /// [`PmemLogError::BadConfig`] for a geometry that does not fit, region errors.
    pub fn format(
        pm: &'a dyn Pmem,
        config: &LogConfig,
        tuning: Tuning,
    ) -> Result<Self, PmemLogError> {
        check_tuning(&tuning)?;
        let unit_count = pm.len().saturating_sub(UNITS_OFF) / u64::from(config.unit_size.max(1));
        let header = RegionHeader {
            unit_size: config.unit_size,
            unit_count,
            uuid: config.uuid,
            mode: config.mode,
        };
        header.check_geometry(pm.len()).map_err(PmemLogError::BadConfig)?;
        let mut io = Persister { pm, stats: LogStats::default(), mutant: tuning.mutant };
        // A header from an earlier format goes first, so a crash cannot pair it with new words.
        io.copy_cached(HEADER_OFF, &[0u8; HEADER_SIZE], true)?;
        io.fence();
        for off in [HEAD_OFF, EPOCH_OFF, COMMIT_OFF] {
            io.store_word(off, 0, true)?;
        }
        io.fence();
        io.copy_cached(HEADER_OFF, &header.encode(), true)?;
        io.fence();
        let (log, recovered) = Self::open(pm, tuning)?;
        debug_assert!(recovered.is_empty());
        Ok(log)
    }

    /// Open the log on `pm`: recover the longest in-order prefix of complete transactions from
    /// the head, then start a new session (the epoch word, persisted before any unit).
    ///
    /// # Errors
    /// [`PmemLogError::NotFormatted`], [`PmemLogError::Corrupted`] for bytes no legal crash
    /// leaves, region errors.
    pub fn open(
        pm: &'a dyn Pmem,
        tuning: Tuning,
    ) -> Result<(Self, Vec<RecoveredTx>), PmemLogError> {
        check_tuning(&tuning)?;
        let mut hb = [0u8; HEADER_SIZE];
        pm.read(HEADER_OFF, &mut hb)?;
        let header = RegionHeader::decode(&hb, pm.len())?;
        let head = read_word(pm, HEAD_OFF)?;
        let epoch_word = read_word(pm, EPOCH_OFF)?;
        let commit_word = read_word(pm, COMMIT_OFF)?;
        let epoch = epoch_word
            .checked_add(1)
            .and_then(|e| u32::try_from(e).ok())
            .ok_or(PmemLogError::Corrupted { at: EPOCH_OFF, what: "epoch word exhausted" })?;
        let limit = match header.mode {
            CommitMode::Count => None,
            CommitMode::Classic => {
                if commit_word < head || commit_word - head > header.unit_count {
                    let what = "commit word outside the live range";
                    return Err(PmemLogError::Corrupted { at: COMMIT_OFF, what });
                }
                Some(commit_word)
            }
        };
        let scan = scan(pm, &header, head, limit, tuning.mutant)?;
        if let Some(limit) = limit {
            if scan.end != limit {
                let what = "a transaction below the commit word is missing or torn";
                return Err(PmemLogError::Corrupted { at: header.unit_off(scan.end), what });
            }
        }
        let next_seq = match scan.txs.last() {
            Some(tx) => tx.seq + 1,
            None if head == 0 => 1,
            None => {
                let what = "no transaction at the head (its anchor is gone)";
                return Err(PmemLogError::Corrupted { at: header.unit_off(head), what });
            }
        };
        let mut io = Persister { pm, stats: LogStats::default(), mutant: tuning.mutant };
        // The new session's number is durable before any unit carries it: units of an
        // interrupted commit from an earlier session can then never pass for this session's.
        io.store_word(EPOCH_OFF, u64::from(epoch), true)?;
        io.fence();
        let live = scan.live.into();
        let log = PmemLog {
            io,
            header,
            tuning,
            epoch,
            head,
            tail: scan.end,
            next_seq,
            live,
            failed: None,
            unit_buf: Vec::with_capacity(header.unit_size as usize),
        };
        log.check_invariants();
        Ok((log, scan.txs))
    }

    /// Commit a transaction of `records`: durable when this returns (unless
    /// [`Tuning::unordered`]). Count mode: copy the units, flush their lines, one fence.
    /// Classic mode: the same, then the commit word, flush, a second fence.
    ///
    /// Returns the transaction's sequence number.
    ///
    /// # Errors
    /// [`PmemLogError::Full`], [`PmemLogError::TooLarge`], [`PmemLogError::Failed`], region
    /// errors (after which the log is failed).
    pub fn commit(&mut self, records: &[&[u8]]) -> Result<u64, PmemLogError> {
        self.check_not_failed()?;
        let payload_bytes: u64 = records.iter().map(|r| r.len() as u64 + 4).sum();
        let payload_max = self.header.payload_max() as u64;
        let count = payload_bytes.div_ceil(payload_max).max(1);
        if records.iter().any(|r| u32::try_from(r.len()).is_err())
            || count > u64::from(u16::MAX)
            || count > self.header.unit_count
        {
            return Err(PmemLogError::TooLarge { bytes: payload_bytes });
        }
        let free = self.header.unit_count - (self.tail - self.head);
        if count > free {
            return Err(PmemLogError::Full { needed: count, free });
        }
        let payload = encode_records(records);
        let result = self.write_units(&payload, count);
        if let Err(e) = &result {
            self.failed.get_or_insert_with(|| e.to_string());
        }
        result
    }

    fn write_units(&mut self, payload: &[u8], count: u64) -> Result<u64, PmemLogError> {
        let seq = self.next_seq;
        let lsn = self.tail;
        let seed = self.header.crc_seed();
        let ordered = !self.tuning.unordered;
        let nt = ordered && payload.len() as u64 >= u64::from(self.tuning.nt_copy_min);
        let mut chunks = payload.chunks(self.header.payload_max());
        for index in 0..count {
            let chunk = chunks.next().unwrap_or(&[]);
            let unit = UnitHeader {
                lsn: lsn + index,
                seq,
                epoch: self.epoch,
                // count <= u16::MAX and chunk.len() <= payload_max < u16::MAX (checked).
                index: index as u16,
                count: count as u16,
                len: chunk.len() as u16,
            };
            let mut buf = std::mem::take(&mut self.unit_buf);
            unit.encode_into(seed, chunk, &mut buf);
            let off = self.header.unit_off(lsn + index);
            let stored = if nt {
                self.io.copy_nt(off, &buf)
            } else {
                self.io.copy_cached(off, &buf, ordered)
            };
            self.unit_buf = buf;
            stored?;
        }
        if ordered {
            let classic = self.header.mode == CommitMode::Classic;
            // The mutant: classic's commit word is stored without the fence that orders it
            // after the units.
            if !(classic && mutant::is(self.tuning.mutant, Mutant::MissingFenceBeforeWatermark)) {
                self.io.fence();
            }
            if classic {
                self.io.store_word(COMMIT_OFF, lsn + count, true)?;
                self.io.fence();
            }
        } else if self.header.mode == CommitMode::Classic {
            self.io.store_word(COMMIT_OFF, lsn + count, false)?;
        }
        self.tail = lsn + count;
        self.next_seq = seq + 1;
        self.live.push_back(LiveTx { seq, lsn, count });
        self.io.stats.commits += 1;
        self.check_invariants();
        Ok(seq)
    }

    /// Free every transaction older than `seq`, which must be live: the head moves to `seq`'s
    /// first unit with one 8-byte atomic store, flushed and fenced before any later commit can
    /// overwrite the freed slots. The newest transaction can never be freed (it anchors the
    /// sequence numbers), so `seq = newest` frees everything else.
    ///
    /// # Errors
    /// [`PmemLogError::NotLive`], [`PmemLogError::Failed`], region errors.
    pub fn release_before(&mut self, seq: u64) -> Result<(), PmemLogError> {
        self.check_not_failed()?;
        let Some(tx) = self.live.iter().find(|t| t.seq == seq).copied() else {
            return Err(PmemLogError::NotLive { seq });
        };
        if tx.lsn == self.head {
            return Ok(());
        }
        let result = self.io.store_word(HEAD_OFF, tx.lsn, true).map(|()| self.io.fence());
        if let Err(e) = &result {
            self.failed.get_or_insert_with(|| e.to_string());
            return result;
        }
        self.head = tx.lsn;
        while self.live.front().is_some_and(|t| t.seq < seq) {
            self.live.pop_front();
        }
        self.check_invariants();
        Ok(())
    }

    /// Units free for new transactions.
    #[must_use]
    pub fn free_units(&self) -> u64 {
        self.header.unit_count - (self.tail - self.head)
    }

    /// Units a transaction of `records` takes.
    #[must_use]
    pub fn units_for(&self, records: &[&[u8]]) -> u64 {
        let bytes: u64 = records.iter().map(|r| r.len() as u64 + 4).sum();
        bytes.div_ceil(self.header.payload_max() as u64).max(1)
    }

    /// Sequence number of the newest live transaction (`None` before the first commit).
    #[must_use]
    pub fn newest_seq(&self) -> Option<u64> {
        self.live.back().map(|t| t.seq)
    }

    /// The region header.
    #[must_use]
    pub fn header(&self) -> RegionHeader {
        self.header
    }

    /// Persistence work so far (this open).
    #[must_use]
    pub fn stats(&self) -> LogStats {
        self.io.stats
    }

    fn check_not_failed(&self) -> Result<(), PmemLogError> {
        match &self.failed {
            Some(first_error) => Err(PmemLogError::Failed { first_error: first_error.clone() }),
            None => Ok(()),
        }
    }

    fn check_invariants(&self) {
        assert!(self.head <= self.tail && self.tail - self.head <= self.header.unit_count);
        if self.live.is_empty() {
            assert_eq!(self.head, self.tail, "nothing live, nothing between head and tail");
        }
        if let (Some(first), Some(last)) = (self.live.front(), self.live.back()) {
            assert_eq!(first.lsn, self.head);
            assert_eq!(last.lsn + last.count, self.tail);
            assert_eq!(last.seq + 1, self.next_seq);
        }
        #[cfg(debug_assertions)]
        for (a, b) in self.live.iter().zip(self.live.iter().skip(1)) {
            assert_eq!((a.lsn + a.count, a.seq + 1), (b.lsn, b.seq));
        }
    }
}

fn check_tuning(tuning: &Tuning) -> Result<(), PmemLogError> {
    if tuning.mutant.is_some() && !mutant::available() {
        return Err(PmemLogError::BadConfig("mutants need a build with the `mutants` feature"));
    }
    Ok(())
}

fn read_word(pm: &dyn Pmem, off: u64) -> Result<u64, PmemLogError> {
    let mut w = [0u8; 8];
    pm.read(off, &mut w)?;
    Ok(u64::from_le_bytes(w))
}

struct Scan {
    txs: Vec<RecoveredTx>,
    live: Vec<LiveTx>,
    /// lsn just past the last accepted transaction.
    end: u64,
}

/// The longest in-order prefix of complete transactions starting at `head` (and, in classic
/// mode, ending at or before `limit`). Reads at most `unit_count` units.
fn scan(
    pm: &dyn Pmem,
    header: &RegionHeader,
    head: u64,
    limit: Option<u64>,
    mutant: Option<Mutant>,
) -> Result<Scan, PmemLogError> {
    let seed = header.crc_seed();
    let payload_max = header.payload_max();
    let check_crc = !mutant::is(mutant, Mutant::UnitLargerThanAtomicWithoutCrc);
    let mut slot = vec![0u8; header.unit_size as usize];
    let mut out = Scan { txs: Vec::new(), live: Vec::new(), end: head };
    let mut expect_seq: Option<u64> = None;
    let mut epoch_min = 0u32;
    let mut payload = Vec::new();
    'txs: while out.end - head < header.unit_count {
        let lsn = out.end;
        // Read one unit and keep it only if it is the one expected at `lsn + i` of the
        // transaction whose first unit is `first`.
        let mut first: Option<UnitHeader> = None;
        payload.clear();
        let mut i = 0u64;
        loop {
            pm.read(header.unit_off(lsn + i), &mut slot)?;
            let Some(u) = UnitHeader::decode_unchecked(&slot, payload_max) else { break 'txs };
            let fits = |f: &UnitHeader| {
                u.lsn == lsn + i
                    && u64::from(u.index) == i
                    && u.count == f.count
                    && u.seq == f.seq
                    && u.epoch == f.epoch
                    // All units but the last are full.
                    && (u64::from(u.index) + 1 == u64::from(u.count)
                        || usize::from(u.len) == payload_max)
            };
            let f = *first.get_or_insert(u);
            if !fits(&f)
                || (check_crc && !u.crc_ok(seed, &slot))
                || f.epoch < epoch_min
                || expect_seq.is_some_and(|s| s != f.seq)
                || lsn - head + u64::from(f.count) > header.unit_count
                || limit.is_some_and(|l| lsn + u64::from(f.count) > l)
            {
                break 'txs;
            }
            payload
                .extend_from_slice(&slot[UNIT_HEADER_SIZE..UNIT_HEADER_SIZE + usize::from(u.len)]);
            i += 1;
            if i == u64::from(f.count) {
                break;
            }
        }
        let Some(f) = first else { break };
        let Some(records) = decode_records(&payload) else {
            if !check_crc {
                // The mutant took torn bytes for a unit; it stops here rather than erroring.
                break;
            }
            let what = "records of a complete transaction do not decode";
            return Err(PmemLogError::Corrupted { at: header.unit_off(lsn), what });
        };
        out.txs.push(RecoveredTx { seq: f.seq, records });
        out.live.push(LiveTx { seq: f.seq, lsn, count: u64::from(f.count) });
        out.end = lsn + u64::from(f.count);
        expect_seq = f.seq.checked_add(1);
        epoch_min = f.epoch;
        if expect_seq.is_none() {
            break;
        }
    }
    Ok(out)
}

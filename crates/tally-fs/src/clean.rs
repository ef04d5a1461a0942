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

use std::collections::HashMap;

use tally_log::{LogError, Transaction, TxId};

use crate::fs::lock;
use crate::mutant::FsMutant;
use crate::record::{Record, DATA_HOLE};
use crate::state::{Key, State};
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

#[derive(Default)]
struct Plan {
    seen: Vec<Key>,
    /// Relocated keys and, for data, the block's index in the new transaction.
    moved: Vec<(Key, Option<u32>)>,
}

impl Fs {
    /// Clean the `segments` oldest segments of `stream`.
    ///
    /// # Errors
    /// `EBUSY` while explicit transactions are open, `ENOSPC` when the live records do not fit
    /// (nothing changed), I/O errors, corrupted records.
    pub fn clean(&self, stream: u16, segments: usize) -> Result<FsCleanReport> {
        let mut st = lock(&self.state);
        self.clean_locked(&mut st, stream, segments)
    }

    /// Clean the oldest segment of the stream with the longest chain, if any stream has more
    /// than its current segment. Returns whether anything was freed.
    pub(crate) fn clean_some(&self, st: &mut State) -> Result<bool> {
        if !st.txns.open.is_empty() {
            return Ok(false);
        }
        let mut best: Option<(usize, u16)> = None;
        for s in 0..self.streams {
            let n = self.log.segment_usage(s)?.len();
            if n > 1 && best.is_none_or(|(m, _)| n > m) {
                best = Some((n, s));
            }
        }
        let Some((_, stream)) = best else { return Ok(false) };
        let r = self.clean_locked(st, stream, 1)?;
        Ok(r.log.segments_freed > 0)
    }

    pub(crate) fn clean_locked(
        &self,
        st: &mut State,
        stream: u16,
        segments: usize,
    ) -> Result<FsCleanReport> {
        if !st.txns.open.is_empty() {
            return Err(FsError::Busy);
        }
        if let Some(e) = &st.failed {
            return Err(FsError::ReadOnly(e.clone()));
        }
        let bs = self.bs as usize;
        let dev = self.log.device().clone();
        let mut plans: HashMap<TxId, Plan> = HashMap::new();
        let mut report = FsCleanReport::default();
        let tombstones_kept = self.mutant != Some(FsMutant::TombstoneDroppedEarly);
        let state: &State = st;
        let log_report = self.log.clean(stream, segments, |rtx| {
            let mut t = Transaction::new(stream);
            let mut plan = Plan::default();
            for bytes in &rtx.records {
                let rec = Record::decode(bytes).map_err(|e| LogError::Corrupted {
                    what: "file-system record",
                    block: rtx.data_start,
                    reason: e.to_string(),
                })?;
                let key = Key::of(&rec);
                plan.seen.push(key.clone());
                report.records_read += 1;
                if !live(state, &rec, &key, tombstones_kept) {
                    continue;
                }
                let rec = match rec {
                    Record::Extent { ver, ino, block, data, crc } if data != DATA_HOLE => {
                        let mut buf = vec![0u8; bs];
                        dev.read(rtx.data_start + u64::from(data), &mut buf)?;
                        if crc32c::crc32c(&buf) != crc {
                            return Err(LogError::Corrupted {
                                what: "data block",
                                block: rtx.data_start + u64::from(data),
                                reason: format!("checksum mismatch (block {block} of inode {ino})"),
                            });
                        }
                        let idx = t.data(buf);
                        plan.moved.push((key, Some(idx)));
                        Record::Extent { ver, ino, block, data: idx, crc }
                    }
                    rec => {
                        plan.moved.push((key, None));
                        rec
                    }
                };
                t.record(rec.encode());
            }
            let relocate = !plan.moved.is_empty();
            plans.insert(rtx.id, plan);
            Ok(relocate.then_some(t))
        })?;
        let landed: HashMap<TxId, tally_log::CommitInfo> =
            log_report.relocated.iter().copied().collect();
        for (old, plan) in plans {
            for k in &plan.seen {
                st.uncount(k);
            }
            let Some(info) = landed.get(&old) else { continue };
            for (key, idx) in plan.moved {
                st.count(&key);
                report.records_relocated += 1;
                if let (Key::Block(ino, b), Some(idx)) = (&key, idx) {
                    report.data_blocks_relocated += 1;
                    if let Some(block) = st.inodes.get_mut(ino).and_then(|i| i.blocks.get_mut(b)) {
                        block.addr = info.data_start + u64::from(idx);
                        block.tx = Some(info.ticket);
                    }
                }
            }
            for k in plan.seen {
                if !st.in_log(&k) {
                    st.tombs.remove(&k);
                    if let Key::Inode(ino) = k {
                        st.freed.remove(&ino);
                    }
                }
            }
        }
        report.log = log_report;
        Ok(report)
    }
}

/// Is `rec` the record that still defines its object?
pub(crate) fn live(st: &State, rec: &Record, key: &Key, tombstones_kept: bool) -> bool {
    let ver = rec.ver();
    let owner = key.owner();
    if let (Some(&freed), Record::Free { .. }) = (st.freed.get(&owner), rec) {
        // The free is needed while anything older of the inode is still in the log.
        return freed == ver && tombstones_kept && st.ino_count.get(&owner).is_some_and(|&c| c > 1);
    }
    if !matches!(key, Key::Fs) && !st.inodes.contains_key(&owner) {
        return false; // freed: everything of it is dead
    }
    let tomb_needed = || {
        tombstones_kept
            && st.tombs.get(key) == Some(&ver)
            && st.key_count.get(key).is_some_and(|&c| c > 1)
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
                .and_then(|d| d.entries.get(name))
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

impl Fs {
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
        let mut report = MaintainReport::default();
        let dirty = !lock(&self.state).cached.is_empty();
        if dirty {
            self.sync()?;
            report.synced = true;
        }
        let total = self.log.device().geometry().block_count / u64::from(self.segment_blocks);
        let mut st = lock(&self.state);
        // Thorough cleaning: a stream's oldest segment less than half live is worth moving.
        if st.txns.open.is_empty() {
            for stream in 0..self.streams {
                for _ in 0..total {
                    if !self.oldest_mostly_dead(&mut st, stream)? {
                        break;
                    }
                    let before = self.log.free_segments();
                    match self.clean_locked(&mut st, stream, 1) {
                        Ok(_) => {
                            report.mostly_dead_cleaned += 1;
                            report.segments_freed +=
                                self.log.free_segments().saturating_sub(before);
                        }
                        Err(FsError::NoSpace) => break,
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        for _ in 0..total {
            let free = u64::from(self.log.free_segments());
            if free * 100 >= total * CLEAN_BELOW_FREE_PERCENT {
                break;
            }
            let before = self.log.free_segments();
            match self.clean_some(&mut st) {
                Ok(true) => {
                    report.segments_freed += self.log.free_segments().saturating_sub(before)
                }
                Ok(false) | Err(FsError::NoSpace) => break,
                Err(e) => return Err(e),
            }
        }
        Ok(report)
    }
}

impl Fs {
    /// Is less than half of `stream`'s oldest segment (bytes of records and data blocks) live?
    /// Measured by reading the segment; not measured again for the same segment until data
    /// blocks amounting to half a segment have died since (records only ever die).
    fn oldest_mostly_dead(&self, st: &mut State, stream: u16) -> Result<bool> {
        let Some(&(segment, dead_then)) = st.liveness_checked.get(&stream) else {
            return self.measure_oldest(st, stream);
        };
        let current = self.log.segment_usage(stream)?.first().map(|u| u.segment);
        let died = st.dead_blocks.saturating_sub(dead_then);
        if current == Some(segment) && died < u64::from(self.segment_blocks / 2) {
            return Ok(false);
        }
        self.measure_oldest(st, stream)
    }

    fn measure_oldest(&self, st: &mut State, stream: u16) -> Result<bool> {
        let Some((segment, txs)) = self.log.oldest_segment_transactions(stream)? else {
            return Ok(false);
        };
        let bs = u64::from(self.bs);
        let (mut total, mut alive) = (0u64, 0u64);
        for tx in &txs {
            total += u64::from(tx.data_count) * bs;
            for bytes in &tx.records {
                let rec = Record::decode(bytes)?;
                let key = Key::of(&rec);
                let data = matches!(rec, Record::Extent { data, .. } if data != DATA_HOLE);
                let size = bytes.len() as u64 + if data { bs } else { 0 };
                total += bytes.len() as u64;
                if live(st, &rec, &key, true) {
                    alive += size;
                }
            }
        }
        let mostly_dead = alive * 2 < total;
        if !mostly_dead {
            st.liveness_checked.insert(stream, (segment, st.dead_blocks));
        }
        Ok(mostly_dead)
    }
}

/// A thread running [`Fs::maintain`] every interval; stops (and is joined) when dropped, or by
/// itself once the file system is dropped.
pub struct Maintenance {
    stop: std::sync::Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Maintenance {
    /// Start the thread. It holds only a weak reference to the file system.
    #[must_use]
    pub fn spawn(fs: &std::sync::Arc<Fs>, every: std::time::Duration) -> Maintenance {
        let weak = std::sync::Arc::downgrade(fs);
        let stop = std::sync::Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("tally-fs-maintain".into())
            .spawn(move || loop {
                {
                    let (m, cv) = &*flag;
                    let guard = m.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    let (guard, _) = cv
                        .wait_timeout_while(guard, every, |stopped| !*stopped)
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    if *guard {
                        return;
                    }
                }
                let Some(fs) = weak.upgrade() else { return };
                if let Err(e) = fs.maintain() {
                    tracing::error!("background maintenance failed: {e}");
                    return;
                }
            })
            .ok();
        Maintenance { stop, thread }
    }
}

impl Drop for Maintenance {
    fn drop(&mut self) {
        let (m, cv) = &*self.stop;
        *m.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = true;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

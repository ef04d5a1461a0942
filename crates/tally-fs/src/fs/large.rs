//! Large explicit transactions (issue 15): a transaction is bounded by free space, not by a
//! log segment, and does not hold its contents in DRAM.
//!
//! - While it runs, its data blocks go to the device in *parts* of the log's large
//!   transaction (`Transaction::run_part`): once [`Fs::part_blocks`] blocks are pending, they
//!   are written out of place as extent records with their data, and their bytes are dropped
//!   from memory once the device has them (`Log::write_out_completed`, no flush). Nothing they
//!   replace is touched: the blocks they supersede stay until the transaction commits.
//! - At commit, what is left (inodes, entries, the last data, tombstones) is cut into log
//!   transactions of at most half a segment each, all parts of the same run but the last,
//!   which is the run's close. The log commits the run iff the close survives with every
//!   part (count-based commit across segments); an abort or a crash before the close leaves
//!   nothing of it (its parts are garbage for cleaning).
//! - Bookkeeping (versions, record counts, tombstones) of the commit's own pieces is done only
//!   once every piece is committed; the parts written while the transaction ran keep what an
//!   abort must put back (`TxnState::streamed`).
//!
//! Invariants: a transaction's parts are all on its stream (`TxnState::stream`); a part's
//! keys leave `touched` (the commit does not write them again unless changed again); the
//! close carries the transaction's dependencies; cleaning, checkpoints and snapshots never
//! run while a transaction is open (`clean.rs`, `checkpoint_with`).

use std::collections::{BTreeSet, HashMap};

use tally_log::{CommitInfo, TxId};

use crate::state::{Key, State};
use crate::txn::{TxnId, TxnState};
use crate::types::{Attr, Ino};
use crate::{FsError, Result};

use super::commit::Submit;
use super::{Fs, CACHE_LIMIT};

/// Data blocks per part at most (1 MiB of 4 KiB blocks): large enough that a part's units are
/// few, small enough that a part wastes little at a segment's end.
const PART_BLOCKS_MAX: u64 = 256;

impl Fs {
    /// Pending data blocks of an explicit transaction that trigger a part.
    pub(crate) fn part_blocks(&self) -> u64 {
        (u64::from(self.segment_blocks) / 4).clamp(1, PART_BLOCKS_MAX)
    }

    /// Blocks one commit piece may take: half a segment, so a piece that does not fit the
    /// rest of a segment wastes at most that.
    fn piece_blocks(&self) -> u64 {
        (u64::from(self.segment_blocks) / 2).max(1)
    }

    /// Before an operation of transaction `id` that adds `blocks` data blocks is handed to
    /// it: whether it makes a part due, and if so whether the part will find room (`ENOSPC`
    /// otherwise: the operation is refused, the transaction stays as it was).
    pub(crate) fn part_due(&self, st: &mut State, id: TxnId, blocks: u64) -> Result<bool> {
        let Some(t) = st.txns.open.get(&id) else { return Ok(false) };
        let pending = t.unstreamed.saturating_add(blocks);
        if pending < self.part_blocks() {
            return Ok(false);
        }
        // The part's blocks and their records, and a segment's end it may leave unused.
        let need = Self::reservation_cost(pending).saturating_add(u64::from(self.segment_blocks));
        let growth = self.growth_blocks(st);
        if growth < need {
            tracing::debug!(pending, need, growth, "no room for a transaction's next part: ENOSPC");
            return Err(FsError::NoSpace);
        }
        Ok(true)
    }

    /// Write transaction `id`'s pending data blocks as parts of its run. Returns whether the
    /// data held in memory is past [`CACHE_LIMIT`] (the caller then drops what the device has,
    /// outside the lock: [`Fs::drop_written_cache`]). Out of space, the blocks stay pending
    /// (the commit fails cleanly later); I/O errors make the file system read-only.
    pub(crate) fn stream_txn_data(&self, st: &mut State, id: TxnId) -> Result<bool> {
        let Some(t) = st.txns.open.get_mut(&id) else { return Ok(false) };
        t.unstreamed = 0;
        let stream = t.stream.unwrap_or(0);
        let mut run = t.run;
        let keys: Vec<Key> = t
            .touched
            .iter()
            .filter(|k| {
                let Key::Block(ino, b) = k else { return false };
                st.inodes
                    .get(ino)
                    .and_then(|i| i.blocks.get(b))
                    .is_some_and(|blk| blk.data.is_some() && blk.tx.is_none())
            })
            .cloned()
            .collect();
        let ver = st.next_ver();
        let per_part = usize::try_from(self.part_blocks()).unwrap_or(usize::MAX);
        for chunk in keys.chunks(per_part) {
            let saved: Vec<(Key, Option<u64>)> =
                chunk.iter().map(|k| (k.clone(), st.tombs.get(k).copied())).collect();
            let Some(built) = Self::build(st, chunk.iter(), &HashMap::new(), ver, stream, &[])
            else {
                continue;
            };
            let mut tx = built.tx;
            tx.run_part(run);
            let info = match self.log_commit_part(st, tx, Submit::Now) {
                Ok(info) => info,
                Err(FsError::NoSpace) => break,
                Err(e) => return Err(e),
            };
            run.get_or_insert(info.ticket.seq);
            self.bookkeep(st, built.written, info, ver);
            let Some(t) = st.txns.open.get_mut(&id) else { break };
            t.run = run;
            for k in chunk {
                t.touched.remove(k);
            }
            t.streamed.extend(saved);
        }
        Ok(st.cached_bytes > CACHE_LIMIT)
    }

    /// Drop the bytes held in memory of data blocks the device has completed (no flush): for
    /// a transaction's parts, which are not durable until its commit.
    pub(crate) fn drop_written_cache(&self) {
        let done = match self.log.write_out_completed() {
            Ok(done) => done,
            Err(e) => {
                let e = self.fail(e);
                tracing::error!("write-out of a transaction's data failed: {e}");
                return;
            }
        };
        // A poisoned lock is reported by the next operation.
        let _ = self.prune_cache_in_slices(|s| done.get(s).copied().unwrap_or(0), true);
    }

    /// Commit an ended transaction's keys: one log transaction as before when it fits half
    /// a segment and wrote no part; otherwise pieces of its run, the last one its close
    /// (with its dependencies). Returns the last transaction written (`None`: nothing).
    pub(crate) fn persist_txn(
        &self,
        st: &mut State,
        t: &TxnState,
        overrides: &HashMap<Ino, Attr>,
        ver: u64,
        stream: u16,
        deps: &[TxId],
    ) -> Result<Option<TxId>> {
        let pieces = self.pieces(st, &t.touched, overrides);
        if t.run.is_none() && pieces.len() <= 1 {
            return self.persist(st, &t.touched, overrides, ver, stream, deps, Submit::Now);
        }
        // Room for every piece before anything is written (each may leave a segment's end).
        let planned: u64 = pieces.iter().map(|p| p.1).sum();
        let waste = (pieces.len() as u64).saturating_mul(self.piece_blocks());
        let growth = self.growth_blocks(st);
        if growth < planned.saturating_add(waste) {
            tracing::debug!(planned, waste, growth, "no room for a transaction's commit: ENOSPC");
            return Err(FsError::NoSpace);
        }
        let mut run = t.run;
        let last = pieces.len().saturating_sub(1);
        let mut committed: Vec<(Vec<crate::fs::commit::Written>, CommitInfo)> = Vec::new();
        for (i, (keys, _)) in pieces.iter().enumerate() {
            let piece_deps = if i == last { deps } else { &[] };
            let built = Self::build(st, keys.iter(), overrides, ver, stream, piece_deps);
            let (mut tx, written) = match built {
                Some(b) => (b.tx, b.written),
                // Nothing to write in the last piece: the close still has to be written.
                None if i == last => (tally_log::Transaction::new(stream), Vec::new()),
                None => continue,
            };
            match (i == last, run) {
                (true, Some(r)) => tx.run_close(r),
                (_, r) => tx.run_part(r),
            };
            let info = if i == last {
                self.log_commit(st, tx, Submit::Now)?
            } else {
                self.log_commit_part(st, tx, Submit::Now)?
            };
            run.get_or_insert(info.ticket.seq);
            committed.push((written, info));
        }
        let Some(close) = committed.last().map(|c| c.1.ticket) else { return Ok(None) };
        for (written, info) in committed {
            self.bookkeep(st, written, info, ver);
        }
        let owners: BTreeSet<Ino> = t.touched.iter().map(Key::owner).collect();
        for ino in owners.into_iter().chain(t.streamed.iter().map(|(k, _)| k.owner())) {
            if let Some(i) = st.inodes.get_mut(&ino) {
                i.last_tx = Some(close);
            }
        }
        Ok(Some(close))
    }

    /// `keys` cut into pieces of at most [`Fs::piece_blocks`] blocks (records and data), in
    /// key order, each with the blocks it takes.
    fn pieces(
        &self,
        st: &State,
        keys: &BTreeSet<Key>,
        overrides: &HashMap<Ino, Attr>,
    ) -> Vec<(Vec<Key>, u64)> {
        let _ = overrides;
        let payload = u64::from(self.bs).saturating_sub(64).max(1);
        let max = self.piece_blocks();
        let mut out: Vec<(Vec<Key>, u64)> = Vec::new();
        let (mut cur, mut data, mut bytes) = (Vec::new(), 0u64, 64u64);
        for key in keys {
            let (d, b) = Self::key_cost(st, key);
            let blocks = |data: u64, bytes: u64| data.saturating_add(bytes.div_ceil(payload));
            if !cur.is_empty() && blocks(data + d, bytes + b) > max {
                out.push((std::mem::take(&mut cur), blocks(data, bytes)));
                (data, bytes) = (0, 64);
            }
            cur.push(key.clone());
            data += d;
            bytes += b;
        }
        if !cur.is_empty() {
            out.push((cur, data.saturating_add(bytes.div_ceil(payload))));
        }
        out
    }

    /// Data blocks and record bytes (an upper bound) the record of `key` takes.
    fn key_cost(st: &State, key: &Key) -> (u64, u64) {
        let inode = st.inodes.get(&key.owner());
        match key {
            Key::Fs => (0, 64),
            Key::Inode(_) => (0, 128 + inode.map_or(0, |i| i.target.len() as u64)),
            Key::Dentry(_, name) => (0, 64 + name.len() as u64),
            Key::Block(_, b) => {
                let data =
                    inode.and_then(|i| i.blocks.get(b)).is_some_and(|blk| blk.data.is_some());
                (u64::from(data), 64)
            }
            Key::Xattr(_, name) => {
                let value = inode.and_then(|i| i.xattrs.get(name)).map_or(0, |x| x.value.len());
                (0, 64 + name.len() as u64 + value as u64)
            }
        }
    }

    /// An ended transaction that did not commit: give its run up and put back the
    /// bookkeeping its parts changed (their records stay in the log, dead, for cleaning).
    pub(crate) fn revert_streamed(&self, st: &mut State, t: &TxnState) {
        if let Some(run) = t.run {
            self.log.abandon_run(t.stream.unwrap_or(0), run);
        }
        for (key, tomb) in &t.streamed {
            st.uncount(key);
            if let Some(v) = tomb {
                st.tombs.insert(key.clone(), *v);
            }
        }
        st.dead_blocks += t.streamed.len() as u64;
    }
}

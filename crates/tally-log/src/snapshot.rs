//! Clean close: a snapshot of the log's stream state and of the layer above's state, so the next
//! open restores both without scanning the log. Its bytes are `crate::format::snapshot`'s; this
//! module writes it, and reads it back only after checking it against the superblock.
//!
//! Invariants:
//! - the snapshot is written to free segments and made durable *before* the superblock points
//!   at it; a crash before that leaves a superblock without a snapshot, and open scans;
//! - open clears the pointer (with the usual epoch bump) durably *before* anything new is
//!   written, so a snapshot is used at most once: after a later crash the log is scanned, never
//!   restored from a stale snapshot;
//! - a close never checkpoints: the log still holds every transaction the snapshot describes,
//!   so a snapshot that fails any check is ignored and the log is scanned instead;
//! - nothing the size of the snapshot is allocated before its header's crc, segment list and
//!   length are checked, and the restored state is trusted only once it agrees with the
//!   superblock and with itself: every segment held once (chains, next segments and the
//!   snapshot's own segments disjoint), each chain starting at its stream's checkpoint, placed
//!   transactions in increasing seq order and inside their chain. The asserts of
//!   `crate::space` and the arithmetic of a checkpoint rely on this.
#![cfg_attr(
    not(test),
    deny(
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects,
        clippy::cast_possible_truncation
    )
)]

use std::collections::VecDeque;

use tally_media::{IoBuf, Write, WriteFlags};

use crate::engine::{lock, Placed, Stream};
use crate::error::corrupted;
use crate::format::codec::widen;
use crate::format::crc_seeded;
use crate::format::snapshot::{blob_prefix, decode_blob, PlacedTx, SnapshotHeader, StreamState};
use crate::format::superblock::{StreamRoot, Superblock};
use crate::space::{Claims, Owner};
use crate::{Log, LogError, Result};

impl Log {
    /// Close the log cleanly: make everything durable, then write a snapshot holding the
    /// streams' state and `payload` (the state of the layer above) to free segments and point
    /// the superblock at it. The next [`Log::open`] restores from it without scanning and hands
    /// `payload` back in [`crate::Recovery::snapshot`].
    ///
    /// Returns `false` (and the log is simply closed) when the snapshot does not fit in the
    /// free segments; the next open then scans.
    ///
    /// # Errors
    /// I/O errors; an earlier failure (fail-stop).
    pub fn close_clean(self, payload: &[u8]) -> Result<bool> {
        self.sync()?;
        let sb = lock(&self.sb);
        let states = self.stream_states(true);
        Ok(self.write_snapshot(sb, &states, &[payload], false)?.is_some())
    }

    /// Write a *checkpoint snapshot* while the log stays open: make everything committed
    /// durable, write the streams' state and `payload` (the layer above's state, which must
    /// describe exactly what was committed before this call: nothing may be committed
    /// meanwhile) to free segments, flush, and point the superblock at it. Unlike a clean
    /// close's, it is kept across opens: [`Log::open`] after a crash restores the streams from
    /// it, scans only what was written after it, and hands back `payload` with those
    /// transactions ([`crate::Recovery::snapshot_is_checkpoint`]). The previous checkpoint
    /// snapshot's segments are freed once the new superblock is durable. Nothing is
    /// checkpointed: the log still holds everything, so a snapshot that fails its checks is
    /// ignored and the log scanned.
    ///
    /// Returns `false` (nothing changed) when the snapshot does not fit the free segments,
    /// when a transaction was committed while it was being taken, or while a large
    /// transaction is open ([`crate::Transaction::run_part`]).
    ///
    /// # Errors
    /// I/O errors; an earlier failure (fail-stop).
    pub fn checkpoint_snapshot(&self, payload: &[u8]) -> Result<bool> {
        self.checkpoint_snapshot_parts(&[payload])
    }

    /// [`Log::checkpoint_snapshot`] of the payload `parts` make one after another (written
    /// from where they are, as if concatenated): a caller that keeps its state's encoding in
    /// pieces hands them over without first copying them into one buffer.
    ///
    /// # Errors
    /// As [`Log::checkpoint_snapshot`].
    pub fn checkpoint_snapshot_parts(&self, parts: &[&[u8]]) -> Result<bool> {
        match self.checkpoint_snapshot_begin()? {
            Some(start) => self.checkpoint_snapshot_finish(start, parts),
            None => Ok(false),
        }
    }

    /// [`Log::checkpoint_snapshot_parts`] in two steps, so that the caller need not keep
    /// everyone else from committing while the snapshot is made durable and written. `begin`
    /// takes the streams' positions (no device I/O: the caller may hold a lock others wait
    /// for): the payload handed to `finish` must describe exactly what was committed before
    /// `begin` returned, and nothing may be committed between the two until `begin` has
    /// returned (the caller's lock). After it, others may commit: their transactions follow
    /// the positions taken, so a recovery from this snapshot replays them on top. From
    /// `begin` to `finish` the superblock is held (the returned [`CheckpointStart`]): no
    /// stream checkpoint frees the segments the positions name, and a commit that must
    /// reserve sequence numbers waits (one in [`OpenOptions::seq_reserve`](crate::OpenOptions)
    /// commits: 2^24 by default). `None` (nothing changed) while a large transaction is open.
    ///
    /// # Errors
    /// An earlier failure (fail-stop).
    pub fn checkpoint_snapshot_begin(&self) -> Result<Option<CheckpointStart<'_>>> {
        self.check_failed()?;
        // An open large transaction's parts are in the log but not in `payload`'s state, and
        // a later close needs them: no checkpoint snapshot while one is open.
        if (0..self.streams.len()).any(|s| self.first_open_run(s).is_some()) {
            return Ok(None);
        }
        // Superblock, then the streams: the lock order of `raise_seq_limit`.
        let sb = lock(&self.sb);
        // Positions only: the placed transactions are copied in `finish`, with the caller's
        // lock given up (below).
        let states = self.stream_states(false);
        let placed = self.placed_blocks.load(std::sync::atomic::Ordering::Relaxed);
        Ok(Some(CheckpointStart { sb, states, placed }))
    }

    /// The second step of [`Log::checkpoint_snapshot_begin`]: make everything up to the
    /// positions it took durable (a durable wait on each stream's last transaction then,
    /// with the superblock held: a flush round takes no superblock lock), write those
    /// positions and `parts` (the payload, as in [`Log::checkpoint_snapshot_parts`]) to free
    /// segments, flush, point the superblock at them, and free the previous checkpoint
    /// snapshot's segments. `false` (nothing changed) when it does not fit. The superblock
    /// is written only once every transaction the snapshot describes is durable, so a crash
    /// at any point recovers either the previous checkpoint and the log after it, or this one
    /// and the log after it.
    ///
    /// # Errors
    /// I/O errors (fail-stop).
    pub fn checkpoint_snapshot_finish(
        &self,
        start: CheckpointStart<'_>,
        parts: &[&[u8]],
    ) -> Result<bool> {
        let CheckpointStart { sb, mut states, placed } = start;
        let wants: Vec<crate::TxId> = states
            .iter()
            .enumerate()
            .filter_map(|(s, st)| {
                Some(crate::TxId { stream: u16::try_from(s).ok()?, seq: st.last_seq })
            })
            .collect();
        if !self.mutant(crate::Mutant::CheckpointBeforeDurable) {
            self.wait_durable_all(&wants)?;
        }
        self.fill_placed(&mut states);
        let Some(segments) = self.write_snapshot(sb, &states, parts, true)? else {
            return Ok(false);
        };
        // What was placed after `begin` is after the positions taken: a crash replays it.
        let _ = self.placed_blocks.fetch_update(
            std::sync::atomic::Ordering::Relaxed,
            std::sync::atomic::Ordering::Relaxed,
            |now| Some(now.saturating_sub(placed)),
        );
        let old = std::mem::replace(&mut *lock(&self.checkpoint_snapshot), segments);
        let mut space = lock(&self.space);
        for s in old {
            space.release(s);
        }
        Ok(true)
    }

    /// Blocks placed in the streams since the checkpoint snapshot in force was written (or
    /// since the open, which restored from it or scanned): what a crash now would replay.
    #[must_use]
    pub fn blocks_since_checkpoint_snapshot(&self) -> u64 {
        self.placed_blocks.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The checkpoint snapshot in force: its segments, first first (empty without one).
    #[must_use]
    pub fn checkpoint_snapshot_segments(&self) -> Vec<u32> {
        lock(&self.checkpoint_snapshot).clone()
    }

    /// Write a snapshot of the streams' state `states` (taken while `sb_state` was held) and
    /// `payload` to free segments, flush, and point the superblock at it (`checkpoint`: as a
    /// checkpoint snapshot). `None` when it does not fit.
    fn write_snapshot(
        &self,
        mut sb_state: std::sync::MutexGuard<'_, crate::engine::SbState>,
        states: &[StreamState],
        payload: &[&[u8]],
        checkpoint: bool,
    ) -> Result<Option<Vec<u32>>> {
        // The blob is the prefix and then the payload, written from where they are: the
        // payload (the file system's whole state: 20 MB for 100,000 files) is copied once,
        // into the writes' buffers. It was copied four times into fresh memory, whose page
        // faults cost more than the copies (the state lock is held meanwhile).
        let prefix = blob_prefix(states);
        let payload_len = payload.iter().fold(0usize, |n, p| n.saturating_add(p.len()));
        let blob_len = prefix.len().saturating_add(payload_len);
        let bs = u64::from(self.block_size);
        let seg_blocks = u64::from(self.segment_blocks);
        // The header block, then the blob.
        let blocks = widen(blob_len).div_ceil(bs).saturating_add(1);
        let count = blocks.div_ceil(seg_blocks);
        if count > widen(SnapshotHeader::segment_count_max(self.block_size)) {
            tracing::warn!(bytes = blob_len, "snapshot too large");
            return Ok(None);
        }
        let mut segments = Vec::new();
        {
            let mut space = lock(&self.space);
            for _ in 0..count {
                match space.alloc() {
                    Some(s) => segments.push(s),
                    None => {
                        for &s in &segments {
                            space.release(s);
                        }
                        tracing::warn!("no free segments for the snapshot");
                        return Ok(None);
                    }
                }
            }
        }
        let Some(sb_generation) = sb_state.sb.generation.checked_add(1) else {
            tracing::warn!("superblock generation exhausted; no snapshot");
            return Ok(None);
        };
        let header = SnapshotHeader {
            sb_generation,
            payload_len: widen(blob_len),
            payload_crc: payload
                .iter()
                .fold(crc_seeded(&self.uuid, &[&prefix]), |crc, p| crc32c::crc32c_append(crc, p)),
            segments,
        };
        // Header, then the blob, block after block through the listed segments.
        let head = header.encode(&self.uuid, self.block_size);
        let mut parts: Vec<&[u8]> = Vec::with_capacity(payload.len().saturating_add(2));
        parts.extend([&head[..], &prefix[..]]);
        parts.extend(payload.iter().copied());
        let starts: Vec<usize> = parts
            .iter()
            .scan(0usize, |at, p| {
                let start = *at;
                *at = at.saturating_add(p.len());
                Some(start)
            })
            .collect();
        let bs_bytes = self.block_size as usize;
        let total = parts.iter().map(|p| p.len()).sum::<usize>().next_multiple_of(bs_bytes);
        let segment_bytes = usize::try_from(seg_blocks.saturating_mul(bs)).unwrap_or(usize::MAX);
        let mut writes = Vec::new();
        for (i, &s) in header.segments.iter().enumerate() {
            let from = i.saturating_mul(segment_bytes);
            let to = from.saturating_add(segment_bytes).min(total);
            let mut at = from;
            while at < to {
                let end = at.saturating_add(SNAPSHOT_WRITE_BYTES).min(to);
                let block = self
                    .segment_start(s)
                    .saturating_add(widen(at.saturating_sub(from)).checked_div(bs).unwrap_or(0));
                writes.push(Write::new(block, gather_window(&parts, &starts, at, end)));
                at = end;
            }
        }
        self.dev.write_sync(writes, WriteFlags::NONE).map_err(|e| self.fail(e))?;
        // The snapshot durable before the superblock that points at it.
        self.dev.flush().map_err(|e| self.fail(e))?;
        let mut sb = sb_state.sb.clone();
        sb.snapshot = header.segments.first().copied();
        sb.snapshot_generation = checkpoint.then_some(sb_generation);
        self.write_superblock(&mut sb_state, sb, true)?;
        Ok(Some(header.segments))
    }

    /// Every stream's position, and (`with_placed`) its placed transactions.
    fn stream_states(&self, with_placed: bool) -> Vec<StreamState> {
        self.streams
            .iter()
            .map(|st| {
                let st = lock(st);
                StreamState {
                    last_seq: st.last_seq,
                    segment: st.segment,
                    offset: st.offset,
                    next_segment: st.next_segment,
                    chain: st.chain.iter().copied().collect(),
                    placed: if with_placed {
                        st.placed.iter().map(placed_tx).collect()
                    } else {
                        Vec::new()
                    },
                }
            })
            .collect()
    }

    /// Fill in the placed transactions of `states`, positions taken by `stream_states(false)`
    /// with the superblock held since: each stream's transactions up to the position's
    /// `last_seq`. None of them has left the stream meanwhile (a stream checkpoint, the only
    /// thing that drops placed transactions, holds the superblock), and those placed since
    /// come after it. Their dead-record counts are read now, so they may count records
    /// superseded after the positions were taken: counts that only steer which segment
    /// cleaning looks at (`Log::mark_dead`), saturating at the transaction's record count.
    /// Copying them when the positions are taken, under the caller's lock, was O(placed
    /// transactions): about 20 ms holding the file system's state lock in one trace of
    /// `examples/small_beside_large.rs`, a few hundred thousand 4 KiB writes in (28 Nov).
    fn fill_placed(&self, states: &mut [StreamState]) {
        for (st, state) in self.streams.iter().zip(states.iter_mut()) {
            let st = lock(st);
            let upto = state.last_seq;
            state.placed = st.placed.iter().take_while(|p| p.seq <= upto).map(placed_tx).collect();
        }
    }
}

/// A placed transaction as a snapshot records it.
fn placed_tx(p: &Placed) -> PlacedTx {
    PlacedTx {
        seq: p.seq,
        epoch: p.epoch,
        end_segment: p.end_segment,
        end_offset: p.end_offset,
        next_segment: p.next_segment,
        records: p.records,
        dead_records: p.dead,
    }
}

/// A checkpoint snapshot begun ([`Log::checkpoint_snapshot_begin`]): the streams' positions
/// it describes, with the superblock held until [`Log::checkpoint_snapshot_finish`] (or until
/// it is dropped, which abandons it: nothing was written).
#[must_use = "a begun checkpoint holds the superblock until it is finished or dropped"]
pub struct CheckpointStart<'a> {
    sb: std::sync::MutexGuard<'a, crate::engine::SbState>,
    states: Vec<StreamState>,
    /// Blocks placed since the last checkpoint snapshot when the positions were taken.
    placed: u64,
}

impl std::fmt::Debug for CheckpointStart<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckpointStart").field("placed", &self.placed).finish_non_exhaustive()
    }
}

/// Bytes per write of a snapshot: a size the I/O buffer pool keeps
/// ([`tally_media::IoBuf`]), so a checkpoint's buffers are mostly the last one's, not fresh
/// pages. A multiple of every block size.
const SNAPSHOT_WRITE_BYTES: usize = 1 << 20;

/// Bytes `[from, to)` of `parts` laid end to end (zeros past their end) in an I/O buffer.
fn gather_window(parts: &[&[u8]], starts: &[usize], from: usize, to: usize) -> IoBuf {
    let mut pieces: Vec<(usize, &[u8])> = Vec::new();
    // The first part ending after `from` (`starts[i]`: where part `i` begins): a payload in
    // many pieces (a file system's inodes, one each) is not walked from its start per window.
    let first = starts.partition_point(|&s| s <= from).saturating_sub(1);
    let mut start = starts.get(first).copied().unwrap_or(0);
    for part in parts.get(first..).unwrap_or_default() {
        if start >= to {
            break;
        }
        let end = start.saturating_add(part.len());
        let (a, b) = (start.max(from), end.min(to));
        // `start <= a < b <= end`: the piece lies inside `part`.
        if let Some(piece) = part.get(a.saturating_sub(start)..b.saturating_sub(start)) {
            if !piece.is_empty() {
                pieces.push((a.saturating_sub(from), piece));
            }
        }
        start = end;
    }
    IoBuf::gather(to.saturating_sub(from), &pieces)
}

/// A stream restored from a snapshot.
pub(crate) struct Restored {
    pub last_seq: u64,
    pub segment: u32,
    pub offset: u32,
    pub next_segment: u32,
    pub chain: VecDeque<u32>,
    pub placed: VecDeque<Placed>,
}

impl Restored {
    pub fn into_stream(self, epoch: u32, next_seq: u64) -> Stream {
        Stream {
            epoch,
            last_seq: self.last_seq,
            next_seq,
            // The caller sets the reservation it made durable.
            seq_limit: next_seq,
            segment: self.segment,
            offset: self.offset,
            next_segment: self.next_segment,
            chain: self.chain,
            placed: self.placed,
            pending: Vec::new(),
            submitting: false,
            direct_submits: 0,
            inflight: Vec::new(),
            durable: self.last_seq,
            runs: std::collections::BTreeMap::new(),
            last_close: 0,
            waits_on: std::collections::BTreeMap::new(),
        }
    }

    fn new(st: StreamState) -> Restored {
        let placed = |p: PlacedTx| Placed {
            seq: p.seq,
            epoch: p.epoch,
            end_segment: p.end_segment,
            end_offset: p.end_offset,
            next_segment: p.next_segment,
            records: p.records,
            dead: p.dead_records,
        };
        Restored {
            last_seq: st.last_seq,
            segment: st.segment,
            offset: st.offset,
            next_segment: st.next_segment,
            chain: st.chain.into(),
            placed: st.placed.into_iter().map(placed).collect(),
        }
    }
}

/// A snapshot that passed every check.
pub(crate) struct Found {
    /// Per stream; `None` for a stream whose checkpoint has passed the checkpoint snapshot's
    /// position (its chain is scanned from the checkpoint, as without a snapshot).
    pub streams: Vec<Option<Restored>>,
    /// The snapshot's own segments.
    pub segments: Vec<u32>,
    pub payload: Vec<u8>,
    /// Blocks read.
    pub blocks: u64,
}

/// Read and check the snapshot the superblock points at. `Ok(None)`, with a warning, when
/// anything is wrong with it: the caller then scans (the log still holds everything).
///
/// # Errors
/// I/O errors only.
pub(crate) fn read(
    dev: &dyn tally_media::Device,
    sb: &Superblock,
    check_generation: bool,
) -> Result<Option<Found>> {
    let Some(first) = sb.snapshot else { return Ok(None) };
    match load(dev, sb, first, check_generation) {
        Ok(found) => Ok(Some(found)),
        Err(e @ LogError::Corrupted { .. }) => {
            tracing::warn!("ignoring the clean-close snapshot ({e}); scanning the log");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// The snapshot starting in segment `first`, checked; [`LogError::Corrupted`] for anything
/// wrong with it.
fn load(
    dev: &dyn tally_media::Device,
    sb: &Superblock,
    first: u32,
    check_generation: bool,
) -> Result<Found> {
    let header_at = sb.segment_start(first);
    let bad = |reason: String| corrupted("clean-close snapshot", header_at, reason);
    let bs = usize::try_from(sb.block_size).map_err(|_| bad("block size".into()))?;
    let mut block = vec![0u8; bs];
    dev.read(header_at, &mut block)?;
    let header = SnapshotHeader::decode(&sb.uuid, &block, header_at, sb.segment_count)?;
    // A clean close's snapshot belongs to the superblock that points at it; a checkpoint
    // snapshot to the one that first did (the superblock records its generation).
    let expected = sb.snapshot_generation.unwrap_or(sb.generation);
    if check_generation && header.sb_generation != expected {
        return Err(bad("written for another superblock generation".into()));
    }
    if header.segments.first() != Some(&first) {
        return Err(bad("its list does not start at the superblock's segment".into()));
    }
    // The snapshot was written to free segments: none is where a stream's chain starts or
    // continues. (Its segments are distinct and inside the log: the header decoder checked.)
    for (s, root) in sb.streams.iter().enumerate() {
        if header.segments.contains(&root.checkpoint_segment)
            || header.segments.contains(&root.checkpoint_next_segment)
        {
            return Err(bad(format!("it lists a segment of stream {s}'s chain")));
        }
    }
    // Bound the length by the listed segments before allocating for it: at most the log.
    let seg_bytes = u64::from(sb.segment_blocks).saturating_mul(u64::from(sb.block_size));
    let room = widen(header.segments.len())
        .checked_mul(seg_bytes)
        .and_then(|n| n.checked_sub(u64::from(sb.block_size)))
        .ok_or_else(|| bad("segment list".into()))?;
    if header.payload_len > room {
        return Err(bad(format!("{} bytes in {room} bytes of segments", header.payload_len)));
    }
    let len = usize::try_from(header.payload_len).map_err(|_| bad("length".into()))?;
    let blocks = header.payload_len.div_ceil(u64::from(sb.block_size)).saturating_add(1);
    let total = usize::try_from(blocks.saturating_mul(u64::from(sb.block_size)))
        .map_err(|_| bad("length".into()))?;
    let mut bytes = vec![0u8; total];
    let chunk = usize::try_from(seg_bytes).map_err(|_| bad("segment size".into()))?;
    for (part, &s) in bytes.chunks_mut(chunk).zip(&header.segments) {
        dev.read(sb.segment_start(s), part)?;
    }
    let blob_end = bs.checked_add(len).ok_or_else(|| bad("length".into()))?;
    let blob = bytes.get(bs..blob_end).ok_or_else(|| bad("length".into()))?;
    if crc_seeded(&sb.uuid, &[blob]) != header.payload_crc {
        return Err(bad("payload checksum".into()));
    }
    let (mut states, payload) = decode_blob(blob, sb.streams.len(), header_at)?;
    let keep = if sb.snapshot_generation.is_some() {
        trim_to_checkpoints(&mut states, sb).map_err(bad)?
    } else {
        vec![true; states.len()]
    };
    check_streams(&states, &keep, sb, &header.segments).map_err(bad)?;
    // The payload is the blob's tail: keep it in place rather than copy it.
    let payload_start = blob_end.saturating_sub(payload.len());
    bytes.truncate(blob_end);
    bytes.drain(..payload_start);
    let streams = states.into_iter().zip(keep).map(|(st, k)| k.then(|| Restored::new(st)));
    Ok(Found { streams: streams.collect(), segments: header.segments, payload: bytes, blocks })
}

/// A checkpoint snapshot's streams against checkpoints made after it (cleaning goes on while
/// the log is open): each chain loses the segments before its stream's checkpoint segment and
/// the placed transactions the checkpoint covers. Says per stream whether anything of the
/// snapshot's is left; a stream whose checkpoint reached the snapshot's position is scanned
/// from its checkpoint. A checkpoint segment the chain does not hold is refused.
fn trim_to_checkpoints(states: &mut [StreamState], sb: &Superblock) -> Result<Vec<bool>, String> {
    if states.len() != sb.streams.len() {
        return Err(format!("{} streams, the superblock has {}", states.len(), sb.streams.len()));
    }
    let mut keep = Vec::with_capacity(states.len());
    for (s, (st, root)) in states.iter_mut().zip(&sb.streams).enumerate() {
        if st.last_seq <= root.checkpoint_seq {
            keep.push(false);
            continue;
        }
        let Some(i) = st.chain.iter().position(|&seg| seg == root.checkpoint_segment) else {
            return Err(format!("stream {s}: its checkpoint is outside the snapshot's chain"));
        };
        st.chain.drain(..i);
        st.placed.retain(|p| p.seq > root.checkpoint_seq);
        keep.push(true);
    }
    Ok(keep)
}

/// Whether the streams' state agrees with the superblock and with itself (module docs).
fn check_streams(
    states: &[StreamState],
    keep: &[bool],
    sb: &Superblock,
    snapshot_segments: &[u32],
) -> Result<(), String> {
    if states.len() != sb.streams.len() {
        return Err(format!("{} streams, the superblock has {}", states.len(), sb.streams.len()));
    }
    let mut claims = Claims::new(sb.segment_count);
    for &s in snapshot_segments {
        claims.claim(s, Owner::Snapshot)?;
    }
    for (s, ((st, root), &k)) in states.iter().zip(&sb.streams).zip(keep).enumerate() {
        let s = u16::try_from(s).map_err(|_| "stream number".to_string())?;
        if !k {
            continue;
        }
        for &seg in &st.chain {
            claims.claim(seg, Owner::Chain(s))?;
        }
        claims.claim(st.next_segment, Owner::Next(s))?;
        check_stream(st, root, sb.segment_blocks).map_err(|why| format!("stream {s}: {why}"))?;
    }
    Ok(())
}

/// One stream's state against its root. Its segments are distinct and inside the log (claimed).
fn check_stream(st: &StreamState, root: &StreamRoot, segment_blocks: u32) -> Result<(), String> {
    let (Some(&front), Some(&back)) = (st.chain.first(), st.chain.last()) else {
        return Err("empty chain".into());
    };
    // The segment after `chain[i]`: the next in the chain, or the reserved one after the last.
    let successor =
        |i: usize| st.chain.get(i.saturating_add(1)).copied().unwrap_or(st.next_segment);
    if front != root.checkpoint_segment || successor(0) != root.checkpoint_next_segment {
        return Err("its chain does not start at its checkpoint".into());
    }
    if back != st.segment || st.offset > segment_blocks {
        return Err("its position is not at the end of its chain".into());
    }
    if st.last_seq == u64::MAX {
        return Err("its sequence numbers are exhausted".into());
    }
    // Walk the placed transactions along the chain: each ends strictly after the one before
    // (a span is at least one block), the first after the checkpoint.
    let mut prev = (0usize, root.checkpoint_offset, root.checkpoint_seq, root.checkpoint_epoch);
    for p in &st.placed {
        let (i, end_prev, seq_prev, epoch_prev) = prev;
        let Some(j) = st.chain.iter().skip(i).position(|&seg| seg == p.end_segment) else {
            return Err(format!("transaction {} ends outside its chain", p.seq));
        };
        let j = j.saturating_add(i);
        let after = if j == i { p.end_offset > end_prev } else { p.end_offset > 0 };
        if !after || p.end_offset > segment_blocks || p.next_segment != successor(j) {
            return Err(format!("transaction {} is not where its chain continues", p.seq));
        }
        if p.seq <= seq_prev || p.epoch < epoch_prev || p.epoch > root.epoch {
            return Err(format!("transaction {} is out of sequence", p.seq));
        }
        if p.dead_records > p.records {
            return Err(format!("transaction {} has more dead records than records", p.seq));
        }
        prev = (j, p.end_offset, p.seq, p.epoch);
    }
    let end = st
        .placed
        .last()
        .map_or((root.checkpoint_segment, root.checkpoint_offset, root.checkpoint_seq), |p| {
            (p.end_segment, p.end_offset, p.seq)
        });
    if end != (st.segment, st.offset, st.last_seq) {
        return Err("its position is not right after its last transaction".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> StreamRoot {
        StreamRoot {
            checkpoint_seq: 10,
            checkpoint_epoch: 1,
            checkpoint_segment: 3,
            checkpoint_offset: 4,
            checkpoint_next_segment: 7,
            epoch: 2,
            base_seq: 10,
            resume_seq: 11,
            seq_limit: 1 << 20,
        }
    }

    fn placed(seq: u64, end_segment: u32, end_offset: u32, next_segment: u32) -> PlacedTx {
        PlacedTx {
            seq,
            epoch: 2,
            end_segment,
            end_offset,
            next_segment,
            records: 2,
            dead_records: 0,
        }
    }

    /// Chain 3 → 7, next 9: two transactions in 3 after the checkpoint, one at the start of 7.
    fn state() -> StreamState {
        StreamState {
            last_seq: 13,
            segment: 7,
            offset: 2,
            next_segment: 9,
            chain: vec![3, 7],
            placed: vec![placed(11, 3, 6, 7), placed(12, 3, 16, 7), placed(13, 7, 2, 9)],
        }
    }

    #[test]
    fn a_consistent_state_passes() {
        check_stream(&state(), &root(), 16).unwrap();
        let idle = StreamState {
            last_seq: 10,
            segment: 3,
            offset: 4,
            next_segment: 7,
            chain: vec![3],
            placed: vec![],
        };
        check_stream(&idle, &root(), 16).unwrap();
    }

    /// Every state a log can be closed in passes the checks: random workloads (spans of one to
    /// twelve blocks on two streams, checkpoints, cleaning, a crash and recovery on the way)
    /// always reopen from their snapshot.
    #[test]
    fn every_snapshot_a_log_writes_passes_its_checks() {
        use std::sync::Arc;

        use tally_media::MemDevice;

        use crate::{LogConfig, OpenOptions, Transaction};

        for seed in 0..24 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let dev = Arc::new(MemDevice::new(512, 2048).unwrap());
            let config = LogConfig { streams: 2, segment_blocks: 16, uuid: [7; 16] };
            Log::format(&*dev, &config).unwrap();
            let (mut log, _) = Log::open(dev.clone(), OpenOptions::default()).unwrap();
            let mut last = [0u64; 2];
            for step in 0..rng.usize(20..120) {
                let stream = rng.u16(0..2);
                let s = usize::from(stream);
                match rng.u8(0..20) {
                    0 if last[s] > 0 => log.checkpoint(stream, last[s]).unwrap(),
                    1 => {
                        let keep = rng.bool();
                        let relocate = |tx: &crate::RecoveredTx| {
                            let mut t = Transaction::new(stream);
                            for r in &tx.records {
                                t.record(r.clone());
                            }
                            Ok(keep.then_some(t))
                        };
                        let _ = log.clean(stream, 1, relocate).unwrap();
                    }
                    2 if step % 3 == 0 => {
                        log.sync().unwrap();
                        drop(log); // crash, then recover by scanning
                        (log, _) = Log::open(dev.clone(), OpenOptions::default()).unwrap();
                    }
                    _ => {
                        let mut t = Transaction::new(stream);
                        t.record(vec![1; rng.usize(0..600)]);
                        for _ in 0..rng.usize(0..8) {
                            t.data(vec![2; 512]);
                        }
                        match log.commit(t) {
                            Ok(info) => last[s] = info.ticket.seq,
                            Err(crate::LogError::NoSpace { .. }) => {
                                log.sync().unwrap();
                                log.checkpoint(stream, last[s]).unwrap();
                            }
                            Err(e) => panic!("seed {seed}: {e}"),
                        }
                    }
                }
            }
            assert!(log.close_clean(b"state").unwrap(), "seed {seed}: no room for the snapshot");
            let (_log, r) = Log::open(dev.clone(), OpenOptions::default()).unwrap();
            assert_eq!(r.snapshot.as_deref(), Some(&b"state"[..]), "seed {seed}: snapshot refused");
        }
    }

    #[test]
    fn inconsistent_states_are_refused() {
        type Edit = (&'static str, fn(&mut StreamState));
        let edits: [Edit; 12] = [
            ("end segment outside the chain", |s| s.placed[0].end_segment = 5),
            ("end segment later than the next", |s| s.placed[0].end_segment = 7),
            ("seq out of order", |s| s.placed[1].seq = 11),
            ("seq at the checkpoint", |s| s.placed[0].seq = 10),
            ("end before the checkpoint", |s| s.placed[0].end_offset = 4),
            ("end past the segment", |s| s.placed[1].end_offset = 17),
            ("wrong next segment", |s| s.placed[0].next_segment = 9),
            ("epoch from the future", |s| s.placed[2].epoch = 3),
            ("chain not at the checkpoint", |s| s.chain[0] = 4),
            ("position not after the last", |s| s.offset = 3),
            ("last seq not the last", |s| s.last_seq = 14),
            ("more dead than records", |s| s.placed[2].dead_records = 3),
        ];
        for (what, edit) in edits {
            let mut st = state();
            edit(&mut st);
            assert!(check_stream(&st, &root(), 16).is_err(), "{what} accepted");
        }
    }
}

//! Opening a log: choose the superblock, scan every stream's chain in parallel, keep the longest
//! complete prefix, cut transactions whose dependencies did not survive (to a fixpoint), check
//! that nothing the log proved durable is missing, then seal each stream's tail and durably bump
//! every stream's epoch before anything new can be written.
//!
//! The acceptance rule for a transaction `T` found where the chain continues after the last
//! accepted `L` (stream root: epoch `E`, base `B`):
//! - `T` is whole: every unit decodes (crc seeded with the image uuid) with `T`'s identity, and
//!   every data block matches its crc (classic transactions also need their commit block);
//! - `T.prev_seq == L.seq`, `T.seq > L.seq`, `T.epoch >= L.epoch`, `T.seq == L.seq + 1` when
//!   both are of one epoch (a run numbers consecutively), and `T.seq < seq_limit`;
//! - `T.epoch == E`, or `T.epoch < E` and `T.seq <= B`.
//!
//! The chain continues right after `L` in the same segment, or at block 0 of the segment `L`
//! named as next (a transaction that did not fit the rest of its segment starts there).
//!
//! Why no discarded transaction (an *orphan*: complete, but after a gap or cut for a missing
//! dependency) is ever accepted later, however many crashes follow — the rule holds across
//! generations because of three things recovery does before the new epoch's superblock:
//! 1. **Seal.** The two places where a successor of the recovered tail can start (the block
//!    after it, block 0 of its next segment) are overwritten with zeros and flushed. An orphan
//!    can only chain to the tail from one of those places (an orphan's `prev_seq` names a
//!    transaction of its own run, and the tail is the last of those recovery kept), so every
//!    orphan becomes unreachable; a transaction written after the recovery chains to a new
//!    sequence number, which no orphan names (2).
//! 2. **Sequence numbers are never reused.** The superblock reserves each stream's numbers
//!    (`seq_limit`): a run writes only below the limit and raises it durably before passing it,
//!    so recovery resumes at the old limit, above anything on the device, seen or not. A
//!    dependency `(stream, seq)` therefore names exactly one transaction.
//! 3. **What recovery vouches for is durable before it says so.** After a process crash the
//!    scan may read transactions still in the device's volatile cache; the flush that makes the
//!    seals durable makes them durable too, before the superblock that records them as the base.
//!
//! Corruption is not a torn tail: every unit carries the stream's durable watermark when it was
//! placed. If a unit found after the chain's end (or a transaction cut for a dependency) proves
//! that a transaction the chain lacks was durable, recovery fails with
//! [`LogError::DurableTransactionLost`] and writes nothing, unless [`OpenOptions::salvage`]
//! asks to keep the longest safe prefix (then [`Recovery::damage`] says what was dropped).
//!
//! Recovery writes the seals, then the superblock (the other copy, then a flush), so a crash
//! inside it leaves either the old or the new superblock, and running it again gives the same
//! result (the seals only overwrite places no survivor occupies).
#![cfg_attr(
    not(test),
    deny(
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects,
        clippy::cast_possible_truncation
    )
)]

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tally_media::{Device, IoBuf, Write, WriteFlags};

use crate::engine::{crc_padded, Placed, SbState, Stream};
use crate::error::corrupted;
use crate::format::body::{Body, Run, RunRole, TxId};
use crate::format::codec::widen;
use crate::format::superblock::{StreamRoot, Superblock, SB_BLOCKS};
use crate::format::unit::{UnitHeader, UnitKind, FLAG_CLASSIC};
use crate::space::{Claims, Owner, Space};
use crate::{Log, LogError, Mutant, OpenOptions, Result};

/// A transaction that survived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveredTx {
    /// Its identity.
    pub id: TxId,
    /// Epoch it was written in.
    pub epoch: u32,
    /// Its records, in order.
    pub records: Vec<Vec<u8>>,
    /// Block of its first data block; data block `i` is at `data_start + i`.
    pub data_start: u64,
    /// Number of data blocks.
    pub data_count: u32,
    /// Dependencies it recorded.
    pub deps: Vec<TxId>,
    /// Its place in a large transaction. A part or close whose run is not committed (no
    /// close survived) is handed over with no records.
    pub run: Option<Run>,
}

/// What recovery found on one stream.
#[derive(Debug, Clone, Default)]
pub struct StreamRecovery {
    /// Survivors after the checkpoint, in commit order.
    pub txs: Vec<RecoveredTx>,
    /// Complete transactions dropped because a dependency did not survive.
    pub cut_by_dependency: usize,
    /// The checkpointed sequence number the scan started after.
    pub checkpoint_seq: u64,
    /// Epoch in force from now on.
    pub epoch: u32,
}

/// What [`Log::open`] found.
#[derive(Debug, Clone, Default)]
pub struct Recovery {
    /// Per stream.
    pub streams: Vec<StreamRecovery>,
    /// Blocks read while scanning.
    pub blocks_scanned: u64,
    /// Time spent scanning (before the superblock update).
    pub scan_time: Duration,
    /// The layer above's state, when the log was closed with [`Log::close_clean`] and opened
    /// from its snapshot without scanning (the streams' `txs` are then empty: everything they
    /// held is described by this state).
    pub snapshot: Option<Vec<u8>>,
    /// `snapshot` is a checkpoint snapshot's ([`Log::checkpoint_snapshot`]): it describes the
    /// state up to a point, and the streams' `txs` are what was committed after it, to be
    /// applied on top. (`false` with a clean close's snapshot: the `txs` are then empty.)
    pub snapshot_is_checkpoint: bool,
    /// Transactions proven durable that recovery could not keep (only with
    /// [`OpenOptions::salvage`]; without it, such damage fails the open).
    pub damage: Vec<Damage>,
}

/// A stream whose chain lacks a transaction that a later unit proves was durable: corruption,
/// not a torn tail.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Damage {
    /// The stream.
    pub stream: u16,
    /// The last transaction kept.
    pub kept_seq: u64,
    /// Where the first missing transaction starts (or would start).
    pub block: u64,
    /// A unit of the stream proves every transaction up to this one durable.
    pub proven_seq: u64,
    /// Sequence numbers of the transactions found after the kept prefix and dropped (those
    /// whose first unit still decodes, and those cut for a missing dependency).
    pub dropped_seqs: Vec<u64>,
}

/// Logs smaller than this many blocks are scanned one stream after another.
const PARALLEL_SCAN_BLOCKS_MIN: u64 = 1 << 14;

struct Scan {
    txs: Vec<(RecoveredTx, Placed)>,
    chain: Vec<u32>,
    next_segment: u32,
    end_segment: u32,
    end_offset: u32,
    max_seq_seen: u64,
    blocks: u64,
    /// Highest durable watermark carried by a survivor (before the dependency closure).
    watermark: u64,
    /// Sequence numbers of the survivors the dependency closure cut.
    cut_seqs: Vec<u64>,
    /// What lies after the chain's end.
    beyond: Beyond,
    /// Large transactions begun (first part found) and not closed yet in the scan.
    open_runs: BTreeSet<u64>,
}

/// Units of the stream found after the end of its chain: evidence that decides whether the end
/// is a torn tail (nothing durable lost) or corruption.
#[derive(Debug, Default)]
struct Beyond {
    /// Highest durable watermark among them.
    watermark: u64,
    /// Sequence numbers of the transactions whose first unit decodes.
    seqs: BTreeSet<u64>,
}

/// Whole segments read at once: a scan reads each segment of its chain with one large read
/// instead of two small reads per transaction (the difference between a scan bounded by I/O
/// latency and one bounded by bandwidth).
#[derive(Default)]
struct SegmentCache {
    segment: Option<u32>,
    bytes: Vec<u8>,
    blocks_read: u64,
}

impl SegmentCache {
    /// `count` blocks at `offset` of `segment` (the caller checked they fit the segment;
    /// [`LogError::Corrupted`] if they do not).
    fn blocks(&mut self, ctx: &Ctx<'_>, segment: u32, offset: u32, count: u64) -> Result<&[u8]> {
        let sb = ctx.sb;
        let outside = || {
            let reason = format!("blocks {offset}+{count} of segment {segment} are outside it");
            corrupted("log unit", sb.segment_start(segment), reason)
        };
        if self.segment != Some(segment) {
            self.segment = None;
            let len = byte_len(sb, u64::from(sb.segment_blocks)).ok_or_else(outside)?;
            self.bytes.resize(len, 0);
            ctx.dev.read(block_in(sb, segment, 0)?, &mut self.bytes)?;
            self.blocks_read = self.blocks_read.saturating_add(u64::from(sb.segment_blocks));
            self.segment = Some(segment);
        }
        let start = byte_len(sb, u64::from(offset)).ok_or_else(outside)?;
        let end = byte_len(sb, count).and_then(|n| n.checked_add(start)).ok_or_else(outside)?;
        self.bytes.get(start..end).ok_or_else(outside)
    }
}

struct Ctx<'a> {
    dev: &'a dyn Device,
    sb: &'a Superblock,
    options: OpenOptions,
    /// Stop the scan after this sequence number (cleaning reads only what it cleans).
    stop_after_seq: u64,
}

impl Ctx<'_> {
    fn mutant(&self, m: Mutant) -> bool {
        self.options.mutant == Some(m)
    }
}

impl Log {
    /// Open the log on `dev`, recovering after a crash if there was one.
    ///
    /// # Errors
    /// [`LogError::NotFormatted`] when neither superblock copy is valid, I/O errors, and a
    /// mutant requested from a build without the `mutants` feature.
    pub fn open(dev: Arc<dyn Device>, options: OpenOptions) -> Result<(Log, Recovery)> {
        if options.mutant.is_some() && !crate::mutants_available() {
            return Err(LogError::Invalid("this build has no mutants (feature `mutants`)".into()));
        }
        let (sb, slot) = read_superblock(&*dev)?;
        let started = Instant::now();
        let check_generation = options.mutant != Some(Mutant::SnapshotKept);
        let mut base = None;
        if let Some(found) = crate::snapshot::read(&*dev, &sb, check_generation)? {
            if sb.snapshot_generation.is_none() {
                return Self::open_restored(dev, (sb, slot), found, options, started);
            }
            base = Some(found);
        }
        // With a checkpoint snapshot, each stream it still describes is scanned from the
        // snapshot's position instead of its checkpoint: the scan sees a superblock whose
        // checkpoint fields are those positions (`eff`); what is written back keeps the real
        // checkpoints (`sb`), so the log still holds everything from them on.
        let eff = effective_superblock(&sb, base.as_ref());
        let ctx = Ctx { dev: &*dev, sb: &eff, options, stop_after_seq: u64::MAX };
        let mut scans = scan_streams(&ctx)?;
        settle_scans(&ctx, &mut scans);
        let scan_time = started.elapsed();
        let blocks_scanned = scans.iter().fold(0u64, |n, s| n.saturating_add(s.blocks));
        let damage = check_damage(&ctx, &scans)?;

        // What a crash now would replay: the chains from where the scan started.
        let replayable = scans
            .iter()
            .zip(&eff.streams)
            .map(|(scan, root)| chain_blocks(&eff, scan.chain.len(), root, scan.end_offset))
            .fold(0u64, u64::saturating_add);
        let joined = join_snapshot(&ctx, &sb, base, &mut scans);
        let JoinedSnapshot { prefixes, mut snapshot_segments, payload, .. } = joined;
        let blocks_scanned = blocks_scanned.saturating_add(joined.blocks);
        // Every stream's chain, each segment held once, checked before anything is written.
        let chains = claim_chains(&ctx, &scans, &snapshot_segments)?;
        // New epoch for every stream, durable before any new write.
        let mut new_sb = sb.clone();
        if payload.is_none() {
            new_sb.snapshot = None;
            new_sb.snapshot_generation = None;
            snapshot_segments.clear();
        }
        let bump = !ctx.mutant(Mutant::NoEpochBump);
        if bump && sb.generation.checked_add(1).is_none() {
            // Refused before the seals: recovery writes nothing on an image it cannot finish.
            let block = SB_BLOCKS.get(slot).copied().unwrap_or_default();
            return Err(corrupted(
                "superblock",
                block,
                "generation u64::MAX cannot be incremented",
            ));
        }
        let resumed = resume_streams(&ctx, &sb, scans, chains, prefixes, bump)?;
        let Resumed { streams, report, roots, mut used, seals } = resumed;
        new_sb.streams = roots;
        // Seals, and whatever the scan read from the device's volatile cache, durable before
        // the superblock that vouches for them (module docs, 1 and 3).
        if !seals.is_empty() {
            let zero = IoBuf::zeroed(sb.block_size as usize);
            let writes = seals.iter().map(|&b| Write::new(b, zero.clone())).collect();
            dev.write_sync(writes, WriteFlags::NONE)?;
        }
        dev.flush()?;
        used.extend(snapshot_segments.iter().copied());
        let space = Space::new(sb.segment_count, used);
        let log = Log::from_parts(dev, SbState { sb, slot }, streams, space, options);
        if bump {
            let durable = !log.mutant(Mutant::EpochBumpNotDurable);
            let mut state = log.sb.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            log.write_superblock(&mut state, new_sb, durable)?;
        }
        *crate::engine::lock(&log.checkpoint_snapshot) = snapshot_segments;
        log.placed_blocks.store(replayable, std::sync::atomic::Ordering::Relaxed);
        let snapshot_is_checkpoint = payload.is_some();
        Ok((
            log,
            Recovery {
                streams: report,
                blocks_scanned,
                scan_time,
                snapshot: payload,
                snapshot_is_checkpoint,
                damage,
            },
        ))
    }

    /// Open from a clean-close snapshot: streams as they were, a new epoch for each, and the
    /// snapshot pointer cleared, durably, before anything new is written.
    fn open_restored(
        dev: Arc<dyn Device>,
        (sb, slot): (Superblock, usize),
        found: crate::snapshot::Found,
        options: OpenOptions,
        started: Instant,
    ) -> Result<(Log, Recovery)> {
        let crate::snapshot::Found { streams: restored, payload, blocks, .. } = found;
        // A clean close's snapshot describes every stream (only a checkpoint snapshot's are
        // trimmed by later checkpoints).
        let restored: Vec<_> = restored.into_iter().flatten().collect();
        if restored.len() != sb.streams.len() {
            return Err(corrupted("clean-close snapshot", 0, "a stream is missing"));
        }
        let mut new_sb = sb.clone();
        if options.mutant != Some(Mutant::SnapshotKept) {
            new_sb.snapshot = None;
        }
        let mut streams = Vec::with_capacity(restored.len());
        let mut report = Vec::with_capacity(restored.len());
        let mut roots = Vec::with_capacity(restored.len());
        let mut used = Vec::new();
        let ctx = Ctx { dev: &*dev, sb: &sb, options, stop_after_seq: u64::MAX };
        // The snapshot loader checked one state per stream root, and that they hold disjoint
        // segments (`space::Claims`).
        let mut replayable = 0u64;
        for (s, (r, &root)) in restored.into_iter().zip(&sb.streams).enumerate() {
            let blocks = chain_blocks(&sb, r.chain.len(), &root, r.offset);
            replayable = replayable.saturating_add(blocks);
            let tail = r.last_seq;
            let new_root = next_root(&ctx, root, tail, tail, s)?;
            roots.push(new_root);
            used.extend(r.chain.iter().copied());
            used.push(r.next_segment);
            let mut stream = r.into_stream(new_root.epoch, new_root.resume_seq);
            stream.seq_limit = new_root.seq_limit;
            streams.push(stream);
            report.push(StreamRecovery {
                txs: Vec::new(),
                cut_by_dependency: 0,
                checkpoint_seq: root.checkpoint_seq,
                epoch: new_root.epoch,
            });
        }
        new_sb.streams = roots;
        let space = Space::new(sb.segment_count, used);
        let log = Log::from_parts(dev, SbState { sb, slot }, streams, space, options);
        {
            let mut state = log.sb.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            log.write_superblock(&mut state, new_sb, true)?;
        }
        log.placed_blocks.store(replayable, std::sync::atomic::Ordering::Relaxed);
        let scan_time = started.elapsed();
        Ok((
            log,
            Recovery {
                streams: report,
                blocks_scanned: blocks,
                scan_time,
                snapshot: Some(payload),
                snapshot_is_checkpoint: false,
                damage: Vec::new(),
            },
        ))
    }
}

/// Step 1 of [`Log::open`]: every stream's chain scanned from where `ctx.sb` says it starts.
/// Streams are scanned in parallel, one thread each, when the log is large enough for that to
/// pay; a small log is scanned faster than a thread starts.
fn scan_streams(ctx: &Ctx<'_>) -> Result<Vec<Scan>> {
    let sb = ctx.sb;
    let log_blocks = u64::from(sb.segment_count).saturating_mul(u64::from(sb.segment_blocks));
    let parallel = sb.streams.len() > 1 && log_blocks >= PARALLEL_SCAN_BLOCKS_MIN;
    // The superblock's stream count is a u16 field.
    let stream_count = u16::try_from(sb.streams.len())
        .map_err(|_| corrupted("superblock", 0, "more than 2^16 streams"))?;
    let scans: Vec<Result<Scan>> = if !parallel {
        (0..stream_count).map(|s| scan_stream(ctx, s)).collect()
    } else {
        std::thread::scope(|scope| {
            let handles: Vec<_> =
                (0..stream_count).map(|s| scope.spawn(move || scan_stream(ctx, s))).collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(LogError::Invalid("scan thread panicked".into())))
                })
                .collect()
        })
    };
    scans.into_iter().collect()
}

/// Step 2 of [`Log::open`]: survivors whose dependencies did not survive are cut (to a
/// fixpoint), and large transactions not closed before a crash are dropped.
fn settle_scans(ctx: &Ctx<'_>, scans: &mut [Scan]) {
    if !ctx.mutant(Mutant::NoDependencyClosure) {
        close_dependencies(ctx.sb, scans);
    }
    for (scan, root) in scans.iter_mut().zip(&ctx.sb.streams) {
        let keep = ctx.mutant(Mutant::RunUnclosedKept);
        settle_runs(&mut scan.txs, root.checkpoint_seq, keep);
    }
}

/// Step 3 of [`Log::open`]: what the log proved durable and is missing. An error unless the
/// caller asked to salvage (then each loss is logged and reported).
fn check_damage(ctx: &Ctx<'_>, scans: &[Scan]) -> Result<Vec<Damage>> {
    let damage = find_damage(ctx, scans)?;
    if let Some(d) = damage.first() {
        if !ctx.options.salvage && !ctx.mutant(Mutant::WatermarkIgnored) {
            return Err(LogError::DurableTransactionLost {
                stream: d.stream,
                kept_seq: d.kept_seq,
                block: d.block,
                proven_seq: d.proven_seq,
            });
        }
        for d in &damage {
            tracing::warn!(
                stream = d.stream,
                kept_seq = d.kept_seq,
                proven_seq = d.proven_seq,
                dropped = ?d.dropped_seqs,
                "salvage: dropping transactions proven durable"
            );
        }
    }
    Ok(damage)
}

/// What [`join_snapshot`] gives back.
struct JoinedSnapshot {
    /// Per stream, the snapshot's part of its chain before what was scanned after it.
    prefixes: Vec<VecDeque<Placed>>,
    /// The snapshot's own segments (kept while it is the checkpoint snapshot).
    snapshot_segments: Vec<u32>,
    /// The checkpoint snapshot's payload, if there is one.
    payload: Option<Vec<u8>>,
    /// Blocks read for the snapshot.
    blocks: u64,
}

/// Step 4 of [`Log::open`]: with a checkpoint snapshot (`base`), each stream's chain is the
/// snapshot's chain followed by what was scanned after it.
fn join_snapshot(
    ctx: &Ctx<'_>,
    sb: &Superblock,
    base: Option<crate::snapshot::Found>,
    scans: &mut [Scan],
) -> JoinedSnapshot {
    let mut prefixes: Vec<VecDeque<Placed>> = Vec::with_capacity(scans.len());
    let snapshot_segments: Vec<u32> =
        sb.snapshot.filter(|_| !ctx.mutant(Mutant::SnapshotKept)).into_iter().collect();
    let Some(found) = base else {
        return JoinedSnapshot { prefixes, snapshot_segments, payload: None, blocks: 0 };
    };
    for (scan, restored) in scans.iter_mut().zip(found.streams) {
        let Some(r) = restored else {
            prefixes.push(VecDeque::new());
            continue;
        };
        // The restored chain ends in the segment the scan started in.
        let mut chain: Vec<u32> = r.chain.iter().copied().collect();
        chain.pop();
        chain.append(&mut scan.chain);
        scan.chain = chain;
        prefixes.push(r.placed);
    }
    JoinedSnapshot {
        prefixes,
        snapshot_segments: found.segments,
        payload: Some(found.payload),
        blocks: found.blocks,
    }
}

/// What [`resume_streams`] gives back.
struct Resumed {
    /// The running state of each stream.
    streams: Vec<Stream>,
    /// What recovery found in each stream.
    report: Vec<StreamRecovery>,
    /// The superblock's new root of each stream.
    roots: Vec<StreamRoot>,
    /// Segments in use.
    used: Vec<u32>,
    /// Blocks to zero where a successor of a recovered tail could start (module docs, 1).
    seals: Vec<u64>,
}

/// Step 5 of [`Log::open`]: each stream resumes after its recovered tail — its new root (a
/// new epoch when `bump`), its running state, its report, the segments it holds and the
/// blocks that seal its tail. `sb` is the real superblock, `ctx.sb` the one the scan saw.
fn resume_streams(
    ctx: &Ctx<'_>,
    sb: &Superblock,
    scans: Vec<Scan>,
    chains: Vec<VecDeque<u32>>,
    prefixes: Vec<VecDeque<Placed>>,
    bump: bool,
) -> Result<Resumed> {
    let mut out = Resumed {
        streams: Vec::with_capacity(scans.len()),
        report: Vec::with_capacity(scans.len()),
        roots: Vec::with_capacity(scans.len()),
        used: Vec::new(),
        seals: Vec::new(),
    };
    let mut prefixes = prefixes.into_iter();
    for (s, ((scan, chain), (&root, &eff_root))) in
        scans.into_iter().zip(chains).zip(sb.streams.iter().zip(&ctx.sb.streams)).enumerate()
    {
        let tail = scan.txs.last().map_or(eff_root.checkpoint_seq, |t| t.0.id.seq);
        let new_root = if bump { next_root(ctx, root, tail, scan.max_seq_seen, s)? } else { root };
        let mut placed = prefixes.next().unwrap_or_default();
        placed.extend(scan.txs.iter().map(|t| t.1));
        out.roots.push(new_root);
        let next_seq = if bump { new_root.resume_seq } else { tail.saturating_add(1) };
        out.used.extend(chain.iter().copied());
        out.used.push(scan.next_segment);
        if !ctx.mutant(Mutant::NoTailSeal) {
            if scan.end_offset < sb.segment_blocks {
                out.seals.push(block_in(sb, scan.end_segment, scan.end_offset)?);
            }
            out.seals.push(block_in(sb, scan.next_segment, 0)?);
        }
        out.streams.push(Stream {
            epoch: new_root.epoch,
            last_seq: tail,
            next_seq,
            seq_limit: if bump { new_root.seq_limit } else { u64::MAX },
            segment: scan.end_segment,
            offset: if ctx.mutant(Mutant::ResumeOverwritesTail) && !scan.txs.is_empty() {
                scan.end_offset.saturating_sub(1)
            } else {
                scan.end_offset
            },
            next_segment: scan.next_segment,
            chain,
            placed,
            pending: Vec::new(),
            submitting: false,
            direct_submits: 0,
            inflight: Vec::new(),
            durable: tail,
            runs: std::collections::BTreeMap::new(),
            last_close: 0,
            waits_on: std::collections::BTreeMap::new(),
        });
        out.report.push(StreamRecovery {
            txs: scan.txs.into_iter().map(|t| t.0).collect(),
            cut_by_dependency: scan.cut_seqs.len(),
            checkpoint_seq: root.checkpoint_seq,
            epoch: new_root.epoch,
        });
    }
    Ok(out)
}

/// The segments each stream's chain holds after the scan (those of its survivors, from its
/// checkpoint segment to its end segment; its reserved next segment comes on top), claimed
/// together with the next segments and the clean-close snapshot's first segment: each held by
/// one owner and inside the log. Units decide where a chain continues, so forged ones could
/// lead it into another stream's segment; [`LogError::Corrupted`], naming the stream and the
/// segment, before anything is written, instead of a [`Space`] that hands one segment to two
/// owners (one overwriting the other's durable transactions; both releasing it).
fn claim_chains(
    ctx: &Ctx<'_>,
    scans: &[Scan],
    snapshot_segments: &[u32],
) -> Result<Vec<VecDeque<u32>>> {
    let sb = ctx.sb;
    let mut claims = Claims::new(sb.segment_count);
    let refused = |segment: u32, why: String| {
        corrupted("stream chain", sb.segment_start(segment), format!("{why}; chains overlap"))
    };
    // A clean close's snapshot is pointed at only while nothing was written after the close
    // (open clears the pointer first), and a checkpoint snapshot's segments are held until a
    // newer one is durable, so no chain can hold one of them. (The snapshot-kept mutant
    // writes on after a clean close's, on purpose: the caller leaves it out.)
    for &seg in snapshot_segments {
        claims.claim(seg, Owner::Snapshot).map_err(|why| refused(seg, why))?;
    }
    let mut chains = Vec::with_capacity(scans.len());
    for (s, scan) in scans.iter().enumerate() {
        let s16 = u16::try_from(s).map_err(|_| corrupted("superblock", 0, "stream count"))?;
        let mut chain: VecDeque<u32> = scan.chain.iter().copied().collect();
        while chain.back().is_some_and(|&seg| seg != scan.end_segment) {
            chain.pop_back();
        }
        for &seg in &chain {
            claims.claim(seg, Owner::Chain(s16)).map_err(|why| refused(seg, why))?;
        }
        let next = scan.next_segment;
        claims.claim(next, Owner::Next(s16)).map_err(|why| refused(next, why))?;
        chains.push(chain);
    }
    Ok(chains)
}

/// Block number of block `offset` of `segment`: [`LogError::Corrupted`] unless the segment is
/// one of the log's and the offset at most its end (then the sum is exact: the superblock's
/// `validate` checked that every segment fits the device).
fn block_in(sb: &Superblock, segment: u32, offset: u32) -> Result<u64> {
    if segment < sb.segment_count && offset <= sb.segment_blocks {
        if let Some(block) = sb.segment_start(segment).checked_add(u64::from(offset)) {
            return Ok(block);
        }
    }
    let reason = format!("block {offset} of segment {segment} is outside the log");
    Err(corrupted("stream chain", sb.segment_start(segment), reason))
}

/// Bytes in `blocks` blocks of the log, if that fits a `usize`.
fn byte_len(sb: &Superblock, blocks: u64) -> Option<usize> {
    usize::try_from(blocks).ok()?.checked_mul(usize::try_from(sb.block_size).ok()?)
}

/// The root stream `s` gets from a recovery that kept it up to `tail`: a new epoch, and
/// sequence numbers resumed above everything any earlier run may have written (module docs, 2).
fn next_root(
    ctx: &Ctx<'_>,
    root: StreamRoot,
    tail: u64,
    max_seq_seen: u64,
    s: usize,
) -> Result<StreamRoot> {
    let exhausted =
        |what: &str| corrupted("superblock", 0, format!("stream {s}: {what} exhausted"));
    let epoch = root.epoch.checked_add(1).ok_or_else(|| exhausted("epochs"))?;
    let above_seen = tail.max(max_seq_seen).checked_add(1).ok_or_else(|| exhausted("seqs"))?;
    let resume_seq = above_seen.max(root.seq_limit);
    let seq_limit =
        resume_seq.checked_add(ctx.options.seq_reserve()).ok_or_else(|| exhausted("seqs"))?;
    Ok(StreamRoot { epoch, base_seq: tail, resume_seq, seq_limit, ..root })
}

/// Streams whose chain, after the dependency closure, ends before a transaction that one of
/// its units proves durable.
fn find_damage(ctx: &Ctx<'_>, scans: &[Scan]) -> Result<Vec<Damage>> {
    let sb = ctx.sb;
    let mut damage = Vec::new();
    for (s, (scan, root)) in (0u16..).zip(scans.iter().zip(&sb.streams)) {
        let kept_seq = scan.txs.last().map_or(root.checkpoint_seq, |t| t.0.id.seq);
        let proven_seq = scan.watermark.max(scan.beyond.watermark);
        if proven_seq <= kept_seq {
            continue;
        }
        let block = if scan.end_offset < sb.segment_blocks {
            block_in(sb, scan.end_segment, scan.end_offset)?
        } else {
            block_in(sb, scan.next_segment, 0)?
        };
        let mut dropped: BTreeSet<u64> = scan.cut_seqs.iter().copied().collect();
        dropped.extend(scan.beyond.seqs.iter().copied().filter(|&q| q > kept_seq));
        damage.push(Damage {
            stream: s,
            kept_seq,
            block,
            proven_seq,
            dropped_seqs: dropped.into_iter().collect(),
        });
    }
    Ok(damage)
}

/// Look past the end of stream `s`'s chain for units of the stream written after its last
/// survivor: the rest of the end segment, the reserved next segment, and every segment those
/// units name as next (bounded: each segment is visited once).
fn probe_beyond(
    ctx: &Ctx<'_>,
    cache: &mut SegmentCache,
    (s, root): (u16, StreamRoot),
    scan: &Scan,
) -> Result<Beyond> {
    let sb = ctx.sb;
    let last_seq = scan.txs.last().map_or(root.checkpoint_seq, |t| t.0.id.seq);
    // Each (segment, start) is visited once; the starts are the end offset and block 0.
    let visited_max = usize::try_from(sb.segment_count).unwrap_or(usize::MAX).saturating_add(1);
    let mut beyond = Beyond::default();
    let mut visited = BTreeSet::new();
    let mut queue = VecDeque::from([(scan.end_segment, scan.end_offset), (scan.next_segment, 0)]);
    while let Some((segment, from)) = queue.pop_front() {
        if segment >= sb.segment_count || !visited.insert((segment, from)) {
            continue;
        }
        if visited.len() > visited_max {
            break;
        }
        for offset in from..sb.segment_blocks {
            let block_no = block_in(sb, segment, offset)?;
            let buf = cache.blocks(ctx, segment, offset, 1)?;
            let Ok((h, _)) = UnitHeader::decode(&sb.uuid, buf, block_no, true) else { continue };
            // Only units the acceptance rule's epoch test admits count as proof: those of an
            // older epoch above `base_seq` were discarded by a recovery (orphans, whose
            // watermarks never pass that recovery's tail, or what a salvage dropped).
            let admitted =
                h.epoch == root.epoch || (h.epoch < root.epoch && h.seq <= root.base_seq);
            if h.stream != s || h.seq <= last_seq || !admitted {
                continue;
            }
            beyond.watermark = beyond.watermark.max(h.durable_watermark);
            if h.unit_index == 0 && h.kind == UnitKind::Body {
                beyond.seqs.insert(h.seq);
            }
            if h.next_segment != segment && !visited.iter().any(|v| v.0 == h.next_segment) {
                queue.push_back((h.next_segment, 0));
            }
        }
    }
    Ok(beyond)
}

/// Read both copies; the valid one with the highest generation wins.
fn read_superblock(dev: &dyn Device) -> Result<(Superblock, usize)> {
    let g = dev.geometry();
    let mut best: Option<(Superblock, usize)> = None;
    let mut errors = Vec::new();
    for (slot, &block) in SB_BLOCKS.iter().enumerate() {
        let mut buf = vec![0u8; g.block_size as usize];
        dev.read(block, &mut buf)?;
        match Superblock::decode(&buf, block) {
            Ok(sb) if best.as_ref().is_none_or(|b| sb.generation > b.0.generation) => {
                best = Some((sb, slot))
            }
            Ok(_) => {}
            Err(e) => errors.push(e.to_string()),
        }
    }
    let (sb, slot) = best.ok_or_else(|| LogError::NotFormatted { reason: errors.join("; ") })?;
    if sb.block_size != g.block_size || sb.block_count > g.block_count {
        return Err(LogError::NotFormatted {
            reason: format!(
                "superblock describes {} blocks of {} bytes; device has {} of {}",
                sb.block_count, sb.block_size, g.block_count, g.block_size
            ),
        });
    }
    Ok((sb, slot))
}

/// Follow one stream's chain from its checkpoint.
fn scan_stream(ctx: &Ctx<'_>, s: u16) -> Result<Scan> {
    let root = *ctx
        .sb
        .streams
        .get(usize::from(s))
        .ok_or_else(|| corrupted("superblock", 0, format!("no stream {s}")))?;
    let mut last = (root.checkpoint_seq, root.checkpoint_epoch);
    let mut scan = Scan {
        txs: Vec::new(),
        chain: vec![root.checkpoint_segment],
        next_segment: root.checkpoint_next_segment,
        end_segment: root.checkpoint_segment,
        end_offset: root.checkpoint_offset,
        max_seq_seen: 0,
        blocks: 0,
        watermark: 0,
        cut_seqs: Vec::new(),
        beyond: Beyond::default(),
        open_runs: BTreeSet::new(),
    };
    let seg_blocks = ctx.sb.segment_blocks;
    let mut cache = SegmentCache::default();
    // Bounded: every step advances through a finite number of segment positions.
    let step_max =
        u64::from(ctx.sb.segment_count).saturating_mul(u64::from(seg_blocks)).saturating_add(1);
    for _ in 0..step_max {
        let here = (scan.end_segment, scan.end_offset);
        let found = if here.1 < seg_blocks {
            try_tx(ctx, &mut cache, s, here.0, here.1, last, root, &mut scan)?
                .filter(|h| h.0.next_segment == scan.next_segment)
        } else {
            None
        };
        let found = match found {
            Some(f) => Some(f),
            // A chain never comes back to a segment it holds: that would be a cycle.
            None if !scan.chain.contains(&scan.next_segment) => {
                let next = scan.next_segment;
                let f = try_tx(ctx, &mut cache, s, next, 0, last, root, &mut scan)?.filter(|h| {
                    h.0.next_segment != next && h.0.next_segment < ctx.sb.segment_count
                });
                if f.is_some() {
                    scan.chain.push(next);
                    scan.end_segment = next;
                    scan.end_offset = 0;
                }
                f
            }
            None => None,
        };
        let Some((header, tx)) = found else {
            if ctx.mutant(Mutant::NoPrefixCut) {
                if let Some(skip) = skip_span(ctx, &mut cache, s, scan.end_segment, scan.end_offset)
                {
                    scan.end_offset = scan.end_offset.saturating_add(skip);
                    continue;
                }
            }
            if ctx.stop_after_seq == u64::MAX {
                scan.beyond = probe_beyond(ctx, &mut cache, (s, root), &scan)?;
            }
            scan.blocks = cache.blocks_read;
            return Ok(scan);
        };
        scan.watermark = scan.watermark.max(header.durable_watermark);
        scan.next_segment = header.next_segment;
        // `try_tx` checked that the transaction ends inside its segment.
        let end = u64::from(scan.end_offset).checked_add(header.span_blocks());
        let at = block_in(ctx.sb, scan.end_segment, scan.end_offset)?;
        scan.end_offset = end.and_then(|e| u32::try_from(e).ok()).ok_or_else(|| {
            corrupted(
                "log unit",
                at,
                format!("stream {s}: transaction {} ends past its segment", header.seq),
            )
        })?;
        let records = u32::try_from(tx.records.len()).map_err(|_| {
            corrupted(
                "log unit",
                at,
                format!("stream {s}: transaction {} has 2^32 records", header.seq),
            )
        })?;
        last = (header.seq, header.epoch);
        let placed = Placed {
            seq: header.seq,
            epoch: header.epoch,
            end_segment: scan.end_segment,
            end_offset: scan.end_offset,
            next_segment: scan.next_segment,
            records,
            dead: 0,
        };
        match tx.run {
            Some(Run { role: RunRole::Part, seq, .. }) => {
                scan.open_runs.insert(seq);
            }
            Some(Run { role: RunRole::Close, seq, .. }) => {
                scan.open_runs.remove(&seq);
            }
            _ => {}
        }
        scan.txs.push((tx, placed));
        // A reader that stops early (cleaning) still needs to know whether the runs it read
        // parts of were closed: it reads on to their closes (or to the chain's end).
        if header.seq >= ctx.stop_after_seq && scan.open_runs.is_empty() {
            scan.blocks = cache.blocks_read;
            return Ok(scan);
        }
    }
    Err(corrupted("stream chain", 0, format!("stream {s} chain does not end")))
}

/// Mutant `NoPrefixCut` only: the span of a broken transaction whose first unit still decodes.
fn skip_span(
    ctx: &Ctx<'_>,
    cache: &mut SegmentCache,
    s: u16,
    segment: u32,
    offset: u32,
) -> Option<u32> {
    if offset >= ctx.sb.segment_blocks {
        return None;
    }
    let block_no = block_in(ctx.sb, segment, offset).ok()?;
    let buf = cache.blocks(ctx, segment, offset, 1).ok()?;
    let (h, _) = UnitHeader::decode(&ctx.sb.uuid, buf, block_no, true).ok()?;
    let end = u64::from(offset).checked_add(h.span_blocks())?;
    let fits = end <= u64::from(ctx.sb.segment_blocks);
    let span = u32::try_from(h.span_blocks()).ok()?;
    (h.stream == s && h.unit_index == 0 && fits).then_some(span)
}

/// The transaction at (`segment`, `offset`) if it is whole and continues the chain after `last`.
#[allow(clippy::too_many_arguments)]
fn try_tx(
    ctx: &Ctx<'_>,
    cache: &mut SegmentCache,
    s: u16,
    segment: u32,
    offset: u32,
    last: (u64, u32),
    root: StreamRoot,
    scan: &mut Scan,
) -> Result<Option<(UnitHeader, RecoveredTx)>> {
    let sb = ctx.sb;
    let bs = sb.block_size as usize;
    let check_crc = !ctx.mutant(Mutant::CrcNotChecked);
    let first = block_in(sb, segment, offset)?;
    let buf = cache.blocks(ctx, segment, offset, 1)?;
    let Ok((h, _)) = UnitHeader::decode(&sb.uuid, buf, first, check_crc) else { return Ok(None) };
    if h.stream != s || h.kind != UnitKind::Body || h.unit_index != 0 {
        return Ok(None);
    }
    // No run writes at or above the reservation in force (the limit is raised durably first):
    // such a number is forged, not a transaction of this stream.
    if h.seq >= root.seq_limit && !ctx.mutant(Mutant::NoEpochBump) {
        return Ok(None);
    }
    scan.max_seq_seen = scan.max_seq_seen.max(h.seq);
    // Inside one epoch (one run) a stream numbers its transactions consecutively; only the
    // first of a run jumps (to its resume point). A whole transaction whose number breaks that
    // was forged or damaged, and must not become the tail that hides what follows it.
    let consecutive = h.epoch != last.1 || Some(h.seq) == last.0.checked_add(1);
    let chained = h.prev_seq == last.0 && h.seq > last.0 && h.epoch >= last.1 && consecutive;
    let epoch_ok = h.epoch == root.epoch || (h.epoch < root.epoch && h.seq <= root.base_seq);
    let follows = if ctx.mutant(Mutant::StaleUnitsAccepted) {
        true // mutant: any whole transaction of the stream continues the chain
    } else if ctx.mutant(Mutant::NoPrefixCut) {
        epoch_ok // mutant: a gap in the chain does not end it
    } else {
        chained && epoch_ok
    };
    if !follows {
        return Ok(None);
    }
    let span = h.span_blocks();
    if u64::from(offset).checked_add(span).is_none_or(|end| end > u64::from(sb.segment_blocks)) {
        return Ok(None);
    }
    // From here on, every block number `first + k` with `k < span` is a block of the segment:
    // exact, since the superblock's `validate` checked that the segments fit the device.
    let all = cache.blocks(ctx, segment, offset, span)?;
    let mut body = Vec::new();
    for (i, block) in all.chunks_exact(bs).take(h.unit_count as usize).enumerate() {
        let Some(at) = first.checked_add(widen(i)) else { return Ok(None) };
        let whole = UnitHeader::decode(&sb.uuid, block, at, check_crc).ok().filter(|(u, _)| {
            let index = u32::try_from(i).ok();
            u.same_transaction(&h) && Some(u.unit_index) == index && u.kind == UnitKind::Body
        });
        let Some((_, payload)) = whole else {
            if ctx.mutant(Mutant::TornTailIsCorruption) {
                return Err(corrupted("log unit", at, "torn transaction (mutant)"));
            }
            return Ok(None);
        };
        body.extend_from_slice(payload);
    }
    let Ok(body) = Body::decode(&body, first) else { return Ok(None) };
    if body.data_crcs.len() != h.data_count as usize {
        return Ok(None);
    }
    let data = all.chunks_exact(bs).skip(h.unit_count as usize).take(h.data_count as usize);
    let checked = if ctx.mutant(Mutant::CountOffByOne) {
        h.data_count.saturating_sub(1)
    } else {
        h.data_count
    };
    for (block, &crc) in data.zip(&body.data_crcs).take(checked as usize) {
        if check_crc && crc_padded(block, bs) != crc {
            return Ok(None);
        }
    }
    if h.flags & FLAG_CLASSIC != 0 {
        // The commit block is the transaction's last (`span` counts it).
        let last = span.checked_sub(1).and_then(|k| first.checked_add(k));
        let (Some(at), Some(block)) = (last, all.chunks_exact(bs).last()) else {
            return Ok(None);
        };
        let Ok((c, _)) = UnitHeader::decode(&sb.uuid, block, at, check_crc) else {
            return Ok(None);
        };
        if c.kind != UnitKind::Commit || !c.same_transaction(&h) || c.unit_index != h.unit_count {
            return Ok(None);
        }
    }
    let Some(data_start) = first.checked_add(u64::from(h.unit_count)) else { return Ok(None) };
    let tx = RecoveredTx {
        id: TxId { stream: s, seq: h.seq },
        epoch: h.epoch,
        records: body.records,
        data_start,
        data_count: h.data_count,
        deps: body.deps,
        run: body.run,
    };
    Ok(Some((h, tx)))
}

/// Blocks of a chain of `segments` segments from `root`'s checkpoint to `end_offset` in its
/// last segment (what a scan from the checkpoint reads, at most).
fn chain_blocks(sb: &Superblock, segments: usize, root: &StreamRoot, end_offset: u32) -> u64 {
    let whole = widen(segments.saturating_sub(1)).saturating_mul(u64::from(sb.segment_blocks));
    whole.saturating_add(u64::from(end_offset)).saturating_sub(u64::from(root.checkpoint_offset))
}

/// The superblock the scan follows: with a checkpoint snapshot, each stream it still
/// describes starts after the snapshot's last transaction of it, at its position.
fn effective_superblock(sb: &Superblock, base: Option<&crate::snapshot::Found>) -> Superblock {
    let mut eff = sb.clone();
    let Some(found) = base else { return eff };
    for (root, restored) in eff.streams.iter_mut().zip(&found.streams) {
        let Some(r) = restored else { continue };
        let Some(last) = r.placed.back() else { continue };
        root.checkpoint_seq = r.last_seq;
        root.checkpoint_epoch = last.epoch;
        root.checkpoint_segment = r.segment;
        root.checkpoint_offset = r.offset;
        root.checkpoint_next_segment = r.next_segment;
    }
    eff
}

/// Cut every stream at its first survivor whose dependency did not survive, until nothing
/// changes. A dependency at or below the other stream's checkpoint is satisfied.
fn close_dependencies(sb: &Superblock, scans: &mut [Scan]) {
    // Each pass removes at least one transaction or stops, so this loop is bounded.
    loop {
        let alive: Vec<BTreeSet<u64>> =
            scans.iter().map(|s| s.txs.iter().map(|t| t.0.id.seq).collect()).collect();
        let satisfied = |d: &TxId| {
            let st = usize::from(d.stream);
            sb.streams.get(st).is_some_and(|root| d.seq <= root.checkpoint_seq)
                || alive.get(st).is_some_and(|seqs| seqs.contains(&d.seq))
        };
        let mut changed = false;
        for (scan, root) in scans.iter_mut().zip(&sb.streams) {
            if let Some(i) = scan.txs.iter().position(|t| !t.0.deps.iter().all(satisfied)) {
                scan.cut_seqs.extend(scan.txs.drain(i..).map(|t| t.0.id.seq));
                if let Some(last) = scan.txs.last() {
                    scan.end_segment = last.1.end_segment;
                    scan.end_offset = last.1.end_offset;
                    scan.next_segment = last.1.next_segment;
                } else {
                    scan.end_segment = root.checkpoint_segment;
                    scan.end_offset = root.checkpoint_offset;
                    scan.next_segment = root.checkpoint_next_segment;
                }
                changed = true;
            }
        }
        if !changed {
            return;
        }
    }
}

/// Read stream `s`'s transactions after its checkpoint, up to and including `upto_seq`, from
/// `dev` (they must be durable: nothing of them may be in flight).
pub(crate) fn read_transactions(
    dev: &dyn Device,
    sb: &Superblock,
    options: OpenOptions,
    s: u16,
    upto_seq: u64,
) -> Result<Vec<RecoveredTx>> {
    let ctx = Ctx { dev, sb, options, stop_after_seq: upto_seq };
    let mut scan = scan_stream(&ctx, s)?;
    let checkpoint_seq = sb.streams.get(usize::from(s)).map_or(0, |r| r.checkpoint_seq);
    settle_runs(&mut scan.txs, checkpoint_seq, options.mutant == Some(Mutant::RunUnclosedKept));
    Ok(scan.txs.into_iter().map(|t| t.0).filter(|t| t.id.seq <= upto_seq).collect())
}

/// Large transactions: hand over the records of a run's parts and close only if the run is
/// committed — its close survived, after parts numbered `0..close.index`, each found once and
/// in order (count-based commit across segments). Every other part or close keeps its place
/// in the chain but loses its records (and its record count): an open run at the end of the
/// chain (a crash before the close), an abandoned one, or one whose parts do not add up
/// (damage). A run named at or below the checkpoint had parts checkpointed, which only
/// happens to a run that was closed or given up (checkpoints never pass an open run's first
/// part): what of it follows the checkpoint is kept iff its close is found.
fn settle_runs(txs: &mut [(RecoveredTx, Placed)], checkpoint_seq: u64, keep_unclosed: bool) {
    // Run name -> next part index expected, or `None` once its parts do not add up.
    let mut seen: std::collections::BTreeMap<u64, Option<u32>> = std::collections::BTreeMap::new();
    let mut committed: BTreeSet<u64> = BTreeSet::new();
    for (tx, _) in txs.iter() {
        let Some(run) = tx.run else { continue };
        if run.seq <= checkpoint_seq {
            if run.role == RunRole::Close {
                committed.insert(run.seq);
            }
            continue;
        }
        match run.role {
            RunRole::Part if run.index == 0 => {
                let fresh = run.seq == tx.id.seq && !seen.contains_key(&run.seq);
                seen.insert(run.seq, fresh.then_some(1));
            }
            RunRole::Part => {
                let next = seen.entry(run.seq).or_insert(None);
                *next = next.filter(|&n| n == run.index).and_then(|n| n.checked_add(1));
            }
            RunRole::Close => {
                if seen.remove(&run.seq).flatten() == Some(run.index) {
                    committed.insert(run.seq);
                }
            }
        }
    }
    if keep_unclosed {
        return; // mutant: parts of a run whose close is missing are kept
    }
    for (tx, placed) in txs.iter_mut() {
        if tx.run.is_some_and(|r| !committed.contains(&r.seq)) {
            tx.records.clear();
            placed.records = 0;
            placed.dead = 0;
        }
    }
}

//! Opening a log: choose the superblock, scan every stream's chain in parallel, keep the longest
//! complete prefix, cut transactions whose dependencies did not survive (to a fixpoint), then
//! durably bump every stream's epoch before anything new can be written.
//!
//! The acceptance rule for a transaction `T` found where the chain continues after the last
//! accepted `L` (stream root: epoch `E`, base `B`):
//! - `T` is whole: every unit decodes (crc seeded with the image uuid) with `T`'s identity, and
//!   every data block matches its crc (classic transactions also need their commit block);
//! - `T.prev_seq == L.seq`, `T.seq > L.seq`, `T.epoch >= L.epoch`;
//! - `T.epoch == E`, or `T.epoch < E` and `T.seq <= B` (older epochs end at the tail that the
//!   recovery which ended them kept: anything of theirs beyond it is an orphan).
//!
//! The chain continues right after `L` in the same segment, or at block 0 of the segment `L`
//! named as next (a transaction that did not fit the rest of its segment starts there). At
//! most one place can hold a `T` that passes the rule.
//!
//! Recovery writes only the superblock (the other copy, then a flush), so a crash inside it
//! leaves either the old or the new superblock, and running it again gives the same result.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tally_media::Device;

use crate::engine::{crc_padded, Placed, SbState, Stream};
use crate::error::corrupted;
use crate::format::body::{Body, TxId};
use crate::format::superblock::{StreamRoot, Superblock, SB_BLOCKS};
use crate::format::unit::{UnitHeader, UnitKind, FLAG_CLASSIC};
use crate::space::Space;
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
    /// `count` blocks at `offset` of `segment` (the caller checked they fit the segment).
    fn blocks(&mut self, ctx: &Ctx<'_>, segment: u32, offset: u32, count: u64) -> Result<&[u8]> {
        let bs = ctx.sb.block_size as usize;
        if self.segment != Some(segment) {
            self.segment = None;
            self.bytes.resize(ctx.sb.segment_blocks as usize * bs, 0);
            ctx.dev.read(ctx.sb.segment_start(segment), &mut self.bytes)?;
            self.blocks_read += u64::from(ctx.sb.segment_blocks);
            self.segment = Some(segment);
        }
        let start = offset as usize * bs;
        Ok(&self.bytes[start..start + count as usize * bs])
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
        if let Some(found) = crate::snapshot::read(&*dev, &sb, check_generation)? {
            return Self::open_restored(dev, (sb, slot), found, options, started);
        }
        let ctx = Ctx { dev: &*dev, sb: &sb, options, stop_after_seq: u64::MAX };
        // Streams are scanned in parallel, one thread each, when the log is large enough for
        // that to pay; a small log is scanned faster than a thread starts.
        let log_blocks = u64::from(sb.segment_count) * u64::from(sb.segment_blocks);
        let parallel = sb.streams.len() > 1 && log_blocks >= PARALLEL_SCAN_BLOCKS_MIN;
        let scans: Vec<Result<Scan>> = if !parallel {
            (0..sb.streams.len()).map(|s| scan_stream(&ctx, s as u16)).collect()
        } else {
            std::thread::scope(|scope| {
                let handles: Vec<_> = (0..sb.streams.len())
                    .map(|s| {
                        let ctx = &ctx;
                        scope.spawn(move || scan_stream(ctx, s as u16))
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(LogError::Invalid("scan thread panicked".into()))
                        })
                    })
                    .collect()
            })
        };
        let mut scans = scans.into_iter().collect::<Result<Vec<Scan>>>()?;
        let mut cut = vec![0usize; scans.len()];
        if !ctx.mutant(Mutant::NoDependencyClosure) {
            close_dependencies(&sb, &mut scans, &mut cut);
        }
        let scan_time = started.elapsed();
        let blocks_scanned = scans.iter().map(|s| s.blocks).sum();

        // New epoch for every stream, durable before any new write.
        let mut new_sb = sb.clone();
        new_sb.snapshot = None;
        let bump = !ctx.mutant(Mutant::NoEpochBump);
        let mut streams = Vec::with_capacity(scans.len());
        let mut report = Vec::with_capacity(scans.len());
        let mut used = Vec::new();
        for (s, scan) in scans.into_iter().enumerate() {
            let root = sb.streams[s];
            let tail = scan.txs.last().map_or(root.checkpoint_seq, |t| t.0.id.seq);
            let new_root = if bump {
                StreamRoot {
                    epoch: root.epoch + 1,
                    base_seq: tail,
                    resume_seq: tail.max(scan.max_seq_seen).max(root.resume_seq.saturating_sub(1))
                        + 1,
                    ..root
                }
            } else {
                root
            };
            new_sb.streams[s] = new_root;
            let next_seq = if bump { new_root.resume_seq } else { tail + 1 };
            // Segments the chain holds: those of the survivors, plus the reserved next one.
            let mut chain: VecDeque<u32> = scan.chain.iter().copied().collect();
            while chain.back().is_some_and(|&seg| seg != scan.end_segment) {
                chain.pop_back();
            }
            used.extend(chain.iter().copied());
            used.push(scan.next_segment);
            streams.push(Stream {
                epoch: new_root.epoch,
                last_seq: tail,
                next_seq,
                segment: scan.end_segment,
                offset: if ctx.mutant(Mutant::ResumeOverwritesTail) && !scan.txs.is_empty() {
                    scan.end_offset - 1
                } else {
                    scan.end_offset
                },
                next_segment: scan.next_segment,
                chain,
                placed: scan.txs.iter().map(|t| t.1).collect(),
                pending: Vec::new(),
                submitting: false,
                direct_submits: 0,
                inflight: Vec::new(),
                durable: tail,
            });
            report.push(StreamRecovery {
                txs: scan.txs.into_iter().map(|t| t.0).collect(),
                cut_by_dependency: cut[s],
                checkpoint_seq: root.checkpoint_seq,
                epoch: new_root.epoch,
            });
        }
        let space = Space::new(sb.segment_count, used);
        let log = Log::from_parts(dev, SbState { sb, slot }, streams, space, options);
        if bump {
            let durable = !log.mutant(Mutant::EpochBumpNotDurable);
            let mut state = log.sb.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            log.write_superblock(&mut state, new_sb, durable)?;
        } else {
            // Still make what was read durable: it may sit in the device's volatile cache.
            log.dev.flush()?;
        }
        Ok((log, Recovery { streams: report, blocks_scanned, scan_time, snapshot: None }))
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
        let crate::snapshot::Found { streams: restored, payload, blocks } = found;
        let mut new_sb = sb.clone();
        if options.mutant != Some(Mutant::SnapshotKept) {
            new_sb.snapshot = None;
        }
        let mut streams = Vec::with_capacity(restored.len());
        let mut report = Vec::with_capacity(restored.len());
        let mut used = Vec::new();
        for (s, r) in restored.into_iter().enumerate() {
            let root = sb.streams[s];
            let tail = r.last_seq;
            let new_root = StreamRoot {
                epoch: root.epoch + 1,
                base_seq: tail,
                resume_seq: tail.max(root.resume_seq.saturating_sub(1)) + 1,
                ..root
            };
            new_sb.streams[s] = new_root;
            used.extend(r.chain.iter().copied());
            used.push(r.next_segment);
            streams.push(r.into_stream(new_root.epoch, new_root.resume_seq));
            report.push(StreamRecovery {
                txs: Vec::new(),
                cut_by_dependency: 0,
                checkpoint_seq: root.checkpoint_seq,
                epoch: new_root.epoch,
            });
        }
        let space = Space::new(sb.segment_count, used);
        let log = Log::from_parts(dev, SbState { sb, slot }, streams, space, options);
        {
            let mut state = log.sb.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            log.write_superblock(&mut state, new_sb, true)?;
        }
        let scan_time = started.elapsed();
        Ok((
            log,
            Recovery {
                streams: report,
                blocks_scanned: blocks,
                scan_time,
                snapshot: Some(payload),
            },
        ))
    }
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
    let root = ctx.sb.streams[usize::from(s)];
    let mut last = (root.checkpoint_seq, root.checkpoint_epoch);
    let mut scan = Scan {
        txs: Vec::new(),
        chain: vec![root.checkpoint_segment],
        next_segment: root.checkpoint_next_segment,
        end_segment: root.checkpoint_segment,
        end_offset: root.checkpoint_offset,
        max_seq_seen: 0,
        blocks: 0,
    };
    let seg_blocks = ctx.sb.segment_blocks;
    let mut cache = SegmentCache::default();
    // Bounded: every step advances through a finite number of segment positions.
    let step_max = u64::from(ctx.sb.segment_count) * u64::from(seg_blocks) + 1;
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
                    scan.end_offset += skip;
                    continue;
                }
            }
            scan.blocks = cache.blocks_read;
            return Ok(scan);
        };
        scan.next_segment = header.next_segment;
        scan.end_offset += header.span_blocks() as u32;
        last = (header.seq, header.epoch);
        let placed = Placed {
            seq: header.seq,
            epoch: header.epoch,
            clock: 0,
            end_segment: scan.end_segment,
            end_offset: scan.end_offset,
            next_segment: scan.next_segment,
            records: tx.records.len() as u32,
            dead: 0,
        };
        scan.txs.push((tx, placed));
        if header.seq >= ctx.stop_after_seq {
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
    let block_no = ctx.sb.segment_start(segment) + u64::from(offset);
    let buf = cache.blocks(ctx, segment, offset, 1).ok()?;
    let (h, _) = UnitHeader::decode(&ctx.sb.uuid, buf, block_no, true).ok()?;
    let fits = u64::from(offset) + h.span_blocks() <= u64::from(ctx.sb.segment_blocks);
    (h.stream == s && h.unit_index == 0 && fits).then_some(h.span_blocks() as u32)
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
    let first = sb.segment_start(segment) + u64::from(offset);
    let buf = cache.blocks(ctx, segment, offset, 1)?;
    let Ok((h, _)) = UnitHeader::decode(&sb.uuid, buf, first, check_crc) else { return Ok(None) };
    if h.stream != s || h.kind != UnitKind::Body || h.unit_index != 0 {
        return Ok(None);
    }
    scan.max_seq_seen = scan.max_seq_seen.max(h.seq);
    let chained = h.prev_seq == last.0 && h.seq > last.0 && h.epoch >= last.1;
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
    if u64::from(offset) + span > u64::from(sb.segment_blocks) {
        return Ok(None);
    }
    let all = cache.blocks(ctx, segment, offset, span)?;
    let mut body = Vec::new();
    for (i, block) in all.chunks_exact(bs).take(h.unit_count as usize).enumerate() {
        let at = first + i as u64;
        let whole = UnitHeader::decode(&sb.uuid, block, at, check_crc).ok().filter(|(u, _)| {
            u.same_transaction(&h) && u.unit_index == i as u32 && u.kind == UnitKind::Body
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
        let at = first + span - 1;
        let block = &all[(span as usize - 1) * bs..];
        let Ok((c, _)) = UnitHeader::decode(&sb.uuid, block, at, check_crc) else {
            return Ok(None);
        };
        if c.kind != UnitKind::Commit || !c.same_transaction(&h) || c.unit_index != h.unit_count {
            return Ok(None);
        }
    }
    let tx = RecoveredTx {
        id: TxId { stream: s, seq: h.seq },
        epoch: h.epoch,
        records: body.records,
        data_start: first + u64::from(h.unit_count),
        data_count: h.data_count,
        deps: body.deps,
    };
    Ok(Some((h, tx)))
}

/// Cut every stream at its first survivor whose dependency did not survive, until nothing
/// changes. A dependency at or below the other stream's checkpoint is satisfied.
fn close_dependencies(sb: &Superblock, scans: &mut [Scan], cut: &mut [usize]) {
    // Each pass removes at least one transaction or stops, so this loop is bounded.
    loop {
        let alive: Vec<BTreeSet<u64>> =
            scans.iter().map(|s| s.txs.iter().map(|t| t.0.id.seq).collect()).collect();
        let stream_count = scans.len();
        let satisfied = |d: &TxId| {
            let st = usize::from(d.stream);
            st < stream_count
                && (d.seq <= sb.streams[st].checkpoint_seq || alive[st].contains(&d.seq))
        };
        let mut changed = false;
        for (s, scan) in scans.iter_mut().enumerate() {
            if let Some(i) = scan.txs.iter().position(|t| !t.0.deps.iter().all(satisfied)) {
                cut[s] += scan.txs.len() - i;
                scan.txs.truncate(i);
                if let Some(last) = scan.txs.last() {
                    scan.end_segment = last.1.end_segment;
                    scan.end_offset = last.1.end_offset;
                    scan.next_segment = last.1.next_segment;
                } else {
                    let root = sb.streams[s];
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
    Ok(scan_stream(&ctx, s)?.txs.into_iter().map(|t| t.0).collect())
}

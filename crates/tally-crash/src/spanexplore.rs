//! The crash explorer of a log spread over several targets (a multi-target image, issue 18).
//!
//! The log runs on a [`SpanDevice`] whose targets are [`CrashDevice`]s, each with its *own*
//! volatile cache: a flush of one target makes only that target's completed writes durable,
//! as for NBD exports on separate servers. A stream's segments are striped over the targets, so
//! its consecutive transactions land on different targets. At every persistence point (every
//! submit, wait and flush any target sees during an op, and the end of every op) each
//! target's crash images are taken independently and combined (the product when small,
//! sampled by seed beyond): so one target may keep a later write of a stream while another
//! loses an earlier one. Every combination is recovered through a [`SpanDevice`] over the
//! images and judged by the log explorer's [`Model`] (I1-I4) and I5 (recovery succeeds).
//!
//! A state is *split* when, for some stream, a target kept the unit of a transaction whose
//! earlier transaction of the same stream, on another target, was lost (the records are found
//! by their tags in each target's bytes): the case where order across targets is carried only
//! by the unit headers. [`SpanReport::split_states`] counts them, so a test can show they were
//! explored; [`SpanReport::first_violation`] says whether a violation came from one.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tally_log::{Log, LogConfig, LogError, Mutant, OpenOptions, Transaction};
use tally_media::{
    Device, DeviceStats, Geometry, Image, MemDevice, SpanDevice, SpanLayout, SpanMutant, Ticket,
    Write, WriteFlags,
};

use crate::explore::{Invariant, Model, ModelTx, Violation};
use crate::{CrashConfig, CrashDevice, CrashOptions, CrashPoint};

/// What to explore.
#[derive(Debug, Clone)]
pub struct SpanExploreConfig {
    /// Targets of the image.
    pub targets: usize,
    /// Streams of the log.
    pub streams: u16,
    /// Block size (small, so segments are few blocks).
    pub block_size: u32,
    /// Blocks per segment, which is also the stripe: a stream moves to another target each
    /// time it fills one.
    pub segment_blocks: u32,
    /// Blocks of each target after its header.
    pub target_blocks: u64,
    /// Random workloads to run.
    pub workloads: usize,
    /// Ops per workload.
    pub ops: usize,
    /// Images taken from each target at a point (exhaustive when fewer exist).
    pub images_per_target: usize,
    /// Combinations of the targets' images judged at a point, at most.
    pub combinations_max: usize,
    /// A broken log protocol.
    pub mutant: Option<Mutant>,
    /// A broken span flush.
    pub span_mutant: Option<SpanMutant>,
    /// Drives every random choice.
    pub seed: u64,
    /// Stop at the first violation.
    pub stop_at_first: bool,
}

impl Default for SpanExploreConfig {
    fn default() -> Self {
        SpanExploreConfig {
            targets: 3,
            streams: 2,
            block_size: 1024,
            segment_blocks: 4,
            target_blocks: 24,
            workloads: 40,
            ops: 10,
            images_per_target: 16,
            combinations_max: 96,
            mutant: None,
            span_mutant: None,
            seed: 1,
            stop_at_first: false,
        }
    }
}

/// The first violation, with what replays it.
#[derive(Debug, Clone)]
pub struct SpanViolation {
    /// Seed of the workload.
    pub workload_seed: u64,
    /// The ops run, one letter each (`a`/`b` ordered on stream 0/1 with a data block, `A`/`B`
    /// durable, `d` stream 1 depending on stream 0's last, `s` sync).
    pub workload: String,
    /// Ops done when the crash came (the crash is inside the next op, or after the last).
    pub ops_done: usize,
    /// Whether the state was split (see the module).
    pub split: bool,
    /// What broke.
    pub violation: Violation,
}

/// Totals of an exploration.
#[derive(Debug, Clone, Default)]
pub struct SpanReport {
    /// Workloads run.
    pub workloads: u64,
    /// Persistence points crashed at.
    pub crash_points: u64,
    /// Combinations of the targets' images recovered and judged.
    pub states_checked: u64,
    /// Of those, split states.
    pub split_states: u64,
    /// Split states whose recovery cut a stream before a transaction that a target kept.
    pub split_states_cut: u64,
    /// Violations found.
    pub violations: u64,
    /// Of those, in split states.
    pub split_violations: u64,
    /// The first violation found in a split state.
    pub first_split_violation: Option<SpanViolation>,
    /// The first.
    pub first_violation: Option<SpanViolation>,
}

/// The targets, recording a joint crash point at each of their operations.
struct Joint {
    targets: Vec<Arc<CrashDevice>>,
    points: Mutex<Option<Vec<Vec<CrashPoint>>>>,
}

impl Joint {
    fn guard(&self) -> MutexGuard<'_, Option<Vec<Vec<CrashPoint>>>> {
        self.points.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every target's state now, taken under one lock (targets flushed in parallel by a span
    /// flush round each change only their own state, in any order: any mix is a real state).
    fn record(&self) {
        let mut guard = self.guard();
        if let Some(points) = guard.as_mut() {
            points.push(self.targets.iter().map(|t| t.crash_point()).collect());
        }
    }

    fn now(&self) -> Vec<CrashPoint> {
        let _guard = self.guard();
        self.targets.iter().map(|t| t.crash_point()).collect()
    }
}

/// One target as the span sees it: its crash device, recording the joint point after every
/// operation.
struct Tap {
    index: usize,
    joint: Arc<Joint>,
}

impl Tap {
    fn dev(&self) -> &CrashDevice {
        &self.joint.targets[self.index]
    }
}

impl Device for Tap {
    fn geometry(&self) -> Geometry {
        self.dev().geometry()
    }
    fn read(&self, block: u64, buf: &mut [u8]) -> tally_media::Result<()> {
        self.dev().read(block, buf)
    }
    fn submit(&self, writes: Vec<Write>, flags: WriteFlags) -> tally_media::Result<Ticket> {
        let t = self.dev().submit(writes, flags);
        self.joint.record();
        t
    }
    fn wait(&self, ticket: Ticket) -> tally_media::Result<()> {
        let r = self.dev().wait(ticket);
        self.joint.record();
        r
    }
    fn flush(&self) -> tally_media::Result<()> {
        self.joint.record();
        let r = self.dev().flush();
        self.joint.record();
        r
    }
    fn stats(&self) -> DeviceStats {
        self.dev().stats()
    }
}

fn record_of(tag: u64) -> Vec<u8> {
    let mut r = tag.to_le_bytes().to_vec();
    r.extend((8u8..40).map(|i| (tag as u8).wrapping_mul(29).wrapping_add(i)));
    r
}

/// A data block of `tag` (not containing the tag's bytes, so finding a tag finds its unit).
fn data_of(tag: u64, block_size: u32) -> Vec<u8> {
    let seed = tag.rotate_left(23) ^ 0xA5A5_5A5A_0F0F_F0F0;
    (0..block_size as usize).map(|i| (seed >> ((i % 8) * 8)) as u8 ^ (i / 8) as u8).collect()
}

/// Which targets' images hold `tag`'s bytes (its unit).
fn holders(images: &[Image], tag: u64) -> Vec<usize> {
    let needle = tag.to_le_bytes();
    images
        .iter()
        .enumerate()
        .filter(|(_, image)| {
            image.written_blocks().any(|(_, b)| b.windows(8).any(|w| w == needle.as_slice()))
        })
        .map(|(i, _)| i)
        .collect()
}

/// Whether, for some stream, a target kept a transaction whose earlier transaction of the
/// same stream, sent to another target, was lost; and per stream the highest index kept (to
/// see whether recovery cut before it). `target_of` maps a tag to the target it was sent to.
fn split_of(
    model: &Model,
    images: &[Image],
    target_of: &BTreeMap<u64, usize>,
) -> (bool, Vec<Option<usize>>) {
    let mut split = false;
    let mut kept_max = Vec::new();
    for list in &model.streams {
        let kept: Vec<bool> = list.iter().map(|t| !holders(images, t.tag).is_empty()).collect();
        let mut max = None;
        for (j, later) in list.iter().enumerate().filter(|&(j, _)| kept[j]) {
            max = Some(j);
            let lost_elsewhere = list[..j].iter().enumerate().any(|(i, earlier)| {
                !kept[i] && target_of.get(&earlier.tag) != target_of.get(&later.tag)
            });
            split |= lost_elsewhere;
        }
        kept_max.push(max);
    }
    (split, kept_max)
}

/// The target an image block is on (the span's placement: lead blocks on target 0, then
/// stripes round-robin).
fn target_of_block(cfg: &SpanExploreConfig, block: u64) -> usize {
    let lead = u64::from(layout(cfg).lead_blocks);
    let stripe = block.saturating_sub(lead) / u64::from(cfg.segment_blocks.max(1));
    if block < lead {
        0
    } else {
        (stripe % cfg.targets.max(1) as u64) as usize
    }
}

/// The log's stripe layout over the targets.
fn layout(cfg: &SpanExploreConfig) -> SpanLayout {
    SpanLayout { stripe_blocks: cfg.segment_blocks, lead_blocks: 2 }
}

/// Run the exploration.
#[must_use]
pub fn explore(cfg: &SpanExploreConfig) -> SpanReport {
    let mut report = SpanReport::default();
    for w in 0..cfg.workloads {
        let seed = cfg.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(w as u64);
        run_one(cfg, seed, &mut report);
        if cfg.stop_at_first && report.violations > 0 {
            break;
        }
    }
    report
}

fn fresh_targets(cfg: &SpanExploreConfig) -> Option<Vec<Image>> {
    let g = Geometry {
        block_size: cfg.block_size,
        block_count: 1 + cfg.target_blocks,
        atomic_write_size: 512.min(cfg.block_size),
    };
    let mems: Vec<Arc<MemDevice>> =
        (0..cfg.targets).map(|_| Arc::new(MemDevice::from_image(Image::new(g)))).collect();
    let devs: Vec<Arc<dyn Device>> = mems.iter().map(|m| m.clone() as Arc<dyn Device>).collect();
    let span = SpanDevice::format(devs, layout(cfg)).ok()?;
    let config =
        LogConfig { streams: cfg.streams, segment_blocks: cfg.segment_blocks, uuid: [0x3C; 16] };
    Log::format(&span, &config).ok()?;
    drop(span);
    Some(mems.iter().map(|m| m.image()).collect())
}

fn open_span(images: &[Image]) -> tally_media::Result<SpanDevice> {
    let devs: Vec<Arc<dyn Device>> = images
        .iter()
        .map(|i| Arc::new(MemDevice::from_image(i.clone())) as Arc<dyn Device>)
        .collect();
    SpanDevice::open(devs)
}

fn i5(message: String) -> Violation {
    Violation { invariant: Invariant::I5RecoverySucceeds, message }
}

fn run_one(cfg: &SpanExploreConfig, seed: u64, report: &mut SpanReport) {
    report.workloads += 1;
    let Some(start) = fresh_targets(cfg) else {
        note(report, seed, "", 0, false, i5("format failed".into()));
        return;
    };
    let joint = Arc::new(Joint {
        targets: start
            .iter()
            .enumerate()
            .map(|(i, image)| {
                Arc::new(CrashDevice::from_image(
                    image.clone(),
                    CrashConfig::with_seed(seed ^ (i as u64 + 1)),
                ))
            })
            .collect(),
        points: Mutex::new(None),
    });
    let taps: Vec<Arc<dyn Device>> = (0..cfg.targets)
        .map(|index| Arc::new(Tap { index, joint: joint.clone() }) as Arc<dyn Device>)
        .collect();
    let mut span = match SpanDevice::open(taps) {
        Ok(s) => s,
        Err(e) => {
            note(report, seed, "", 0, false, i5(e.to_string()));
            return;
        }
    };
    span.set_mutant(cfg.span_mutant);
    let options = OpenOptions { mutant: cfg.mutant, ..OpenOptions::default() };
    let log = match Log::open(Arc::new(span), options) {
        Ok((log, _)) => log,
        Err(e) => {
            note(report, seed, "", 0, false, i5(e.to_string()));
            return;
        }
    };
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut model = Model::new(usize::from(cfg.streams));
    let mut letters = String::new();
    let mut target_of = BTreeMap::new();
    let mut tag = seed.rotate_left(32) | 1;
    for done in 0..cfg.ops {
        let op = *rng.choice(b"aabbABds".iter()).unwrap_or(&b'a');
        letters.push(char::from(op));
        *joint.guard() = Some(Vec::new());
        tag = tag.wrapping_add(0x1_0001);
        let (stopped, placed, ack) = apply(&log, &mut model, op, tag, cfg.block_size);
        if let Some(block) = placed {
            target_of.insert(tag, target_of_block(cfg, block));
        }
        // Inside the op nothing it acknowledges is acknowledged yet; after it, it is.
        let inside = joint.guard().take().unwrap_or_default();
        let after = joint.now();
        let at = At { seed, letters: &letters, done, target_of: &target_of };
        for point in &inside {
            judge(cfg, &at, point, &model, &mut rng, report);
            if cfg.stop_at_first && report.violations > 0 {
                return;
            }
        }
        match ack {
            Ack::Nothing => {}
            Ack::One(id) => model.ack(id),
            Ack::All => model.ack_all(),
        }
        judge(cfg, &at, &after, &model, &mut rng, report);
        if cfg.stop_at_first && report.violations > 0 {
            return;
        }
        if stopped {
            break;
        }
    }
}

/// What an op acknowledged durable when it returned.
enum Ack {
    Nothing,
    One(tally_log::TxId),
    All,
}

/// Run one op: whether the workload cannot go on (out of space or a failed device), the block
/// of the committed transaction's data block (its segment, hence its target), and what it
/// acknowledged (left to the caller: crash points inside the op are judged before it).
fn apply(
    log: &Log,
    model: &mut Model,
    op: u8,
    tag: u64,
    block_size: u32,
) -> (bool, Option<u64>, Ack) {
    if op == b's' {
        return match log.sync() {
            Ok(()) => (false, None, Ack::All),
            Err(_) => (true, None, Ack::Nothing),
        };
    }
    let stream: u16 = if matches!(op, b'a' | b'A') { 0 } else { 1 };
    let dep = (op == b'd').then(|| model.streams[0].last().map(|t| t.id)).flatten();
    let mut tx = Transaction::new(stream);
    tx.record(record_of(tag));
    let data = data_of(tag, block_size);
    tx.data(data.clone());
    if let Some(d) = dep {
        tx.depend_on(d);
    }
    let durable = op.is_ascii_uppercase();
    let result = if durable { log.commit_durable(tx) } else { log.commit(tx) };
    match result {
        Ok(info) => {
            model.streams[usize::from(stream)].push(ModelTx {
                tag,
                id: info.ticket,
                records: vec![record_of(tag)],
                data: vec![data],
                deps: dep.into_iter().collect(),
                acked: false,
                run: None,
            });
            let ack = if durable { Ack::One(info.ticket) } else { Ack::Nothing };
            (false, Some(info.data_start), ack)
        }
        Err(LogError::NoSpace { .. }) | Err(_) => (true, None, Ack::Nothing),
    }
}

/// Where a crash point is: the workload and what was placed where.
struct At<'a> {
    seed: u64,
    letters: &'a str,
    done: usize,
    target_of: &'a BTreeMap<u64, usize>,
}

fn judge(
    cfg: &SpanExploreConfig,
    at: &At<'_>,
    point: &[CrashPoint],
    model: &Model,
    rng: &mut fastrand::Rng,
    report: &mut SpanReport,
) {
    report.crash_points += 1;
    let options = CrashOptions {
        tearing: false,
        samples: cfg.images_per_target,
        exhaustive_images_max: cfg.images_per_target as u64,
        seed: Some(rng.u64(..)),
        ..CrashOptions::default()
    };
    let per_target: Vec<Vec<Image>> =
        point.iter().map(|p| p.crash_images(options.clone()).collect()).collect();
    if per_target.iter().any(Vec::is_empty) {
        return;
    }
    let total: usize = per_target
        .iter()
        .map(Vec::len)
        .try_fold(1usize, |a, n| a.checked_mul(n))
        .unwrap_or(usize::MAX);
    let combos: Vec<Vec<usize>> = if total <= cfg.combinations_max {
        (0..total)
            .map(|mut k| {
                per_target
                    .iter()
                    .map(|list| {
                        let i = k % list.len();
                        k /= list.len();
                        i
                    })
                    .collect()
            })
            .collect()
    } else {
        (0..cfg.combinations_max)
            .map(|_| per_target.iter().map(|list| rng.usize(..list.len())).collect())
            .collect()
    };
    for combo in combos {
        let images: Vec<Image> =
            combo.iter().zip(&per_target).map(|(&i, list)| list[i].clone()).collect();
        report.states_checked += 1;
        let (split, kept_max) = split_of(model, &images, at.target_of);
        if split {
            report.split_states += 1;
        }
        match recover(cfg, &images, model) {
            Ok(survivors) => {
                let cut = kept_max
                    .iter()
                    .zip(&survivors)
                    .any(|(kept, &got)| kept.is_some_and(|k| got <= k));
                if split && cut {
                    report.split_states_cut += 1;
                }
            }
            Err(v) => {
                note(report, at.seed, at.letters, at.done, split, v);
                if cfg.stop_at_first {
                    return;
                }
            }
        }
    }
}

/// Recover the images and judge them; the survivors per stream.
fn recover(
    cfg: &SpanExploreConfig,
    images: &[Image],
    model: &Model,
) -> Result<Vec<usize>, Violation> {
    let span = open_span(images).map_err(|e| i5(format!("opening the targets: {e}")))?;
    let span = Arc::new(span);
    let options = OpenOptions { mutant: cfg.mutant, ..OpenOptions::default() };
    let dev: Arc<dyn Device> = span.clone();
    let opened = catch_unwind(AssertUnwindSafe(|| Log::open(dev, options)))
        .map_err(|_| i5("recovery panicked".into()))?;
    let (_log, rec) = opened.map_err(|e| i5(format!("recovery failed: {e}")))?;
    model.check(&rec, &*span)?;
    Ok(rec.streams.iter().map(|s| s.txs.len()).collect())
}

fn note(
    report: &mut SpanReport,
    seed: u64,
    letters: &str,
    done: usize,
    split: bool,
    violation: Violation,
) {
    report.violations += 1;
    let found = SpanViolation {
        workload_seed: seed,
        workload: letters.to_string(),
        ops_done: done,
        split,
        violation,
    };
    if split {
        report.split_violations += 1;
        if report.first_split_violation.is_none() {
            report.first_split_violation = Some(found.clone());
        }
    }
    if report.first_violation.is_none() {
        report.first_violation = Some(found);
    }
}

//! Running workloads and checking every crash state.

use std::collections::{BTreeMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use tally_log::{
    CommitMode, Log, LogConfig, LogError, Mutant, OpenOptions, Recovery, Transaction, WriteBehind,
};
use tally_media::{Device, Geometry, Image, MemDevice};

use super::model::{survivor_tags, Invariant, Model, ModelTx, Violation};
use super::workload::{Op, Workload};
use crate::fsexplore::medium::{self, Mounted, Point, Recorder};
use crate::fsexplore::Medium;
use crate::{CrashConfig, CrashDevice, CrashOptions, FaultPlan};
use generations::LastRecovery;
use tally_media::pmem::{BlockMutant, BlockView};

mod generations;

/// The image a workload starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Start {
    /// A freshly formatted log.
    Empty,
    /// Stream 0 filled until no segment is free.
    NearlyFull,
    /// Segments filled, checkpointed and reused several times: stale units everywhere.
    Wrapped,
}

impl Start {
    /// Every start.
    pub const ALL: [Start; 3] = [Start::Empty, Start::NearlyFull, Start::Wrapped];
}

/// When the log under exploration writes its committed transactions to the device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WriteOuts {
    /// No write-behind: each commit is submitted as it is placed.
    Through,
    /// Write-behind, and the explorer writes the buffers out (`Log::write_out`) at the end of
    /// every op, inside it: the device sees what `Through` shows, through the write-out path,
    /// and every op's own write-out has its crash points.
    #[default]
    EachOp,
    /// Write-behind, the buffers written out only by the log itself: at durability requests
    /// (`A`, `l`, `s`, `k`, `g`) and past the thresholds of [`WriteOuts::write_behind`], so one
    /// write-out carries several ops' commits in several submissions, each crashed inside.
    AcrossOps,
}

impl WriteOuts {
    /// Every mode.
    pub const ALL: [WriteOuts; 3] = [WriteOuts::Through, WriteOuts::EachOp, WriteOuts::AcrossOps];

    /// Its name on the command line.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            WriteOuts::Through => "through",
            WriteOuts::EachOp => "each-op",
            WriteOuts::AcrossOps => "across-ops",
        }
    }

    /// The mode called `name`.
    #[must_use]
    pub fn from_name(name: &str) -> Option<Self> {
        WriteOuts::ALL.into_iter().find(|m| m.name() == name)
    }

    /// The log's write-behind for blocks of `block_size`: no flusher thread (deterministic),
    /// a stream written out past 6 blocks, every stream past 12, 4 blocks per submission (an
    /// `m` or `M` alone is larger and goes alone).
    #[must_use]
    pub fn write_behind(self, block_size: u32) -> Option<WriteBehind> {
        let bs = u64::from(block_size);
        (self != WriteOuts::Through).then_some(WriteBehind {
            interval: None,
            stream_bytes_max: 6 * bs,
            memory_bytes_max: 12 * bs,
            write_bytes_max: 4 * bs,
        })
    }
}

/// What to explore, and how hard.
#[derive(Debug, Clone)]
pub struct ExploreConfig {
    /// Block size of the simulated device (1 KiB: two 512-byte sectors, so units can tear).
    pub block_size: u32,
    /// Streams of the log.
    pub streams: u16,
    /// Blocks per segment (small, so workloads cross segment boundaries).
    pub segment_blocks: u32,
    /// Segments on the device.
    pub segment_count: u32,
    /// How crash images are made at each point.
    pub crash: CrashOptions,
    /// A crash op continues from at most this many of its images.
    pub branch_max: usize,
    /// Also crash inside every recovery.
    pub recovery_crashes: bool,
    /// Also crash between the device operations inside each op (after every submit, wait and
    /// flush the op makes), not only between ops.
    pub crash_inside_ops: bool,
    /// A deliberately broken protocol variant.
    pub mutant: Option<Mutant>,
    /// When committed transactions are written to the device.
    pub write_outs: WriteOuts,
    /// Drives every random choice.
    pub seed: u64,
    /// Stop at the first violation.
    pub stop_at_first: bool,
    /// What the log runs on (persistent memory: the cache-line simulator under the block
    /// view; `crash` then gives only `samples`, images being drawn from the cache-line model).
    pub medium: Medium,
    /// A deliberately broken persistent-memory block protocol (with [`Medium::Pmem`]).
    pub pmem_mutant: Option<BlockMutant>,
    /// Multi-generation checks: record the crash points inside every recovery a workload
    /// continues from (after `c`, `p`, `r`) and judge their images against what was committed
    /// and acknowledged before the crash. (`p` always does; `c` otherwise only before an `r`.)
    pub recovery_points: bool,
}

impl Default for ExploreConfig {
    fn default() -> Self {
        ExploreConfig {
            block_size: 1024,
            streams: 2,
            segment_blocks: 8,
            segment_count: 10,
            crash: CrashOptions {
                tearing: true,
                samples: 64,
                exhaustive_images_max: 1024,
                ..CrashOptions::default()
            },
            branch_max: 6,
            recovery_crashes: true,
            crash_inside_ops: true,
            mutant: None,
            write_outs: WriteOuts::default(),
            seed: 1,
            stop_at_first: false,
            medium: Medium::Block,
            pmem_mutant: None,
            recovery_points: false,
        }
    }
}

/// The first violation found, with what replays it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FirstViolation {
    /// Seed of the run.
    pub seed: u64,
    /// The workload, one letter per op.
    pub workload: String,
    /// The image the workload started from.
    pub start: Start,
    /// Op after which the crash happened.
    pub op_index: usize,
    /// Which invariant broke.
    pub invariant: Invariant,
    /// What was seen.
    pub message: String,
    /// Crash states checked before it, in the whole run.
    pub states_before: u64,
    /// The command that replays it.
    pub replay: String,
}

/// Totals of an exploration, as `tally crash log --json` prints them.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Report {
    /// Workloads run.
    pub workloads: u64,
    /// Persistence points crashed at (between ops and, with `crash_inside_ops`, inside them).
    pub crash_points: u64,
    /// Of those, points inside an op.
    pub crash_points_inside_ops: u64,
    /// Post-crash images recovered and judged.
    pub states_checked: u64,
    /// Distinct images among them.
    pub unique_states: u64,
    /// Images left by crashes inside recovery, recovered and compared.
    pub recovery_crash_states: u64,
    /// Generations run: recoveries after a power loss (`c`) or a process crash (`p`) that a
    /// workload continued from.
    pub generations: u64,
    /// Of those, recoveries after a process crash (`p`: the device's volatile cache kept).
    pub process_crashes: u64,
    /// Power losses inside a recovery that a workload continued from (`r`).
    pub crashes_in_recovery: u64,
    /// Crash points inside the recoveries a workload ran (`c`, `p`, `r`), judged like any other
    /// point (also counted in `crash_points`).
    pub recovery_points: u64,
    /// Violations found.
    pub violations: u64,
    /// Violations per invariant.
    pub violations_by_invariant: BTreeMap<String, u64>,
    /// Whether every crash point was enumerated exhaustively.
    pub all_exhaustive: bool,
    /// Enumeration passes (untorn, torn) that were sampled rather than exhaustive.
    pub sampled_passes: u64,
    /// States checked per second of wall time.
    pub states_per_sec: f64,
    /// Wall time.
    pub elapsed_sec: f64,
    /// The mutant explored, if any.
    pub mutant: Option<String>,
    /// When committed transactions were written to the device.
    pub write_outs: WriteOuts,
    /// What the log ran on: `block` or `pmem`.
    pub medium: Medium,
    /// The first violation.
    pub first_violation: Option<FirstViolation>,
}

/// Runs workloads and accumulates a [`Report`].
pub struct Explorer {
    cfg: ExploreConfig,
    report: Report,
    unique: HashSet<u64>,
    started: Instant,
    starts: BTreeMap<u8, (Image, Model)>,
}

/// Where in which workload we are, for reporting.
#[derive(Clone, Copy)]
struct At<'a> {
    workload: &'a Workload,
    start: Start,
    op_index: usize,
}

/// Tags of forward-progress commits: never used by workloads.
const PROGRESS_TAG: u64 = 1 << 63;

impl Explorer {
    /// A new explorer.
    #[must_use]
    pub fn new(cfg: ExploreConfig) -> Self {
        let mutant = cfg
            .mutant
            .map(|m| m.name().to_string())
            .or_else(|| cfg.pmem_mutant.map(|m| m.name().to_string()));
        let medium = cfg.medium;
        let write_outs = cfg.write_outs;
        Explorer {
            cfg,
            report: Report {
                all_exhaustive: true,
                mutant,
                medium,
                write_outs,
                ..Report::default()
            },
            unique: HashSet::new(),
            started: Instant::now(),
            starts: BTreeMap::new(),
        }
    }

    /// The report so far.
    #[must_use]
    pub fn report(&self) -> Report {
        let mut r = self.report.clone();
        r.elapsed_sec = self.started.elapsed().as_secs_f64();
        r.states_per_sec = r.states_checked as f64 / r.elapsed_sec.max(1e-9);
        r.unique_states = self.unique.len() as u64;
        r
    }

    /// Whether to stop: a violation was found and the run stops at the first.
    #[must_use]
    pub fn done(&self) -> bool {
        self.cfg.stop_at_first && self.report.violations > 0
    }

    fn open_options(&self) -> OpenOptions {
        OpenOptions {
            mutant: self.cfg.mutant,
            write_behind: self.cfg.write_outs.write_behind(self.cfg.block_size),
            ..OpenOptions::default()
        }
    }

    fn geometry(&self) -> Geometry {
        let blocks = 2 + u64::from(self.cfg.segment_count) * u64::from(self.cfg.segment_blocks);
        let bs = self.cfg.block_size;
        Geometry { block_size: bs, block_count: blocks, atomic_write_size: 512.min(bs) }
    }

    /// Run one workload from `start`. With `branch_all`, a crash op continues from up to
    /// `branch_max` images; otherwise from one image chosen by seed.
    pub fn run(&mut self, workload: &Workload, start: Start, branch_all: bool) {
        self.report.workloads += 1;
        let (image, model) = self.start_state(start);
        let dev = Recorder::new(self.cfg.medium, &image, self.cfg.seed, self.view());
        let log = match Log::open(dev.device(), self.open_options()) {
            Ok((log, _)) => log,
            Err(e) => {
                let at = At { workload, start, op_index: 0 };
                self.record(
                    at,
                    Violation {
                        invariant: Invariant::I5RecoverySucceeds,
                        message: format!("opening the start image: {e}"),
                    },
                );
                return;
            }
        };
        let mut rng = fastrand::Rng::with_seed(self.point_seed(workload, start, usize::MAX));
        self.run_from(workload, start, 0, &dev, log, model, branch_all, &mut rng, None);
    }

    #[allow(clippy::too_many_arguments)]
    fn run_from(
        &mut self,
        workload: &Workload,
        start: Start,
        first_op: usize,
        dev: &Recorder,
        log: Log,
        mut model: Model,
        branch_all: bool,
        rng: &mut fastrand::Rng,
        last: Option<&LastRecovery>,
    ) {
        for (i, &op) in workload.0.iter().enumerate().skip(first_op) {
            let at = At { workload, start, op_index: i };
            match op {
                Op::ProcessCrash => {
                    if let Some(c) = self.process_crash(dev, log, &model, at) {
                        self.continue_from(c, workload, start, i + 1, branch_all, rng);
                    }
                    return;
                }
                // Only right after a recovery (`c`, `p`, `r`): else it does nothing.
                Op::CrashInRecovery => match last.filter(|l| i == first_op && !l.points.is_empty())
                {
                    Some(last) => {
                        if let Some(c) = self.crash_in_recovery(last, rng, at) {
                            self.continue_from(c, workload, start, i + 1, branch_all, rng);
                        }
                        return;
                    }
                    None => continue,
                },
                _ => {}
            }
            if op == Op::Crash {
                drop(log);
                let mut images: Vec<Image> = match dev {
                    // Multi-generation: the untorn images (exhaustive when few) and the torn
                    // ones, as judged at the point, so a power loss that keeps one commit and
                    // loses another is as likely as a torn one.
                    _ if self.cfg.recovery_points => self.point_images(&dev.point_now(), at),
                    Recorder::Block(d) => {
                        d.inner().crash_images(self.crash_options(workload, start, i)).collect()
                    }
                    Recorder::Pmem(_) => {
                        let seed = self.point_seed(workload, start, i);
                        let samples = self.cfg.crash.samples;
                        let passes = medium::passes(
                            &dev.point_now(),
                            self.pmem_geometry(),
                            samples,
                            0,
                            seed,
                        );
                        passes.into_iter().flat_map(|p| p.images).collect()
                    }
                };
                rng.shuffle(&mut images);
                // Multi-generation: half the time first an image whose recovery cuts a
                // transaction for a lost dependency (the one a random run takes, and the first
                // branch of a bounded one).
                if self.cfg.recovery_points {
                    if let Some(k) = medium::cutting_image(&images, rng, self.open_options()) {
                        images.swap(0, k);
                    }
                }
                images.truncate(if branch_all { self.cfg.branch_max } else { 1 });
                let record =
                    self.cfg.recovery_points || workload.0.get(i + 1) == Some(&Op::CrashInRecovery);
                for image in images {
                    if self.done() {
                        return;
                    }
                    let next = Recorder::new(self.cfg.medium, &image, rng.u64(..), self.view());
                    // The image was judged at the point before (I1–I7): a failing one ends
                    // this branch.
                    if let Some(c) = self.recover_on(next, &model, at, record, false) {
                        self.report.generations += 1;
                        self.continue_from(c, workload, start, i + 1, branch_all, rng);
                    }
                }
                return;
            }
            let before = model.clone();
            dev.set_recording(self.cfg.crash_inside_ops);
            let applied = apply(&log, op, &mut model, self.cfg.block_size, self.cfg.segment_blocks)
                .and_then(|()| match self.cfg.write_outs {
                    WriteOuts::EachOp => log.write_out().map_err(|e| workload_error(op, &e)),
                    WriteOuts::Through | WriteOuts::AcrossOps => Ok(()),
                });
            let inside = dev.take_points();
            if let Err(v) = applied {
                self.record(at, v);
                return;
            }
            if !inside.is_empty() {
                let candidates = inside_candidates(&before, &model);
                let mut seen = HashSet::new();
                for point in &inside {
                    self.report.crash_points_inside_ops += 1;
                    self.check_point(point, &candidates, at, &mut seen);
                    if self.done() {
                        return;
                    }
                }
            }
            self.check_point(
                &dev.point_now(),
                std::slice::from_ref(&model),
                at,
                &mut HashSet::new(),
            );
            if self.done() {
                return;
            }
        }
    }

    fn point_seed(&self, workload: &Workload, start: Start, op_index: usize) -> u64 {
        let mut h = crc32c::crc32c(workload.to_string().as_bytes()) as u64;
        h = h << 32 | (start as u64) << 24 | (op_index as u64 & 0xFF_FFFF);
        h ^ self.cfg.seed.rotate_left(17)
    }

    fn crash_options(&self, workload: &Workload, start: Start, op_index: usize) -> CrashOptions {
        CrashOptions {
            seed: Some(self.point_seed(workload, start, op_index)),
            ..self.cfg.crash.clone()
        }
    }

    /// Every crash image at this point, recovered and judged: first every untorn image
    /// (exhaustive up to 12 uncertain writes), then the torn ones (exhaustive while they number
    /// at most `crash.exhaustive_images_max`, sampled beyond), each distinct image once.
    fn check_point(
        &mut self,
        point: &Point,
        models: &[Model],
        at: At<'_>,
        seen: &mut HashSet<u64>,
    ) {
        self.report.crash_points += 1;
        let point = match point {
            Point::Block(p) => p,
            Point::Pmem(_) => return self.check_pmem_point(point, models, at, seen),
        };
        let torn = self.crash_options(at.workload, at.start, at.op_index);
        let untorn =
            CrashOptions { tearing: false, exhaustive_images_max: 1 << 16, ..torn.clone() };
        let passes = if torn.tearing { vec![untorn, torn] } else { vec![untorn] };
        for options in passes {
            let mut images = point.crash_images(options);
            for image in images.by_ref() {
                let hash = image_hash(&image);
                if !seen.insert(hash) {
                    continue;
                }
                self.report.states_checked += 1;
                self.unique.insert(hash);
                if let Err(v) = self.check_image(&image, models) {
                    self.record(at, v);
                    if self.done() {
                        return;
                    }
                }
            }
            let exhaustive = images.report().exhaustive;
            self.report.all_exhaustive &= exhaustive;
            self.report.sampled_passes += u64::from(!exhaustive);
        }
    }

    /// Every cache-line image at a persistent-memory point (exhaustive when few, else
    /// `crash.samples` draws), recovered and judged, each distinct image once.
    fn check_pmem_point(
        &mut self,
        point: &Point,
        models: &[Model],
        at: At<'_>,
        seen: &mut HashSet<u64>,
    ) {
        let seed = self.point_seed(at.workload, at.start, at.op_index);
        let samples = self.cfg.crash.samples;
        for pass in medium::passes(point, self.pmem_geometry(), samples, 0, seed) {
            for image in &pass.images {
                let hash = image_hash(image);
                if !seen.insert(hash) {
                    continue;
                }
                self.report.states_checked += 1;
                self.unique.insert(hash);
                if let Err(v) = self.check_image(image, models) {
                    self.record(at, v);
                    if self.done() {
                        return;
                    }
                }
            }
            self.report.all_exhaustive &= pass.exhaustive;
            self.report.sampled_passes += u64::from(!pass.exhaustive);
        }
    }

    fn view(&self) -> BlockView {
        medium::explorer_view(self.cfg.block_size, self.cfg.pmem_mutant)
    }

    fn pmem_geometry(&self) -> Geometry {
        Geometry { atomic_write_size: 8, ..self.geometry() }
    }

    /// Judge one image: it must be a legal outcome of at least one of `models` (one model
    /// between ops; inside an op, each state the op could have reached), then pass I5–I7.
    fn check_image(&mut self, image: &Image, models: &[Model]) -> Result<(), Violation> {
        let mem = Arc::new(MemDevice::from_image(image.clone()));
        let rec = self.recover(mem.clone())?;
        let mut first_error = None;
        for model in models {
            match model.check(&rec, &*mem) {
                Ok(()) => {
                    first_error = None;
                    break;
                }
                Err(v) => {
                    first_error.get_or_insert(v);
                }
            }
        }
        if let Some(v) = first_error {
            if std::env::var_os("TALLY_EXPLORE_DEBUG").is_some() {
                eprintln!(
                    "survivors: {:?}",
                    super::model::survivor_tags(&rec)
                        .iter()
                        .map(|s| s.iter().map(|r| r.first().copied()).collect::<Vec<_>>())
                        .collect::<Vec<_>>()
                );
                for m in models {
                    eprintln!(
                        "candidate: {:?} ckpt {:?}",
                        m.streams
                            .iter()
                            .map(|l| l
                                .iter()
                                .map(|t| (t.tag, t.id.seq, t.acked))
                                .collect::<Vec<_>>())
                            .collect::<Vec<_>>(),
                        m.checkpoint
                    );
                    eprintln!("   -> {:?}", m.check(&rec, &*mem).err().map(|e| e.message));
                }
            }
            return Err(v);
        }
        // I6: recovering the recovered device changes nothing.
        let again = self.recover(mem.clone())?;
        if survivor_tags(&again) != survivor_tags(&rec) {
            return Err(Violation {
                invariant: Invariant::I6Idempotent,
                message: "a second recovery found different survivors".into(),
            });
        }
        if self.cfg.recovery_crashes {
            self.check_recovery_crashes(image, &rec)?;
        }
        self.check_forward_progress(&mem, &rec)
    }

    fn recover(&self, dev: Arc<dyn Device>) -> Result<Recovery, Violation> {
        let opts = self.open_options();
        match catch_unwind(AssertUnwindSafe(|| Log::open(dev, opts))) {
            Ok(Ok((_, rec))) => Ok(rec),
            Ok(Err(e)) => Err(Violation {
                invariant: Invariant::I5RecoverySucceeds,
                message: format!("recovery failed: {e}"),
            }),
            Err(_) => Err(Violation {
                invariant: Invariant::I5RecoverySucceeds,
                message: "recovery panicked".into(),
            }),
        }
    }

    /// Crash inside recovery: its superblock write done, its flush failed. Every image that
    /// leaves must recover to the same survivors.
    fn check_recovery_crashes(&mut self, image: &Image, rec: &Recovery) -> Result<(), Violation> {
        if self.cfg.medium == Medium::Pmem {
            // On persistent memory: images drawn before the fences of a recovery on the
            // cache-line simulator.
            let dev = Mounted::new(Medium::Pmem, image, self.cfg.seed, self.view());
            let opts = self.open_options();
            let _ = catch_unwind(AssertUnwindSafe(|| Log::open(dev.device(), opts)));
            for (inner, _) in dev.recovery_crash_images(image, 16, self.cfg.seed, |_| {}) {
                self.report.recovery_crash_states += 1;
                let again = self.recover(Arc::new(MemDevice::from_image(inner)))?;
                if survivor_tags(&again) != survivor_tags(rec) {
                    return Err(Violation {
                        invariant: Invariant::I6Idempotent,
                        message: "a crash inside recovery on pmem changed what survives".into(),
                    });
                }
            }
            return Ok(());
        }
        let faults = FaultPlan { flush_eio_nth: Some(1), ..FaultPlan::none() };
        let dev = Arc::new(CrashDevice::from_image(
            image.clone(),
            CrashConfig { faults, ..CrashConfig::with_seed(self.cfg.seed) },
        ));
        let opts = self.open_options();
        let _ = catch_unwind(AssertUnwindSafe(|| Log::open(dev.clone(), opts)));
        for inner in dev.crash_images(CrashOptions { tearing: false, ..CrashOptions::default() }) {
            self.report.recovery_crash_states += 1;
            let again = self.recover(Arc::new(MemDevice::from_image(inner)))?;
            if survivor_tags(&again) != survivor_tags(rec) {
                return Err(Violation {
                    invariant: Invariant::I6Idempotent,
                    message: "a crash inside recovery changed what survives".into(),
                });
            }
        }
        Ok(())
    }

    /// I7: after recovery, a durable commit on every stream works and survives a reopen.
    fn check_forward_progress(
        &self,
        mem: &Arc<MemDevice>,
        rec: &Recovery,
    ) -> Result<(), Violation> {
        let fail = |message: String| Violation { invariant: Invariant::I7ForwardProgress, message };
        let (log, _) = Log::open(mem.clone(), self.open_options())
            .map_err(|e| fail(format!("reopen: {e}")))?;
        for s in 0..log.stream_count() {
            let mut tx = Transaction::new(s);
            tx.record((PROGRESS_TAG | u64::from(s)).to_le_bytes().to_vec());
            match log.commit_durable(tx) {
                Ok(_) | Err(LogError::NoSpace { .. }) => {}
                Err(e) => return Err(fail(format!("commit after recovery on stream {s}: {e}"))),
            }
        }
        drop(log);
        let after = self.recover(mem.clone())?;
        for (s, (before, now)) in survivor_tags(rec).iter().zip(survivor_tags(&after)).enumerate() {
            let is_progress = |r: &Vec<u8>| r.len() == 8 && r[7] & 0x80 != 0;
            let (new, old): (Vec<_>, Vec<_>) = now.into_iter().partition(is_progress);
            if old.len() > before.len() && old[..before.len()] == before[..] {
                return Err(Violation {
                    invariant: Invariant::I2NoPhantom,
                    message: format!(
                        "stream {s}: after recovery and one new commit, {} transaction(s) discarded by that recovery came back",
                        old.len() - before.len()
                    ),
                });
            }
            if old != *before || new.len() > 1 {
                return Err(fail(format!(
                    "stream {s}: {} survivors before the new commit; after it {} old and {} new",
                    before.len(),
                    old.len(),
                    new.len()
                )));
            }
        }
        Ok(())
    }

    fn record(&mut self, at: At<'_>, v: Violation) {
        self.report.violations += 1;
        *self.report.violations_by_invariant.entry(v.invariant.name().to_string()).or_default() +=
            1;
        if self.report.first_violation.is_none() {
            let mutant = self
                .cfg
                .mutant
                .map(Mutant::name)
                .or(self.cfg.pmem_mutant.map(BlockMutant::name))
                .map_or(String::new(), |m| format!(" --mutant {m}"));
            // Multi-generation runs replay one branch: the image choices hang on every option.
            let generations = if self.cfg.recovery_points {
                format!(
                    " --generations {} --samples {} --exhaustive-images-max {} --tearing {}",
                    at.workload.generation_count().max(1),
                    self.cfg.crash.samples,
                    self.cfg.crash.exhaustive_images_max,
                    self.cfg.crash.tearing
                )
            } else {
                String::new()
            };
            let start = match at.start {
                Start::Empty => "empty",
                Start::NearlyFull => "nearly-full",
                Start::Wrapped => "wrapped",
            };
            let write_outs = match self.cfg.write_outs {
                WriteOuts::EachOp => String::new(),
                w => format!(" --write-outs {}", w.name()),
            };
            self.report.first_violation = Some(FirstViolation {
                seed: self.cfg.seed,
                workload: at.workload.to_string(),
                start: at.start,
                op_index: at.op_index,
                invariant: v.invariant,
                message: v.message,
                states_before: self.report.states_checked,
                replay: format!(
                    "tally crash log --medium {}{generations}{write_outs} --workload {} --start {start} --seed {}{mutant} --json",
                    self.cfg.medium.name(), at.workload, self.cfg.seed
                ),
            });
        }
    }

    /// The image and model a workload starts from (built once per explorer).
    fn start_state(&mut self, start: Start) -> (Image, Model) {
        if let Some(s) = self.starts.get(&(start as u8)) {
            return s.clone();
        }
        let made = self.make_start(start);
        self.starts.insert(start as u8, made.clone());
        made
    }

    fn make_start(&self, start: Start) -> (Image, Model) {
        let mem = Arc::new(MemDevice::from_image(Image::new(self.geometry())));
        let config = LogConfig {
            streams: self.cfg.streams,
            segment_blocks: self.cfg.segment_blocks,
            uuid: [0x5A; 16],
        };
        let mut model = Model::new(usize::from(self.cfg.streams));
        // The start is built with the correct protocol: mutants are judged on the workload.
        let built = Log::format(&*mem, &config)
            .and_then(|()| Log::open(mem.clone(), OpenOptions::default()));
        let Ok((log, _)) = built else { return (mem.image(), model) };
        let mut tag = 1 << 40;
        let mut fill = |log: &Log, model: &mut Model| loop {
            tag += 1;
            let mut tx = Transaction::new(0);
            tx.record(tag_record(tag, 24));
            match log.commit_durable(tx) {
                Ok(info) => model.streams[0].push(ModelTx {
                    tag,
                    id: info.ticket,
                    records: vec![tag_record(tag, 24)],
                    data: vec![],
                    deps: vec![],
                    acked: true,
                    run: None,
                }),
                Err(_) => return,
            }
        };
        match start {
            Start::Empty => {}
            Start::NearlyFull => fill(&log, &mut model),
            Start::Wrapped => {
                for _ in 0..3 {
                    fill(&log, &mut model);
                    if let Some(last) = model.streams[0].last().map(|t| t.id.seq) {
                        let _ = log.checkpoint(0, last);
                        model.checkpoint(0, last);
                    }
                }
            }
        }
        drop(log);
        (mem.image(), model)
    }
}

/// The states a crash inside an op may leave, as models judged with what was acknowledged
/// before the op (nothing the op does is acknowledged until it returns): the op done; the op
/// not done; the op's new transactions present without the checkpoint it ends with (`k`, `g`).
fn inside_candidates(before: &Model, after: &Model) -> Vec<Model> {
    let acked: HashSet<u64> =
        before.streams.iter().flatten().filter(|t| t.acked).map(|t| t.tag).collect();
    let mut done = after.clone();
    for tx in done.streams.iter_mut().flatten() {
        tx.acked = acked.contains(&tx.tag);
    }
    let mut added = before.clone();
    for (s, list) in after.streams.iter().enumerate() {
        for tx in list.iter().filter(|t| !before.streams[s].iter().any(|b| b.id == t.id)) {
            added.streams[s].push(ModelTx { acked: false, ..tx.clone() });
        }
    }
    vec![done, before.clone(), added]
}

/// A record that starts with `tag` and is `len` bytes long (at least 8).
fn tag_record(tag: u64, len: usize) -> Vec<u8> {
    let mut r = tag.to_le_bytes().to_vec();
    r.extend((8..len.max(8)).map(|i| (tag as u8).wrapping_mul(31).wrapping_add(i as u8)));
    r
}

/// A data block derived from `tag` and its index, zero-padded to the block.
fn tag_data(tag: u64, index: usize, block_size: u32, len: usize) -> Vec<u8> {
    let mut block = vec![0u8; block_size as usize];
    let seed = tag.rotate_left(7) ^ index as u64;
    for (i, b) in block.iter_mut().take(len).enumerate() {
        *b = (seed >> ((i % 8) * 8)) as u8 ^ i as u8;
    }
    block
}

/// Apply one op to the live log and the model.
fn apply(
    log: &Log,
    op: Op,
    model: &mut Model,
    block_size: u32,
    segment_blocks: u32,
) -> Result<(), Violation> {
    let next_tag = model
        .streams
        .iter()
        .flatten()
        .map(|t| t.tag)
        .max()
        .unwrap_or(0)
        .max(model.lost.iter().copied().max().unwrap_or(0))
        + 1;
    let (stream, record_len, data_count, mode, dep) = match op {
        Op::Small => (0u16, 24, 0, CommitMode::Ordered, None),
        Op::SmallDurable => (0, 24, 0, CommitMode::Count, None),
        // Three units' worth of body, and two data blocks (the second one short).
        Op::Multi => (0, 2 * (block_size as usize - 64) + 40, 2, CommitMode::Ordered, None),
        // A whole segment: units for all but two blocks, and two data blocks.
        Op::Max => {
            let units = segment_blocks as usize - 2;
            (0, units * (block_size as usize - 64) - 128, 2, CommitMode::Ordered, None)
        }
        Op::Dependent => (1, 24, 0, CommitMode::Ordered, model.streams[0].last().map(|t| t.id)),
        Op::DependentDurable => {
            (1, 24, 0, CommitMode::Count, model.streams[0].last().map(|t| t.id))
        }
        Op::CrossDependent => (
            0,
            24,
            0,
            CommitMode::Ordered,
            model.streams.get(1).and_then(|l| l.last()).map(|t| t.id),
        ),
        Op::Classic => (1, 24, 1, CommitMode::Classic, None),
        Op::Sync => {
            log.sync().map_err(|e| workload_error(op, &e))?;
            model.ack_all();
            return Ok(());
        }
        Op::Checkpoint => {
            // The first transaction: the rest of its segment must survive the checkpoint.
            if let Some(target) = model.streams[0].first().map(|t| t.id) {
                log.checkpoint(0, target.seq).map_err(|e| workload_error(op, &e))?;
                model.ack(target);
                model.checkpoint(0, target.seq);
            }
            return Ok(());
        }
        Op::Clean => return clean(log, model, 0),
        Op::CleanElsewhere => return clean(log, model, 1),
        Op::Large => return large(log, model, next_tag, block_size, segment_blocks),
        Op::Crash | Op::ProcessCrash | Op::CrashInRecovery => return Ok(()),
    };
    let tag = next_tag;
    let mut tx = Transaction::new(stream);
    let record = tag_record(tag, record_len);
    tx.record(record.clone());
    let data: Vec<Vec<u8>> = (0..data_count)
        .map(|j| tag_data(tag, j, block_size, if j == 1 { 300 } else { block_size as usize }))
        .collect();
    for (j, d) in data.iter().enumerate() {
        tx.data(if j == 1 { d[..300].to_vec() } else { d.clone() });
    }
    if let Some(d) = dep {
        tx.depend_on(d);
    }
    match log.commit_with(tx, mode) {
        Ok(info) => {
            model.streams[usize::from(stream)].push(ModelTx {
                tag,
                id: info.ticket,
                records: vec![record],
                data,
                deps: dep.into_iter().collect(),
                acked: false,
                run: None,
            });
            if matches!(mode, CommitMode::Count | CommitMode::Classic) {
                model.ack(info.ticket);
            }
            Ok(())
        }
        Err(LogError::NoSpace { .. }) => Ok(()),
        Err(e) => Err(workload_error(op, &e)),
    }
}

/// `L`: a large transaction on stream 0: three parts that each fill a whole segment, then its
/// close (one unit and a data block), so its units span four segments. Out of space part-way,
/// the run is abandoned: its parts stay in the log, never committed.
fn large(
    log: &Log,
    model: &mut Model,
    first_tag: u64,
    block_size: u32,
    segment_blocks: u32,
) -> Result<(), Violation> {
    let mut run: Option<u64> = None;
    for part in 0..4u64 {
        let close = part == 3;
        let tag = first_tag + part;
        let (record_len, data_count) = if close {
            (24, 1)
        } else {
            // As `M`: units for all but two blocks (the run field takes 8 of the slack).
            ((segment_blocks as usize - 2) * (block_size as usize - 64) - 128, 2)
        };
        let mut tx = Transaction::new(0);
        let record = tag_record(tag, record_len);
        tx.record(record.clone());
        let data: Vec<Vec<u8>> =
            (0..data_count).map(|j| tag_data(tag, j, block_size, block_size as usize)).collect();
        for d in &data {
            tx.data(d.clone());
        }
        match (close, run) {
            (true, Some(r)) => tx.run_close(r),
            (_, r) => tx.run_part(r),
        };
        match log.commit(tx) {
            Ok(info) => {
                let name = *run.get_or_insert(info.ticket.seq);
                model.streams[0].push(ModelTx {
                    tag,
                    id: info.ticket,
                    records: vec![record],
                    data,
                    deps: Vec::new(),
                    acked: false,
                    run: Some((name, close)),
                });
            }
            Err(LogError::NoSpace { .. }) => {
                if let Some(r) = run {
                    log.abandon_run(0, r);
                }
                return Ok(());
            }
            Err(e) => return Err(workload_error(Op::Large, &e)),
        }
    }
    Ok(())
}

/// `g` (`target` 0) and `G` (`target` 1): clean stream 0's oldest segment, relocating every
/// transaction (records and data) in it onto stream `target`.
fn clean(log: &Log, model: &mut Model, target: u16) -> Result<(), Violation> {
    let dev = log.device().clone();
    let bs = dev.geometry().block_size as usize;
    let op = if target == 0 { Op::Clean } else { Op::CleanElsewhere };
    let report = log.clean_split_to(0, 1, target, |t| {
        if t.records.is_empty() {
            return Ok(Vec::new()); // a member of a large transaction that was never committed
        }
        let mut moved = Transaction::new(target);
        for r in &t.records {
            moved.record(r.clone());
        }
        for i in 0..u64::from(t.data_count) {
            let mut block = vec![0u8; bs];
            dev.read(t.data_start + i, &mut block)?;
            moved.data(block);
        }
        Ok(vec![moved])
    });
    let report = match report {
        Ok(report) => report,
        // Cleaning a full log may not fit: a clean error, and nothing changed.
        Err(LogError::NoSpace { .. }) => return Ok(()),
        Err(e) => return Err(workload_error(op, &e)),
    };
    let Some(upto) = report.checkpointed_seq else { return Ok(()) };
    for (old, new) in &report.relocated {
        if let Some(tx) = model.streams[0].iter().find(|t| t.id == *old).cloned() {
            // A relocated copy is an ordinary transaction of the target stream, whatever run
            // its original was in.
            let copy = ModelTx { id: new.ticket, deps: Vec::new(), run: None, ..tx };
            model.streams[usize::from(target)].push(copy);
        }
    }
    model.ack_all(); // cleaning syncs before it checkpoints
    model.checkpoint(0, upto);
    Ok(())
}

fn workload_error(op: Op, e: &LogError) -> Violation {
    Violation {
        invariant: Invariant::I7ForwardProgress,
        message: format!("op {:?} failed: {e}", op),
    }
}

/// A cheap fingerprint of an image, for counting distinct states.
fn image_hash(image: &Image) -> u64 {
    let mut h: u64 = 0;
    for (block, bytes) in image.written_blocks() {
        let c = crc32c::crc32c_append(block as u32, bytes);
        h = h.rotate_left(5) ^ (u64::from(c) << 32 | block);
    }
    h
}

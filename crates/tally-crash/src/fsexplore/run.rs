//! Running file-system workloads on a crash device and judging every crash state.

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use tally_fs::{
    FileKind, Fs, FsError, FsMutant, Ino, IoCause, MkfsOptions, MountOptions, Owner, RenameFlags,
    SetAttr, XattrSet, ROOT,
};
use tally_media::{Device, Geometry, Image, MemDevice};

use super::medium::{self, Medium, Mounted, Point, Recorder};
use super::model::{
    Candidates, FsInvariant, FsViolation, History, MIno, MOp, MState, RawNode, Tree, TreeNode,
    MROOT,
};
use super::workload::{
    pattern, resolve, step_tag, FsOp, FsWorkload, Persist, Step, TxnEnd, WriteKind, START_XATTR,
};
use tally_media::pmem::{BlockMutant, BlockView};

mod concurrent;
mod generations;

/// What to explore, and how hard.
#[derive(Debug, Clone)]
pub struct FsExploreConfig {
    /// Block size of the simulated device (1 KiB: two 512-byte sectors, so blocks can tear).
    pub block_size: u32,
    /// Streams of the file system (1: every crash must recover a prefix of the operations).
    pub streams: u16,
    /// Blocks per log segment (small, so cleaning has whole segments to relocate).
    pub segment_blocks: u32,
    /// Segments on the device.
    pub segment_count: u32,
    /// Untorn images drawn at a point when there are too many to enumerate.
    pub samples: usize,
    /// Torn images at a point: enumerated up to this many, else this many drawn (0: no torn
    /// pass).
    pub torn_samples: usize,
    /// Also crash between the device operations inside each operation (after every submit,
    /// wait and flush it makes).
    pub crash_inside_ops: bool,
    /// Crash images of the device right after recovery, and inside it, mounted again (I6).
    pub idempotence_images_max: usize,
    /// A deliberately broken variant of the file system.
    pub mutant: Option<FsMutant>,
    /// A deliberately broken log underneath (e.g. `crc-not-checked`, the log unit larger than
    /// the failure-atomic unit without a checksum).
    pub log_mutant: Option<tally_log::Mutant>,
    /// What the workloads run on.
    pub medium: Medium,
    /// A deliberately broken persistent-memory block protocol (with [`Medium::Pmem`]).
    pub pmem_mutant: Option<BlockMutant>,
    /// Drives every random choice.
    pub seed: u64,
    /// Stop at the first violation.
    pub stop_at_first: bool,
    /// Generations of a multi-generation workload ([`FsExplorer::run_generations`]).
    pub generations: u32,
    /// Steps per generation (at most [`super::model::HISTORY_OPS_MAX`]).
    pub ops_per_generation: usize,
}

impl Default for FsExploreConfig {
    fn default() -> Self {
        FsExploreConfig {
            block_size: 1024,
            streams: 2,
            segment_blocks: 16,
            segment_count: 16,
            samples: 32,
            torn_samples: 8,
            crash_inside_ops: true,
            idempotence_images_max: 4,
            mutant: None,
            log_mutant: None,
            medium: Medium::Block,
            pmem_mutant: None,
            seed: 1,
            stop_at_first: false,
            generations: 4,
            ops_per_generation: 3,
        }
    }
}

/// The first violation found, with what replays it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FsFirstViolation {
    /// Seed of the run.
    pub seed: u64,
    /// The workload set (`seq-1`, `seq-2`, …) and the workload's index in it.
    pub set: String,
    /// Index in the set.
    pub index: usize,
    /// The workload.
    pub workload: String,
    /// Step after (or inside) which the crash happened, and where: `op`, `persist`, `inside op`…
    pub at: String,
    /// Which invariant broke.
    pub invariant: FsInvariant,
    /// What was seen.
    pub message: String,
    /// Crash states checked before it, in the whole run.
    pub states_before: u64,
    /// The command that replays it.
    pub replay: String,
}

/// Totals of an exploration, as `tally crash fs --json` prints them.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct FsReport {
    /// Workloads run.
    pub workloads: u64,
    /// Persistence points crashed at (after every operation and persistence call, and with
    /// `crash_inside_ops` inside them).
    pub crash_points: u64,
    /// Of those, points inside an operation.
    pub crash_points_inside_ops: u64,
    /// Post-crash images mounted and judged.
    pub states_checked: u64,
    /// Distinct images among them.
    pub unique_states: u64,
    /// Images of a crash right after recovery, mounted again (I6).
    pub recovery_crash_states: u64,
    /// Generations run by multi-generation workloads: mounts after a power loss or a process
    /// crash that a workload continued from.
    pub generations: u64,
    /// Of those, mounts after a process crash (the device's volatile cache kept).
    pub process_crashes: u64,
    /// Power losses inside such a mount that a workload continued from.
    pub crashes_in_recovery: u64,
    /// Crash points inside those mounts, judged like any other point (also counted in
    /// `crash_points`).
    pub recovery_points: u64,
    /// Violations found.
    pub violations: u64,
    /// Violations per invariant.
    pub violations_by_invariant: BTreeMap<String, u64>,
    /// Whether every untorn pass was exhaustive.
    pub all_exhaustive: bool,
    /// Passes that were sampled rather than exhaustive.
    pub sampled_passes: u64,
    /// States checked per second of wall time.
    pub states_per_sec: f64,
    /// Wall time.
    pub elapsed_sec: f64,
    /// The mutant explored, if any.
    pub mutant: Option<String>,
    /// What the workloads ran on: `block` or `pmem`.
    pub medium: Medium,
    /// The persistent-memory block-protocol mutant explored, if any.
    pub pmem_mutant: Option<String>,
    /// The first violation.
    pub first_violation: Option<FsFirstViolation>,
}

/// The start of every workload: a durable image and the model of its tree.
#[derive(Clone)]
pub struct FsStart {
    /// The image (durable: synced, not cleanly unmounted, so mount scans the log).
    pub image: Image,
    /// The model of its tree.
    pub state: MState,
    /// Model inode → file-system inode.
    pub map: BTreeMap<MIno, Ino>,
}

/// Runs workloads and accumulates an [`FsReport`].
pub struct FsExplorer {
    cfg: FsExploreConfig,
    report: FsReport,
    unique: HashSet<u64>,
    started: Instant,
    start: Option<Result<FsStart, String>>,
    /// What a multi-generation workload did so far (steps and crashes), for its report.
    trace: Option<String>,
}

/// Where we are, for reporting.
#[derive(Clone, Copy)]
struct At<'a> {
    set: &'a str,
    index: usize,
    workload: &'a dyn std::fmt::Display,
    step: usize,
    what: &'static str,
}

/// The file system a workload runs on, and its device.
#[derive(Clone, Copy)]
struct Live<'a> {
    fs: &'a Fs,
    dev: &'a Recorder,
}

/// Name of the file the forward-progress check creates (never used by workloads).
const PROGRESS_NAME: &[u8] = b"zz_progress";
const PROGRESS_LEN: usize = 1500;
/// Bound on a walk of a recovered tree.
const WALK_NODES_MAX: usize = 10_000;
const OWNER: Owner = Owner { uid: 0, gid: 0 };

impl FsExplorer {
    /// A new explorer.
    #[must_use]
    pub fn new(cfg: FsExploreConfig) -> Self {
        let mutant = cfg
            .mutant
            .map(|m| m.name().to_string())
            .or_else(|| cfg.log_mutant.map(|m| m.name().to_string()));
        let pmem_mutant = cfg.pmem_mutant.map(|m| m.name().to_string());
        let medium = cfg.medium;
        FsExplorer {
            cfg,
            report: FsReport {
                all_exhaustive: true,
                mutant,
                medium,
                pmem_mutant,
                ..FsReport::default()
            },
            unique: HashSet::new(),
            started: Instant::now(),
            start: None,
            trace: None,
        }
    }

    /// The report so far.
    #[must_use]
    pub fn report(&self) -> FsReport {
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

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &FsExploreConfig {
        &self.cfg
    }

    fn mount_options(&self) -> MountOptions {
        MountOptions {
            mutant: self.cfg.mutant,
            log_mutant: self.cfg.log_mutant,
            ..MountOptions::default()
        }
    }

    fn geometry(&self) -> Geometry {
        let blocks = 2 + u64::from(self.cfg.segment_count) * u64::from(self.cfg.segment_blocks);
        let bs = self.cfg.block_size;
        Geometry { block_size: bs, block_count: blocks, atomic_write_size: 512.min(bs) }
    }

    /// The geometry of the medium's images (persistent memory: 8-byte atomic words).
    fn medium_geometry(&self) -> Geometry {
        match self.cfg.medium {
            Medium::Block => self.geometry(),
            Medium::Pmem => Geometry { atomic_write_size: 8, ..self.geometry() },
        }
    }

    fn view(&self) -> BlockView {
        medium::explorer_view(self.cfg.block_size, self.cfg.pmem_mutant)
    }

    fn bs(&self) -> u64 {
        u64::from(self.cfg.block_size)
    }

    /// The start state (built once, with the correct protocol: mutants are judged on the
    /// workloads).
    ///
    /// # Errors
    /// The start could not be built (a bug in the file system or the explorer).
    pub fn start(&mut self) -> Result<FsStart, String> {
        if self.start.is_none() {
            self.start = Some(self.make_start());
        }
        self.start.clone().unwrap_or_else(|| Err("no start".into()))
    }

    /// B3's starting tree: `/A`, `/A/foo` (two blocks, an extended attribute), `/bar` (500
    /// bytes), `/B`; then overwrites of `foo` and `bar` until every stream's chain spans two
    /// segments (so `clean` has a segment to relocate), and `sync`.
    fn make_start(&self) -> Result<FsStart, String> {
        let mem = Arc::new(MemDevice::from_image(Image::new(self.geometry())));
        let opts = MkfsOptions {
            streams: self.cfg.streams,
            segment_blocks: self.cfg.segment_blocks,
            uuid: Some([0x5A; 16]),
        };
        Fs::mkfs(mem.clone(), &opts).map_err(|e| format!("mkfs: {e}"))?;
        let fs =
            Fs::mount(mem.clone(), MountOptions::default()).map_err(|e| format!("mount: {e}"))?;
        let bs = self.bs();
        let mut st = MState::default();
        let mut map = BTreeMap::from([(MROOT, ROOT)]);
        let mut tag = 1 << 20;
        let run = |st: &mut MState, map: &mut BTreeMap<MIno, Ino>, op: MOp| {
            exec(&fs, map, &op, None).map_err(|e| format!("start: {op:?}: {e}"))?;
            st.apply(&op).map(|_| ())
        };
        let setup = [
            FsOp::Mkdir("/A".into()),
            FsOp::Create("/A/foo".into()),
            FsOp::Write("/A/foo".into(), WriteKind::Overwrite),
            FsOp::Write("/A/foo".into(), WriteKind::Append),
            FsOp::Create("/bar".into()),
            FsOp::Mkdir("/B".into()),
        ];
        for op in &setup {
            tag += 1;
            if let Some(m) = resolve(&st, op, tag, bs)? {
                run(&mut st, &mut map, m)?;
            }
        }
        let foo_ino = st.lookup("/A/foo").ok_or("no /A/foo")?;
        let bar = st.lookup("/bar").ok_or("no /bar")?;
        run(
            &mut st,
            &mut map,
            MOp::Write { ino: foo_ino, off: 0, data: pattern(tag, 2 * bs as usize) },
        )?;
        run(
            &mut st,
            &mut map,
            MOp::SetXattr { ino: foo_ino, name: START_XATTR.to_vec(), value: b"1".to_vec() },
        )?;
        run(&mut st, &mut map, MOp::Write { ino: bar, off: 0, data: pattern(tag + 1, 500) })?;
        for round in 0..64u64 {
            let chains: Vec<usize> = (0..self.cfg.streams)
                .map(|s| fs.log().segment_usage(s).map_or(0, |u| u.len()))
                .collect();
            if chains.iter().all(|&n| n >= 2) {
                break;
            }
            let t = tag + 2 + round;
            run(
                &mut st,
                &mut map,
                MOp::Write { ino: foo_ino, off: 0, data: pattern(t, 2 * bs as usize) },
            )?;
            run(&mut st, &mut map, MOp::Write { ino: bar, off: 0, data: pattern(t + 100, 500) })?;
        }
        fs.sync().map_err(|e| format!("start: sync: {e}"))?;
        let live = walk(&fs)?;
        if live != st.tree() {
            return Err(format!(
                "start: the tree differs from the model: {}",
                live.diff(&st.tree())
            ));
        }
        drop(fs);
        Ok(FsStart { image: mem.image(), state: st, map })
    }

    /// Run every workload of `set` (named for reports: `seq-1`, `seq-2`, …).
    pub fn run_all(&mut self, set: &str, workloads: &[FsWorkload]) {
        for (index, w) in workloads.iter().enumerate() {
            if self.done() {
                return;
            }
            self.run(set, index, w);
        }
    }

    /// Run one workload from the start state, checking every crash point.
    pub fn run(&mut self, set: &str, index: usize, workload: &FsWorkload) {
        self.report.workloads += 1;
        let at0 = At { set, index, workload, step: 0, what: "start" };
        let start = match self.start() {
            Ok(s) => s,
            Err(e) => {
                self.record(
                    at0,
                    FsViolation { invariant: FsInvariant::I4MountAndFsck, message: e },
                );
                return;
            }
        };
        let dev = Recorder::new(self.cfg.medium, &start.image, self.cfg.seed, self.view());
        let opts = self.mount_options();
        let fs = match catch_unwind(AssertUnwindSafe(|| Fs::mount(dev.device(), opts))) {
            Ok(Ok(fs)) => fs,
            other => {
                let message = match other {
                    Ok(Err(e)) => format!("mounting the start image: {e}"),
                    _ => "mounting the start image panicked".into(),
                };
                self.record(at0, FsViolation { invariant: FsInvariant::I4MountAndFsck, message });
                return;
            }
        };
        let mut map = start.map.clone();
        let mut state = start.state.clone();
        let mut hist = History::new(start.state.clone(), self.cfg.streams == 1);
        for (i, step) in workload.0.iter().enumerate() {
            let at = At { set, index, workload, step: i, what: "op" };
            let live = Live { fs: &fs, dev: &dev };
            if !self.run_step(live, (&mut map, &mut state, &mut hist), step, step_tag(i), at) {
                return;
            }
        }
    }

    /// Run one step (its operation, then its persistence call) on the live file system and the
    /// model, checking every crash point; false when the workload should stop.
    fn run_step(
        &mut self,
        live: Live<'_>,
        (map, state, hist): (&mut BTreeMap<MIno, Ino>, &mut MState, &mut History),
        step: &Step,
        tag: u64,
        at: At<'_>,
    ) -> bool {
        let Live { fs, dev } = live;
        let bs = self.bs();
        // The operation.
        dev.set_recording(self.cfg.crash_inside_ops);
        let before = hist.clone();
        let done =
            catch_unwind(AssertUnwindSafe(|| run_op(fs, map, state, hist, &step.op, tag, bs)));
        let inside = dev.take_points();
        let done = match done {
            Ok(r) => r,
            Err(_) => Err(format!("`{}` panicked", step.op)),
        };
        if let Err(message) = done {
            self.record(at, FsViolation { invariant: FsInvariant::I1Atomicity, message });
            return false;
        }
        if let Err(v) = self.live_check(fs, state, &step.op) {
            self.record(at, v);
            return false;
        }
        // Inside the op nothing it does is acknowledged: the history with the op (present
        // or not) and the acknowledgements from before it.
        let mut inside_hist = hist.clone();
        inside_hist.acked = before.acked;
        if !self.points(&inside, &inside_hist, At { what: "inside op", ..at }) {
            return false;
        }
        if !self.points(&[dev.point_now()], hist, at) {
            return false;
        }
        // The persistence call.
        if step.persist == Persist::Nothing {
            return true;
        }
        let at = At { what: "persist", ..at };
        dev.set_recording(self.cfg.crash_inside_ops);
        let before = hist.clone();
        let done =
            catch_unwind(AssertUnwindSafe(|| run_persist(fs, map, state, hist, &step.persist)));
        let inside = dev.take_points();
        let done = match done {
            Ok(r) => r,
            Err(_) => Err(format!("`{}` panicked", step.persist)),
        };
        if let Err(message) = done {
            self.record(at, FsViolation { invariant: FsInvariant::I3Durability, message });
            return false;
        }
        if !self.points(&inside, &before, At { what: "inside persist", ..at }) {
            return false;
        }
        self.points(&[dev.point_now()], hist, at)
    }

    /// The live file system must show the model's full state after every operation (an abort
    /// restores it exactly; nothing is lost in DRAM).
    fn live_check(&self, fs: &Fs, state: &MState, op: &FsOp) -> Result<(), FsViolation> {
        let live = walk(fs)
            .map_err(|message| FsViolation { invariant: FsInvariant::I1Atomicity, message })?;
        let want = state.tree();
        if live != want {
            return Err(FsViolation {
                invariant: FsInvariant::I1Atomicity,
                message: format!(
                    "after `{op}` the live tree differs from the model: {}",
                    live.diff(&want)
                ),
            });
        }
        Ok(())
    }

    /// Check every crash point of `points` against `hist`; false when the run should stop.
    fn points(&mut self, points: &[Point], hist: &History, at: At<'_>) -> bool {
        if points.is_empty() {
            return true;
        }
        let cands = Candidates::new(hist);
        let mut seen = HashSet::new();
        for (k, point) in points.iter().enumerate() {
            self.report.crash_points += 1;
            if at.what.starts_with("inside") {
                self.report.crash_points_inside_ops += 1;
            }
            self.check_point(point, &cands, at, k, &mut seen);
            if self.done() {
                return false;
            }
        }
        true
    }

    fn point_seed(&self, at: At<'_>, k: usize) -> u64 {
        let text = format!("{}#{}#{}#{}#{k}", at.set, at.workload, at.step, at.what);
        u64::from(crc32c::crc32c(text.as_bytes())) << 16 ^ self.cfg.seed.rotate_left(23)
    }

    /// Every untorn image at the point (exhaustive up to 12 uncertain writes, else sampled),
    /// then torn ones (sampled), each distinct image once per point group; on persistent
    /// memory, the cache-line images (see `medium.rs`).
    fn check_point(
        &mut self,
        point: &Point,
        cands: &Candidates,
        at: At<'_>,
        k: usize,
        seen: &mut HashSet<u64>,
    ) {
        let seed = self.point_seed(at, k);
        let (samples, torn) = (self.cfg.samples, self.cfg.torn_samples);
        for pass in medium::passes(point, self.medium_geometry(), samples, torn, seed) {
            for image in &pass.images {
                let hash = image_hash(image);
                if !seen.insert(hash) {
                    continue;
                }
                self.report.states_checked += 1;
                self.unique.insert(hash);
                if let Err(v) = self.check_image(image, cands) {
                    self.record(at, v);
                    if self.done() {
                        return;
                    }
                }
            }
            if pass.primary {
                self.report.all_exhaustive &= pass.exhaustive;
            }
            self.report.sampled_passes += u64::from(!pass.exhaustive);
        }
    }

    fn mount(&self, dev: Arc<dyn Device>, invariant: FsInvariant) -> Result<Fs, FsViolation> {
        let opts = self.mount_options();
        match catch_unwind(AssertUnwindSafe(|| Fs::mount(dev, opts))) {
            Ok(Ok(fs)) => Ok(fs),
            Ok(Err(e)) => Err(FsViolation { invariant, message: format!("mount failed: {e}") }),
            Err(_) => Err(FsViolation { invariant, message: "mount panicked".into() }),
        }
    }

    /// Judge one image: I4 (mount, fsck), I1–I3 (the tree), I6 (mount again after a crash
    /// right after recovery), I5 (a new fsynced file survives a remount).
    fn check_image(&mut self, image: &Image, cands: &Candidates) -> Result<(), FsViolation> {
        let dev = Mounted::new(self.cfg.medium, image, self.cfg.seed, self.view());
        let fs = self.mount(dev.device(), FsInvariant::I4MountAndFsck)?;
        let tree = walk_checked(&fs, FsInvariant::I1Atomicity)?;
        cands.check(&tree)?;
        let fsck = catch_unwind(AssertUnwindSafe(|| fs.fsck()));
        match fsck {
            Ok(r) if r.is_clean() => {}
            Ok(r) => {
                return Err(FsViolation {
                    invariant: FsInvariant::I4MountAndFsck,
                    message: format!(
                        "fsck: {}",
                        r.problems.iter().take(4).cloned().collect::<Vec<_>>().join("; ")
                    ),
                })
            }
            Err(_) => {
                return Err(FsViolation {
                    invariant: FsInvariant::I4MountAndFsck,
                    message: "fsck panicked".into(),
                })
            }
        }
        // I6: a crash right after the first recovery, and a crash inside it (block: its first
        // flush fails, so what it wrote before may or may not be there; pmem: before one of
        // its flushes or fences): every image either leaves mounts to the same tree.
        let opts = self.mount_options();
        let again =
            dev.recovery_crash_images(image, self.cfg.idempotence_images_max, self.cfg.seed, |d| {
                let _ = catch_unwind(AssertUnwindSafe(|| Fs::mount(d, opts)));
            });
        for (again, when) in again {
            self.report.recovery_crash_states += 1;
            let fs2 =
                self.mount(Arc::new(MemDevice::from_image(again)), FsInvariant::I6Idempotence)?;
            let tree2 = walk_checked(&fs2, FsInvariant::I6Idempotence)?;
            if tree2 != tree {
                return Err(FsViolation {
                    invariant: FsInvariant::I6Idempotence,
                    message: format!(
                        "mounting again after a crash {when} recovery: {}",
                        tree2.diff(&tree)
                    ),
                });
            }
        }
        // I5: create, write and fsync a new file; it survives a crash after the fsync.
        let progress = |fs: &Fs| -> Result<(), FsError> {
            let a = fs.create(None, ROOT, PROGRESS_NAME, 0o644, OWNER)?;
            fs.write(None, a.ino, 0, &pattern(u64::MAX, PROGRESS_LEN))?;
            fs.fsync(a.ino)
        };
        let fail =
            |message: String| FsViolation { invariant: FsInvariant::I5ForwardProgress, message };
        match catch_unwind(AssertUnwindSafe(|| progress(&fs))) {
            Ok(Ok(())) => {}
            Ok(Err(FsError::NoSpace)) => return Ok(()),
            Ok(Err(e)) => return Err(fail(format!("create, write, fsync after recovery: {e}"))),
            Err(_) => return Err(fail("create, write, fsync after recovery panicked".into())),
        }
        drop(fs);
        let fs3 = self.mount(
            Arc::new(MemDevice::from_image(dev.durable_image())),
            FsInvariant::I5ForwardProgress,
        )?;
        let tree3 = walk_checked(&fs3, FsInvariant::I5ForwardProgress)?;
        let mut want = tree;
        let path = format!("/{}", String::from_utf8_lossy(PROGRESS_NAME));
        want.0.insert(
            path.clone(),
            TreeNode {
                dir: false,
                perm: 0o644,
                nlink: 1,
                size: PROGRESS_LEN as u64,
                data: pattern(u64::MAX, PROGRESS_LEN),
                xattrs: BTreeMap::new(),
                link: path,
                dotdot_ok: true,
            },
        );
        if tree3 != want {
            return Err(fail(format!(
                "after a new fsynced file and a crash: {}",
                tree3.diff(&want)
            )));
        }
        Ok(())
    }

    fn record(&mut self, at: At<'_>, v: FsViolation) {
        self.report.violations += 1;
        *self.report.violations_by_invariant.entry(v.invariant.name().to_string()).or_default() +=
            1;
        if std::env::var_os("TALLY_EXPLORE_DEBUG").is_some() {
            eprintln!(
                "violation in {} #{} `{}` step {} {}: {}: {}",
                at.set,
                at.index,
                at.workload,
                at.step,
                at.what,
                v.invariant.name(),
                v.message
            );
        }
        if self.report.first_violation.is_none() {
            let (workload, set) = match &self.trace {
                Some(trace) => (
                    format!("{trace}{}", at.workload),
                    format!(
                        "generations {} --ops-per-generation {} --samples {} --torn-samples {}",
                        self.cfg.generations,
                        self.cfg.ops_per_generation,
                        self.cfg.samples,
                        self.cfg.torn_samples
                    ),
                ),
                None => (at.workload.to_string(), format!("set {}", at.set)),
            };
            self.report.first_violation = Some(FsFirstViolation {
                seed: self.cfg.seed,
                set: at.set.to_string(),
                index: at.index,
                workload,
                at: format!("step {} ({})", at.step, at.what),
                invariant: v.invariant,
                message: v.message,
                states_before: self.report.states_checked,
                replay: format!(
                    "tally crash fs --medium {} --{set} --index {} --seed {} --streams {}{}{}{}",
                    self.cfg.medium.name(),
                    at.index,
                    self.cfg.seed,
                    self.cfg.streams,
                    self.cfg.mutant.map_or(String::new(), |m| format!(" --mutant {}", m.name())),
                    self.cfg
                        .log_mutant
                        .map_or(String::new(), |m| format!(" --mutant {}", m.name())),
                    self.cfg
                        .pmem_mutant
                        .map_or(String::new(), |m| format!(" --mutant {}", m.name()))
                ),
            });
        }
    }
}

/// Run one workload operation on the file system and the model.
fn run_op(
    fs: &Fs,
    map: &mut BTreeMap<MIno, Ino>,
    state: &mut MState,
    hist: &mut History,
    op: &FsOp,
    tag: u64,
    bs: u64,
) -> Result<(), String> {
    let err = |e: FsError| format!("`{op}` failed: {e}");
    match op {
        FsOp::Clean(stream) => match fs.clean(*stream, usize::MAX) {
            Ok(_) | Err(FsError::Busy | FsError::NoSpace) => Ok(()),
            Err(e) => Err(err(e)),
        },
        FsOp::Txn(body, end) => {
            let mut scratch = state.clone();
            let mut ops = Vec::new();
            for (i, sub) in body.iter().enumerate() {
                let m = resolve(&scratch, sub, tag * 16 + i as u64 + 1, bs)?
                    .ok_or("empty op in a transaction")?;
                scratch.apply(&m)?;
                ops.push(m);
            }
            let tx = fs.begin().map_err(err)?;
            for m in &ops {
                if let Err(e) = exec(fs, map, m, Some(&tx)) {
                    let _ = fs.abort(tx);
                    return Err(err(e));
                }
            }
            match end {
                TxnEnd::Abort => fs.abort(tx).map_err(err),
                TxnEnd::Commit | TxnEnd::CommitDurable => {
                    let group = MOp::Group(ops);
                    let touched = state.apply(&group)?;
                    hist.push(group, touched);
                    if *end == TxnEnd::CommitDurable {
                        fs.commit_durable(tx).map_err(err)?;
                        hist.ack(1 << (hist.ops.len() - 1));
                    } else {
                        fs.commit(tx).map_err(err)?;
                    }
                    Ok(())
                }
            }
        }
        _ => {
            let m = resolve(state, op, tag, bs)?.ok_or("nothing to do")?;
            exec(fs, map, &m, None).map_err(err)?;
            let touched = state.apply(&m)?;
            hist.push(m, touched);
            Ok(())
        }
    }
}

/// Run a persistence call and record what it acknowledged.
fn run_persist(
    fs: &Fs,
    map: &BTreeMap<MIno, Ino>,
    state: &MState,
    hist: &mut History,
    persist: &Persist,
) -> Result<(), String> {
    let target = |p: &str| -> Result<(MIno, Ino), String> {
        let m = state.lookup(p).ok_or_else(|| format!("{p} does not exist"))?;
        Ok((m, *map.get(&m).ok_or_else(|| format!("{p} has no inode"))?))
    };
    let err = |e: FsError| format!("`{persist}` failed: {e}");
    match persist {
        Persist::Fsync(p) | Persist::FsyncDir(p) => {
            let (m, ino) = target(p)?;
            fs.fsync(ino).map_err(err)?;
            hist.ack(hist.touching(m));
        }
        Persist::Fdatasync(p) => {
            let (m, ino) = target(p)?;
            fs.fdatasync(ino).map_err(err)?;
            hist.ack(hist.touching(m));
        }
        Persist::Barrier(p) => {
            let (m, ino) = target(p)?;
            fs.barrier(ino).map_err(err)?;
            hist.barrier(m);
        }
        Persist::Sync => {
            fs.sync().map_err(err)?;
            hist.ack_all();
        }
        Persist::Nothing => {}
    }
    Ok(())
}

/// Apply a model operation to the file system (`txn`: inside an explicit transaction).
fn exec(
    fs: &Fs,
    map: &mut BTreeMap<MIno, Ino>,
    op: &MOp,
    txn: Option<&tally_fs::Txn>,
) -> Result<(), FsError> {
    let ino = |m: &MIno| map.get(m).copied().ok_or(FsError::NotFound);
    match op {
        MOp::Create { dir, name, new, is_dir, perm } => {
            let d = ino(dir)?;
            let a = if *is_dir {
                fs.mkdir(txn, d, name, *perm, OWNER)?
            } else {
                fs.create(txn, d, name, *perm, OWNER)?
            };
            map.insert(*new, a.ino);
        }
        MOp::Write { ino: f, off, data } => {
            let n = fs.write(txn, ino(f)?, *off, data)?;
            if n != data.len() {
                return Err(FsError::io(IoCause::ShortWrite { written: n, len: data.len() }));
            }
        }
        MOp::SetSize { ino: f, size } => {
            fs.setattr(txn, ino(f)?, &SetAttr { size: Some(*size), ..SetAttr::default() })?;
        }
        MOp::Chmod { ino: f, perm } => {
            fs.setattr(txn, ino(f)?, &SetAttr { perm: Some(*perm), ..SetAttr::default() })?;
        }
        MOp::SetXattr { ino: f, name, value } => {
            fs.setxattr(txn, ino(f)?, name, value, XattrSet::Any)?
        }
        MOp::RemoveXattr { ino: f, name } => fs.removexattr(txn, ino(f)?, name)?,
        MOp::Link { ino: f, dir, name } => {
            fs.link(txn, ino(f)?, ino(dir)?, name)?;
        }
        MOp::Unlink { dir, name } => fs.unlink(txn, ino(dir)?, name)?,
        MOp::Rmdir { dir, name } => fs.rmdir(txn, ino(dir)?, name)?,
        MOp::Rename { sdir, sname, ddir, dname } => {
            fs.rename(txn, ino(sdir)?, sname, ino(ddir)?, dname, RenameFlags::default())?;
        }
        MOp::Group(ops) => {
            for op in ops {
                exec(fs, map, op, txn)?;
            }
        }
    }
    Ok(())
}

fn walk_checked(fs: &Fs, invariant: FsInvariant) -> Result<Tree, FsViolation> {
    walk(fs).map_err(|message| FsViolation { invariant, message })
}

/// The canonical tree of a mounted file system: breadth first from the root, entries by name
/// (the model's order), every file read whole (crc-checked by the file system).
///
/// # Errors
/// A read or lookup that failed (`EIO` on a legal image is a lost write).
pub fn walk(fs: &Fs) -> Result<Tree, String> {
    let mut raw = Vec::new();
    let mut queue = VecDeque::from([("/".to_string(), ROOT, ROOT)]);
    let mut seen_dirs = BTreeSet::from([ROOT]);
    while let Some((path, ino, parent)) = queue.pop_front() {
        if raw.len() > WALK_NODES_MAX {
            return Err("more nodes than any workload makes".into());
        }
        let attr = fs.getattr(ino).map_err(|e| format!("getattr {path}: {e}"))?;
        let mut xattrs = BTreeMap::new();
        for name in fs.listxattr(ino).map_err(|e| format!("listxattr {path}: {e}"))? {
            let v = fs.getxattr(ino, &name).map_err(|e| format!("getxattr {path}: {e}"))?;
            xattrs.insert(name, v);
        }
        let dir = attr.kind == FileKind::Dir;
        let mut node = RawNode {
            path: path.clone(),
            id: ino,
            dir,
            perm: attr.perm,
            nlink: attr.nlink,
            size: if dir { 0 } else { attr.size },
            data: Vec::new(),
            xattrs,
            dotdot_ok: true,
        };
        if dir {
            let mut entries = fs.readdir(ino, 0).map_err(|e| format!("readdir {path}: {e}"))?;
            node.dotdot_ok = entries.iter().any(|e| e.name == b".." && e.ino == parent);
            entries.retain(|e| e.name != b"." && e.name != b"..");
            entries.sort_by(|a, b| a.name.cmp(&b.name));
            for e in entries {
                let child = super::model::join(&path, &String::from_utf8_lossy(&e.name));
                let is_dir = fs.getattr(e.ino).map(|a| a.kind == FileKind::Dir).unwrap_or(false);
                if is_dir && !seen_dirs.insert(e.ino) {
                    // A directory with two names: recorded once more, not walked again.
                    raw.push(RawNode {
                        path: child,
                        id: e.ino,
                        dir: true,
                        perm: 0,
                        nlink: 0,
                        size: 0,
                        data: Vec::new(),
                        xattrs: BTreeMap::new(),
                        dotdot_ok: false,
                    });
                    continue;
                }
                queue.push_back((child, e.ino, ino));
            }
        } else {
            node.data =
                fs.read(ino, 0, attr.size as usize).map_err(|e| format!("read {path}: {e}"))?;
            if node.data.len() as u64 != attr.size {
                return Err(format!("read {path}: {} bytes of {}", node.data.len(), attr.size));
            }
        }
        raw.push(node);
    }
    Ok(Tree::from_raw(raw, false))
}

/// A fingerprint of an image, for counting distinct states.
fn image_hash(image: &Image) -> u64 {
    let mut h: u64 = 0;
    for (block, bytes) in image.written_blocks() {
        let c = crc32c::crc32c_append(block as u32, bytes);
        h = h.rotate_left(7) ^ (u64::from(c) << 32 | block);
    }
    h
}

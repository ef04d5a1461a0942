//! Multi-generation file-system workloads: steps on the recovered tree, a crash, a mount, more
//! steps on what the mount recovered, another crash, and so on.
//!
//! A generation is `ops_per_generation` steps drawn by seed from the catalogue of the tree as
//! it is (`catalogue`, `persists`; half the draws among operations on an inode the step before
//! touched, so one object's operations follow each other across streams; half the steps persist
//! nothing, so crashes find them undecided), each run and checked as in a seq-n workload (crash
//! points after and inside every operation and persistence call), then one of:
//! - a **power loss**: an image of the device now (untorn or torn, chosen by seed; half the time
//!   one whose recovery cuts a transaction for a lost dependency, when there is one), judged
//!   like any other, mounted on a fresh device;
//! - a **process crash**: the writes in flight complete, the file system is dropped, and the
//!   mount runs on the *same* device, reading what is still only in its volatile cache;
//!
//! and then, one time in three, a **power loss inside that mount**: an image of one of the crash
//! points recorded inside it, mounted in its place. Every image of every crash point inside
//! every mount is judged against the generation's history: until the mount returns, nothing it
//! decided is acknowledged.
//!
//! The oracle carries across generations through the history's base: the next generation's
//! history starts from the tree the mount recovered (durable: the mount made it so before it
//! returned), so every later image must hold it except where later operations changed it, what
//! an earlier recovery dropped can never reappear (no candidate has it), and closure under
//! order is checked on each generation's operations.
//!
//! One seed and the workload's index reproduce the whole run: the steps are drawn as it goes,
//! from the tree each recovery left.

use std::collections::{BTreeMap, BTreeSet};
use std::panic::{catch_unwind, AssertUnwindSafe};

use tally_fs::{Fs, Ino, ROOT};
use tally_log::OpenOptions;
use tally_media::Image;

use super::{image_hash, walk, At, FsExplorer, Live};
use crate::fsexplore::medium::{self, Point, Recorder};
use crate::fsexplore::model::{
    Candidates, FsInvariant, FsViolation, History, MIno, MState, HISTORY_OPS_MAX,
};
use crate::fsexplore::workload::{
    after, catalogue, persists, resolve, step_tag, FsOp, FsWorkload, Persist, Step,
};

/// Name of the set multi-generation workloads report.
const SET: &str = "generations";

/// A mounted state a generation starts from.
struct Mounted {
    dev: Recorder,
    fs: Fs,
}

impl FsExplorer {
    /// Run multi-generation workload `index`: [`super::FsExploreConfig::generations`]
    /// generations of [`super::FsExploreConfig::ops_per_generation`] steps, each ending in a
    /// crash, drawn by the seed and `index` as the run goes.
    pub fn run_generations(&mut self, index: usize) {
        self.report.workloads += 1;
        self.trace = Some(String::new());
        self.generations(index);
        self.trace = None;
    }

    fn generations(&mut self, index: usize) {
        let empty = FsWorkload(Vec::new());
        let at0 = At { set: SET, index, workload: &empty, step: 0, what: "start" };
        let start = match self.start() {
            Ok(s) => s,
            Err(message) => {
                let v = FsViolation { invariant: FsInvariant::I4MountAndFsck, message };
                return self.record(at0, v);
            }
        };
        let seed = self.cfg.seed ^ (index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut rng = fastrand::Rng::with_seed(seed);
        let dev = Recorder::new(self.cfg.medium, &start.image, rng.u64(..), self.view());
        let (fs, _) = self.mount_recording(&dev);
        let Some(fs) = self.mounted(fs, at0) else { return };
        let mut live = Mounted { dev, fs };
        let mut state = start.state.clone();
        let mut map = start.map.clone();
        let bs = self.bs();
        let steps_max = self.cfg.ops_per_generation.min(HISTORY_OPS_MAX);
        // What the last operation touched: half the draws stay near it.
        let mut near = BTreeSet::new();
        for generation in 0..self.cfg.generations as usize {
            let mut hist = History::new(state.clone(), self.cfg.streams == 1);
            let mut steps = FsWorkload(Vec::new());
            for k in 0..steps_max {
                let ops = catalogue(&state, self.cfg.streams, bs);
                if ops.is_empty() {
                    break;
                }
                // Tags stay unique across generations: every write's bytes are its own.
                let tag = step_tag(generation * HISTORY_OPS_MAX + k);
                let op = draw(&ops, &state, &near, tag, bs, &mut rng);
                let choices = persists(&op, &after(&state, &op, tag, bs));
                // Half the steps persist nothing: what a crash cuts is what is not yet durable.
                let persist = if rng.bool() {
                    Persist::Nothing
                } else {
                    choices[rng.usize(..choices.len())].clone()
                };
                let step = Step { op, persist };
                steps.0.push(step.clone());
                let at = At { set: SET, index, workload: &steps, step: k, what: "op" };
                let on = Live { fs: &live.fs, dev: &live.dev };
                if !self.run_step(on, (&mut map, &mut state, &mut hist), &step, tag, at) {
                    return;
                }
                if let Some(touched) = hist.touched.last() {
                    near.clone_from(touched);
                }
            }
            // The trace holds the steps now: a violation from here on reports it alone.
            self.trace_steps(&steps);
            let at = At { set: SET, index, workload: &empty, step: steps.0.len(), what: "mount" };
            let Some((next, tree_judged)) = self.crash_and_mount(live, &hist, &mut rng, at) else {
                return;
            };
            live = next;
            // What the mount recovered: the state of some legal subset of this generation's
            // operations, the base of the next generation's history.
            let found = walk(&live.fs)
                .map_err(|message| FsViolation { invariant: FsInvariant::I1Atomicity, message });
            let cands = Candidates::new(&hist);
            let mask = match found.and_then(|tree| cands.check(&tree)) {
                Ok(mask) => mask,
                Err(v) => {
                    if !tree_judged {
                        self.record(at, v);
                    }
                    return;
                }
            };
            if !tree_judged {
                if let Err(v) = fsck_clean(&live.fs) {
                    return self.record(at, v);
                }
            }
            let Some(next_state) = state_of(&hist, mask) else {
                let message = format!("the operations of mask {mask:b} do not apply");
                return self
                    .record(at, FsViolation { invariant: FsInvariant::I1Atomicity, message });
            };
            state = next_state;
            map = match remap(&live.fs, &state) {
                Ok(map) => map,
                Err(message) => {
                    let v = FsViolation { invariant: FsInvariant::I1Atomicity, message };
                    return self.record(at, v);
                }
            };
            self.report.generations += 1;
        }
    }

    /// End a generation with a crash (chosen by `rng`) and mount what it leaves, judging every
    /// crash point inside the mount against `hist`. Returns the mounted state and whether its
    /// tree was already judged (as an image); `None` when the workload stops.
    fn crash_and_mount(
        &mut self,
        live: Mounted,
        hist: &History,
        rng: &mut fastrand::Rng,
        at: At<'_>,
    ) -> Option<(Mounted, bool)> {
        let Mounted { dev, fs } = live;
        let cands = Candidates::new(hist);
        let (dev, mut judged) = if rng.bool() {
            drop(fs);
            let images = self.images_at(&dev.point_now(), rng.u64(..));
            let options = OpenOptions { mutant: self.cfg.log_mutant, ..OpenOptions::default() };
            let k = medium::cutting_image(&images, rng, options)
                .unwrap_or_else(|| rng.usize(..images.len().max(1)));
            let image = images.get(k)?;
            self.trace_push(" || power loss");
            if !self.judge(image, &cands, at) {
                return None;
            }
            (Recorder::new(self.cfg.medium, image, rng.u64(..), self.view()), true)
        } else {
            dev.complete_all();
            drop(fs);
            self.trace_push(" || process crash");
            self.report.process_crashes += 1;
            (dev, false)
        };
        let (fs, points) = self.mount_recording(&dev);
        if !self.points(&points, hist, at) {
            return None;
        }
        self.report.recovery_points += points.len() as u64;
        let mut live = Mounted { dev, fs: self.mounted(fs, at)? };
        if rng.usize(..3) == 0 && !points.is_empty() {
            // A power loss inside that mount: an image one of its points was judged with.
            let k = rng.usize(..points.len());
            let images = self.images_at(&points[k], self.point_seed(at, k));
            let image = images.get(rng.usize(..images.len().max(1)))?;
            self.trace_push(" + power loss inside the mount");
            drop(live);
            let dev = Recorder::new(self.cfg.medium, image, rng.u64(..), self.view());
            let (fs, inside) = self.mount_recording(&dev);
            if !self.points(&inside, hist, at) {
                return None;
            }
            self.report.recovery_points += inside.len() as u64;
            self.report.crashes_in_recovery += 1;
            live = Mounted { dev, fs: self.mounted(fs, at)? };
            judged = true;
        }
        self.trace_push(" || ");
        Some((live, judged))
    }

    /// Mount on `dev`, recording the crash points inside the mount.
    fn mount_recording(&self, dev: &Recorder) -> (Result<Fs, FsViolation>, Vec<Point>) {
        dev.set_recording(true);
        let fs = self.mount(dev.device(), FsInvariant::I4MountAndFsck);
        (fs, dev.take_points())
    }

    /// The mounted file system, or the failure recorded.
    fn mounted(&mut self, fs: Result<Fs, FsViolation>, at: At<'_>) -> Option<Fs> {
        match fs {
            Ok(fs) => Some(fs),
            Err(v) => {
                self.record(at, v);
                None
            }
        }
    }

    /// Judge one image (I1–I6) as a state of its own; false when the workload stops.
    fn judge(&mut self, image: &Image, cands: &Candidates, at: At<'_>) -> bool {
        self.report.states_checked += 1;
        self.unique.insert(image_hash(image));
        if let Err(v) = self.check_image(image, cands) {
            self.record(at, v);
            return false;
        }
        true
    }

    /// The images [`FsExplorer::check_point`] judges at `point` with `seed`, in its order.
    fn images_at(&self, point: &Point, seed: u64) -> Vec<Image> {
        let (samples, torn) = (self.cfg.samples, self.cfg.torn_samples);
        medium::passes(point, self.medium_geometry(), samples, torn, seed)
            .into_iter()
            .flat_map(|pass| pass.images)
            .collect()
    }

    fn trace_push(&mut self, what: &str) {
        if let Some(trace) = self.trace.as_mut() {
            trace.push_str(what);
        }
    }

    /// Record a generation's steps in the trace.
    fn trace_steps(&mut self, steps: &FsWorkload) {
        let text = steps.to_string();
        self.trace_push(&text);
    }
}

/// One operation of `ops`: half the time (when there is one) among those that touch an inode
/// of `near`, so operations on one object follow each other (on different streams they depend
/// on each other: the cross-stream dependencies a recovery cuts).
fn draw(
    ops: &[FsOp],
    state: &MState,
    near: &BTreeSet<MIno>,
    tag: u64,
    bs: u64,
    rng: &mut fastrand::Rng,
) -> FsOp {
    let touches_near = |op: &&FsOp| match resolve(state, op, tag, bs) {
        Ok(Some(m)) => state.clone().apply(&m).is_ok_and(|t| !t.is_disjoint(near)),
        _ => false,
    };
    let close: Vec<&FsOp> =
        if rng.bool() { ops.iter().filter(touches_near).collect() } else { Vec::new() };
    match close.as_slice() {
        [] => ops[rng.usize(..ops.len())].clone(),
        close => close[rng.usize(..close.len())].clone(),
    }
}

/// `fsck` of the mounted file system is clean (I4).
fn fsck_clean(fs: &Fs) -> Result<(), FsViolation> {
    let fail = |message: String| FsViolation { invariant: FsInvariant::I4MountAndFsck, message };
    match catch_unwind(AssertUnwindSafe(|| fs.fsck())) {
        Ok(r) if r.is_clean() => Ok(()),
        Ok(r) => Err(fail(format!("fsck: {}", r.problems.join("; ")))),
        Err(_) => Err(fail("fsck panicked".into())),
    }
}

/// The model state after the operations of `mask`, model inode numbers never reused.
fn state_of(hist: &History, mask: u64) -> Option<MState> {
    let mut st = hist.base.clone();
    for (i, op) in hist.ops.iter().enumerate() {
        if mask & 1 << i != 0 {
            st.apply(op).ok()?;
        }
    }
    st.next = hist.full_state().map_or(st.next, |full| full.next.max(st.next));
    Some(st)
}

/// Model inode → file-system inode for every path of `state`, looked up in `fs` (the inode
/// numbers the recovered file system has).
fn remap(fs: &Fs, state: &MState) -> Result<BTreeMap<MIno, Ino>, String> {
    let mut map = BTreeMap::new();
    for (path, mino) in state.paths() {
        let mut ino = ROOT;
        for part in path.split('/').filter(|p| !p.is_empty()) {
            ino = fs.lookup(ino, part.as_bytes()).map_err(|e| format!("lookup {path}: {e}"))?.ino;
        }
        map.insert(mino, ino);
    }
    Ok(map)
}

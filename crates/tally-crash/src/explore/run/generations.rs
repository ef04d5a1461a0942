//! Continuing a workload after a crash: the recoveries of a multi-generation workload.
//!
//! A generation ends in a power loss (`c`: an image of the device, chosen by seed, torn ones
//! included, recovered on a fresh device) or a process crash (`p`: the writes in flight
//! complete, the log is dropped, and recovery runs on the *same* device, reading what is still
//! only in its volatile cache). Either recovery may itself be cut by a power loss (`r`: an image
//! of a crash point recorded inside it, recovered in its place). The workload then goes on from
//! the recovered state.
//!
//! The oracle carries across generations because the [`Model`] does: a recovery's survivors are
//! acknowledged (the recovery made them durable before it returned) and stay in the model, so
//! every later recovery must keep them (I4); what it did not keep joins `lost` and must never
//! come back (I2); prefix and dependency closure are checked after every recovery (I3).
//!
//! Invariants kept here:
//! - the images of a crash point inside a recovery are judged against the model *before* the
//!   crash: until the recovery returns, nothing it decided is acknowledged;
//! - the state a workload continues from passed every check: a continuation whose survivors the
//!   model rejects ends the branch (the violation is recorded once, where it was found).

use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};

use tally_log::Log;
use tally_media::Image;

use super::{At, Explorer, Invariant, Model, Point, Recorder, Start, Violation, Workload};
use crate::fsexplore::medium;
use crate::CrashOptions;

/// The recovery a workload just continued from: the crash points recorded inside it, and the
/// model its images are judged against (what was committed and acknowledged before the crash).
pub(super) struct LastRecovery {
    /// Points after each of the recovery's device operations (empty when not recorded).
    pub(super) points: Vec<Point>,
    /// The model before the crash.
    pub(super) model: Model,
}

/// The state a workload continues from after a crash and its recovery.
pub(super) struct Continuation {
    pub(super) dev: Recorder,
    pub(super) log: Log,
    pub(super) model: Model,
    pub(super) last: LastRecovery,
}

impl Explorer {
    /// Run the rest of `workload` (from op `next_op`) from the state `c`.
    pub(super) fn continue_from(
        &mut self,
        c: Continuation,
        workload: &Workload,
        start: Start,
        next_op: usize,
        branch_all: bool,
        rng: &mut fastrand::Rng,
    ) {
        let Continuation { dev, log, model, last } = c;
        self.run_from(workload, start, next_op, &dev, log, model, branch_all, rng, Some(&last));
    }

    /// `p`: the process dies with writes in flight; they complete (the device keeps its cache)
    /// and recovery runs on the same device. Its crash points, and its survivors, are judged
    /// against `model`.
    pub(super) fn process_crash(
        &mut self,
        dev: &Recorder,
        log: Log,
        model: &Model,
        at: At<'_>,
    ) -> Option<Continuation> {
        dev.complete_all();
        drop(log);
        // The state before the recovery needs no point of its own: its images are those of the
        // point after the last op (completing a write only narrows the orders a crash allows).
        let c = self.recover_on(dev.clone(), model, at, true, true)?;
        self.report.generations += 1;
        self.report.process_crashes += 1;
        Some(c)
    }

    /// `r`: a power loss inside the recovery that just ran: an image of one of its crash points
    /// (chosen by seed, torn ones included; already judged there), recovered in its place.
    pub(super) fn crash_in_recovery(
        &mut self,
        last: &LastRecovery,
        rng: &mut fastrand::Rng,
        at: At<'_>,
    ) -> Option<Continuation> {
        assert!(!last.points.is_empty(), "r needs a recorded recovery");
        let point = &last.points[rng.usize(..last.points.len())];
        let images = self.point_images(point, at);
        let image = images.get(rng.usize(..images.len().max(1)))?;
        let next = Recorder::new(self.cfg.medium, image, rng.u64(..), self.view());
        let c = self.recover_on(next, &last.model, at, true, false)?;
        self.report.crashes_in_recovery += 1;
        Some(c)
    }

    /// Recover on `dev` (recording its crash points when `record`, and judging them against
    /// `model`), then judge the survivors when `judge` (a process crash: nobody judged this
    /// state before) and make them the model the workload continues with.
    pub(super) fn recover_on(
        &mut self,
        dev: Recorder,
        model: &Model,
        at: At<'_>,
        record: bool,
        judge: bool,
    ) -> Option<Continuation> {
        dev.set_recording(record);
        let options = self.open_options();
        let opened = catch_unwind(AssertUnwindSafe(|| Log::open(dev.device(), options)));
        let points = dev.take_points();
        if record {
            self.check_recovery_points(&points, model, at);
            if self.done() {
                return None;
            }
        }
        let failed =
            |message: String| Violation { invariant: Invariant::I5RecoverySucceeds, message };
        let checked = match opened {
            Ok(Ok((log, rec))) => model.check(&rec, &*dev.device()).map(|()| (log, rec)),
            Ok(Err(e)) => Err(failed(format!("recovery failed: {e}"))),
            Err(_) => Err(failed("recovery panicked".into())),
        };
        let (log, rec) = match checked {
            Ok(ok) => ok,
            Err(v) => {
                if judge {
                    self.record(at, v);
                }
                return None;
            }
        };
        let mut next = model.clone();
        next.recovered(&rec);
        let last = LastRecovery { points, model: model.clone() };
        Some(Continuation { dev, log, model: next, last })
    }

    /// Judge every image of every crash point recorded inside a recovery against `model`, each
    /// distinct image once for the recovery.
    fn check_recovery_points(&mut self, points: &[Point], model: &Model, at: At<'_>) {
        let mut seen = HashSet::new();
        for point in points {
            self.report.recovery_points += 1;
            self.check_point(point, std::slice::from_ref(model), at, &mut seen);
            if self.done() {
                return;
            }
        }
    }

    /// The images [`Explorer::check_point`] judges at `point`, in its order.
    pub(super) fn point_images(&self, point: &Point, at: At<'_>) -> Vec<Image> {
        match point {
            Point::Block(p) => {
                let torn = self.crash_options(at.workload, at.start, at.op_index);
                let untorn =
                    CrashOptions { tearing: false, exhaustive_images_max: 1 << 16, ..torn.clone() };
                let passes = if torn.tearing { vec![untorn, torn] } else { vec![untorn] };
                passes.into_iter().flat_map(|o| p.crash_images(o)).collect()
            }
            Point::Pmem(_) => {
                let seed = self.point_seed(at.workload, at.start, at.op_index);
                let geometry = self.pmem_geometry();
                medium::passes(point, geometry, self.cfg.crash.samples, 0, seed)
                    .into_iter()
                    .flat_map(|p| p.images)
                    .collect()
            }
        }
    }
}

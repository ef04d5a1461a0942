//! Running a concurrent workload (`fsexplore/concurrent.rs`): the scheduled steps of two
//! threads, each an operation, a step of a thread's explicit transaction, or a persistence
//! call, with every crash point after and inside each judged as in a seq-n workload.
//!
//! The model keeps the committed state (what the history's operations leave) apart from each
//! thread's open transaction (its resolved operations, applied to the DRAM view but in no
//! history until the commit): the live tree must be the committed state with the open
//! transactions applied; a crash image must be the state after a legal subset of the history.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, PoisonError};

use tally_fs::{Fs, FsError, Ino, Txn};

use super::{exec, run_persist, walk, At, FsExplorer, FsStart, Live};
use crate::fsexplore::concurrent::{ConcurrentWorkload, TStep};
use crate::fsexplore::medium::{Point, Recorder};
use crate::fsexplore::model::{FsInvariant, FsViolation, History, MIno, MOp, MState};
use crate::fsexplore::workload::{resolve, step_tag, FsOp, Persist, TxnEnd};

/// The model's side of a running concurrent workload.
struct Threads {
    map: BTreeMap<MIno, Ino>,
    /// What the committed operations leave.
    committed: MState,
    hist: History,
    /// Each thread's open transaction and its operations so far.
    open: [Option<(Txn, Vec<MOp>)>; 2],
}

impl Threads {
    /// The DRAM view: the committed state with the open transactions' operations applied.
    fn live(&self) -> Result<MState, String> {
        let mut st = self.committed.clone();
        for (_, ops) in self.open.iter().flatten() {
            for op in ops {
                st.apply(op)?;
            }
        }
        Ok(st)
    }
}

impl FsExplorer {
    /// The start image on a recording device, mounted (a panic or an error there is I4).
    fn mount_recorded(&self, start: &FsStart) -> Result<(Recorder, Fs), FsViolation> {
        let dev = Recorder::new(self.cfg.medium, &start.image, self.cfg.seed, self.view());
        let opts = self.mount_options();
        match catch_unwind(AssertUnwindSafe(|| Fs::mount(dev.device(), opts))) {
            Ok(Ok(fs)) => Ok((dev, fs)),
            _ => Err(FsViolation {
                invariant: FsInvariant::I4MountAndFsck,
                message: "mounting the start image failed".to_string(),
            }),
        }
    }

    /// Run concurrent workload `index` of `set` from the start state, checking every crash
    /// point.
    pub fn run_concurrent(&mut self, set: &str, index: usize, workload: &ConcurrentWorkload) {
        self.report.workloads += 1;
        let at0 = At { set, index, workload, step: 0, what: "start" };
        let start = match self.start() {
            Ok(s) => s,
            Err(message) => {
                let v = FsViolation { invariant: FsInvariant::I4MountAndFsck, message };
                return self.record(at0, v);
            }
        };
        let (dev, fs) = match self.mount_recorded(&start) {
            Ok(mounted) => mounted,
            Err(v) => return self.record(at0, v),
        };
        let mut th = Threads {
            map: start.map.clone(),
            committed: start.state.clone(),
            hist: History::new(start.state.clone(), self.cfg.streams == 1),
            open: [None, None],
        };
        for (i, (t, step)) in workload.steps().iter().enumerate() {
            let at = At { set, index, workload, step: i, what: "step" };
            let live = Live { fs: &fs, dev: &dev };
            if !self.run_thread_step(live, &mut th, usize::from(*t), step, step_tag(i), at) {
                return;
            }
        }
        // Transactions left open by a workload would be a bug in the workload.
        if th.open.iter().any(Option::is_some) {
            let message = "a transaction was left open".to_string();
            self.record(at0, FsViolation { invariant: FsInvariant::I1Atomicity, message });
        }
    }

    /// Run one step of thread `t`, then check the live tree and every crash point inside and
    /// after it; false when the workload should stop.
    fn run_thread_step(
        &mut self,
        live: Live<'_>,
        th: &mut Threads,
        t: usize,
        step: &TStep,
        tag: u64,
        at: At<'_>,
    ) -> bool {
        let Live { fs, dev } = live;
        let bs = self.bs();
        dev.set_recording(self.cfg.crash_inside_ops);
        let before = th.hist.clone();
        let done = catch_unwind(AssertUnwindSafe(|| thread_step(fs, th, t, step, tag, bs)));
        let inside = dev.take_points();
        let done = done.unwrap_or_else(|_| Err(format!("`{step}` panicked")));
        if let Err(message) = done {
            self.record(at, FsViolation { invariant: FsInvariant::I1Atomicity, message });
            return false;
        }
        let want = match th.live() {
            Ok(st) => st.tree(),
            Err(message) => {
                self.record(at, FsViolation { invariant: FsInvariant::I1Atomicity, message });
                return false;
            }
        };
        match walk(fs) {
            Ok(tree) if tree == want => {}
            Ok(tree) => {
                let message = format!(
                    "after `t{t}: {step}` the live tree differs from the model: {}",
                    tree.diff(&want)
                );
                self.record(at, FsViolation { invariant: FsInvariant::I1Atomicity, message });
                return false;
            }
            Err(message) => {
                self.record(at, FsViolation { invariant: FsInvariant::I1Atomicity, message });
                return false;
            }
        }
        // Inside a step nothing it does is acknowledged yet: the history with its operation
        // (present or not) and the acknowledgements from before it.
        let mut inside_hist = th.hist.clone();
        inside_hist.acked = before.acked;
        if !self.points(&inside, &inside_hist, At { what: "inside step", ..at }) {
            return false;
        }
        self.points(&[dev.point_now()], &th.hist, at)
    }
}

/// Run `step` of thread `t` on the file system and the model.
fn thread_step(
    fs: &Fs,
    th: &mut Threads,
    t: usize,
    step: &TStep,
    tag: u64,
    bs: u64,
) -> Result<(), String> {
    let err = |e: FsError| format!("`t{t}: {step}` failed: {e}");
    match step {
        TStep::Op(FsOp::Clean(stream)) => match fs.clean(*stream, usize::MAX) {
            // `EBUSY` while a transaction is open: nothing cleaned.
            Ok(_) | Err(FsError::Busy | FsError::NoSpace) => {}
            Err(e) => return Err(err(e)),
        },
        TStep::Op(op) => {
            // Resolved against the DRAM view (names the other thread's open transaction
            // made are taken), applied to the committed state.
            let m = resolve(&th.live()?, op, tag, bs)?.ok_or("nothing to do")?;
            exec(fs, &mut th.map, &m, None).map_err(err)?;
            let touched = th.committed.apply(&m)?;
            th.hist.push(m, touched);
        }
        TStep::Begin => {
            if th.open[t].is_some() {
                return Err(format!("t{t} began a second transaction"));
            }
            th.open[t] = Some((fs.begin().map_err(err)?, Vec::new()));
        }
        TStep::InTxn(op) => {
            let live = th.live()?;
            let m = resolve(&live, op, tag, bs)?.ok_or("nothing to do")?;
            let (txn, ops) = th.open[t].as_mut().ok_or_else(|| format!("t{t}: no transaction"))?;
            exec(fs, &mut th.map, &m, Some(txn)).map_err(err)?;
            ops.push(m);
        }
        TStep::End(end) => {
            let (txn, ops) = th.open[t].take().ok_or_else(|| format!("t{t}: no transaction"))?;
            match end {
                TxnEnd::Abort => fs.abort(txn).map_err(err)?,
                TxnEnd::Commit | TxnEnd::CommitDurable => {
                    let group = MOp::Group(ops);
                    let touched = th.committed.apply(&group)?;
                    th.hist.push(group, touched);
                    if *end == TxnEnd::CommitDurable {
                        fs.commit_durable(txn).map_err(err)?;
                        th.hist.ack(1 << (th.hist.ops.len() - 1));
                    } else {
                        fs.commit(txn).map_err(err)?;
                    }
                }
            }
        }
        TStep::Persist(p) => {
            // Paths resolve in the DRAM view; what is acknowledged is the history's.
            let live = th.live()?;
            run_persist(fs, &th.map, &live, &mut th.hist, p)?;
        }
    }
    Ok(())
}

/// A thread's resolved step, for [`FsExplorer::run_threads`].
enum Planned {
    Op(MOp),
    /// `fsync` of the model inode, and what it acknowledges when it returns.
    Fsync(MIno, u64),
    Begin,
    InTxn(MOp),
    /// `commit`, or `commit_durable` with what it acknowledges.
    Commit(Option<u64>),
    Abort,
}

/// Points recorded between two acknowledgements, with what was acknowledged before them.
type Segments = Vec<(Vec<Point>, u64)>;

impl FsExplorer {
    /// Run `workload`'s two threads' steps on two OS threads at once (`threaded`: each thread
    /// in its own directory, plain operations and `fsync`s), recording crash points inside
    /// every device operation either makes. When an `fsync` returns, the points recorded so
    /// far are set aside with the acknowledgements from before it (all those points came
    /// before it returned), then its own acknowledgement is added; each point is judged
    /// against the history (thread 0's operations, then thread 1's: they share no object,
    /// so every order gives the same trees and the same dependencies) with those. The OS
    /// chooses the interleaving: a run is not reproduced exactly by its seed.
    pub fn run_threads(&mut self, set: &str, index: usize, workload: &ConcurrentWorkload) {
        self.report.workloads += 1;
        let at0 = At { set, index, workload, step: 0, what: "start" };
        let fail = |message: String| FsViolation { invariant: FsInvariant::I1Atomicity, message };
        let start = match self.start() {
            Ok(s) => s,
            Err(message) => {
                let v = FsViolation { invariant: FsInvariant::I4MountAndFsck, message };
                return self.record(at0, v);
            }
        };
        let bs = self.bs();
        // Resolve each thread's steps in order, thread 0's first.
        let mut scratch = start.state.clone();
        let mut hist = History::new(start.state.clone(), self.cfg.streams == 1);
        // Thread 0's operations first in the history, whatever order they ran in: no order
        // between the threads' namespace changes and the other's operations can be claimed
        // (they share no object, so nothing else orders them either).
        hist.names_ordered = false;
        let mut plans: [Vec<Planned>; 2] = [Vec::new(), Vec::new()];
        for (t, steps) in workload.threads.iter().enumerate() {
            let mut own = 0u64;
            // The thread's open transaction: the state with its operations, and them.
            let mut open: Option<(MState, Vec<MOp>)> = None;
            for (k, step) in steps.iter().enumerate() {
                let planned = match step {
                    TStep::Begin => {
                        open = Some((scratch.clone(), Vec::new()));
                        Planned::Begin
                    }
                    TStep::InTxn(op) => {
                        let Some((st, ops)) = open.as_mut() else {
                            return self.record(at0, fail(format!("{step}: no transaction")));
                        };
                        let m = match resolve(st, op, step_tag(t * 32 + k), bs) {
                            Ok(Some(m)) => m,
                            other => return self.record(at0, fail(format!("{step}: {other:?}"))),
                        };
                        if let Err(e) = st.apply(&m) {
                            return self.record(at0, fail(e));
                        }
                        ops.push(m.clone());
                        Planned::InTxn(m)
                    }
                    TStep::End(end) => {
                        let Some((_, ops)) = open.take() else {
                            return self.record(at0, fail(format!("{step}: no transaction")));
                        };
                        if *end == TxnEnd::Abort {
                            Planned::Abort
                        } else {
                            let group = MOp::Group(ops);
                            let touched = match scratch.apply(&group) {
                                Ok(touched) => touched,
                                Err(e) => return self.record(at0, fail(e)),
                            };
                            hist.push(group, touched);
                            let bit = 1 << (hist.ops.len() - 1);
                            own |= bit;
                            Planned::Commit(
                                (*end == TxnEnd::CommitDurable).then(|| hist.closure(bit)),
                            )
                        }
                    }
                    TStep::Op(op) => {
                        let tag = step_tag(t * 32 + k);
                        let m = match resolve(&scratch, op, tag, bs) {
                            Ok(Some(m)) => m,
                            other => return self.record(at0, fail(format!("{step}: {other:?}"))),
                        };
                        let touched = match scratch.apply(&m) {
                            Ok(touched) => touched,
                            Err(e) => return self.record(at0, fail(e)),
                        };
                        hist.push(m.clone(), touched);
                        own |= 1 << (hist.ops.len() - 1);
                        Planned::Op(m)
                    }
                    TStep::Persist(
                        Persist::Fsync(p) | Persist::Fdatasync(p) | Persist::FsyncDir(p),
                    ) => {
                        let Some(m) = scratch.lookup(p) else {
                            return self.record(at0, fail(format!("{p} does not exist")));
                        };
                        Planned::Fsync(m, hist.closure(hist.touching(m) & own))
                    }
                    other => {
                        return self.record(at0, fail(format!("`{other}` is not for OS threads")))
                    }
                };
                plans[t].push(planned);
            }
        }
        let (dev, fs) = match self.mount_recorded(&start) {
            Ok(mounted) => mounted,
            Err(v) => return self.record(at0, v),
        };
        let recording = self.cfg.crash_inside_ops;
        let acked = Mutex::new((Segments::new(), 0u64));
        dev.set_recording(recording);
        let results: Vec<Result<(), String>> = std::thread::scope(|sc| {
            let handles: Vec<_> = plans
                .iter()
                .map(|plan| {
                    let (fs, dev, acked, map) = (&fs, &dev, &acked, start.map.clone());
                    sc.spawn(move || {
                        let mut map = map;
                        let mut txn = None;
                        // A durable wait returned: set the points so far aside with the
                        // acknowledgements from before it, then add its own.
                        let acknowledge = |ack: u64| {
                            let mut g = acked.lock().unwrap_or_else(PoisonError::into_inner);
                            let points = dev.take_points();
                            dev.set_recording(recording);
                            let before = g.1;
                            g.0.push((points, before));
                            g.1 |= ack;
                        };
                        for p in plan {
                            match p {
                                Planned::Op(m) => exec(fs, &mut map, m, None)
                                    .map_err(|e| format!("{m:?} failed: {e}"))?,
                                Planned::Fsync(m, ack) => {
                                    let ino = *map.get(m).ok_or("fsync of no inode")?;
                                    fs.fsync(ino).map_err(|e| format!("fsync failed: {e}"))?;
                                    acknowledge(*ack);
                                }
                                Planned::Begin => {
                                    txn = Some(fs.begin().map_err(|e| format!("begin: {e}"))?);
                                }
                                Planned::InTxn(m) => exec(fs, &mut map, m, txn.as_ref())
                                    .map_err(|e| format!("{m:?} in a transaction: {e}"))?,
                                Planned::Commit(durable) => {
                                    let t = txn.take().ok_or("commit without begin")?;
                                    match durable {
                                        Some(ack) => {
                                            fs.commit_durable(t)
                                                .map_err(|e| format!("commit_durable: {e}"))?;
                                            acknowledge(*ack);
                                        }
                                        None => fs.commit(t).map_err(|e| format!("commit: {e}"))?,
                                    }
                                }
                                Planned::Abort => {
                                    let t = txn.take().ok_or("abort without begin")?;
                                    fs.abort(t).map_err(|e| format!("abort: {e}"))?;
                                }
                            }
                        }
                        Ok(())
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into())))
                .collect()
        });
        let (mut segments, acked_all) = acked.into_inner().unwrap_or_else(PoisonError::into_inner);
        segments.push((dev.take_points(), acked_all));
        for r in results {
            if let Err(message) = r {
                return self.record(at0, fail(message));
            }
        }
        let at = At { set, index, workload, step: workload.threads[0].len(), what: "threads" };
        match walk(&fs) {
            Ok(tree) if tree == scratch.tree() => {}
            Ok(tree) => {
                let message = format!("the live tree differs: {}", tree.diff(&scratch.tree()));
                return self.record(at, fail(message));
            }
            Err(message) => return self.record(at, fail(message)),
        }
        for (points, acks) in segments {
            let mut h = hist.clone();
            h.acked = acks;
            if !self.points(&points, &h, At { what: "inside threads", ..at }) {
                return;
            }
        }
        hist.acked = acked_all;
        self.points(&[dev.point_now()], &hist, at);
    }
}

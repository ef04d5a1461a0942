//! Concurrent workloads for the file-system explorer (issue 16): two threads, each with its own
//! list of steps, interleaved in an order the seed chooses.
//!
//! The threads are logical: a deterministic scheduler runs one step at a time, the next one
//! taken from the thread the schedule names, so one seed replays the same device writes and
//! the same crash points. What makes them concurrent to the file system is what the steps of
//! one thread leave open while the other's run: an explicit transaction begun by one thread,
//! with its operations applied to the DRAM state but not committed, while the other creates,
//! renames and removes in the same directories and makes its own operations durable
//! (`fsync`, `fdatasync`, a directory's `fsync`, `sync`). Overlap in time inside one call is
//! the business of `tally-fs`'s `tests/shuttle.rs` and `tests/linearizable.rs`.
//!
//! Both threads start from the explorer's start tree (`/A`, `/A/foo`, `/bar`, `/B`). Thread 0
//! owns `/A/foo` and the names it makes (`*0*`); thread 1 owns `/bar` and its own names
//! (`*1*`); `/A` and `/B` are shared: both create there, and they rename across them in
//! opposite directions (`/A/… → /B/…` and `/B/… → /A/…`). Owning disjoint objects is what
//! lets every interleaving run: a plain operation on an object another thread's open
//! transaction holds would wait for it, and a scheduler running one step at a time cannot
//! let it.
//!
//! Every committed operation is in the history when it commits; an open transaction's
//! operations are in no history until its commit (a crash before it must show none of them,
//! whatever the other thread made durable meanwhile); an aborted one never. The invariants are
//! the explorer's (I1–I6).

use std::fmt;

use super::workload::{FsOp, Persist, TruncKind, TxnEnd, WriteKind};

/// One step of a thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TStep {
    /// An operation outside transactions.
    Op(FsOp),
    /// `begin` (the thread's transaction).
    Begin,
    /// An operation inside the thread's open transaction.
    InTxn(FsOp),
    /// The end of the thread's transaction.
    End(TxnEnd),
    /// A persistence call.
    Persist(Persist),
}

/// Two threads' steps and the order they run in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConcurrentWorkload {
    /// Each thread's steps, in its order.
    pub threads: [Vec<TStep>; 2],
    /// Which thread runs each step (each thread's steps in its order).
    pub schedule: Vec<u8>,
}

impl ConcurrentWorkload {
    /// The steps in the order they run, with their thread.
    #[must_use]
    pub fn steps(&self) -> Vec<(u8, TStep)> {
        let mut next = [0usize; 2];
        let mut out = Vec::new();
        for &t in &self.schedule {
            let i = usize::from(t & 1);
            if let Some(s) = self.threads[i].get(next[i]) {
                out.push((t & 1, s.clone()));
                next[i] += 1;
            }
        }
        out
    }
}

fn p(s: &str) -> String {
    s.to_string()
}

/// Thread 0's scripts: a transaction on `/A/foo` creating in `/A`, ended each of three ways,
/// then an `fsync` of the file; or plain writes, creates and a rename `/A → /B`, made durable.
fn scripts0(end: TxnEnd) -> Vec<Vec<TStep>> {
    use TStep::{Begin, End, InTxn, Op, Persist as P};
    vec![
        vec![
            Begin,
            InTxn(FsOp::Write(p("/A/foo"), WriteKind::Overwrite)),
            InTxn(FsOp::Create(p("/A/t0"))),
            End(end),
            P(Persist::Fsync(p("/A/foo"))),
        ],
        vec![
            Op(FsOp::Create(p("/A/c0"))),
            Op(FsOp::Write(p("/A/c0"), WriteKind::Append)),
            Op(FsOp::Rename(p("/A/c0"), p("/B/m0"))),
            P(Persist::Fsync(p("/B/m0"))),
            Op(FsOp::Write(p("/A/foo"), WriteKind::Unaligned)),
            P(Persist::Fdatasync(p("/A/foo"))),
        ],
        vec![
            Begin,
            InTxn(FsOp::Mkdir(p("/B/d0"))),
            InTxn(FsOp::Truncate(p("/A/foo"), TruncKind::Down)),
            End(end),
            Op(FsOp::Create(p("/A/c0"))),
            P(Persist::FsyncDir(p("/A"))),
        ],
    ]
}

/// Thread 1's scripts: creates in the shared directories with a rename `/B → /A`, each made
/// durable by a directory's `fsync` or `sync`; a transaction on `/bar` creating in `/B`; or
/// `/bar` unlinked and the streams cleaned.
fn scripts1(end: TxnEnd, streams: u16) -> Vec<Vec<TStep>> {
    use TStep::{Begin, End, InTxn, Op, Persist as P};
    vec![
        vec![
            Op(FsOp::Create(p("/B/n1"))),
            Op(FsOp::Rename(p("/B/n1"), p("/A/m1"))),
            P(Persist::FsyncDir(p("/A"))),
            Op(FsOp::Write(p("/bar"), WriteKind::Append)),
            P(Persist::Fsync(p("/bar"))),
        ],
        vec![
            Op(FsOp::Mkdir(p("/A/d1"))),
            Op(FsOp::Write(p("/bar"), WriteKind::Big)),
            P(Persist::Sync),
            Op(FsOp::Create(p("/B/c1"))),
            P(Persist::Barrier(p("/B/c1"))),
            Op(FsOp::Unlink(p("/B/c1"))),
        ],
        vec![
            Begin,
            InTxn(FsOp::Write(p("/bar"), WriteKind::Append)),
            InTxn(FsOp::Create(p("/B/t1"))),
            End(end),
            Op(FsOp::Create(p("/A/c1"))),
            P(Persist::Fsync(p("/A/c1"))),
        ],
        // The longer workloads' tombstone case (`workload::longer`) beside the other thread:
        // `/bar` unlinked, big writes moving a stream on, then each stream cleaned (`EBUSY`,
        // nothing done, while the other thread's transaction is open).
        [
            Op(FsOp::Unlink(p("/bar"))),
            Op(FsOp::Create(p("/B/c1"))),
            Op(FsOp::Write(p("/B/c1"), WriteKind::Big)),
            Op(FsOp::Write(p("/B/c1"), WriteKind::Big)),
        ]
        .into_iter()
        .chain((0..streams).map(|s| Op(FsOp::Clean(s))))
        .collect(),
    ]
}

/// `count` concurrent workloads drawn by `seed` for a file system of `streams` streams: a
/// script for each thread (the ends of their transactions drawn too), and an interleaving of
/// their steps.
#[must_use]
pub fn concurrent(count: usize, streams: u16, seed: u64) -> Vec<ConcurrentWorkload> {
    let mut rng = fastrand::Rng::with_seed(seed ^ 0xC0C0_2016);
    let ends = [TxnEnd::Commit, TxnEnd::CommitDurable, TxnEnd::Abort];
    let mut out: Vec<ConcurrentWorkload> = Vec::new();
    let mut tries = 0;
    while out.len() < count && tries < count * 20 {
        tries += 1;
        let s0 = scripts0(ends[rng.usize(..ends.len())]);
        let s1 = scripts1(ends[rng.usize(..ends.len())], streams);
        let threads = [s0[rng.usize(..s0.len())].clone(), s1[rng.usize(..s1.len())].clone()];
        let (mut left0, mut left1) = (threads[0].len(), threads[1].len());
        let mut schedule = Vec::new();
        while left0 + left1 > 0 {
            // Uniform over the remaining steps: every interleaving can come out.
            if rng.usize(..left0 + left1) < left0 {
                schedule.push(0);
                left0 -= 1;
            } else {
                schedule.push(1);
                left1 -= 1;
            }
        }
        let w = ConcurrentWorkload { threads, schedule };
        if !out.contains(&w) {
            out.push(w);
        }
    }
    out
}

/// Workloads for two OS threads running at once (`FsExplorer::run_threads`): each thread
/// in its own directory (thread 0 in `/A`, owning `/A/foo`; thread 1 in `/B`), plain
/// operations, `fsync`s and (thread 0) a transaction, so the two threads share no object and
/// any real interleaving leaves the same tree. `count` drawn by `seed`, repeats allowed (each
/// run interleaves differently); the schedule is empty: the OS chooses.
#[must_use]
pub fn threaded(count: usize, seed: u64) -> Vec<ConcurrentWorkload> {
    use TStep::{Begin, End, InTxn, Op, Persist as P};
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x7A12_2016);
    let ends = [TxnEnd::Commit, TxnEnd::CommitDurable, TxnEnd::Abort];
    let t0 = |end: TxnEnd| {
        [
            // A transaction of thread 0 open while thread 1 flushes and fsyncs.
            vec![
                Begin,
                InTxn(FsOp::Write(p("/A/foo"), WriteKind::Big)),
                InTxn(FsOp::Create(p("/A/t0"))),
                End(end),
                P(Persist::Fsync(p("/A/foo"))),
            ],
            vec![
                Op(FsOp::Create(p("/A/r0"))),
                Op(FsOp::Write(p("/A/r0"), WriteKind::Append)),
                P(Persist::Fsync(p("/A/r0"))),
                Op(FsOp::Write(p("/A/foo"), WriteKind::Overwrite)),
                Op(FsOp::Rename(p("/A/r0"), p("/A/s0"))),
                P(Persist::FsyncDir(p("/A"))),
            ],
            vec![
                Op(FsOp::Write(p("/A/foo"), WriteKind::Big)),
                P(Persist::Fdatasync(p("/A/foo"))),
                Op(FsOp::Create(p("/A/r0"))),
                Op(FsOp::Unlink(p("/A/r0"))),
                Op(FsOp::Mkdir(p("/A/e0"))),
                P(Persist::Fsync(p("/A/e0"))),
            ],
        ]
    };
    let t1 = [
        vec![
            Op(FsOp::Create(p("/B/r1"))),
            Op(FsOp::Write(p("/B/r1"), WriteKind::Big)),
            P(Persist::Fsync(p("/B/r1"))),
            Op(FsOp::Mkdir(p("/B/e1"))),
            Op(FsOp::Rename(p("/B/r1"), p("/B/e1/r1"))),
            P(Persist::FsyncDir(p("/B/e1"))),
        ],
        vec![
            Op(FsOp::Mkdir(p("/B/e1"))),
            Op(FsOp::Create(p("/B/e1/f1"))),
            Op(FsOp::Write(p("/B/e1/f1"), WriteKind::Unaligned)),
            P(Persist::Fsync(p("/B/e1/f1"))),
            Op(FsOp::Chmod(p("/B/e1/f1"))),
            Op(FsOp::SetXattr(p("/B/e1/f1"))),
        ],
    ];
    (0..count)
        .map(|_| ConcurrentWorkload {
            threads: {
                let t0 = t0(ends[rng.usize(..ends.len())]);
                [t0[rng.usize(..t0.len())].clone(), t1[rng.usize(..t1.len())].clone()]
            },
            schedule: Vec::new(),
        })
        .collect()
}

impl fmt::Display for TStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TStep::Op(op) => write!(f, "{op}"),
            TStep::Begin => write!(f, "begin"),
            TStep::InTxn(op) => write!(f, "txn {op}"),
            TStep::End(end) => write!(f, "{}", format!("{end:?}").to_lowercase()),
            TStep::Persist(p) => write!(f, "{p}"),
        }
    }
}

impl fmt::Display for ConcurrentWorkload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.schedule.is_empty() {
            // Run on OS threads: each thread's steps.
            for (t, steps) in self.threads.iter().enumerate() {
                let list: Vec<String> = steps.iter().map(ToString::to_string).collect();
                write!(f, "{}t{t}: {}", if t > 0 { " || " } else { "" }, list.join(", "))?;
            }
            return Ok(());
        }
        for (i, (t, s)) in self.steps().iter().enumerate() {
            if i > 0 {
                write!(f, " | ")?;
            }
            write!(f, "t{t}: {s}")?;
        }
        Ok(())
    }
}

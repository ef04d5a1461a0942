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
        for (i, (t, s)) in self.steps().iter().enumerate() {
            if i > 0 {
                write!(f, " | ")?;
            }
            write!(f, "t{t}: {s}")?;
        }
        Ok(())
    }
}

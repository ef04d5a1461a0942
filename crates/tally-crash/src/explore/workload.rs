//! Workloads for the log explorer: short op sequences, written as one letter per op so a
//! failing workload can be replayed from the command line (`--workload amc`). Multi-generation
//! workloads (`Workload::generations`) are the same letters: a few ops, then a power loss (`c`)
//! or a process crash (`p`), maybe a power loss inside the recovery that follows (`r`), and on
//! to the next generation.

use std::fmt;

/// One step of a workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `a`: a one-unit ordered commit on stream 0.
    Small,
    /// `A`: a one-unit durable (count-based) commit on stream 0.
    SmallDurable,
    /// `m`: an ordered commit on stream 0 with three units and two data blocks.
    Multi,
    /// `M`: an ordered commit on stream 0 that fills a whole segment (units and two data
    /// blocks), so it always starts a segment of its own.
    Max,
    /// `d`: an ordered commit on stream 1 that depends on stream 0's last transaction.
    Dependent,
    /// `D`: a durable (count-based) commit on stream 1 that depends on stream 0's last
    /// transaction: acknowledged only once that dependency is durable too, though nothing
    /// asked for stream 0.
    DependentDurable,
    /// `l`: a classic-mode (journal + commit block) commit on stream 1.
    Classic,
    /// `s`: `sync()`.
    Sync,
    /// `k`: checkpoint stream 0 up to its first transaction after the last checkpoint.
    Checkpoint,
    /// `g`: clean stream 0's oldest segment, relocating every transaction in it.
    Clean,
    /// `c`: crash, then recover (the explorer branches over the crash images).
    Crash,
    /// `e`: an ordered commit on stream 0 that depends on stream 1's last transaction (the
    /// mirror of `d`: a stream-0 transaction a recovery may cut, left on the media right after
    /// its stream's tail).
    CrossDependent,
    /// `p`: a process crash: the writes in flight complete, the log is dropped and opened again
    /// on the same device, whose volatile cache keeps what it held (the recovery reads it).
    ProcessCrash,
    /// `r`: a power loss inside the recovery that just ran (after `c`, `p` or `r`): an image of
    /// one of the crash points recorded inside it, chosen by seed, recovered in its place.
    /// Anywhere else it does nothing.
    CrashInRecovery,
    /// `L`: a large transaction on stream 0 spanning four segments: three parts that each
    /// fill a segment (units and two data blocks), then its close (`Transaction::run_part`).
    Large,
    /// `G`: clean stream 0's oldest segment, relocating every transaction in it onto stream 1
    /// (hot/cold separation: what survives cleaning goes to a stream of its own).
    CleanElsewhere,
}

impl Op {
    /// Every op, in alphabet order.
    pub const ALL: [Op; 10] = [
        Op::Small,
        Op::SmallDurable,
        Op::Multi,
        Op::Max,
        Op::Dependent,
        Op::Classic,
        Op::Sync,
        Op::Checkpoint,
        Op::Clean,
        Op::Crash,
    ];

    /// Ops outside the bounded alphabet ([`Op::ALL`]): multi-generation workloads and the named
    /// workload sets of `tests/log_explore.rs` use them.
    pub const MORE: [Op; 6] = [
        Op::CrossDependent,
        Op::ProcessCrash,
        Op::CrashInRecovery,
        Op::Large,
        Op::CleanElsewhere,
        Op::DependentDurable,
    ];

    /// Whether the op ends a generation: a crash the workload recovers from.
    #[must_use]
    pub fn is_crash(self) -> bool {
        matches!(self, Op::Crash | Op::ProcessCrash | Op::CrashInRecovery)
    }

    /// Its letter.
    #[must_use]
    pub fn letter(self) -> char {
        match self {
            Op::Small => 'a',
            Op::SmallDurable => 'A',
            Op::Multi => 'm',
            Op::Max => 'M',
            Op::Dependent => 'd',
            Op::DependentDurable => 'D',
            Op::Classic => 'l',
            Op::Sync => 's',
            Op::Checkpoint => 'k',
            Op::Clean => 'g',
            Op::Crash => 'c',
            Op::CrossDependent => 'e',
            Op::ProcessCrash => 'p',
            Op::CrashInRecovery => 'r',
            Op::Large => 'L',
            Op::CleanElsewhere => 'G',
        }
    }

    /// Parse a letter.
    #[must_use]
    pub fn from_letter(c: char) -> Option<Op> {
        Op::ALL.into_iter().chain(Op::MORE).find(|op| op.letter() == c)
    }
}

/// A sequence of ops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload(pub Vec<Op>);

impl Workload {
    /// Parse letters such as `"amc"`.
    ///
    /// # Errors
    /// The first letter that names no op.
    pub fn parse(s: &str) -> Result<Workload, String> {
        s.chars()
            .map(|c| {
                Op::from_letter(c)
                    .ok_or_else(|| format!("unknown op {c:?} (ops: aAmMdDlskgceprLG)"))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Workload)
    }

    /// Every sequence of length 1..=`len_max` over `alphabet`, plus every sequence of length
    /// `len_max + 1` that contains a crash (ACE's seq-n with a crash-and-recover step).
    #[must_use]
    pub fn bounded(len_max: usize, alphabet: &[Op]) -> Vec<Workload> {
        let mut out = Vec::new();
        let mut layer: Vec<Vec<Op>> = vec![Vec::new()];
        for len in 1..=len_max + 1 {
            layer = layer
                .iter()
                .flat_map(|w| alphabet.iter().map(move |&op| [w.as_slice(), &[op]].concat()))
                .collect();
            for w in &layer {
                if len <= len_max || w.contains(&Op::Crash) {
                    out.push(Workload(w.clone()));
                }
            }
        }
        out
    }

    /// A seeded random workload of `ops` ops, with crashes among them.
    #[must_use]
    pub fn random(rng: &mut fastrand::Rng, ops: usize) -> Workload {
        // Commits dominate, as in real use; every op kind appears.
        const WEIGHTED: [Op; 18] = [
            Op::Small,
            Op::Small,
            Op::Small,
            Op::SmallDurable,
            Op::Multi,
            Op::Multi,
            Op::Dependent,
            Op::Dependent,
            Op::Classic,
            Op::Sync,
            Op::Checkpoint,
            Op::Crash,
            Op::Small,
            Op::Multi,
            Op::Dependent,
            Op::SmallDurable,
            Op::Max,
            Op::Clean,
        ];
        Workload((0..ops).map(|_| WEIGHTED[rng.usize(..WEIGHTED.len())]).collect())
    }
}

impl Workload {
    /// A seeded multi-generation workload: `generations` times, `ops_per_generation` ops drawn
    /// by weight (every op but `c`, `p`, `r`; cross-stream dependencies `d` and `e` often), then a power loss (`c`) or a process
    /// crash (`p`), each followed one time in three by a power loss inside its recovery (`r`).
    #[must_use]
    pub fn generations(
        rng: &mut fastrand::Rng,
        generations: usize,
        ops_per_generation: usize,
    ) -> Workload {
        // Cross-stream dependencies both ways are where a recovery cuts transactions and leaves
        // them on the media: they weigh more than in `random`.
        const WEIGHTED: [Op; 17] = [
            Op::Small,
            Op::Small,
            Op::Small,
            Op::SmallDurable,
            Op::Multi,
            Op::Multi,
            Op::Max,
            Op::Dependent,
            Op::Dependent,
            Op::Dependent,
            Op::CrossDependent,
            Op::CrossDependent,
            Op::CrossDependent,
            Op::Classic,
            Op::Sync,
            Op::Checkpoint,
            Op::Clean,
        ];
        let mut ops = Vec::with_capacity(generations * (ops_per_generation + 2));
        for _ in 0..generations {
            ops.extend((0..ops_per_generation).map(|_| WEIGHTED[rng.usize(..WEIGHTED.len())]));
            ops.push(if rng.bool() { Op::Crash } else { Op::ProcessCrash });
            if rng.usize(..3) == 0 {
                ops.push(Op::CrashInRecovery);
            }
        }
        Workload(ops)
    }

    /// Generations of the workload: the crashes it recovers from (`c`, `p`; an `r` is a crash
    /// inside one of their recoveries, not a generation of its own).
    #[must_use]
    pub fn generation_count(&self) -> usize {
        self.0.iter().filter(|op| matches!(op, Op::Crash | Op::ProcessCrash)).count()
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|op| write!(f, "{}", op.letter()))
    }
}

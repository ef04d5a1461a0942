//! The reference model of the log: what was committed on each stream since its checkpoint,
//! what was acknowledged as durable, what a recovery already threw away. Every recovered image
//! is judged against it.

use std::collections::{BTreeMap, BTreeSet};

use tally_log::{Recovery, TxId};
use tally_media::Device;

/// An invariant of PRIOR_ART.md §4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Invariant {
    /// I1: a recovered transaction is exactly what was committed (records and data).
    I1Atomicity,
    /// I2: nothing recovered that was never committed or was already discarded.
    I2NoPhantom,
    /// I3: per-stream prefix and dependency closure.
    I3PrefixAndDependencies,
    /// I4: every acknowledged-durable transaction survives.
    I4Durability,
    /// I5: recovery succeeds (no error, no panic) on every legal image.
    I5RecoverySucceeds,
    /// I6: recovery is idempotent, also after a crash inside it.
    I6Idempotent,
    /// I7: new commits after recovery work and survive.
    I7ForwardProgress,
}

impl Invariant {
    /// Short name, as printed.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Invariant::I1Atomicity => "I1 atomicity",
            Invariant::I2NoPhantom => "I2 no phantom",
            Invariant::I3PrefixAndDependencies => "I3 prefix and dependencies",
            Invariant::I4Durability => "I4 durability",
            Invariant::I5RecoverySucceeds => "I5 recovery succeeds",
            Invariant::I6Idempotent => "I6 idempotent recovery",
            Invariant::I7ForwardProgress => "I7 forward progress",
        }
    }
}

/// A broken invariant, with what was seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Which.
    pub invariant: Invariant,
    /// What was wrong.
    pub message: String,
}

fn violation(invariant: Invariant, message: String) -> Violation {
    Violation { invariant, message }
}

/// One committed transaction as the model knows it.
#[derive(Debug, Clone)]
pub struct ModelTx {
    /// Unique in the whole run; the first 8 bytes of the first record.
    pub tag: u64,
    /// Identity the log gave it.
    pub id: TxId,
    /// Records as committed.
    pub records: Vec<Vec<u8>>,
    /// Data blocks as committed (zero-padded to the block).
    pub data: Vec<Vec<u8>>,
    /// Dependencies it was committed with.
    pub deps: Vec<TxId>,
    /// Whether the log acknowledged it durable.
    pub acked: bool,
    /// A member of a large transaction: its run's name, and whether it is the close.
    pub run: Option<(u64, bool)>,
}

/// The reference model.
#[derive(Debug, Clone, Default)]
pub struct Model {
    /// Per stream: transactions after the checkpoint, in commit order.
    pub streams: Vec<Vec<ModelTx>>,
    /// Per stream: checkpointed sequence number.
    pub checkpoint: Vec<u64>,
    /// Tags of transactions a recovery discarded: they must never come back.
    pub lost: BTreeSet<u64>,
}

impl Model {
    /// An empty model of `streams` streams.
    #[must_use]
    pub fn new(streams: usize) -> Self {
        Model {
            streams: vec![Vec::new(); streams],
            checkpoint: vec![0; streams],
            lost: BTreeSet::new(),
        }
    }

    /// Mark `id`, its stream's prefix, and its dependencies (transitively) acknowledged.
    pub fn ack(&mut self, id: TxId) {
        let mut todo = vec![id];
        while let Some(id) = todo.pop() {
            let Some(list) = self.streams.get_mut(usize::from(id.stream)) else { continue };
            for tx in list.iter_mut().filter(|t| t.id.seq <= id.seq && !t.acked) {
                tx.acked = true;
                todo.extend(tx.deps.iter().copied());
            }
        }
    }

    /// Mark everything acknowledged (after `sync`).
    pub fn ack_all(&mut self) {
        self.streams.iter_mut().flatten().for_each(|t| t.acked = true);
    }

    /// Stream `s` checkpointed up to `seq`.
    pub fn checkpoint(&mut self, s: usize, seq: u64) {
        self.streams[s].retain(|t| t.id.seq > seq);
        self.checkpoint[s] = seq;
    }

    /// Judge a recovery of an image: I1–I4. `dev` holds the image (for data blocks).
    ///
    /// # Errors
    /// The first broken invariant.
    pub fn check(&self, rec: &Recovery, dev: &dyn Device) -> Result<(), Violation> {
        let bs = dev.geometry().block_size as usize;
        let mut survived: Vec<BTreeSet<u64>> = vec![BTreeSet::new(); self.streams.len()];
        for (s, (list, got)) in self.streams.iter().zip(&rec.streams).enumerate() {
            // Matched by sequence number, then compared by tag: a relocated copy (cleaning)
            // carries its original's tag under a new sequence number.
            let by_seq: BTreeMap<u64, &ModelTx> = list.iter().map(|t| (t.id.seq, t)).collect();
            // Large transactions committed in this recovery: their close survived with its
            // records.
            let committed: BTreeSet<u64> = got
                .txs
                .iter()
                .filter(|t| !t.records.is_empty())
                .filter_map(|t| by_seq.get(&t.id.seq).and_then(|m| m.run))
                .filter(|&(_, close)| close)
                .map(|(run, _)| run)
                .collect();
            let run_committed = |run: u64| committed.contains(&run);
            for (i, tx) in got.txs.iter().enumerate() {
                if tx.run.is_some() && tx.records.is_empty() {
                    // A member of a large transaction that was not committed: it keeps its
                    // place in the chain, without records.
                    let Some(model) = by_seq.get(&tx.id.seq).filter(|m| m.run.is_some()) else {
                        return Err(violation(
                            Invariant::I2NoPhantom,
                            format!(
                                "stream {s} seq {}: an empty run member never committed",
                                tx.id.seq
                            ),
                        ));
                    };
                    if model.run.is_some_and(|(run, _)| run_committed(run)) {
                        return Err(violation(
                            Invariant::I1Atomicity,
                            format!("stream {s} seq {}: a committed large transaction lost a part's records", tx.id.seq),
                        ));
                    }
                    if list.get(i).map(|t| t.tag) != Some(model.tag) {
                        return Err(violation(Invariant::I3PrefixAndDependencies, format!("stream {s}: survivor #{i} (seq {}) is not the {i}-th committed transaction: not a prefix", tx.id.seq)));
                    }
                    survived[s].insert(model.id.seq);
                    continue;
                }
                let tag =
                    tx.records.first().and_then(|r| r.get(..8)).map_or(u64::MAX, |b| {
                        u64::from_le_bytes(b.try_into().unwrap_or([0xFF; 8]))
                    });
                let Some(model) = by_seq.get(&tx.id.seq).filter(|m| m.tag == tag) else {
                    let what = if self.lost.contains(&tag) {
                        "a discarded transaction came back"
                    } else {
                        "never committed"
                    };
                    return Err(violation(
                        Invariant::I2NoPhantom,
                        format!("stream {s} recovered tag {tag:#x} (seq {}): {what}", tx.id.seq),
                    ));
                };
                if let Some((run, _)) = model.run.filter(|&(run, _)| !run_committed(run)) {
                    return Err(violation(
                        Invariant::I1Atomicity,
                        format!("stream {s} tag {tag:#x}: a part of large transaction {run} survived without its close"),
                    ));
                }
                if tx.records != model.records {
                    return Err(violation(
                        Invariant::I1Atomicity,
                        format!("stream {s} tag {tag:#x}: records differ from what was committed"),
                    ));
                }
                if tx.data_count as usize != model.data.len() {
                    return Err(violation(
                        Invariant::I1Atomicity,
                        format!(
                            "stream {s} tag {tag:#x}: {} data blocks, committed {}",
                            tx.data_count,
                            model.data.len()
                        ),
                    ));
                }
                for (j, want) in model.data.iter().enumerate() {
                    let mut block = vec![0u8; bs];
                    if dev.read(tx.data_start + j as u64, &mut block).is_err() || &block != want {
                        return Err(violation(Invariant::I1Atomicity, format!("stream {s} tag {tag:#x}: data block {j} differs from what was committed")));
                    }
                }
                if list.get(i).map(|t| t.tag) != Some(tag) {
                    return Err(violation(Invariant::I3PrefixAndDependencies, format!("stream {s}: survivor #{i} is tag {tag:#x}, not the {i}-th committed transaction: not a prefix")));
                }
                survived[s].insert(model.id.seq);
            }
            if let Some(lost) = list.iter().find(|t| t.acked && !survived[s].contains(&t.id.seq)) {
                return Err(violation(
                    Invariant::I4Durability,
                    format!(
                        "stream {s}: tag {:#x} (seq {}) was acknowledged durable and is gone",
                        lost.tag, lost.id.seq
                    ),
                ));
            }
        }
        for (s, list) in self.streams.iter().enumerate() {
            for tx in list.iter().filter(|t| survived[s].contains(&t.id.seq)) {
                for dep in &tx.deps {
                    let ds = usize::from(dep.stream);
                    let ok = dep.seq <= self.checkpoint.get(ds).copied().unwrap_or(0)
                        || survived.get(ds).is_some_and(|set| set.contains(&dep.seq));
                    if !ok {
                        return Err(violation(
                            Invariant::I3PrefixAndDependencies,
                            format!(
                                "stream {s} tag {:#x} survived without its dependency {}:{}",
                                tx.tag, dep.stream, dep.seq
                            ),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// After a crash and recovery: the survivors are now the committed (and durable) state;
    /// everything else is lost for good.
    pub fn recovered(&mut self, rec: &Recovery) {
        for (s, got) in rec.streams.iter().enumerate() {
            let keep: BTreeSet<u64> = got.txs.iter().map(|t| t.id.seq).collect();
            let (kept, lost): (Vec<ModelTx>, Vec<ModelTx>) = std::mem::take(&mut self.streams[s])
                .into_iter()
                .partition(|t| keep.contains(&t.id.seq));
            self.lost.extend(lost.iter().map(|t| t.tag));
            self.streams[s] = kept.into_iter().map(|t| ModelTx { acked: true, ..t }).collect();
        }
    }
}

/// The set of survivors of a recovery, by tag, for comparing two recoveries.
#[must_use]
pub fn survivor_tags(rec: &Recovery) -> Vec<Vec<Vec<u8>>> {
    rec.streams
        .iter()
        .map(|s| s.txs.iter().map(|t| t.records.first().cloned().unwrap_or_default()).collect())
        .collect()
}

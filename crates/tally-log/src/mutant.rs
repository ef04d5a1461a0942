//! Deliberately broken protocol variants, compiled in only with the `mutants` feature.
//!
//! Each one removes one mechanism the contract depends on; the crash explorer must catch every
//! one of them (a checker that cannot fail proves nothing). A mutant is chosen per log instance
//! (`OpenOptions::mutant`); a build without the feature refuses to open a log with one.

/// A broken variant of the log protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mutant {
    /// Recovery skips over an incomplete transaction and keeps later ones.
    NoPrefixCut,
    /// Recovery keeps transactions whose dependencies did not survive.
    NoDependencyClosure,
    /// Recovery accepts a transaction whose last unit is missing.
    CountOffByOne,
    /// Recovery ignores unit and data checksums.
    CrcNotChecked,
    /// `commit_durable` acknowledges without flushing.
    FlushSkipped,
    /// Recovery does not bump the epoch: orphans after a gap can come back.
    NoEpochBump,
    /// Recovery writes the epoch bump but does not make it durable before new writes.
    EpochBumpNotDurable,
    /// Recovery follows any unit of the stream, ignoring the sequence chain and epoch rules.
    StaleUnitsAccepted,
    /// A checkpoint moves the chain's start to the next segment even when transactions after
    /// the checkpointed one remain in its segment.
    CheckpointSkipsSegmentTail,
    /// Recovery reports a torn transaction at the end of the log as corruption and fails,
    /// instead of ending the chain before it.
    TornTailIsCorruption,
    /// After recovery a stream resumes writing one block too early, over its last survivor.
    ResumeOverwritesTail,
    /// A flush round does not wait for orderless commits that are being submitted, so it can
    /// declare them durable before their write exists. A race: only a concurrent test sees it.
    OrderlessSubmitUntracked,
    /// A checkpoint frees its segments for reuse before the superblock that moves the chain's
    /// start past them is durable: new transactions can overwrite what a crash still needs
    /// (the log's "allocator reuse before durability").
    SegmentsReusedBeforeCheckpointDurable,
    /// A snapshot is trusted after a crash: opening from it leaves the superblock pointing at
    /// it, and open does not check that the snapshot was written for the superblock in force;
    /// after a later crash the stale snapshot comes back and what was written since is lost.
    SnapshotKept,
    /// Recovery does not seal the places after each stream's recovered tail: an orphan left
    /// there chains to the tail again once a later recovery's base passes its seq.
    NoTailSeal,
    /// Recovery ignores durable watermarks: a damaged transaction proven durable is taken for
    /// a torn tail, and everything after it is silently dropped.
    WatermarkIgnored,
    /// A write-out takes a stream's buffered batches newest first (as if the batch a
    /// durability request needs could jump the queue), while the flush round trusts the
    /// stream's written watermark: an older batch can stay in memory behind a flush that
    /// declared it durable.
    WriteOutReordered,
    /// Recovery keeps the parts of a large transaction whose close did not survive (a
    /// transaction whose last segments' units are missing is taken as committed).
    RunUnclosedKept,
    /// Cleaning on transactions the caller read ([`crate::Log::clean_read_to`]) does not check
    /// them against the log's own: it relocates what the caller read and checkpoints past what
    /// the log placed in its oldest segment, so a read made stale meanwhile (that segment
    /// cleaned, the next one at the head since) frees records nothing relocated. Not in
    /// [`Mutant::ALL`] (the explorers' workloads read and clean in one step); the unit test
    /// `clean_read_unchecked_is_caught` (`clean.rs`) must catch it.
    CleanReadUnchecked,
    /// Cleaning that relocates to another stream makes only the cleaned stream durable before
    /// its checkpoint frees the cleaned segments: a crash can keep the checkpoint and lose the
    /// copies on the target stream (what was live in the freed segments is gone).
    RelocationNotDurable,
    /// A flush round makes durable only the transactions its waiters asked for (each stream's
    /// prefix up to them), not their dependencies on other streams: a transaction
    /// acknowledged durable is cut by recovery when a dependency did not reach the media.
    DurableClosureSkipped,
    /// A checkpoint snapshot is written, and the superblock pointed at it, without first
    /// making durable the transactions it describes (`Log::checkpoint_snapshot_finish` skips
    /// its durable wait): a crash keeps a state naming blocks that never reached the media.
    /// Not in [`Mutant::ALL`] (the explorers take no checkpoint snapshots); tally-fs's
    /// `tests/checkpoint.rs` `a_checkpoint_names_only_durable_blocks` must catch it.
    CheckpointBeforeDurable,
}

impl Mutant {
    /// Every mutant, in a fixed order.
    pub const ALL: [Mutant; 20] = [
        Mutant::NoPrefixCut,
        Mutant::NoDependencyClosure,
        Mutant::CountOffByOne,
        Mutant::CrcNotChecked,
        Mutant::FlushSkipped,
        Mutant::NoEpochBump,
        Mutant::EpochBumpNotDurable,
        Mutant::StaleUnitsAccepted,
        Mutant::CheckpointSkipsSegmentTail,
        Mutant::TornTailIsCorruption,
        Mutant::ResumeOverwritesTail,
        Mutant::OrderlessSubmitUntracked,
        Mutant::SegmentsReusedBeforeCheckpointDurable,
        Mutant::SnapshotKept,
        Mutant::NoTailSeal,
        Mutant::WatermarkIgnored,
        Mutant::WriteOutReordered,
        Mutant::RunUnclosedKept,
        Mutant::RelocationNotDurable,
        Mutant::DurableClosureSkipped,
    ];

    /// Kebab-case name, as the CLI takes it.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Mutant::NoPrefixCut => "no-prefix-cut",
            Mutant::NoDependencyClosure => "no-dependency-closure",
            Mutant::CountOffByOne => "count-off-by-one",
            Mutant::CrcNotChecked => "crc-not-checked",
            Mutant::FlushSkipped => "flush-skipped",
            Mutant::NoEpochBump => "no-epoch-bump",
            Mutant::EpochBumpNotDurable => "epoch-bump-not-durable",
            Mutant::StaleUnitsAccepted => "stale-units-accepted",
            Mutant::CheckpointSkipsSegmentTail => "checkpoint-skips-segment-tail",
            Mutant::TornTailIsCorruption => "torn-tail-is-corruption",
            Mutant::ResumeOverwritesTail => "resume-overwrites-tail",
            Mutant::OrderlessSubmitUntracked => "orderless-submit-untracked",
            Mutant::SegmentsReusedBeforeCheckpointDurable => {
                "segments-reused-before-checkpoint-durable"
            }
            Mutant::SnapshotKept => "snapshot-trusted-after-crash",
            Mutant::NoTailSeal => "no-tail-seal",
            Mutant::WatermarkIgnored => "watermark-ignored",
            Mutant::WriteOutReordered => "write-out-reordered",
            Mutant::RunUnclosedKept => "run-unclosed-kept",
            Mutant::CleanReadUnchecked => "clean-read-unchecked",
            Mutant::RelocationNotDurable => "relocation-not-durable",
            Mutant::DurableClosureSkipped => "durable-closure-skipped",
            Mutant::CheckpointBeforeDurable => "checkpoint-before-durable",
        }
    }

    /// Whether the race needs several threads to show: the single-threaded crash explorer
    /// cannot catch it; `tests/concurrency.rs` does.
    #[must_use]
    pub fn needs_concurrency(self) -> bool {
        matches!(self, Mutant::OrderlessSubmitUntracked)
    }

    /// Whether only a workload with a clean close shows it: the log explorer never closes
    /// cleanly; `tests/snapshot.rs` here and the file-system crash tests do.
    #[must_use]
    pub fn needs_clean_close(self) -> bool {
        matches!(self, Mutant::SnapshotKept)
    }

    /// Whether only a workload that keeps working across several crashes and recoveries (or a
    /// process crash followed by a power loss) shows it: the multi-generation explorations
    /// catch these, not the single-crash bounded runs.
    #[must_use]
    pub fn needs_generations(self) -> bool {
        matches!(self, Mutant::NoTailSeal)
    }

    /// Whether only damage to durable data (a flipped bit, not a torn write) shows it: the
    /// crash explorer models torn writes; `tests/durable_damage.rs` here catches it.
    #[must_use]
    pub fn needs_damage(self) -> bool {
        matches!(self, Mutant::WatermarkIgnored)
    }

    /// Whether only a log that buffers several operations' commits before a durability request
    /// shows it: the explorer with write-outs across operations
    /// (`WriteOuts::AcrossOps` in `tally-crash`), not the one that writes out after each op.
    #[must_use]
    pub fn needs_write_behind(self) -> bool {
        matches!(self, Mutant::WriteOutReordered)
    }

    /// Whether only a workload with large transactions (runs of parts across segments) shows
    /// it: the explorer's `L` workloads (`tally-crash`'s `tests/log_explore.rs`).
    #[must_use]
    pub fn needs_large_transactions(self) -> bool {
        matches!(self, Mutant::RunUnclosedKept)
    }

    /// Whether only a workload that cleans one stream onto another shows it: the explorer's
    /// `G` workloads (`tally-crash`'s `tests/log_explore.rs`).
    #[must_use]
    pub fn needs_relocation_elsewhere(self) -> bool {
        matches!(self, Mutant::RelocationNotDurable)
    }

    /// Parse a kebab-case name.
    #[must_use]
    pub fn from_name(name: &str) -> Option<Mutant> {
        Mutant::ALL
            .into_iter()
            .chain([Mutant::CleanReadUnchecked, Mutant::CheckpointBeforeDurable])
            .find(|m| m.name() == name)
    }
}

/// Whether this build carries the mutants.
#[must_use]
pub const fn available() -> bool {
    cfg!(feature = "mutants")
}

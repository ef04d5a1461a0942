//! Deliberately broken variants of the file system, compiled in only with the `mutants`
//! feature. Each removes one mechanism the contract rests on; the crash tests must catch every
//! one (a checker that cannot fail proves nothing).

/// A broken variant of the file system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FsMutant {
    /// Rename commits the removal of the old name as a transaction of its own, before the rest
    /// (NOVA's bug: rename not atomic).
    RenameSplit,
    /// Unlink commits the removal of the name apart from the link-count change and the free
    /// (NOVA's bug: superseded entry invalidated outside its transaction).
    UnlinkSplit,
    /// No cross-stream dependencies are recorded: write-then-rename is no longer safe.
    NoDependencies,
    /// Mount applies records in the order found in the log instead of version order: a record
    /// relocated by cleaning overrides a newer one.
    ReplayInLogOrder,
    /// `fsync` returns without waiting for durability.
    FsyncNotDurable,
    /// Cleaning drops a tombstone (removed name, freed inode, hole) while older records of
    /// the same object remain in the log: the object comes back after a remount.
    TombstoneDroppedEarly,
    /// `fsck` counts the data blocks but does not read them: a damaged block passes. Not a protocol mutant (not in [`FsMutant::ALL`], which the crash explorer
    /// judges); the image-damage tests of `tally fsck` must catch it.
    FsckSkipsDataBlocks,
    /// `barrier` keeps the oldest not-yet-durable barrier of a stream instead of its newest:
    /// a later barrier on the same stream orders nothing. Not in [`FsMutant::ALL`] (the
    /// explorer's workloads are too short to reach it); `tally-crash`'s
    /// `tests/barrier_crash.rs` must catch it.
    BarrierKeepsOldest,
    /// Cleaning judges tombstones as if no checkpoint snapshot were in force: one written
    /// after the snapshot is dropped once older records of its object have left the log, and
    /// a crash recovers the snapshot, which still holds the object, without it. Not in
    /// [`FsMutant::ALL`] (the explorer's workloads have no online checkpoint yet);
    /// `tests/checkpoint.rs` must catch it.
    CheckpointTombstoneDropped,
    /// A transaction that changes a directory's entries (create, unlink, rename, ...) is not
    /// made a barrier: a later durable wait on another stream's file leaves it out, and a
    /// crash keeps the later, acknowledged change without it (SQLite's journal unlink lost
    /// under a later commit: the database rolled back over acknowledged commits).
    NamespaceNotOrdered,
    /// An operation past the replay budget leaves the checkpoint to the maintenance thread
    /// however far past the budget the log is: a thread that does not keep up lets the log a
    /// crash replays grow without bound. Not in [`FsMutant::ALL`] (the explorer has no
    /// checkpoints); the unit test `fs::tests::a_slow_maintenance_thread_leaves_replay_bounded`
    /// must catch it.
    CheckpointLeftToMaintenance,
    /// Cleaning points a moved block's map entry at its copy without holding the block's
    /// bytes in memory until the copy is durable: a read while the cleaning's flush is under
    /// way goes to the device before the copy has reached it. Not in [`FsMutant::ALL`] (the
    /// explorer's reads do not race a cleaning); the unit test
    /// `clean::tests::a_cleanings_flush_holds_no_one_up` must catch it.
    RelocatedReadEarly,
}

impl FsMutant {
    /// Every mutant.
    pub const ALL: [FsMutant; 7] = [
        FsMutant::RenameSplit,
        FsMutant::UnlinkSplit,
        FsMutant::NoDependencies,
        FsMutant::ReplayInLogOrder,
        FsMutant::FsyncNotDurable,
        FsMutant::TombstoneDroppedEarly,
        FsMutant::NamespaceNotOrdered,
    ];

    /// Kebab-case name.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            FsMutant::RenameSplit => "rename-split",
            FsMutant::UnlinkSplit => "unlink-split",
            FsMutant::NoDependencies => "no-dependencies",
            FsMutant::ReplayInLogOrder => "replay-in-log-order",
            FsMutant::FsyncNotDurable => "fsync-not-durable",
            FsMutant::TombstoneDroppedEarly => "tombstone-dropped-early",
            FsMutant::FsckSkipsDataBlocks => "fsck-skips-data-blocks",
            FsMutant::BarrierKeepsOldest => "barrier-keeps-oldest",
            FsMutant::CheckpointTombstoneDropped => "checkpoint-tombstone-dropped",
            FsMutant::NamespaceNotOrdered => "namespace-not-ordered",
            FsMutant::CheckpointLeftToMaintenance => "checkpoint-left-to-maintenance",
            FsMutant::RelocatedReadEarly => "relocated-read-early",
        }
    }

    /// Parse a name.
    #[must_use]
    pub fn from_name(name: &str) -> Option<FsMutant> {
        FsMutant::ALL
            .into_iter()
            .chain([
                FsMutant::FsckSkipsDataBlocks,
                FsMutant::BarrierKeepsOldest,
                FsMutant::CheckpointTombstoneDropped,
                FsMutant::CheckpointLeftToMaintenance,
                FsMutant::RelocatedReadEarly,
            ])
            .find(|m| m.name() == name)
    }
}

/// Whether this build can run mutants.
#[must_use]
pub fn available() -> bool {
    cfg!(feature = "mutants")
}

//! Deliberately broken variants of the VFS, usable only with the `mutants` feature. Each
//! removes one thing SQLite's batch-atomic commit relies on; `tests/crash.rs`,
//! `tests/attach_crash.rs` and `tests/attach_fail.rs` must catch each (a checker that cannot
//! fail proves nothing).

/// A broken variant of the VFS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum VfsMutant {
    /// `SQLITE_FCNTL_COMMIT_ATOMIC_WRITE` commits the file's transaction without waiting for
    /// durability, yet counts the file as synced, so the `xSync` that follows skips the flush:
    /// SQLite acknowledges a commit a crash can lose.
    CommitNotDurable,
    /// `SQLITE_FCNTL_ROLLBACK_ATOMIC_WRITE` commits the pages written so far instead of
    /// aborting them: a batch SQLite gave up on (and then redoes through a journal) leaves
    /// half a transaction in the file until the redo lands.
    RollbackKeepsPages,
    /// `SQLITE_FCNTL_ROLLBACK_ATOMIC_WRITE` aborts the batch but forgets one page: the first
    /// one written after the header page stays in the file (written again plainly after the
    /// abort), so the file holds one page of a transaction SQLite gave up on until the redo
    /// lands.
    RollbackForgetsAPage,
    /// [`atomic`](crate::atomic) groups nothing: each database commits its own batch (one
    /// `Fs` transaction per file, each durable), as SQLite does in `journal_mode=MEMORY` on
    /// its own. A crash between two files' commits keeps one database's half of the
    /// transaction.
    GroupCommitsEachFile,
    /// [`atomic`](crate::atomic) leaves the second database out of the group: its pages are
    /// committed by its own batch in SQLite's phase one, before the group's commit.
    GroupLeavesSecondFile,
    /// [`atomic`](crate::atomic)'s phase two reports a group commit that failed (a device
    /// error in its write or its flush; the `Fs` undid the transaction) as committed: SQLite
    /// finishes the transaction in every database and `atomic` returns `Ok`, for a transfer
    /// that is in neither file.
    PhaseTwoFailureIgnored,
    /// A database write does not write out the rollback journal's pending appends first
    /// (`vfs::PendingJournal`): they reach the `Fs` only at the next sync, read or size, after
    /// the pages they undo. A batch SQLite redoes through a journal writes the journal and then
    /// the pages with no sync between, so a crash can keep pages with no journal to undo them.
    JournalAfterPages,
    /// A truncate of a database in an open [`atomic`](crate::atomic) group is answered `OK`
    /// and not made: an auto-vacuum shrink of the main database (which SQLite truncates before
    /// it sends the group's commit) leaves the file at its old length, and a test that claims
    /// to exercise shrinking inside a group exercises nothing.
    GroupTruncateDropped,
}

impl VfsMutant {
    /// Every mutant.
    pub const ALL: [VfsMutant; 8] = [
        VfsMutant::CommitNotDurable,
        VfsMutant::RollbackKeepsPages,
        VfsMutant::RollbackForgetsAPage,
        VfsMutant::GroupCommitsEachFile,
        VfsMutant::GroupLeavesSecondFile,
        VfsMutant::PhaseTwoFailureIgnored,
        VfsMutant::JournalAfterPages,
        VfsMutant::GroupTruncateDropped,
    ];

    /// Kebab-case name.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            VfsMutant::CommitNotDurable => "commit-not-durable",
            VfsMutant::RollbackKeepsPages => "rollback-keeps-pages",
            VfsMutant::RollbackForgetsAPage => "rollback-forgets-a-page",
            VfsMutant::GroupCommitsEachFile => "group-commits-each-file",
            VfsMutant::GroupLeavesSecondFile => "group-leaves-second-file",
            VfsMutant::PhaseTwoFailureIgnored => "phase-two-failure-ignored",
            VfsMutant::JournalAfterPages => "journal-after-pages",
            VfsMutant::GroupTruncateDropped => "group-truncate-dropped",
        }
    }
}

/// Whether mutants are compiled in (the `mutants` feature).
#[must_use]
pub fn available() -> bool {
    cfg!(feature = "mutants")
}

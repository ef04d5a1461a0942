//! The file-system crash explorer.
//!
//! Workloads in the style of B3/ACE (`workload`): from a small durable tree (`/A`, `/A/foo` with
//! two blocks and an extended attribute, `/bar`, `/B`), one or two operations over create, mkdir,
//! write (append, overwrite, unaligned, sparse), truncate, link, unlink, rename, rmdir, chmod,
//! xattrs, explicit transactions and cleaning, each followed by fsync, fdatasync, a directory's
//! fsync, a barrier, sync or nothing. They run on a [`crate::CrashDevice`]; after every
//! operation and every persistence call (and between the device operations inside them) every
//! image a power failure could leave (exhaustive when small, sampled by seed beyond) is mounted
//! and judged against a reference model (`model`):
//!
//! - I1 atomicity: the recovered tree is the model's state after some subset of the operations,
//!   each all or nothing (an explicit transaction is one operation; an aborted one never
//!   appears);
//! - I2 causal order: the subset is closed under "an earlier operation touching a common inode"
//!   and under barriers; with one stream it is a prefix;
//! - I3 durability: every operation acknowledged durable (fsync, fdatasync, commit_durable,
//!   sync, with what they depend on) is in it;
//! - I4: mount succeeds without panic and `fsck` is clean;
//! - I5 forward progress: a new file created, written and fsynced after recovery survives a
//!   crash;
//! - I6 idempotence: every image a crash right after recovery leaves mounts to the same tree.
//!
//! Multi-generation workloads (`FsExplorer::run_generations`, `run/generations.rs`) continue
//! after crashes: steps on the recovered tree, a power loss or a process crash (the mount runs
//! on the same device, its volatile cache kept), sometimes a power loss inside that mount, and
//! again, with every crash point inside every mount judged.
//!
//! One seed reproduces everything; `docs/FS-CRASH-TESTING.md` has the counts.

mod concurrent;
pub(crate) mod medium;
mod model;
mod run;
mod workload;

pub use tally_fs::{mutants_available, FsMutant};

pub use concurrent::{concurrent, threaded, ConcurrentWorkload, TStep};
pub use medium::{explorer_view, Medium};
pub use model::{
    Candidates, FsInvariant, FsViolation, History, MIno, MNode, MOp, MState, Tree, TreeNode, MROOT,
};
pub use run::{walk, FsExploreConfig, FsExplorer, FsFirstViolation, FsReport, FsStart};
pub use workload::{
    catalogue, large, longer, names, persists, resolve, seq1, seq2, seq2_sample, workload_set,
    FsOp, FsWorkload, Persist, Step, TruncKind, TxnEnd, WriteKind, HUGE_BLOCKS,
};

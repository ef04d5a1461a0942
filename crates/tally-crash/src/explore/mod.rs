//! The log crash explorer.
//!
//! A workload (a few ops: commits of several shapes on two streams, a dependency, a classic
//! commit, sync, checkpoint, crash-and-recover) runs against a [`CrashDevice`]. After every op —
//! a persistence point — every image a power failure could leave (exhaustive when small, sampled
//! by seed beyond) is recovered and judged against a reference [`Model`]:
//!
//! - I1–I4 by [`Model::check`] (atomicity, no phantom or resurrected transaction, per-stream
//!   prefix and dependency closure, durability of everything acknowledged);
//! - I5: recovery returns without error or panic;
//! - I6: recovering the recovered device again gives the same survivors, and so does every image
//!   a crash *inside* recovery can leave (the epoch-bump superblock written but its flush
//!   failed, so the write may or may not be there);
//! - I7: after recovery, a new durable commit on every stream works and survives a reopen.
//!
//! A crash op continues the workload from several of the images (bounded runs) or one (random
//! runs), so sequences like commit, commit, crash, commit, crash are explored. Multi-generation
//! workloads (`Workload::generations`, `ExploreConfig::recovery_points`) run several
//! generations of ops, each ending in a power loss (`c`) or a process crash (`p`: recovery on
//! the same device, its volatile cache kept), sometimes a power loss inside that recovery
//! (`r`); every crash point inside every recovery is judged too, and the model carries what
//! was acknowledged and what was discarded across generations (`run/generations.rs`). One seed
//! reproduces everything; a violation carries the command that replays it.

mod model;
mod run;
mod workload;

pub use model::{Invariant, Model, ModelTx, Violation};
pub use run::{ExploreConfig, Explorer, FirstViolation, Report, Start, WriteOuts};
pub use workload::{Op, Workload};

//! Tally's simulated devices, below every layer that is tested on them.
//!
//! - [`CrashDevice`]: a block [`Device`](tally_media::Device) with a volatile write cache and
//!   writes in flight, whose possible post-crash images can be enumerated or sampled, with
//!   injected faults ([`FaultPlan`]); its fault model is stated at the top of `src/device/mod.rs`
//!   and in `docs/CRASH-MODEL.md`. [`RecordingDevice`] stops a workload at chosen points to take
//!   those images.
//! - [`PmemSim`]: a persistent-memory region whose crashes are enumerated per 64-byte line, and
//!   [`PmemSimDevice`], the block view on it (`docs/PMEM-CRASH-MODEL.md`).
//!
//! This crate depends only on `tally-media`, so `tally-log` and `tally-fs` use it in their own
//! tests; the crash explorers that drive whole workloads over it are in `tally-crash`.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod device;
pub mod pmem;

pub use device::{
    CompletionPolicy, CrashConfig, CrashDevice, CrashImages, CrashOptions, CrashPoint, CrashReport,
    FaultPlan, RecordingDevice,
};
pub use pmem::{
    PmemCrashImages, PmemCrashOptions, PmemCrashPoint, PmemSim, PmemSimDevice, PmemSimStats,
};

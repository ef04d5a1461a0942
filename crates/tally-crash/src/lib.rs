//! Crash-state exploration for Tally.
//!
//! [`CrashDevice`] is the simulated disk every correctness claim rests on: its fault model is
//! stated at the top of `src/device/mod.rs` and in `docs/CRASH-MODEL.md`.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod device;
pub mod explore;
pub mod fsexplore;
pub mod pmem;

pub use device::{
    CompletionPolicy, CrashConfig, CrashDevice, CrashImages, CrashOptions, CrashPoint, CrashReport,
    FaultPlan, RecordingDevice,
};
pub use pmem::{
    PmemCrashImages, PmemCrashOptions, PmemCrashPoint, PmemSim, PmemSimDevice, PmemSimStats,
};

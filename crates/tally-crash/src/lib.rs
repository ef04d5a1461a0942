//! Crash-state exploration for Tally: the explorers of the log ([`explore`]) and of the file
//! system ([`fsexplore`]), which run workloads, crash them and check every image.
//!
//! The simulated devices they run on are in `tally-sim` (below the log and the file system, so
//! those crates test against them directly); they are re-exported here, as [`device`], [`pmem`]
//! and the names below. [`CrashDevice`] is the simulated disk every correctness claim rests on:
//! its fault model is stated at the top of `tally-sim`'s `src/device/mod.rs` and in
//! `docs/CRASH-MODEL.md`.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod explore;
pub mod fsexplore;
pub mod spanexplore;

pub use tally_sim::{device, pmem};
pub use tally_sim::{
    CompletionPolicy, CrashConfig, CrashDevice, CrashImages, CrashOptions, CrashPoint, CrashReport,
    FaultPlan, PmemCrashImages, PmemCrashOptions, PmemCrashPoint, PmemSim, PmemSimDevice,
    PmemSimStats, RecordingDevice,
};

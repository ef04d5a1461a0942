//! Tally's benchmarks, run by `tally bench …` and `bench/*.sh`, never by the test suite.
//!
//! - [`tx`]: transactions per second of each commit mode of the log on a file device, with the
//!   costs behind them (flushes, submissions, syscalls, bytes and CPU per transaction) and the
//!   ratios between modes measured in the same run;
//! - [`recovery`]: how fast [`tally_log::Log::open`] scans a full log;
//! - [`crash_mount`]: a file system's mount after a crash as its history grows and what is
//!   live stays the same (online checkpoints keep it flat);
//! - [`fs`]: the file system's stream policies (per file, per thread, one stream) and its two
//!   mount paths (clean-unmount snapshot, scan after a crash);
//! - [`fs_peers`]: the file system against ext4 and SQLite on same-size block devices, its mount
//!   of 100,000 files, and the write amplification of its cleaning;
//! - [`peer`], [`varmail`], [`append`], [`multicommit`]: one timed window of a workload that
//!   `bench/run.sh` runs side by side with ext4, SQLite, RocksDB, LMDB and a FUSE pass-through;
//! - [`append_crash`]: what of an ordered append stream survives a simulated crash, with a
//!   barrier, an fsync or neither after each append;
//! - [`probe`] (`tally probe`): what one durable commit costs on a device, also the flush
//!   latency printed beside the benchmarks' results; [`scratch`]: the rule that keeps other
//!   people's data safe from a probe or a benchmark (what is created, refused, undone).
//!
//! Rules every benchmark here keeps (STYLE.md rule 13, DESIGN.md §5):
//! - results are ratios measured in one run, each with the machine and the device's flush
//!   latency beside it; an absolute figure is never reported alone;
//! - every mode is repeated, runs interleaved (mode A, B, … then again), and reported as a
//!   median with its min–max spread;
//! - a target file that holds data is never overwritten without `force`, and a file the
//!   benchmark created is removed unless `keep`.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod append;
pub mod append_crash;
pub mod crash_mount;
mod error;
pub mod fs;
pub mod fs_peers;
pub mod image;
pub mod measure;
pub mod multicommit;
pub mod peer;
pub mod probe;
pub mod recovery;
pub mod scratch;
pub mod target;
pub mod tx;
pub mod varmail;

pub use error::BenchError;
pub use measure::{parse_size, Spread};

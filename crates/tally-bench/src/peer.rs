//! What the side-by-side workloads share (`varmail`, `append`, `multicommit`): one timed window
//! of one system, reported as counts the runner (`bench/run.sh`) turns into medians and ratios.
//!
//! A window measures one system once. Repetition, interleaving of systems and the spread are the
//! runner's job, because several peers are other programs (fio, `db_bench`, an LMDB driver) and
//! one scheme must hold for all of them. Device-level counts (flushes, bytes reaching the
//! device) are read by the runner from `/proc/diskstats` of each system's loop device, the same
//! way for every peer; the Tally library also reports its own counters here.

use std::path::Path;
use std::sync::Arc;

use tally_fs::{Fs, MkfsOptions, MountOptions};
use tally_media::{Device, DeviceStats, DirectMode, FileDevice, FileOptions};

use crate::BenchError;

/// One timed window of one system.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Window {
    /// Workload name (`varmail`, `append`, `multicommit`).
    pub workload: String,
    /// System measured, as the runner names it.
    pub system: String,
    /// Operations completed in the window (the workload says what one is).
    pub ops: u64,
    /// Length of the window, seconds.
    pub seconds: f64,
    /// `ops / seconds`.
    pub ops_per_s: f64,
    /// CPU time of this process (user + system, all threads) per operation, µs. A FUSE daemon's
    /// or the kernel's own threads are not in it; the runner adds the daemon's.
    pub cpu_us_per_op: f64,
    /// Payload bytes the workload asked to write in the window.
    pub payload_bytes: u64,
    /// Operation latency percentiles (µs) where the workload times single operations.
    pub latency_p50_us: Option<f64>,
    /// 99th percentile of the same.
    pub latency_p99_us: Option<f64>,
    /// Tally's own device counters over the window (library systems only).
    pub tally_device: Option<DeviceStats>,
    /// Anything a reader must know about this system's figure.
    pub note: Option<String>,
}

impl Window {
    /// A window of `ops` operations over `seconds`, with `cpu_s` of CPU time.
    #[must_use]
    pub fn new(workload: &str, system: &str, ops: u64, seconds: f64, cpu_s: f64) -> Window {
        let per_op = |x: f64| if ops == 0 { 0.0 } else { x / ops as f64 };
        Window {
            workload: workload.to_string(),
            system: system.to_string(),
            ops,
            seconds,
            ops_per_s: if seconds > 0.0 { ops as f64 / seconds } else { 0.0 },
            cpu_us_per_op: per_op(cpu_s * 1e6),
            payload_bytes: 0,
            latency_p50_us: None,
            latency_p99_us: None,
            tally_device: None,
            note: None,
        }
    }
}

/// A fresh Tally file system on `device` (a block device or an image file), mounted as a
/// library, with the device handle kept for its counters.
///
/// # Errors
/// The device cannot be opened (O_DIRECT), or mkfs / mount fail.
pub fn fresh_tally(device: &Path) -> Result<(Arc<dyn Device>, Fs), BenchError> {
    let options = FileOptions { direct: DirectMode::On, ..FileOptions::default() };
    let dev: Arc<dyn Device> = Arc::new(FileDevice::open(device, options)?);
    Fs::mkfs(dev.clone(), &MkfsOptions { streams: 4, ..MkfsOptions::default() }).map_err(fs_err)?;
    let fs = Fs::mount(dev.clone(), MountOptions::default()).map_err(fs_err)?;
    Ok((dev, fs))
}

/// A file-system error as a benchmark failure.
pub(crate) fn fs_err(e: tally_fs::FsError) -> BenchError {
    BenchError::Failed { reason: e.to_string() }
}

/// An I/O error on a peer's path as a benchmark failure, naming what was being done.
pub(crate) fn io_err<'a>(what: &str, path: &'a Path) -> impl Fn(std::io::Error) -> BenchError + 'a {
    let what = what.to_string();
    move |e| BenchError::Failed { reason: format!("{what} {}: {e}", path.display()) }
}

/// Bytes the workloads write: not all zero and not all alike, so no layer can compress or
/// deduplicate them away. Deterministic per `seed`.
#[must_use]
pub fn payload(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut v = vec![0u8; len];
    rng.fill(&mut v);
    v
}

//! `probe`: measure what a file or block device costs per durable commit.
//!
//! It opens the target as a [`FileDevice`] (so it measures exactly the path Tally uses:
//! `O_DIRECT` and io_uring where available) and times, per iteration, a 4 KiB write, an
//! `fdatasync` after a 4 KiB write, and a 4 KiB FUA (`RWF_DSYNC`) write. One stream of commits
//! that each need one flush can go no faster than `1 / median flush latency`.
//!
//! Safety of the data on the target is the rule of [`crate::scratch`], used without filling:
//! - a missing path is created (sparse, then preallocated with `fallocate`) and deleted at the
//!   end unless `keep`;
//! - an existing *empty* regular file is used, and truncated back to empty unless `keep`;
//! - anything else that exists (a non-empty file, a block device) is refused unless `force`,
//!   since probing overwrites the first blocks; with `force` it is used as it is.
//!
//! The blocks written are pre-written once and flushed before timing, so the numbers are for
//! overwrites in place, as a log on preallocated segments sees them, not for first writes into
//! unwritten extents (which cost the file system a metadata commit on every flush).

use std::path::{Path, PathBuf};
use std::time::Instant;

use tally_media::{
    Device, DeviceStats, EngineKind, FileDevice, FileOptions, IoBuf, MediaError, Write, WriteFlags,
};

use crate::scratch::{Occupant, Scratch, ScratchError, ScratchOptions, ScratchWarning};

/// Bytes written by each timed write.
pub const PROBE_WRITE_SIZE: usize = 4096;
/// Untimed iterations run before each measurement.
const WARMUP_COUNT: u32 = 5;
/// Most distinct blocks the probe writes (it cycles over them).
const REGION_BLOCK_COUNT_MAX: u64 = 1024;

/// What to probe, and how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeOptions {
    /// Size of the file to create when the path does not exist.
    pub size_bytes: u64,
    /// Timed iterations of each measurement.
    pub iterations: u32,
    /// Keep a file the probe created (or extended) instead of removing (truncating) it.
    pub keep: bool,
    /// Allow writing into an existing non-empty file or a block device.
    pub force: bool,
}

impl Default for ProbeOptions {
    fn default() -> Self {
        ProbeOptions { size_bytes: 64 << 20, iterations: 200, keep: false, force: false }
    }
}

/// Latency distribution of one measurement, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct LatencyUs {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Fastest.
    pub min: f64,
    /// Slowest.
    pub max: f64,
    /// Arithmetic mean.
    pub mean: f64,
}

impl LatencyUs {
    /// The distribution of `samples` (nanoseconds); `None` if there are none.
    #[must_use]
    pub fn from_nanos(samples: &[u64]) -> Option<Self> {
        let mut sorted = samples.to_vec();
        sorted.sort_unstable();
        let count = sorted.len();
        let last = *sorted.last()?;
        let us = |nanos: u64| nanos as f64 / 1000.0;
        let sum: u128 = sorted.iter().map(|&s| u128::from(s)).sum();
        Some(LatencyUs {
            p50: percentile_us(&sorted, 0.50),
            p99: percentile_us(&sorted, 0.99),
            min: us(sorted[0]),
            max: us(last),
            mean: sum as f64 / count as f64 / 1000.0,
        })
    }
}

/// Nearest-rank percentile `q` (0..=1) of `sorted` nanoseconds, in microseconds; 0 if empty.
///
/// Nearest rank: the smallest sample with at least `q` of them at or below it.
#[must_use]
pub fn percentile_us(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = (q * sorted.len() as f64).ceil() as usize;
    sorted[index.clamp(1, sorted.len()) - 1] as f64 / 1000.0
}

/// The machine the probe ran on.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MachineInfo {
    /// Kernel release (`uname -r`).
    pub kernel: String,
    /// Hardware architecture (`uname -m`).
    pub arch: String,
    /// CPUs available to this process.
    pub cpu_count: u32,
}

impl std::fmt::Display for MachineInfo {
    /// As the reports print it: `Linux 6.1.0 x86_64, 8 CPUs`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Linux {} {}, {} CPUs", self.kernel, self.arch, self.cpu_count)
    }
}

/// What a probe measured.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ProbeReport {
    /// The path probed.
    pub path: PathBuf,
    /// Whether the probe created the file.
    pub created: bool,
    /// Size of the device in bytes (whole blocks).
    pub size_bytes: u64,
    /// Block size used.
    pub block_size: u32,
    /// Timed iterations of each measurement.
    pub iterations: u32,
    /// Whether `O_DIRECT` worked.
    pub direct: bool,
    /// Why `O_DIRECT` is not used, if it failed.
    pub direct_note: Option<String>,
    /// Whether io_uring worked.
    pub io_uring: bool,
    /// Why io_uring is not used, if it failed.
    pub io_uring_note: Option<String>,
    /// The write engine used.
    pub engine: EngineKind,
    /// Latency of a 4 KiB write (submit to completion; not durable).
    pub write_4k_us: LatencyUs,
    /// Latency of `fdatasync` after a completed 4 KiB write.
    pub fdatasync_us: LatencyUs,
    /// Latency of a 4 KiB FUA (`RWF_DSYNC`) write.
    pub fua_write_us: LatencyUs,
    /// Durable commits per second one stream can reach with a flush per commit: 1 / median
    /// `fdatasync` latency.
    pub ceiling_commits_per_sec: f64,
    /// The same with a FUA write per commit instead: 1 / median FUA write latency.
    pub ceiling_commits_per_sec_fua: f64,
    /// What the device did during the probe.
    pub stats: DeviceStats,
    /// Where it ran.
    pub machine: MachineInfo,
}

/// Why a probe did not run or did not finish.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProbeError {
    /// The options or the path make no sense (bad size, missing directory, a directory, …).
    #[error("{reason}")]
    BadInput {
        /// Why.
        reason: String,
    },
    /// The path holds data the probe would overwrite.
    #[error("refusing to probe {}: {reason}; pass --force to overwrite it", path.display())]
    Refused {
        /// The path given.
        path: PathBuf,
        /// What is there.
        reason: String,
    },
    /// Preparing the file failed.
    #[error(transparent)]
    Prepare(ScratchError),
    /// The device failed.
    #[error(transparent)]
    Media(#[from] MediaError),
}

impl ProbeError {
    /// Whether the caller asked for something impossible (as opposed to an I/O failure).
    #[must_use]
    pub fn is_bad_input(&self) -> bool {
        match self {
            ProbeError::BadInput { .. } | ProbeError::Refused { .. } => true,
            ProbeError::Prepare(error) => error.is_bad_input(),
            ProbeError::Media(_) => false,
        }
    }
}

/// The probe's own words for what it refuses; other failures keep the scratch target's.
impl From<ScratchError> for ProbeError {
    fn from(error: ScratchError) -> Self {
        match error {
            ScratchError::Directory { .. } | ScratchError::BadInput { .. } => {
                ProbeError::BadInput { reason: error.to_string() }
            }
            ScratchError::Refused { path, occupant: Occupant::BlockDevice } => {
                let reason = "it is a block device and probing overwrites its first blocks";
                ProbeError::Refused { path, reason: reason.to_string() }
            }
            ScratchError::Refused { path, occupant: Occupant::File { len_bytes } } => {
                let reason =
                    format!("it is a file of {len_bytes} bytes that probing would overwrite");
                ProbeError::Refused { path, reason }
            }
            ScratchError::Io { .. } => ProbeError::Prepare(error),
        }
    }
}

/// The probe's target: sized to `options.size_bytes` if created or empty, never filled (the
/// probe zeroes only the blocks it uses).
fn prepare(path: &Path, options: &ProbeOptions) -> Result<Scratch, ProbeError> {
    let scratch_options = ScratchOptions {
        size_bytes: options.size_bytes,
        keep: options.keep,
        force: options.force,
        fill: false,
        extend_forced: false,
        warn,
    };
    Ok(Scratch::prepare(path, scratch_options)?)
}

fn warn(warning: &ScratchWarning) {
    match warning {
        ScratchWarning::Fallocate { path, error } => {
            tracing::warn!(path = %path.display(), %error, "fallocate failed; probing a sparse file");
        }
        ScratchWarning::Cleanup { path, error } => {
            tracing::warn!(path = %path.display(), %error, "could not clean up after probe");
        }
    }
}

/// The machine this runs on.
#[must_use]
pub fn machine_info() -> MachineInfo {
    // SAFETY: utsname is plain old data; all-zero is a valid value for uname to overwrite.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: uts is a valid, writable utsname.
    let ok = unsafe { libc::uname(&mut uts) } == 0;
    let text = |field: &[libc::c_char]| {
        let bytes: Vec<u8> = field.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    let (kernel, arch) =
        if ok { (text(&uts.release), text(&uts.machine)) } else { (String::new(), String::new()) };
    let cpu_count = std::thread::available_parallelism()
        .map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX));
    MachineInfo { kernel, arch, cpu_count }
}

/// One 4 KiB-per-block write of `block`, its first bytes stamped with `stamp`.
fn stamped_write(block: u64, block_size: usize, stamp: u64) -> Vec<Write> {
    let mut data = IoBuf::zeroed(block_size);
    data[..8].copy_from_slice(&stamp.to_le_bytes());
    vec![Write::new(block, data)]
}

fn elapsed_nanos(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Measure `path`; see the module documentation for what is written where.
///
/// # Errors
/// [`ProbeError::BadInput`] / [`ProbeError::Refused`] before anything is written;
/// [`ProbeError::Prepare`] / [`ProbeError::Media`] when the device fails.
pub fn probe(path: &Path, options: ProbeOptions) -> Result<ProbeReport, ProbeError> {
    if options.iterations == 0 {
        return Err(ProbeError::BadInput { reason: "iterations must be at least 1".to_string() });
    }
    if options.size_bytes < PROBE_WRITE_SIZE as u64 {
        return Err(ProbeError::BadInput {
            reason: format!(
                "size {} is smaller than one {PROBE_WRITE_SIZE}-byte block",
                options.size_bytes
            ),
        });
    }
    let scratch = prepare(path, &options)?;
    let report = measure(path, &options, scratch.created());
    drop(scratch);
    report
}

fn measure(path: &Path, options: &ProbeOptions, created: bool) -> Result<ProbeReport, ProbeError> {
    let device = FileDevice::open(path, FileOptions::default())?;
    let t = time_device(&device, options.iterations)?;
    let per_sec = |latency: &LatencyUs| 1e6 / latency.p50.max(1e-3);
    Ok(ProbeReport {
        path: path.to_path_buf(),
        created,
        size_bytes: t.size_bytes,
        block_size: t.block_size,
        iterations: options.iterations,
        direct: device.direct(),
        direct_note: device.direct_fallback().map(str::to_string),
        io_uring: device.engine() == EngineKind::IoUring,
        io_uring_note: device.engine_fallback().map(str::to_string),
        engine: device.engine(),
        ceiling_commits_per_sec: per_sec(&t.write_flush_us),
        ceiling_commits_per_sec_fua: per_sec(&t.fua_write_us),
        write_4k_us: t.write_4k_us,
        fdatasync_us: t.write_flush_us,
        fua_write_us: t.fua_write_us,
        stats: t.stats,
        machine: machine_info(),
    })
}

/// What [`time_device`] measured on any device.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DeviceTimings {
    /// Size of the device in bytes.
    pub size_bytes: u64,
    /// Its block size.
    pub block_size: u32,
    /// A one-block write, submit to completion (not durable).
    pub write_4k_us: LatencyUs,
    /// A flush after a completed one-block write.
    pub write_flush_us: LatencyUs,
    /// A one-block FUA write.
    pub fua_write_us: LatencyUs,
    /// What the device did while timed.
    pub stats: DeviceStats,
}

/// Time one-block writes, flushes and FUA writes on `device`, `iterations` of each after a
/// warm-up. Overwrites its first blocks (at most 1024).
///
/// # Errors
/// The device's errors; [`ProbeError::BadInput`] for zero iterations.
pub fn time_device(device: &dyn Device, iterations: u32) -> Result<DeviceTimings, ProbeError> {
    let geometry = device.geometry();
    let block_size = geometry.block_size as usize;
    let region_block_count = geometry.block_count.min(REGION_BLOCK_COUNT_MAX);
    let region_bytes = usize::try_from(region_block_count).unwrap_or(0) * block_size;
    device.write_sync(vec![Write::new(0, IoBuf::zeroed(region_bytes))], WriteFlags::NONE)?;
    device.flush()?;
    let before = device.stats();

    let total = iterations + WARMUP_COUNT;
    let mut stamp = 0u64;
    let mut next_block = || {
        stamp += 1;
        (stamp % region_block_count, stamp)
    };
    let mut write_nanos = Vec::with_capacity(total as usize);
    let mut flush_nanos = Vec::with_capacity(total as usize);
    let mut fua_nanos = Vec::with_capacity(total as usize);
    for _ in 0..total {
        let (block, stamp) = next_block();
        let writes = stamped_write(block, block_size, stamp);
        let start = Instant::now();
        device.write_sync(writes, WriteFlags::NONE)?;
        write_nanos.push(elapsed_nanos(start));
    }
    for _ in 0..total {
        let (block, stamp) = next_block();
        device.write_sync(stamped_write(block, block_size, stamp), WriteFlags::NONE)?;
        let start = Instant::now();
        device.flush()?;
        flush_nanos.push(elapsed_nanos(start));
    }
    for _ in 0..total {
        let (block, stamp) = next_block();
        let writes = stamped_write(block, block_size, stamp);
        let start = Instant::now();
        device.write_sync(writes, WriteFlags::FUA)?;
        fua_nanos.push(elapsed_nanos(start));
    }
    let stats = device.stats() - before;

    let skip = WARMUP_COUNT as usize;
    let distribution = |samples: &[u64]| {
        LatencyUs::from_nanos(&samples[skip..])
            .ok_or_else(|| ProbeError::BadInput { reason: "no samples".to_string() })
    };
    Ok(DeviceTimings {
        size_bytes: geometry.size_bytes(),
        block_size: geometry.block_size,
        write_4k_us: distribution(&write_nanos)?,
        write_flush_us: distribution(&flush_nanos)?,
        fua_write_us: distribution(&fua_nanos)?,
        stats,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let samples: Vec<u64> = (1..=100).map(|i| i * 1000).collect();
        let l = LatencyUs::from_nanos(&samples).unwrap();
        assert_eq!((l.p50, l.p99, l.min, l.max), (50.0, 99.0, 1.0, 100.0));
        assert!((l.mean - 50.5).abs() < 1e-9);
        let one = LatencyUs::from_nanos(&[7000]).unwrap();
        assert_eq!((one.p50, one.p99), (7.0, 7.0));
        assert!(LatencyUs::from_nanos(&[]).is_none());
    }

    #[test]
    fn refuses_before_writing() {
        let dir = std::env::temp_dir().join(format!("tally-probe-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("data");
        std::fs::write(&file, b"precious").unwrap();
        let err = probe(&file, ProbeOptions::default()).unwrap_err();
        assert!(matches!(err, ProbeError::Refused { .. }), "{err}");
        assert_eq!(std::fs::read(&file).unwrap(), b"precious");
        let err = probe(&dir, ProbeOptions::default()).unwrap_err();
        assert!(err.is_bad_input(), "{err}");
        let err = probe(&dir.join("missing/x"), ProbeOptions::default()).unwrap_err();
        assert!(err.is_bad_input(), "{err}");
        let zero = ProbeOptions { iterations: 0, ..ProbeOptions::default() };
        assert!(probe(&dir.join("new"), zero).unwrap_err().is_bad_input());
        assert!(!dir.join("new").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn cleans_up_what_it_made() {
        let dir = std::env::temp_dir().join(format!("tally-probe-clean-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let quick = ProbeOptions { size_bytes: 1 << 20, iterations: 3, ..ProbeOptions::default() };

        let empty = dir.join("empty");
        std::fs::File::create(&empty).unwrap();
        let report = probe(&empty, quick).unwrap();
        assert!(!report.created);
        assert_eq!(report.size_bytes, 1 << 20);
        assert_eq!(std::fs::metadata(&empty).unwrap().len(), 0, "truncated back to empty");

        let kept = dir.join("kept");
        let report = probe(&kept, ProbeOptions { keep: true, ..quick }).unwrap();
        assert!(report.created);
        assert_eq!(std::fs::metadata(&kept).unwrap().len(), 1 << 20);
        assert!(report.fdatasync_us.p50 > 0.0 && report.ceiling_commits_per_sec > 0.0);
        assert_eq!(report.stats.flushes, u64::from(3 + WARMUP_COUNT));

        let gone = dir.join("gone");
        probe(&gone, quick).unwrap();
        assert!(!gone.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

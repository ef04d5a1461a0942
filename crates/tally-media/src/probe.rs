//! `probe`: measure what a file or block device costs per durable commit.
//!
//! It opens the target as a [`FileDevice`] (so it measures exactly the path Tally uses:
//! `O_DIRECT` and io_uring where available) and times, per iteration, a 4 KiB write, an
//! `fdatasync` after a 4 KiB write, and a 4 KiB FUA (`RWF_DSYNC`) write. One stream of commits
//! that each need one flush can go no faster than `1 / median flush latency`.
//!
//! Safety of the data on the target (the rule, in one place):
//! - a missing path is created (sparse, then preallocated with `fallocate`) and deleted at the
//!   end unless `keep`;
//! - an existing *empty* regular file is used, and truncated back to empty unless `keep`;
//! - anything else that exists (a non-empty file, a block device) is refused unless `force`,
//!   since probing overwrites the first blocks.
//!
//! The blocks written are pre-written once and flushed before timing, so the numbers are for
//! overwrites in place, as a log on preallocated segments sees them, not for first writes into
//! unwritten extents (which cost the file system a metadata commit on every flush).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::file::fallocate;
use crate::{
    Device, DeviceStats, EngineKind, FileDevice, FileOptions, IoBuf, MediaError, Write, WriteFlags,
};

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
        // Nearest-rank percentile: the smallest sample with at least q of them at or below it.
        let rank = |q: f64| {
            let index = (q * count as f64).ceil() as usize;
            sorted[index.clamp(1, count) - 1]
        };
        let us = |nanos: u64| nanos as f64 / 1000.0;
        let sum: u128 = sorted.iter().map(|&s| u128::from(s)).sum();
        Some(LatencyUs {
            p50: us(rank(0.50)),
            p99: us(rank(0.99)),
            min: us(sorted[0]),
            max: us(last),
            mean: sum as f64 / count as f64 / 1000.0,
        })
    }
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
    /// Preparing or cleaning up the file failed.
    #[error("{op} {} failed: {source}", path.display())]
    Io {
        /// The operation.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The device failed.
    #[error(transparent)]
    Media(#[from] MediaError),
}

impl ProbeError {
    /// Whether the caller asked for something impossible (as opposed to an I/O failure).
    #[must_use]
    pub fn is_bad_input(&self) -> bool {
        matches!(self, ProbeError::BadInput { .. } | ProbeError::Refused { .. })
    }
}

/// What to undo when the probe ends, successfully or not.
struct Cleanup {
    path: PathBuf,
    action: Option<CleanupAction>,
}

enum CleanupAction {
    Remove,
    TruncateToEmpty,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let outcome = match self.action {
            Some(CleanupAction::Remove) => std::fs::remove_file(&self.path),
            Some(CleanupAction::TruncateToEmpty) => {
                OpenOptions::new().write(true).open(&self.path).and_then(|f| f.set_len(0))
            }
            None => Ok(()),
        };
        if let Err(error) = outcome {
            tracing::warn!(path = %self.path.display(), %error, "could not clean up after probe");
        }
    }
}

fn io_error(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> ProbeError {
    let path = path.to_path_buf();
    move |source| ProbeError::Io { op, path, source }
}

/// Give `file` its size, sparse first, then preallocated where the file system can.
fn size_file(file: &File, path: &Path, size_bytes: u64) -> Result<(), ProbeError> {
    file.set_len(size_bytes).map_err(io_error("extend", path))?;
    if let Err(error) = fallocate(file, size_bytes) {
        tracing::warn!(path = %path.display(), %error, "fallocate failed; probing a sparse file");
    }
    Ok(())
}

/// Decide whether `path` may be probed, prepare it, and say what to undo afterwards.
fn prepare(path: &Path, options: &ProbeOptions) -> Result<(Cleanup, bool), ProbeError> {
    let mut cleanup = Cleanup { path: path.to_path_buf(), action: None };
    match std::fs::metadata(path) {
        Ok(metadata) if metadata.is_dir() => Err(ProbeError::BadInput {
            reason: format!("{} is a directory; give a file or block device path", path.display()),
        }),
        Ok(metadata) if metadata.file_type().is_block_device() => {
            if options.force {
                Ok((cleanup, false))
            } else {
                let reason = "it is a block device and probing overwrites its first blocks";
                Err(ProbeError::Refused { path: path.to_path_buf(), reason: reason.to_string() })
            }
        }
        Ok(metadata) if metadata.is_file() => {
            if metadata.len() == 0 {
                let file =
                    OpenOptions::new().write(true).open(path).map_err(io_error("open", path))?;
                if !options.keep {
                    cleanup.action = Some(CleanupAction::TruncateToEmpty);
                }
                size_file(&file, path, options.size_bytes)?;
                Ok((cleanup, false))
            } else if options.force {
                Ok((cleanup, false))
            } else {
                let reason = format!(
                    "it is a file of {} bytes that probing would overwrite",
                    metadata.len()
                );
                Err(ProbeError::Refused { path: path.to_path_buf(), reason })
            }
        }
        Ok(_) => Err(ProbeError::BadInput {
            reason: format!("{} is neither a regular file nor a block device", path.display()),
        }),
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            let parent = match path.parent() {
                Some(parent) if !parent.as_os_str().is_empty() => parent,
                _ => Path::new("."),
            };
            if !parent.is_dir() {
                return Err(ProbeError::BadInput {
                    reason: format!("directory {} does not exist", parent.display()),
                });
            }
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(path)
                .map_err(io_error("create", path))?;
            if !options.keep {
                cleanup.action = Some(CleanupAction::Remove);
            }
            size_file(&file, path, options.size_bytes)?;
            Ok((cleanup, true))
        }
        Err(error) => Err(io_error("stat", path)(error)),
    }
}

fn machine_info() -> MachineInfo {
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
/// [`ProbeError::Io`] / [`ProbeError::Media`] when the device fails.
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
    let (cleanup, created) = prepare(path, &options)?;
    let report = measure(path, &options, created);
    drop(cleanup);
    report
}

fn measure(path: &Path, options: &ProbeOptions, created: bool) -> Result<ProbeReport, ProbeError> {
    let device = FileDevice::open(path, FileOptions::default())?;
    let geometry = device.geometry();
    let block_size = geometry.block_size as usize;
    let region_block_count = geometry.block_count.min(REGION_BLOCK_COUNT_MAX);
    let region_bytes = usize::try_from(region_block_count).unwrap_or(0) * block_size;
    device.write_sync(vec![Write::new(0, IoBuf::zeroed(region_bytes))], WriteFlags::NONE)?;
    device.flush()?;
    let before = device.stats();

    let total = options.iterations + WARMUP_COUNT;
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
    let write_4k_us = distribution(&write_nanos)?;
    let fdatasync_us = distribution(&flush_nanos)?;
    let fua_write_us = distribution(&fua_nanos)?;
    let per_sec = |latency: &LatencyUs| 1e6 / latency.p50.max(1e-3);
    Ok(ProbeReport {
        path: path.to_path_buf(),
        created,
        size_bytes: geometry.size_bytes(),
        block_size: geometry.block_size,
        iterations: options.iterations,
        direct: device.direct(),
        direct_note: device.direct_fallback().map(str::to_string),
        io_uring: device.engine() == EngineKind::IoUring,
        io_uring_note: device.engine_fallback().map(str::to_string),
        engine: device.engine(),
        ceiling_commits_per_sec: per_sec(&fdatasync_us),
        ceiling_commits_per_sec_fua: per_sec(&fua_write_us),
        write_4k_us,
        fdatasync_us,
        fua_write_us,
        stats,
        machine: machine_info(),
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

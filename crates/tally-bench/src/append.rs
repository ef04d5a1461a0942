//! `tally bench peer append`: an ordered append stream, one writer, fixed-size blocks — the
//! write pattern of a log or a mail spool (ccNVMe fig. 11 with one job; issue #6 workloads 2
//! and 6).
//!
//! Systems:
//! - `posix-fsync`: `write` + `fsync` per block on a file in `--dir` (ext4, a Tally mount,
//!   anything): the only way POSIX offers to keep appends in order across a crash;
//! - `tally-fsync`: the same through the Tally library (`Fs::write` + `Fs::fsync`), no FUSE;
//! - `tally-barrier`: `Fs::write` + `Fs::barrier` per block: every append is ordered after the
//!   previous one, none waits for a flush. The window ends with `Fs::sync` **inside** it, so
//!   every counted append is durable when the clock stops — the comparison with fsync is fair.
//!
//! The stream stops at the deadline or after `bytes_max`, whichever comes first, so a fast
//! system never fills its image.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::PathBuf;
use std::time::Instant;

use tally_fs::{Owner, ROOT};

use crate::measure::{percentile_us, process_cpu_time};
use crate::peer::{fresh_tally, fs_err, io_err, payload, Window};
use crate::BenchError;

/// Which system runs the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppendSystem {
    /// `write` + `fsync` on a file in a directory.
    PosixFsync,
    /// Tally library, `write` + `fsync`.
    TallyFsync,
    /// Tally library, `write` + `barrier`, one `sync` at the end of the window.
    TallyBarrier,
}

impl AppendSystem {
    /// The name used on the command line and in reports.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            AppendSystem::PosixFsync => "posix-fsync",
            AppendSystem::TallyFsync => "tally-fsync",
            AppendSystem::TallyBarrier => "tally-barrier",
        }
    }
}

impl std::str::FromStr for AppendSystem {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        [AppendSystem::PosixFsync, AppendSystem::TallyFsync, AppendSystem::TallyBarrier]
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| format!("unknown system {s:?}: posix-fsync, tally-fsync, tally-barrier"))
    }
}

/// What one append window runs.
#[derive(Debug, Clone)]
pub struct AppendOptions {
    /// System.
    pub system: AppendSystem,
    /// Directory for `posix-fsync` (a file `append.dat` is created there and removed after).
    pub dir: Option<PathBuf>,
    /// Block device or image for the Tally systems (a fresh file system is made on it).
    pub device: Option<PathBuf>,
    /// Bytes per append.
    pub block_bytes: usize,
    /// Length of the window, seconds.
    pub seconds: f64,
    /// Stop early after this many bytes.
    pub bytes_max: u64,
}

/// Run one window.
///
/// # Errors
/// A missing `dir`/`device` for the system, and any I/O or file-system failure.
pub fn run(o: &AppendOptions) -> Result<Window, BenchError> {
    if o.block_bytes == 0 || o.seconds.is_nan() || o.seconds <= 0.0 {
        return Err(BenchError::BadInput { reason: "block and seconds must be > 0".into() });
    }
    let block = payload(o.block_bytes, 1);
    let count_max = o.bytes_max / o.block_bytes as u64;
    let mut lat_ns: Vec<u64> = Vec::new();
    let mut window = match o.system {
        AppendSystem::PosixFsync => {
            let dir = o
                .dir
                .as_ref()
                .ok_or_else(|| BenchError::BadInput { reason: "posix-fsync needs --dir".into() })?;
            let path = dir.join("append.dat");
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .truncate(true)
                .write(true)
                .custom_flags(libc::O_APPEND)
                .open(&path)
                .map_err(io_err("create", &path))?;
            f.sync_all().map_err(io_err("fsync", &path))?;
            let cpu0 = process_cpu_time();
            let start = Instant::now();
            let mut n = 0u64;
            while n < count_max && start.elapsed().as_secs_f64() < o.seconds {
                let t = Instant::now();
                f.write_all(&block).map_err(io_err("append to", &path))?;
                f.sync_all().map_err(io_err("fsync", &path))?;
                lat_ns.push(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX));
                n += 1;
            }
            let secs = start.elapsed().as_secs_f64();
            let w = Window::new("append", o.system.name(), n, secs, cpu_secs(cpu0));
            drop(f);
            std::fs::remove_file(&path).map_err(io_err("remove", &path))?;
            w
        }
        AppendSystem::TallyFsync | AppendSystem::TallyBarrier => {
            let device = o.device.as_ref().ok_or_else(|| BenchError::BadInput {
                reason: format!("{} needs --device", o.system.name()),
            })?;
            let (dev, fs) = fresh_tally(device)?;
            let me = Owner { uid: 0, gid: 0 };
            let ino = fs.create(None, ROOT, b"append.dat", 0o644, me).map_err(fs_err)?.ino;
            fs.sync().map_err(fs_err)?;
            let before = dev.stats();
            let cpu0 = process_cpu_time();
            let start = Instant::now();
            let mut n = 0u64;
            while n < count_max && start.elapsed().as_secs_f64() < o.seconds {
                let t = Instant::now();
                fs.write(None, ino, n * o.block_bytes as u64, &block).map_err(fs_err)?;
                if o.system == AppendSystem::TallyFsync {
                    fs.fsync(ino).map_err(fs_err)?;
                } else {
                    fs.barrier(ino).map_err(fs_err)?;
                }
                lat_ns.push(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX));
                n += 1;
            }
            // Inside the window: what was counted is durable when the clock stops.
            fs.sync().map_err(fs_err)?;
            let secs = start.elapsed().as_secs_f64();
            let mut w = Window::new("append", o.system.name(), n, secs, cpu_secs(cpu0));
            w.tally_device = Some(dev.stats() - before);
            fs.unmount().map_err(fs_err)?;
            w
        }
    };
    lat_ns.sort_unstable();
    window.payload_bytes = window.ops * o.block_bytes as u64;
    window.latency_p50_us = Some(percentile_us(&lat_ns, 0.50));
    window.latency_p99_us = Some(percentile_us(&lat_ns, 0.99));
    Ok(window)
}

/// CPU seconds this process used since `cpu0`.
pub(crate) fn cpu_secs(cpu0: std::time::Duration) -> f64 {
    process_cpu_time().saturating_sub(cpu0).as_secs_f64()
}

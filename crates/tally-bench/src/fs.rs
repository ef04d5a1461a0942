//! `tally bench fs`: the file system's stream policies and its two mount paths, side by side in
//! one run on one file.
//!
//! **Streams.** For each policy — per file (`ino % streams`), per thread, and a single stream
//! (total order) — a fresh file system is made on the target and `threads` threads each run
//! `files` rounds of: create a file in the thread's own directory, write `write_bytes` to it,
//! `fsync` it. Reported per policy: rounds per second (median and range over `runs`), device
//! flushes per fsync, and CPU time per round. This is the measurement behind the default
//! (DESIGN.md: "per thread or per file — choose, measure, document").
//!
//! **Mount.** The last per-file image is unmounted cleanly (snapshot), mounted (timed: the
//! snapshot path), then dropped without unmount (a crash) and mounted again (timed: the scan
//! and replay path). Both mounts must find every file.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use tally_fs::{Fs, MkfsOptions, MountOptions, MountReport, Owner, StreamPolicy, ROOT};
use tally_media::{Device, DirectMode, FileDevice, FileOptions};

use crate::measure::{process_cpu_time, Spread};
use crate::target::Target;
use crate::BenchError;

/// What `tally bench fs` runs.
#[derive(Debug, Clone)]
pub struct FsOptions {
    /// File to run on.
    pub path: PathBuf,
    /// Size of the image, MiB.
    pub size_mib: u64,
    /// Streams of the multi-stream file systems.
    pub streams: u16,
    /// Threads.
    pub threads: u32,
    /// Rounds (create + write + fsync) per thread.
    pub files: u32,
    /// Bytes written per file.
    pub write_bytes: usize,
    /// Repetitions per policy.
    pub runs: u32,
    /// Keep the file afterwards.
    pub keep: bool,
    /// Use a file that holds data.
    pub force: bool,
}

impl Default for FsOptions {
    fn default() -> Self {
        FsOptions {
            path: PathBuf::new(),
            size_mib: 512,
            streams: 4,
            threads: 4,
            files: 500,
            write_bytes: 4096,
            runs: 3,
            keep: false,
            force: false,
        }
    }
}

/// One policy's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PolicyRow {
    /// `per-file`, `per-thread` or `single-stream`.
    pub policy: String,
    /// Streams the file system had.
    pub streams: u16,
    /// Rounds per second.
    pub rounds_per_s: Spread,
    /// Device flushes per fsync.
    pub flushes_per_fsync: Spread,
    /// Process CPU microseconds per round.
    pub cpu_us_per_round: Spread,
}

/// The two mount paths.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MountRow {
    /// Mount after a clean unmount.
    pub snapshot: MountReport,
    /// Mount after a crash.
    pub scan: MountReport,
    /// Scan time / snapshot time.
    pub scan_over_snapshot: f64,
}

/// Everything `tally bench fs` measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FsReport {
    /// Threads.
    pub threads: u32,
    /// Rounds per thread.
    pub files: u32,
    /// Bytes per write.
    pub write_bytes: usize,
    /// Per policy.
    pub policies: Vec<PolicyRow>,
    /// Mount paths.
    pub mount: MountRow,
    /// CPUs available.
    pub cpu_count: u32,
}

/// Run the benchmark; `progress` receives one line per step.
///
/// # Errors
/// Bad options or a refused path before anything is written; device and file-system failures;
/// a mount that does not find every file.
pub fn run(o: &FsOptions, progress: &dyn Fn(&str)) -> Result<FsReport, BenchError> {
    if o.threads == 0 || o.files == 0 || o.runs == 0 || o.streams == 0 || o.size_mib < 64 {
        return Err(BenchError::BadInput {
            reason: "threads, files, runs and streams must be at least 1, the size at least 64 MiB"
                .into(),
        });
    }
    let size_bytes = o.size_mib << 20;
    progress(&format!("preparing {} ({} MiB)", o.path.display(), o.size_mib));
    let target = Target::prepare(&o.path, size_bytes, false, o.keep, o.force)?;
    let file_options = FileOptions { direct: DirectMode::On, ..FileOptions::default() };
    let fs_err = |e: tally_fs::FsError| BenchError::Failed { reason: e.to_string() };
    let policies = [
        ("per-file", StreamPolicy::PerFile, o.streams),
        ("per-thread", StreamPolicy::PerThread, o.streams),
        ("single-stream", StreamPolicy::PerFile, 1),
    ];
    let mut rows = Vec::new();
    let mut last_image = None;
    for (name, policy, streams) in policies {
        let (mut rate, mut flushes, mut cpu) = (Vec::new(), Vec::new(), Vec::new());
        for run in 0..o.runs {
            progress(&format!("{name}: run {}/{}", run + 1, o.runs));
            let dev: Arc<dyn Device> = Arc::new(FileDevice::open(target.path(), file_options)?);
            let mkfs = MkfsOptions { streams, segment_blocks: 1024, uuid: None };
            Fs::mkfs(dev.clone(), &mkfs).map_err(fs_err)?;
            let fs = Arc::new(
                Fs::mount(dev.clone(), MountOptions { streams: policy, ..MountOptions::default() })
                    .map_err(fs_err)?,
            );
            let me = Owner { uid: 0, gid: 0 };
            let dirs: Vec<u64> = (0..o.threads)
                .map(|t| fs.mkdir(None, ROOT, format!("t{t}").as_bytes(), 0o755, me).map(|a| a.ino))
                .collect::<Result<_, _>>()
                .map_err(fs_err)?;
            fs.sync().map_err(fs_err)?;
            let before = dev.stats();
            let cpu0 = process_cpu_time();
            let start = Instant::now();
            let results: Vec<Result<(), tally_fs::FsError>> = std::thread::scope(|s| {
                let handles: Vec<_> = dirs
                    .iter()
                    .map(|&dir| {
                        let fs = fs.clone();
                        s.spawn(move || {
                            let data = vec![0x5a; o.write_bytes];
                            for i in 0..o.files {
                                let f =
                                    fs.create(None, dir, format!("f{i}").as_bytes(), 0o644, me)?;
                                fs.write(None, f.ino, 0, &data)?;
                                fs.fsync(f.ino)?;
                            }
                            Ok(())
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join()
                            .unwrap_or(Err(tally_fs::FsError::Invalid("benchmark thread panicked")))
                    })
                    .collect()
            });
            let elapsed = start.elapsed().as_secs_f64();
            let cpu_used = (process_cpu_time() - cpu0).as_secs_f64();
            results.into_iter().collect::<Result<Vec<()>, _>>().map_err(fs_err)?;
            let rounds = f64::from(o.threads) * f64::from(o.files);
            let d = dev.stats() - before;
            rate.push(rounds / elapsed);
            flushes.push(d.flushes as f64 / rounds);
            cpu.push(cpu_used * 1e6 / rounds);
            drop(fs);
            last_image = Some(dev);
        }
        rows.push(PolicyRow {
            policy: name.to_string(),
            streams,
            rounds_per_s: Spread::of(rate),
            flushes_per_fsync: Spread::of(flushes),
            cpu_us_per_round: Spread::of(cpu),
        });
    }

    // Mount paths, on the last image (single-stream: its files are all there, it was synced
    // by the fsyncs; a clean unmount first).
    progress("mount: clean unmount, snapshot mount, crash, scan mount");
    let dev = last_image.ok_or_else(|| BenchError::Failed { reason: "no image".into() })?;
    let expect = u64::from(o.threads) * (u64::from(o.files) + 1) + 1;
    let fs = Fs::mount(dev.clone(), MountOptions::default()).map_err(fs_err)?;
    fs.unmount().map_err(fs_err)?;
    let fs = Fs::mount(dev.clone(), MountOptions::default()).map_err(fs_err)?;
    let snapshot = fs.mount_report();
    drop(fs); // crash
    let fs = Fs::mount(dev, MountOptions::default()).map_err(fs_err)?;
    let scan = fs.mount_report();
    if !snapshot.from_snapshot
        || scan.from_snapshot
        || snapshot.inodes != expect
        || scan.inodes != expect
    {
        return Err(BenchError::Failed {
            reason: format!(
                "mounts found {} and {} inodes, expected {expect}",
                snapshot.inodes, scan.inodes
            ),
        });
    }
    drop(fs);
    drop(target);
    Ok(FsReport {
        threads: o.threads,
        files: o.files,
        write_bytes: o.write_bytes,
        policies: rows,
        mount: MountRow {
            scan_over_snapshot: scan.time.as_secs_f64() / snapshot.time.as_secs_f64().max(1e-9),
            snapshot,
            scan,
        },
        cpu_count: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
    })
}

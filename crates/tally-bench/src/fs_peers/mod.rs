//! `tally bench fs-peers`: the file system against ext4 (`data=ordered`) and SQLite, in one run,
//! on two block devices of the same size (loop devices over same-size files in one directory,
//! set up by `bench/fs.sh`, so both stacks pay the same layers underneath). Issue #4's targets:
//!
//! - **append**: 4 KiB append + fsync on a file of each thread's own, 1 and 8 threads;
//! - **create**: create + write 4 KiB + fsync + close, each thread in its own directory;
//! - **atomic**: one transaction updating 2 or 4 files (4 KiB each) with `commit_durable`,
//!   against SQLite with the same number of ATTACHed databases in rollback-journal mode
//!   ([`sqlite`]), files on the same ext4;
//! - **mount** of 100,000 files after a clean unmount and after a crash ([`mount`]);
//! - **cleaning**: write amplification of random overwrites at 90 % full ([`clean`]).
//!
//! Tally runs through the library on a [`tally_media::FileDevice`] opened (`O_DIRECT`) on its
//! block device, freshly made for every run; ext4 and SQLite run through `std::fs` and
//! `rusqlite` in a fresh directory of the mounted ext4 for every run. Runs alternate (Tally, then
//! the peer, then Tally again …), so drift on this shared machine hits both alike; every ratio is
//! taken per run and of the medians. Flushes and bytes written per operation come from the
//! kernel's counters of each block device ([`blockdev`]), identical for both sides.

use std::path::PathBuf;
use std::sync::{Arc, Barrier};
use std::time::Instant;

use tally_fs::{Fs, FsError, MkfsOptions, MountOptions, Owner};
use tally_media::{Device, DirectMode, FileDevice, FileOptions};

use crate::measure::{process_cpu_time, Spread};
use crate::BenchError;

pub mod blockdev;
pub mod clean;
pub mod latency;
pub mod mount;
pub mod sqlite;
mod workloads;

use blockdev::{BlockCounters, BlockDev};

/// The sections a run can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Section {
    /// 4 KiB append + fsync, 1 and 8 threads, against ext4.
    Append,
    /// create + write + fsync + close, 1 and 8 threads, against ext4.
    Create,
    /// Atomic update of 2 and 4 files against SQLite with ATTACHed databases.
    Atomic,
    /// Mount of many files after a clean unmount and after a crash.
    Mount,
    /// Write amplification of cleaning under a 90 %-full overwrite workload.
    Clean,
    /// create + write + fsync + close, every thread in one shared directory, against ext4
    /// (issue #16; not in [`Section::ALL`]).
    CreateShared,
    /// 4 appenders' fsync latency on a 90 %-full file system, alone and beside a cleaning
    /// thread (issue #16; not in [`Section::ALL`]).
    Mixed,
    /// fsync latency of a small file alone and beside a streaming writer, against ext4
    /// (issue #16; not in [`Section::ALL`]).
    Isolation,
}

impl Section {
    /// The sections of issue #4, in the order they run (the default).
    pub const ALL: [Section; 5] =
        [Section::Append, Section::Create, Section::Atomic, Section::Mount, Section::Clean];
}

/// What `tally bench fs-peers` runs.
#[derive(Debug, Clone)]
pub struct PeersOptions {
    /// Block device (or file) Tally runs on; overwritten.
    pub tally_dev: PathBuf,
    /// Directory on the mounted ext4 the peers run in (a fresh subdirectory per run).
    pub ext4_dir: PathBuf,
    /// Sections to run.
    pub sections: Vec<Section>,
    /// Seconds per timed run.
    pub seconds: f64,
    /// Runs per system and workload.
    pub runs: u32,
    /// Thread counts of the append and create workloads.
    pub threads: Vec<u32>,
    /// Files updated per atomic transaction.
    pub atomic_files: Vec<u32>,
    /// Files made for the mount section.
    pub mount_files: u32,
    /// Size of the file system of the cleaning section, MiB (the start of `tally_dev`).
    pub clean_mib: u64,
    /// Fractions of the cleaning file system filled before overwriting, one measurement each;
    /// the last is the baseline.
    pub clean_fills: Vec<f64>,
    /// Log streams of the cleaning file system.
    pub clean_streams: u16,
    /// Size of the mixed run's file system, MiB (the start of `tally_dev`).
    pub mixed_mib: u64,
}

impl Default for PeersOptions {
    fn default() -> Self {
        PeersOptions {
            tally_dev: PathBuf::new(),
            ext4_dir: PathBuf::new(),
            sections: Section::ALL.to_vec(),
            seconds: 3.0,
            runs: 3,
            threads: vec![1, 8],
            atomic_files: vec![2, 4],
            mount_files: 100_000,
            clean_mib: 64,
            clean_fills: vec![0.9, 0.75, 0.25],
            clean_streams: 4,
            mixed_mib: 128,
        }
    }
}

/// One system's figures for one workload, over the runs.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Side {
    /// Operations (or transactions) per second.
    pub ops_per_s: Spread,
    /// Flushes that reached the block device, per operation.
    pub flushes_per_op: Spread,
    /// KiB the block device was sent, per operation.
    pub kib_written_per_op: Spread,
    /// Process CPU (user + system, all threads) per operation, µs; kernel threads (jbd2, the
    /// loop device's workers) are not in it.
    pub cpu_us_per_op: Spread,
}

/// One workload, Tally beside its peer.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PeerRow {
    /// `append`, `create`, `create-shared` or `atomic`.
    pub workload: String,
    /// Threads (append, create) or files per transaction (atomic).
    pub width: u32,
    /// `ext4` or `sqlite`.
    pub peer: String,
    /// Tally's figures.
    pub tally: Side,
    /// The peer's figures.
    pub other: Side,
    /// Tally ops/s ÷ peer ops/s, run by run.
    pub ratio_per_run: Spread,
    /// Ratio of the medians.
    pub ratio_of_medians: f64,
    /// The target for the ratio.
    pub target: f64,
    /// Whether the ratio of the medians reaches the target.
    pub met: bool,
    /// Flushes per commit Tally's own device counters saw (atomic only; the block-layer figure
    /// is in `tally`).
    pub tally_device_flushes_per_op: Option<Spread>,
}

/// Everything `tally bench fs-peers` measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PeersReport {
    /// Seconds per timed run.
    pub seconds: f64,
    /// Runs per system and workload.
    pub runs: u32,
    /// Tally's device (`MAJ:MIN`) and its size in bytes.
    pub tally_device: (String, u64),
    /// ext4's device (`MAJ:MIN`).
    pub ext4_device: String,
    /// Workloads against a peer.
    pub rows: Vec<PeerRow>,
    /// The mount section.
    pub mount: Option<mount::MountSection>,
    /// The cleaning section.
    pub clean: Option<clean::CleanSection>,
    /// The mixed section (appenders beside a cleaner).
    pub mixed: Option<latency::MixedSection>,
    /// The fsync isolation section.
    pub isolation: Option<latency::IsolationSection>,
    /// Version of the SQLite measured.
    pub sqlite_version: String,
    /// CPUs available.
    pub cpu_count: u32,
}

/// One timed run's raw figures.
#[derive(Debug, Clone, Copy)]
struct Sample {
    ops: u64,
    secs: f64,
    cpu_s: f64,
    block: BlockCounters,
}

impl Sample {
    fn per_op(&self) -> (f64, f64, f64, f64) {
        let ops = self.ops.max(1) as f64;
        (
            self.ops as f64 / self.secs,
            self.block.flushes as f64 / ops,
            self.block.bytes_written as f64 / 1024.0 / ops,
            self.cpu_s * 1e6 / ops,
        )
    }
}

fn side(samples: &[Sample]) -> Side {
    let v: Vec<_> = samples.iter().map(Sample::per_op).collect();
    Side {
        ops_per_s: Spread::of(v.iter().map(|x| x.0)),
        flushes_per_op: Spread::of(v.iter().map(|x| x.1)),
        kib_written_per_op: Spread::of(v.iter().map(|x| x.2)),
        cpu_us_per_op: Spread::of(v.iter().map(|x| x.3)),
    }
}

pub(crate) fn fs_err(e: FsError) -> BenchError {
    BenchError::Failed { reason: e.to_string() }
}

pub(crate) fn io_err(what: &str) -> impl Fn(std::io::Error) -> BenchError + '_ {
    move |e| BenchError::Failed { reason: format!("{what}: {e}") }
}

/// The owner of everything the benchmark makes.
pub(crate) const ME: Owner = Owner { uid: 0, gid: 0 };

/// Run `op` on one thread per state until `seconds` have passed (every thread starts at once),
/// counting operations; `dev` is the block device whose counters are read around it.
fn timed<S: Send>(
    states: Vec<S>,
    seconds: f64,
    dev: &BlockDev,
    op: impl Fn(&mut S, u64) -> Result<(), BenchError> + Sync,
) -> Result<Sample, BenchError> {
    let barrier = Barrier::new(states.len() + 1);
    let duration = std::time::Duration::from_secs_f64(seconds);
    let (results, before, cpu0, start) = std::thread::scope(|s| {
        let handles: Vec<_> = states
            .into_iter()
            .map(|mut state| {
                let (barrier, op) = (&barrier, &op);
                s.spawn(move || -> Result<u64, BenchError> {
                    barrier.wait();
                    let start = Instant::now();
                    let mut n = 0u64;
                    while start.elapsed() < duration {
                        op(&mut state, n)?;
                        n += 1;
                    }
                    Ok(n)
                })
            })
            .collect();
        let before = dev.read();
        let cpu0 = process_cpu_time();
        let start = Instant::now();
        barrier.wait();
        let results: Vec<Result<u64, BenchError>> = handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(BenchError::Failed { reason: "a benchmark thread panicked".into() })
                })
            })
            .collect();
        (results, before, cpu0, start)
    });
    let secs = start.elapsed().as_secs_f64();
    let cpu_s = (process_cpu_time() - cpu0).as_secs_f64();
    let block = dev.read()? - before?;
    let mut ops = 0;
    for r in results {
        ops += r?;
    }
    Ok(Sample { ops, secs, cpu_s, block })
}

/// Tally's device and a fresh file system on it.
pub(crate) struct TallySide {
    pub(crate) dev: Arc<dyn Device>,
    pub(crate) block: BlockDev,
}

impl TallySide {
    fn open(path: &std::path::Path) -> Result<TallySide, BenchError> {
        let block = BlockDev::of(path)?;
        let dev: Arc<dyn Device> = Arc::new(FileDevice::open(path, direct())?);
        Ok(TallySide { dev, block })
    }

    /// A fresh file system with `streams` streams, mounted.
    fn fresh(&self, streams: u16) -> Result<Arc<Fs>, BenchError> {
        let mkfs = MkfsOptions { streams, segment_blocks: 1024, uuid: None };
        Fs::mkfs(self.dev.clone(), &mkfs).map_err(fs_err)?;
        Ok(Arc::new(Fs::mount(self.dev.clone(), MountOptions::default()).map_err(fs_err)?))
    }
}

pub(crate) fn direct() -> FileOptions {
    FileOptions { direct: DirectMode::On, ..FileOptions::default() }
}

/// Run the sections asked for; `progress` receives one line per step.
///
/// # Errors
/// Bad options or paths before anything is written; device, file-system, ext4 and SQLite
/// failures; a mount that does not find every file.
pub fn run(o: &PeersOptions, progress: &dyn Fn(&str)) -> Result<PeersReport, BenchError> {
    if o.runs == 0
        || !o.seconds.is_finite()
        || o.seconds <= 0.0
        || o.threads.contains(&0)
        || o.atomic_files.contains(&0)
    {
        return Err(BenchError::BadInput {
            reason: "runs, seconds, threads and files per transaction must be positive".into(),
        });
    }
    if !o.ext4_dir.is_dir() {
        return Err(BenchError::BadInput {
            reason: format!("{} is not a directory (the mounted ext4)", o.ext4_dir.display()),
        });
    }
    let tally = TallySide::open(&o.tally_dev)?;
    let ext4 = BlockDev::of(&o.ext4_dir)?;
    if ext4.id == tally.block.id {
        return Err(BenchError::BadInput {
            reason: "the ext4 directory lives on Tally's device; give two devices".into(),
        });
    }
    let mut rows = Vec::new();
    let cx = workloads::Cx { o, tally: &tally, ext4: &ext4, progress };
    for section in &o.sections {
        match section {
            Section::Append | Section::Create | Section::CreateShared => {
                for &t in &o.threads {
                    rows.push(workloads::threads(&cx, *section, t)?);
                }
            }
            Section::Atomic => {
                for &n in &o.atomic_files {
                    rows.push(workloads::atomic(&cx, n)?);
                }
            }
            Section::Mount | Section::Clean | Section::Mixed | Section::Isolation => {}
        }
    }
    let mount = if o.sections.contains(&Section::Mount) {
        Some(mount::run(&tally, o.mount_files, o.runs, progress)?)
    } else {
        None
    };
    let clean = if o.sections.contains(&Section::Clean) {
        Some(clean::run(&tally, o.clean_mib, &o.clean_fills, o.clean_streams, o.runs, progress)?)
    } else {
        None
    };
    let mixed = if o.sections.contains(&Section::Mixed) {
        Some(latency::mixed(&tally, o.mixed_mib, o.seconds, o.runs, progress)?)
    } else {
        None
    };
    let isolation = if o.sections.contains(&Section::Isolation) {
        Some(latency::isolation(&tally, &o.ext4_dir, o.seconds, o.runs, progress)?)
    } else {
        None
    };
    let geometry = tally.dev.geometry();
    Ok(PeersReport {
        seconds: o.seconds,
        runs: o.runs,
        tally_device: (
            tally.block.id.clone(),
            geometry.block_count * u64::from(geometry.block_size),
        ),
        ext4_device: ext4.id.clone(),
        rows,
        mount,
        clean,
        mixed,
        isolation,
        sqlite_version: rusqlite::version().to_string(),
        cpu_count: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
    })
}

/// A row from the interleaved samples of both sides.
fn row(
    workload: &str,
    width: u32,
    peer: &str,
    target: f64,
    tally: &[Sample],
    other: &[Sample],
) -> PeerRow {
    let (t, p) = (side(tally), side(other));
    let per_run =
        tally.iter().zip(other).map(|(a, b)| a.per_op().0 / b.per_op().0.max(f64::MIN_POSITIVE));
    let ratio_of_medians = t.ops_per_s.median / p.ops_per_s.median.max(f64::MIN_POSITIVE);
    PeerRow {
        workload: workload.into(),
        width,
        peer: peer.into(),
        tally: t,
        other: p,
        ratio_per_run: Spread::of(per_run),
        ratio_of_medians,
        target,
        met: ratio_of_medians >= target,
        tally_device_flushes_per_op: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(ops: u64, secs: f64, flushes: u64) -> Sample {
        let block = BlockCounters { flushes, bytes_written: ops * 8192 };
        Sample { ops, secs, cpu_s: 0.1, block }
    }

    #[test]
    fn ratios_are_taken_run_by_run_and_of_the_medians() {
        let tally = [sample(300, 1.0, 300), sample(200, 1.0, 200), sample(400, 1.0, 400)];
        let ext4 = [sample(100, 1.0, 200), sample(100, 1.0, 200), sample(200, 1.0, 400)];
        let r = row("append", 1, "ext4", 1.8, &tally, &ext4);
        assert_eq!(r.tally.ops_per_s.median, 300.0);
        assert_eq!(r.other.ops_per_s.median, 100.0);
        assert_eq!(r.ratio_of_medians, 3.0);
        assert_eq!((r.ratio_per_run.min, r.ratio_per_run.max), (2.0, 3.0));
        assert_eq!(r.tally.flushes_per_op.median, 1.0);
        assert_eq!(r.other.flushes_per_op.median, 2.0);
        assert_eq!(r.tally.kib_written_per_op.median, 8.0);
        assert!(r.met);
        assert!(!row("append", 1, "ext4", 3.5, &tally, &ext4).met);
    }
}

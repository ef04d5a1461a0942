//! `tally bench crash-mount`: how long a mount after a crash takes as the history grows while
//! what is live stays the same (issue 15: recovery bounded by what is live, not by what was ever
//! written).
//!
//! For each live set — a few large files, or many small ones — a fresh file system is made on
//! the target file and filled with the live set; then random overwrites of the live files (each
//! its own transaction, an `fsync`-equivalent `sync` every 4 MiB) are written until the history
//! reaches each of the sizes asked for, ascending, on the same image. At each size the file
//! system is dropped without unmounting (a crash: nothing more is written, the online
//! checkpoints and what followed them are all the image has) and mounted again, `runs` times:
//! the mount's time, blocks read and transactions replayed are what is reported. Then, as the
//! reference in the same run, a clean unmount and a mount from its snapshot, `runs` times. The
//! writing then goes on from that mount.
//!
//! Every mount must find the live set's inodes; anything else is an error.

use std::path::PathBuf;
use std::sync::Arc;

use tally_fs::{Fs, Ino, MkfsOptions, MountOptions, MountReport, Owner, ROOT};
use tally_media::{Device, DirectMode, FileDevice, FileOptions};

use crate::measure::Spread;
use crate::target::Target;
use crate::BenchError;

/// Bytes per overwrite of a large file.
const LARGE_WRITE: usize = 64 << 10;
/// Size of each large file.
const LARGE_FILE: u64 = 16 << 20;
/// Bytes per overwrite of a small file (two blocks, written at offset 0).
const SMALL_WRITE: usize = 8 << 10;
/// Small files per directory and per creating transaction.
const SMALL_PER_DIR: u32 = 1000;
const SMALL_PER_TX: u32 = 100;
/// A sync after this many bytes of overwrites.
const SYNC_EVERY: u64 = 4 << 20;
/// Below this many files the live set is large files, else small ones.
const MANY: u32 = 1000;

/// Issue 15's bounds on a mount after a crash: a few live files, and 100,000.
pub const FEW_TARGET_S: f64 = 0.3;
/// See [`FEW_TARGET_S`].
pub const MANY_TARGET_S: f64 = 1.0;

const ME: Owner = Owner { uid: 0, gid: 0 };

/// What `tally bench crash-mount` runs.
#[derive(Debug, Clone)]
pub struct CrashMountOptions {
    /// File to run on.
    pub path: PathBuf,
    /// Size of the image, MiB.
    pub image_mib: u64,
    /// Live sets, in files (under 1,000: files of 16 MiB; else files of 8 KiB).
    pub live_files: Vec<u32>,
    /// History sizes to crash at, MiB of overwrites (ascending).
    pub history_mib: Vec<u64>,
    /// Timed mounts of each kind at each point.
    pub runs: u32,
    /// Keep the file afterwards.
    pub keep: bool,
    /// Use a file that holds data.
    pub force: bool,
}

impl Default for CrashMountOptions {
    fn default() -> Self {
        CrashMountOptions {
            path: PathBuf::new(),
            image_mib: 3072,
            live_files: vec![3, 100_000],
            history_mib: vec![100, 1024, 4096],
            runs: 3,
            keep: false,
            force: false,
        }
    }
}

/// One point: a live set after a history.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CrashMountRow {
    /// Live files.
    pub live_files: u32,
    /// Bytes of live file data.
    pub live_bytes: u64,
    /// Overwrites written so far (the creation of the live set not counted), MiB.
    pub history_mib: u64,
    /// Mounts after the crash, seconds.
    pub crash_mount_s: Spread,
    /// Blocks the last of them read.
    pub crash_blocks_read: u64,
    /// Log transactions it replayed.
    pub crash_replayed: u64,
    /// It started from a checkpoint snapshot.
    pub from_checkpoint: bool,
    /// Mounts after a clean unmount (snapshot), seconds: the reference.
    pub clean_mount_s: Spread,
    /// Blocks such a mount read.
    pub clean_blocks_read: u64,
    /// Crash mount ÷ clean mount, medians.
    pub crash_over_clean: f64,
    /// Issue 15's bound for this live set, seconds.
    pub target_s: f64,
    /// Whether the median crash mount is within it.
    pub met: bool,
}

/// Everything `tally bench crash-mount` measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CrashMountReport {
    /// Image size, MiB.
    pub image_mib: u64,
    /// The replay budget the mounts used (the library's default), MiB.
    pub replay_budget_mib: u64,
    /// One row per live set and history size.
    pub rows: Vec<CrashMountRow>,
    /// Load average (1 min) at the start and at the end.
    pub load: (f64, f64),
    /// CPUs available.
    pub cpu_count: u32,
}

fn fs_err(e: tally_fs::FsError) -> BenchError {
    BenchError::Failed { reason: e.to_string() }
}

fn load_1min() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

/// The live set on a fresh file system: its inodes and the bytes each overwrite writes.
fn make_live(fs: &Fs, files: u32, progress: &dyn Fn(&str)) -> Result<Vec<Ino>, BenchError> {
    progress(&format!("making {files} live files"));
    let mut inos = Vec::with_capacity(files as usize);
    if files < MANY {
        let chunk = vec![0x5au8; 1 << 20];
        for i in 0..files {
            let a =
                fs.create(None, ROOT, format!("big{i}").as_bytes(), 0o644, ME).map_err(fs_err)?;
            for off in (0..LARGE_FILE).step_by(chunk.len()) {
                fs.write(None, a.ino, off, &chunk).map_err(fs_err)?;
            }
            inos.push(a.ino);
        }
    } else {
        let data = vec![0xa5u8; SMALL_WRITE];
        let mut dir = ROOT;
        let mut made = 0;
        while made < files {
            let tx = fs.begin().map_err(fs_err)?;
            let batch = SMALL_PER_TX.min(files - made);
            let result = (made..made + batch).try_for_each(|i| {
                if i % SMALL_PER_DIR == 0 {
                    let name = format!("d{}", i / SMALL_PER_DIR);
                    dir = fs.mkdir(Some(&tx), ROOT, name.as_bytes(), 0o755, ME)?.ino;
                }
                let a = fs.create(Some(&tx), dir, format!("f{i}").as_bytes(), 0o644, ME)?;
                fs.write(Some(&tx), a.ino, 0, &data)?;
                inos.push(a.ino);
                Ok(())
            });
            if let Err(e) = result {
                let _ = fs.abort(tx);
                return Err(fs_err(e));
            }
            fs.commit(tx).map_err(fs_err)?;
            made += batch;
        }
    }
    fs.sync().map_err(fs_err)?;
    Ok(inos)
}

/// Overwrite random live files until `bytes` more are written.
fn overwrite(fs: &Fs, inos: &[Ino], bytes: u64, rng: &mut fastrand::Rng) -> Result<(), BenchError> {
    let large = inos.len() < MANY as usize;
    let mut buf = vec![0u8; if large { LARGE_WRITE } else { SMALL_WRITE }];
    let (mut written, mut since_sync) = (0u64, 0u64);
    while written < bytes {
        let ino = inos[rng.usize(..inos.len())];
        let offset =
            if large { rng.u64(..LARGE_FILE / LARGE_WRITE as u64) * LARGE_WRITE as u64 } else { 0 };
        rng.fill(&mut buf[..64]);
        fs.write(None, ino, offset, &buf).map_err(fs_err)?;
        written += buf.len() as u64;
        since_sync += buf.len() as u64;
        if since_sync >= SYNC_EVERY {
            fs.sync().map_err(fs_err)?;
            since_sync = 0;
        }
    }
    fs.sync().map_err(fs_err)
}

fn mount(dev: &Arc<dyn Device>, inodes: u64, crash: bool) -> Result<(Fs, MountReport), BenchError> {
    let fs = Fs::mount(dev.clone(), MountOptions::default()).map_err(fs_err)?;
    let r = fs.mount_report();
    if r.inodes != inodes || (crash && r.from_snapshot && !r.from_checkpoint) {
        return Err(BenchError::Failed {
            reason: format!(
                "a mount {} found {} inodes, expected {inodes}",
                if crash { "after a crash" } else { "after a clean unmount" },
                r.inodes
            ),
        });
    }
    Ok((fs, r))
}

/// Run the benchmark; `progress` receives one line per step.
///
/// # Errors
/// Bad options or a refused path before anything is written; device and file-system failures;
/// a mount that misses live files.
pub fn run(o: &CrashMountOptions, progress: &dyn Fn(&str)) -> Result<CrashMountReport, BenchError> {
    if o.runs == 0 || o.live_files.is_empty() || o.history_mib.is_empty() || o.image_mib < 256 {
        return Err(BenchError::BadInput {
            reason: "runs, live sets and history sizes must be given; the image at least 256 MiB"
                .into(),
        });
    }
    let mut history = o.history_mib.clone();
    history.sort_unstable();
    let load_start = load_1min();
    let target = Target::prepare(&o.path, o.image_mib << 20, false, o.keep, o.force)?;
    let file_options = FileOptions { direct: DirectMode::On, ..FileOptions::default() };
    let mut rows = Vec::new();
    let mut rng = fastrand::Rng::with_seed(0x15);
    for &files in &o.live_files {
        let dev: Arc<dyn Device> = Arc::new(FileDevice::open(target.path(), file_options)?);
        Fs::mkfs(dev.clone(), &MkfsOptions::default()).map_err(fs_err)?;
        let fs = Fs::mount(dev.clone(), MountOptions::default()).map_err(fs_err)?;
        let inos = make_live(&fs, files, progress)?;
        let inodes = fs.mount_report().inodes + u64::try_from(inos.len()).unwrap_or(u64::MAX);
        let dirs = if files < MANY { 0 } else { u64::from(files.div_ceil(SMALL_PER_DIR)) };
        let inodes = inodes + dirs;
        let live_bytes = if files < MANY {
            u64::from(files) * LARGE_FILE
        } else {
            u64::from(files) * SMALL_WRITE as u64
        };
        let mut fs = Some(fs);
        let mut done_mib = 0;
        for &h in &history {
            if let Some(f) = &fs {
                progress(&format!("{files} live files: overwriting up to {h} MiB of history"));
                overwrite(f, &inos, (h - done_mib.min(h)) << 20, &mut rng)?;
            }
            done_mib = done_mib.max(h);
            let (mut crash_s, mut last) = (Vec::new(), MountReport::default());
            for r in 0..o.runs {
                progress(&format!(
                    "{files} live files, {h} MiB: crash and mount {}/{}",
                    r + 1,
                    o.runs
                ));
                drop(fs.take()); // a crash: no unmount, no snapshot
                let (mounted, report) = mount(&dev, inodes, true)?;
                crash_s.push(report.time.as_secs_f64());
                last = report;
                fs = Some(mounted);
            }
            let (mut clean_s, mut clean_blocks) = (Vec::new(), 0);
            for r in 0..o.runs {
                progress(&format!(
                    "{files} live files, {h} MiB: unmount and mount {}/{}",
                    r + 1,
                    o.runs
                ));
                if let Some(f) = fs.take() {
                    f.unmount().map_err(fs_err)?;
                }
                let (mounted, report) = mount(&dev, inodes, false)?;
                clean_s.push(report.time.as_secs_f64());
                clean_blocks = report.blocks_read;
                fs = Some(mounted);
            }
            let (crash_mount_s, clean_mount_s) = (Spread::of(crash_s), Spread::of(clean_s));
            let target_s = if files < MANY { FEW_TARGET_S } else { MANY_TARGET_S };
            rows.push(CrashMountRow {
                live_files: files,
                live_bytes,
                history_mib: h,
                crash_mount_s,
                crash_blocks_read: last.blocks_read,
                crash_replayed: last.transactions_replayed,
                from_checkpoint: last.from_checkpoint,
                clean_mount_s,
                clean_blocks_read: clean_blocks,
                crash_over_clean: crash_mount_s.median / clean_mount_s.median.max(1e-9),
                target_s,
                met: crash_mount_s.median <= target_s,
            });
        }
        if let Some(f) = fs.take() {
            f.unmount().map_err(fs_err)?;
        }
    }
    drop(target);
    Ok(CrashMountReport {
        image_mib: o.image_mib,
        replay_budget_mib: tally_fs::REPLAY_BUDGET_DEFAULT >> 20,
        rows,
        load: (load_start, load_1min()),
        cpu_count: std::thread::available_parallelism()
            .map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX)),
    })
}

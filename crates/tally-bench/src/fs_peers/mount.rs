//! Mount of a file system holding many files: after a clean unmount (the snapshot is read, no
//! scan) and after a crash (every stream's log scanned, its records replayed). The files are
//! empty, a thousand per directory, created a hundred per explicit transaction (so the log holds
//! their records densely, as a program creating them in bulk would write it).

use std::sync::Arc;

use tally_fs::{Fs, MkfsOptions, MountOptions, MountReport, ROOT};
use tally_media::Device;

use super::{fs_err, TallySide, ME};
use crate::measure::process_cpu_time;
use crate::{BenchError, Spread};

/// Files per directory.
const FILES_PER_DIR: u32 = 1000;
/// Creates per explicit transaction.
const FILES_PER_TX: u32 = 100;
/// Issue #4's bound on a mount after a clean unmount of 100,000 files, seconds.
pub const SNAPSHOT_TARGET_S: f64 = 0.2;

/// What the mount section measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MountSection {
    /// Files made.
    pub files: u32,
    /// Inodes every mount found (files, directories, the root).
    pub inodes: u64,
    /// Seconds it took to make them (one run, for scale).
    pub create_s: f64,
    /// Clean unmounts (snapshot written), seconds.
    pub unmount_s: Spread,
    /// Mounts after a clean unmount, seconds.
    pub snapshot_s: Spread,
    /// Process CPU time of those mounts, seconds (all threads).
    pub snapshot_cpu_s: Spread,
    /// Blocks the snapshot mount read.
    pub snapshot_blocks_read: u64,
    /// Mounts after a crash, seconds.
    pub scan_s: Spread,
    /// Process CPU time of those mounts, seconds (all threads).
    pub scan_cpu_s: Spread,
    /// Blocks the scan read (the log).
    pub scan_blocks_read: u64,
    /// Log transactions the scan replayed.
    pub transactions_replayed: u64,
    /// Scan ÷ snapshot, medians.
    pub scan_over_snapshot: f64,
    /// The bound on the snapshot mount, seconds (scaled to the files made: the bound is
    /// for 100,000).
    pub snapshot_target_s: f64,
    /// Whether the median snapshot mount is within the bound.
    pub met: bool,
}

fn check(r: &MountReport, snapshot: bool, inodes: u64) -> Result<(), BenchError> {
    if r.from_snapshot != snapshot || r.inodes != inodes {
        return Err(BenchError::Failed {
            reason: format!(
                "a mount {} found {} inodes, expected {inodes} {}",
                if r.from_snapshot { "from the snapshot" } else { "by scan" },
                r.inodes,
                if snapshot { "from the snapshot" } else { "by scan" }
            ),
        });
    }
    Ok(())
}

fn create_batch(
    fs: &Fs,
    tx: &tally_fs::Txn,
    dir: &mut u64,
    files: std::ops::Range<u32>,
) -> Result<(), tally_fs::FsError> {
    for i in files {
        if i % FILES_PER_DIR == 0 {
            let name = format!("d{}", i / FILES_PER_DIR);
            *dir = fs.mkdir(Some(tx), ROOT, name.as_bytes(), 0o755, ME)?.ino;
        }
        fs.create(Some(tx), *dir, format!("f{i}").as_bytes(), 0o644, ME)?;
    }
    Ok(())
}

/// Make `files` files, then time `runs` mounts of each kind.
///
/// # Errors
/// File-system failures; a mount that takes the wrong path or misses files.
pub(crate) fn run(
    tally: &TallySide,
    files: u32,
    runs: u32,
    progress: &dyn Fn(&str),
) -> Result<MountSection, BenchError> {
    let dev: Arc<dyn Device> = tally.dev.clone();
    Fs::mkfs(dev.clone(), &MkfsOptions::default()).map_err(fs_err)?;
    let fs = Fs::mount(dev.clone(), MountOptions::default()).map_err(fs_err)?;
    progress(&format!("mount: creating {files} files"));
    let start = std::time::Instant::now();
    let (mut dir, mut made) = (ROOT, 0u32);
    while made < files {
        let tx = fs.begin().map_err(fs_err)?;
        let batch = FILES_PER_TX.min(files - made);
        let result = create_batch(&fs, &tx, &mut dir, made..made + batch);
        if let Err(e) = result {
            let _ = fs.abort(tx);
            return Err(fs_err(e));
        }
        fs.commit(tx).map_err(fs_err)?;
        made += batch;
    }
    fs.sync().map_err(fs_err)?;
    let create_s = start.elapsed().as_secs_f64();
    let inodes = u64::from(files) + u64::from(files.div_ceil(FILES_PER_DIR)) + 1;

    let (mut unmount_s, mut snapshot_s, mut snapshot_blocks_read) = (Vec::new(), Vec::new(), 0);
    let (mut snapshot_cpu, mut scan_cpu) = (Vec::new(), Vec::new());
    let mut fs = Some(fs);
    for run in 0..runs {
        progress(&format!("mount: clean unmount and snapshot mount {}/{runs}", run + 1));
        let t = std::time::Instant::now();
        if let Some(fs) = fs.take() {
            fs.unmount().map_err(fs_err)?;
        }
        unmount_s.push(t.elapsed().as_secs_f64());
        let cpu0 = process_cpu_time();
        let mounted = Fs::mount(dev.clone(), MountOptions::default()).map_err(fs_err)?;
        let r = mounted.mount_report();
        snapshot_cpu.push((process_cpu_time() - cpu0).as_secs_f64());
        check(&r, true, inodes)?;
        snapshot_s.push(r.time.as_secs_f64());
        snapshot_blocks_read = r.blocks_read;
        fs = Some(mounted);
    }
    let (mut scan_s, mut scan_blocks_read, mut transactions_replayed) = (Vec::new(), 0, 0);
    for run in 0..runs {
        progress(&format!("mount: crash and scan mount {}/{runs}", run + 1));
        drop(fs.take()); // a crash: no unmount, no snapshot
        let cpu0 = process_cpu_time();
        let mounted = Fs::mount(dev.clone(), MountOptions::default()).map_err(fs_err)?;
        let r = mounted.mount_report();
        scan_cpu.push((process_cpu_time() - cpu0).as_secs_f64());
        check(&r, false, inodes)?;
        scan_s.push(r.time.as_secs_f64());
        scan_blocks_read = r.blocks_read;
        transactions_replayed = r.transactions_replayed;
        fs = Some(mounted);
    }
    drop(fs);
    let (snapshot_s, scan_s) = (Spread::of(snapshot_s), Spread::of(scan_s));
    let snapshot_target_s = SNAPSHOT_TARGET_S * f64::from(files) / 100_000.0;
    Ok(MountSection {
        files,
        inodes,
        create_s,
        unmount_s: Spread::of(unmount_s),
        snapshot_s,
        snapshot_cpu_s: Spread::of(snapshot_cpu),
        snapshot_blocks_read,
        scan_s,
        scan_cpu_s: Spread::of(scan_cpu),
        scan_blocks_read,
        transactions_replayed,
        scan_over_snapshot: scan_s.median / snapshot_s.median.max(1e-9),
        snapshot_target_s,
        met: snapshot_s.median <= snapshot_target_s,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mount_on_the_wrong_path_or_missing_inodes_is_refused() {
        let ok = MountReport { from_snapshot: true, inodes: 5, ..MountReport::default() };
        assert!(check(&ok, true, 5).is_ok());
        assert!(check(&ok, false, 5).is_err());
        assert!(check(&MountReport { inodes: 4, ..ok }, true, 5).is_err());
    }
}

//! Two `ATTACH`ed databases on the crash simulator: the split bank (`common::split`: each
//! transfer moves money from an account in one database to an account in the other and is
//! recorded in both), each transfer one `tally_sqlite::atomic` group, a crash point recorded at
//! every submit, wait and flush of every commit, post-crash images drawn at each (torn writes
//! included, and always the worst case), each remounted, both databases opened and checked:
//! - `PRAGMA integrity_check` is `ok` in both;
//! - the balances over both databases sum to the opening total;
//! - both databases hold exactly transfers `1..=n`, the same `n`, with `n` at least the number
//!   acknowledged (returned from `atomic`) when the crash hit and at most one more.
//!
//! Mutants it must catch (feature `mutants`): `group-commits-each-file` (each database commits
//! its own batch, as SQLite in `journal_mode=MEMORY` does alone: a crash between the two
//! commits keeps one half of a transfer) and `group-leaves-second-file` (the attached database
//! commits on its own in phase one, before the group).

mod common;

use std::sync::Arc;

use common::split;
use common::*;
use tally_crash::{CrashConfig, CrashDevice, CrashOptions, CrashPoint, RecordingDevice};
use tally_fs::{Fs, MkfsOptions, MountOptions};
use tally_media::{Device, Geometry, Image, MemDevice};
use tally_sqlite::{TallyVfs, VfsMutant, VfsOptions};

/// Transfers per run.
const TRANSFERS: i64 = 20;
/// Images drawn per crash point, besides the worst case.
const SAMPLES_PER_POINT: usize = 3;

/// Run the workload; each crash point with the number of transfers acknowledged before it.
fn run(seed: u64, mutant: Option<VfsMutant>) -> (Vec<(i64, CrashPoint)>, tally_sqlite::VfsStats) {
    let geometry = Geometry::new(4096, 2048, 512).unwrap();
    let dev = RecordingDevice::new(CrashDevice::new(geometry, CrashConfig::with_seed(seed)));
    let ddev: Arc<dyn Device> = dev.clone();
    let mkfs = MkfsOptions { streams: 2, segment_blocks: 64, uuid: Some([17; 16]) };
    let fs = mkfs_mount(ddev, &mkfs);
    let options = VfsOptions { mutant, ..VfsOptions::default() };
    let vfs = TallyVfs::register(&vfs_name("attach-crash"), fs.clone(), options).unwrap();
    let db = split::open(&vfs);
    split::create(&db);
    fs.sync().unwrap();
    let setup = vfs.stats();
    let mut points = Vec::new();
    for k in 1..=TRANSFERS {
        dev.set_recording(true);
        split::apply(&db, &split::transfer(seed, k)).unwrap();
        points.extend(dev.take_points().into_iter().map(|p| (k - 1, p)));
    }
    points.push((TRANSFERS, dev.inner().crash_point()));
    let stats = vfs.stats();
    assert_eq!(stats.journal_opens, setup.journal_opens, "a journal in a group");
    if mutant.is_none() {
        assert_eq!(stats.group_commits - setup.group_commits, TRANSFERS as u64, "{stats:?}");
    }
    drop(db);
    drop(vfs);
    (points, stats)
}

/// What is wrong with `image`, recovered, given `acked` transfers acknowledged before the crash.
fn judge(image: &Image, seed: u64, acked: i64) -> Option<String> {
    let dev: Arc<dyn Device> = Arc::new(MemDevice::from_image(image.clone()));
    let fs = match Fs::mount(dev, MountOptions::default()) {
        Ok(fs) => Arc::new(fs),
        Err(e) => return Some(format!("mount failed: {e}")),
    };
    let vfs = TallyVfs::register(&vfs_name("attach-judge"), fs, VfsOptions::default()).unwrap();
    let db = match split::try_open(&vfs) {
        Ok(db) => db,
        Err(e) => return Some(format!("open: {e}")),
    };
    let seen = match split::look(&db, seed) {
        Ok(seen) => seen,
        Err(e) => return Some(format!("unreadable: {e}")),
    };
    if seen.integrity != ["ok", "ok"] {
        return Some(format!("integrity_check: {:?}", seen.integrity));
    }
    let sum: i64 = seen.balances.iter().sum();
    if sum != TOTAL {
        return Some(format!("balances sum to {sum}, not {TOTAL} (half a transfer kept)"));
    }
    let [a, b] = &seen.transfers;
    if a != b {
        return Some(format!("main has transfers {a:?}, b has {b:?}"));
    }
    let n = a.len() as i64;
    if *a != (1..=n).collect::<Vec<_>>() || !seen.rows_match {
        return Some(format!("transfers {a:?} are not the workload's"));
    }
    if n < acked {
        return Some(format!("{n} transfers, {acked} were acknowledged"));
    }
    if n > acked + 1 {
        return Some(format!("{n} transfers, only {} had begun", acked + 1));
    }
    if seen.balances != split::model(seed, n) {
        return Some(format!("balances {:?} are not those after {n} transfers", seen.balances));
    }
    None
}

/// Images checked and the violations found.
fn explore(seed: u64, mutant: Option<VfsMutant>) -> (usize, Vec<String>) {
    let (points, stats) = run(seed, mutant);
    let mut images = 0;
    let mut bad = Vec::new();
    for (i, (acked, point)) in points.iter().enumerate() {
        let options = CrashOptions {
            exhaustive_max: 3,
            samples: SAMPLES_PER_POINT,
            seed: Some(seed ^ (i as u64) << 20),
            tearing: true,
            ..CrashOptions::default()
        };
        let drawn = point.crash_images(options).take(SAMPLES_PER_POINT + 5);
        for image in std::iter::once(point.durable_image().clone()).chain(drawn) {
            images += 1;
            if let Some(why) = judge(&image, seed, *acked) {
                bad.push(format!("point {i} (acked {acked}): {why}"));
            }
        }
    }
    eprintln!(
        "seed {seed} mutant {mutant:?}: {} points, {images} images, {} violations, {stats:?}",
        points.len(),
        bad.len()
    );
    (images, bad)
}

#[test]
fn every_crash_image_has_both_databases_at_the_same_transfer() {
    for seed in [1, 2] {
        let (images, bad) = explore(seed, None);
        assert!(images > 100, "too few images to mean anything: {images}");
        assert!(bad.is_empty(), "seed {seed}: {bad:#?}");
    }
}

#[cfg(feature = "mutants")]
#[test]
fn each_file_committing_on_its_own_is_caught() {
    let (_, bad) = explore(1, Some(VfsMutant::GroupCommitsEachFile));
    assert!(bad.iter().any(|b| b.contains("half a transfer")), "not caught: {bad:#?}");
}

#[cfg(feature = "mutants")]
#[test]
fn the_second_file_left_out_is_caught() {
    let (_, bad) = explore(1, Some(VfsMutant::GroupLeavesSecondFile));
    assert!(bad.iter().any(|b| b.contains("half a transfer")), "not caught: {bad:#?}");
}

//! The bank on the crash simulator: SQLite on the VFS over a `CrashDevice`, a crash point
//! recorded at every submit, wait and flush of every commit, a handful of post-crash images
//! drawn at each (torn block writes included, and always the worst case: every uncertain write
//! lost), each remounted and checked from outside:
//! - `PRAGMA integrity_check` is `ok` and the balances sum to the opening total;
//! - the database is exactly the workload after `n` transfers, with `n` at least the number
//!   SQLite had acknowledged (returned from COMMIT) when the crash hit, and at most one more
//!   (the one in progress).
//!
//! The same check catches the four mutants: `commit-not-durable` (an acknowledged transfer
//! lost), `rollback-keeps-pages` (half a transfer kept: a batch too large for one transaction
//! is rolled back and redone through a journal, and the mutant commits the half it had
//! written), `rollback-forgets-a-page` (the rollback undoes all but one page: the first written after
//! the header) and `journal-after-pages` (the journal's appends, kept in memory by the VFS, reach
//! the file system after the database pages of that redo: pages with no journal to undo them).
//! One `u64` seed drives the workload, the device and the sampler; a failure prints it.

mod common;

use std::sync::Arc;

use common::*;
use rusqlite::Connection;
use tally_crash::{CrashConfig, CrashDevice, CrashOptions, CrashPoint, RecordingDevice};
use tally_fs::{Fs, MkfsOptions, MountOptions};
use tally_media::{Device, Geometry, Image, MemDevice};
use tally_sqlite::{TallyVfs, VfsMutant, VfsOptions};

/// Transfers per run.
const TRANSFERS: i64 = 24;
/// Images drawn per crash point, besides the worst case.
const SAMPLES_PER_POINT: usize = 3;

fn vfs_options(batch_blocks_max: Option<u64>, mutant: Option<VfsMutant>) -> VfsOptions {
    VfsOptions {
        batch_bytes_max: batch_blocks_max.map(|b| b * 4096),
        mutant,
        ..VfsOptions::default()
    }
}

/// Run the workload; each crash point with the number of transfers acknowledged before it.
fn run(
    seed: u64,
    batch_blocks_max: Option<u64>,
    mutant: Option<VfsMutant>,
) -> (Vec<(i64, CrashPoint)>, tally_sqlite::VfsStats) {
    let geometry = Geometry::new(4096, 2048, 512).unwrap();
    let dev = RecordingDevice::new(CrashDevice::new(geometry, CrashConfig::with_seed(seed)));
    let ddev: Arc<dyn Device> = dev.clone();
    let mkfs = MkfsOptions { streams: 2, segment_blocks: 64, uuid: Some([17; 16]) };
    let fs = mkfs_mount(ddev, &mkfs);
    let vfs =
        TallyVfs::register(&vfs_name("crash"), fs.clone(), vfs_options(batch_blocks_max, mutant))
            .unwrap();
    let db = open(&vfs);
    create(&db);
    fs.sync().unwrap();
    let setup = vfs.stats();
    let mut points = Vec::new();
    for k in 1..=TRANSFERS {
        dev.set_recording(true);
        apply(&db, &transfer(seed, k));
        points.extend(dev.take_points().into_iter().map(|p| (k - 1, p)));
    }
    points.push((TRANSFERS, dev.inner().crash_point()));
    let stats = vfs.stats();
    if batch_blocks_max.is_none() {
        assert_eq!(stats.journal_opens, setup.journal_opens, "a journal on the batch path");
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
    let vfs = TallyVfs::register(&vfs_name("judge"), fs, VfsOptions::default()).unwrap();
    // Opening and reading rolls back a hot journal, if the crash left one.
    let db: Connection = match try_open(&vfs) {
        Ok(db) => db,
        Err(e) => return Some(format!("open: {e}")),
    };
    let seen = match look(&db, seed) {
        Ok(seen) => seen,
        Err(e) => return Some(format!("unreadable: {e}")),
    };
    if seen.integrity != "ok" {
        return Some(format!("integrity_check: {}", seen.integrity));
    }
    let sum: i64 = seen.balances.iter().sum();
    if sum != TOTAL {
        return Some(format!("balances sum to {sum}, not {TOTAL}"));
    }
    let n = seen.transfers.len() as i64;
    if seen.transfers != (1..=n).collect::<Vec<_>>() || !seen.rows_match {
        return Some(format!("transfers {:?} are not the workload's", seen.transfers));
    }
    if n < acked {
        return Some(format!("{n} transfers, {acked} were acknowledged"));
    }
    if n > acked + 1 {
        return Some(format!("{n} transfers, only {} had begun", acked + 1));
    }
    if seen.balances != model(seed, n) {
        return Some(format!("balances {:?} are not those after {n} transfers", seen.balances));
    }
    None
}

/// Images checked and the violations found (with their first few descriptions).
fn explore(
    seed: u64,
    batch_blocks_max: Option<u64>,
    mutant: Option<VfsMutant>,
) -> (usize, Vec<String>) {
    let (points, stats) = run(seed, batch_blocks_max, mutant);
    if batch_blocks_max.is_some() {
        assert!(stats.batch_overflows > 0, "no batch overflowed: the journal path is untested");
    }
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
        "seed {seed} batch max {batch_blocks_max:?} mutant {mutant:?}: {} points, {images} images, \
         {} violations, {stats:?}",
        points.len(),
        bad.len()
    );
    (images, bad)
}

#[test]
fn every_crash_image_is_a_prefix_holding_every_acknowledged_commit() {
    for seed in [1, 2] {
        let (images, bad) = explore(seed, None, None);
        assert!(images > 100, "too few images to mean anything: {images}");
        assert!(bad.is_empty(), "seed {seed}: {bad:#?}");
    }
}

#[test]
fn batches_redone_through_a_journal_survive_crashes_too() {
    let (images, bad) = explore(3, Some(4), None);
    assert!(images > 100, "too few images to mean anything: {images}");
    assert!(bad.is_empty(), "seed 3: {bad:#?}");
}

#[cfg(feature = "mutants")]
#[test]
fn commit_not_durable_is_caught() {
    let (_, bad) = explore(1, None, Some(VfsMutant::CommitNotDurable));
    assert!(!bad.is_empty(), "commit-not-durable went unnoticed");
    assert!(bad.iter().any(|b| b.contains("acknowledged")), "{bad:#?}");
}

#[cfg(feature = "mutants")]
#[test]
fn rollback_keeping_pages_is_caught() {
    let (_, bad) = explore(3, Some(4), Some(VfsMutant::RollbackKeepsPages));
    assert!(!bad.is_empty(), "rollback-keeps-pages went unnoticed");
}

#[cfg(feature = "mutants")]
#[test]
fn rollback_forgetting_a_page_is_caught() {
    let (_, bad) = explore(3, Some(4), Some(VfsMutant::RollbackForgetsAPage));
    assert!(!bad.is_empty(), "rollback-forgets-a-page went unnoticed");
    eprintln!("first violation: {}", bad[0]);
}

#[cfg(feature = "mutants")]
#[test]
fn journal_after_pages_is_caught() {
    let (_, bad) = explore(3, Some(4), Some(VfsMutant::JournalAfterPages));
    assert!(!bad.is_empty(), "journal-after-pages went unnoticed");
}

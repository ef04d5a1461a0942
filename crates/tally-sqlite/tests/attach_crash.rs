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
//! The shrinking workload does the same with both databases in `auto_vacuum=FULL`, every odd
//! transfer adding four page-sized junk rows to each database and every even one deleting
//! them, so that every even commit shrinks both files: SQLite truncates each database in its
//! phase two (`pager_end_transaction`), the main database's before the group's commit (into
//! the group), the attached one's after it (a plain truncate, not durable until a later
//! flush; SQLite trusts the page count in the header, so a file longer than it is harmless).
//! Checked besides: both files shrink, and both hold the junk rows transfer `n` leaves.
//!
//! Mutants it must catch (feature `mutants`): `group-commits-each-file` (each database commits
//! its own batch, as SQLite in `journal_mode=MEMORY` does alone: a crash between the two
//! commits keeps one half of a transfer), `group-leaves-second-file` (the attached database
//! commits on its own in phase one, before the group) and, on the shrinking workload,
//! `group-commits-each-file` again and `group-truncate-dropped` (a truncate inside the group is
//! answered `OK` and not made: the main database never shrinks, so the check that both files
//! shrink is shown to see it).

mod common;

use std::sync::Arc;

use common::split;
use common::*;
use tally_crash::{CrashConfig, CrashDevice, CrashOptions, CrashPoint, RecordingDevice};
use tally_fs::{Fs, MkfsOptions, MountOptions, ROOT};
use tally_media::{Device, Geometry, Image, MemDevice};
use tally_sqlite::{TallyVfs, VfsMutant, VfsOptions};

/// Transfers per run.
const TRANSFERS: i64 = 20;
/// Images drawn per crash point, besides the worst case.
const SAMPLES_PER_POINT: usize = 3;

/// Which transfers the run makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Workload {
    /// `split::apply`.
    Transfers,
    /// `split::apply_shrinking`, both databases in `auto_vacuum=FULL`.
    Shrinking,
}

/// The sizes of the two database files.
fn sizes(fs: &Fs) -> [u64; 2] {
    [b"a.db".as_slice(), b"b.db"].map(|name| {
        let ino = fs.lookup(ROOT, name).unwrap().ino;
        fs.getattr(ino).unwrap().size
    })
}

/// Run the workload; each crash point with the number of transfers acknowledged before it.
fn run(
    seed: u64,
    mutant: Option<VfsMutant>,
    workload: Workload,
) -> (Vec<(i64, CrashPoint)>, tally_sqlite::VfsStats, Vec<String>) {
    let geometry = Geometry::new(4096, 2048, 512).unwrap();
    let dev = RecordingDevice::new(CrashDevice::new(geometry, CrashConfig::with_seed(seed)));
    let ddev: Arc<dyn Device> = dev.clone();
    let mkfs = MkfsOptions { streams: 2, segment_blocks: 64, uuid: Some([17; 16]) };
    let fs = mkfs_mount(ddev, &mkfs);
    let options = VfsOptions { mutant, ..VfsOptions::default() };
    let vfs = TallyVfs::register(&vfs_name("attach-crash"), fs.clone(), options).unwrap();
    let db = split::open(&vfs);
    match workload {
        Workload::Transfers => split::create(&db),
        Workload::Shrinking => split::create_vacuuming(&db),
    }
    fs.sync().unwrap();
    let setup = vfs.stats();
    let mut points = Vec::new();
    let mut grown = sizes(&fs);
    let mut shrink_missing = Vec::new();
    for k in 1..=TRANSFERS {
        dev.set_recording(true);
        let t = split::transfer(seed, k);
        match workload {
            Workload::Transfers => split::apply(&db, &t).unwrap(),
            Workload::Shrinking => split::apply_shrinking(&db, &t)
                .unwrap_or_else(|e| panic!("transfer {k}: {e} ({:?})", vfs.stats())),
        }
        points.extend(dev.take_points().into_iter().map(|p| (k - 1, p)));
        if workload == Workload::Shrinking {
            let now = sizes(&fs);
            if k % 2 == 1 {
                grown = now;
            } else {
                // Both files shrank (by the junk's pages, less what the transfer's own rows
                // took).
                if now[0] >= grown[0] || now[1] >= grown[1] {
                    shrink_missing.push(format!("transfer {k}: {grown:?} -> {now:?}"));
                }
            }
        }
    }
    points.push((TRANSFERS, dev.inner().crash_point()));
    let stats = vfs.stats();
    assert_eq!(stats.journal_opens, setup.journal_opens, "a journal in a group");
    if mutant.is_none() {
        assert_eq!(stats.group_commits - setup.group_commits, TRANSFERS as u64, "{stats:?}");
    }
    drop(db);
    drop(vfs);
    (points, stats, shrink_missing)
}

/// What is wrong with `image`, recovered, given `acked` transfers acknowledged before the crash.
fn judge(image: &Image, seed: u64, acked: i64, workload: Workload) -> Option<String> {
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
    if workload == Workload::Shrinking {
        let junk = match split::junk(&db) {
            Ok(junk) => junk,
            Err(e) => return Some(format!("junk unreadable: {e}")),
        };
        let want = split::junk_after(n);
        if junk != [want, want] {
            return Some(format!("junk rows {junk:?} after {n} transfers, not {want} in each"));
        }
    }
    None
}

/// Images checked and the violations found (a commit of the shrinking workload that shrank
/// no file is one).
fn explore(seed: u64, mutant: Option<VfsMutant>, workload: Workload) -> (usize, Vec<String>) {
    let (points, stats, shrink_missing) = run(seed, mutant, workload);
    let mut images = 0;
    let mut bad: Vec<String> =
        shrink_missing.into_iter().map(|s| format!("no file shrank: {s}")).collect();
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
            if let Some(why) = judge(&image, seed, *acked, workload) {
                bad.push(format!("point {i} (acked {acked}): {why}"));
            }
        }
    }
    eprintln!(
        "seed {seed} mutant {mutant:?} {workload:?}: {} points, {images} images, {} violations, {stats:?}",
        points.len(),
        bad.len()
    );
    (images, bad)
}

#[test]
fn every_crash_image_has_both_databases_at_the_same_transfer() {
    for seed in [1, 2] {
        let (images, bad) = explore(seed, None, Workload::Transfers);
        assert!(images > 100, "too few images to mean anything: {images}");
        assert!(bad.is_empty(), "seed {seed}: {bad:#?}");
    }
}

#[cfg(feature = "mutants")]
#[test]
fn each_file_committing_on_its_own_is_caught() {
    let (_, bad) = explore(1, Some(VfsMutant::GroupCommitsEachFile), Workload::Transfers);
    assert!(bad.iter().any(|b| b.contains("half a transfer")), "not caught: {bad:#?}");
}

#[cfg(feature = "mutants")]
#[test]
fn the_second_file_left_out_is_caught() {
    let (_, bad) = explore(1, Some(VfsMutant::GroupLeavesSecondFile), Workload::Transfers);
    assert!(bad.iter().any(|b| b.contains("half a transfer")), "not caught: {bad:#?}");
}

#[test]
fn every_crash_image_of_two_shrinking_databases_is_whole() {
    let (images, bad) = explore(3, None, Workload::Shrinking);
    assert!(images > 100, "too few images to mean anything: {images}");
    assert!(bad.is_empty(), "{bad:#?}");
}

#[cfg(feature = "mutants")]
#[test]
fn a_shrinking_group_committing_file_by_file_is_caught() {
    let (_, bad) = explore(3, Some(VfsMutant::GroupCommitsEachFile), Workload::Shrinking);
    assert!(bad.iter().any(|b| b.contains("half a transfer")), "not caught: {bad:#?}");
}

#[cfg(feature = "mutants")]
#[test]
fn a_truncate_dropped_in_the_group_is_caught() {
    let (_, bad) = explore(3, Some(VfsMutant::GroupTruncateDropped), Workload::Shrinking);
    assert!(bad.iter().any(|b| b.contains("no file shrank")), "not caught: {bad:#?}");
}

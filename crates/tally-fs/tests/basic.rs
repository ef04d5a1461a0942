//! Smoke tests of the file system's main paths, each across a remount.

use std::sync::Arc;

use tally_fs::{Fs, FsError, MkfsOptions, MountOptions, Owner, RenameFlags, SetAttr, ROOT};
use tally_media::{Device, MemDevice};

const ME: Owner = Owner { uid: 1000, gid: 1000 };

fn fresh(blocks: u64, streams: u16, segment_blocks: u32) -> Arc<dyn Device> {
    let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, blocks).unwrap());
    Fs::mkfs(dev.clone(), &MkfsOptions { streams, segment_blocks, uuid: None }).unwrap();
    dev
}

fn mount(dev: &Arc<dyn Device>) -> Fs {
    Fs::mount(dev.clone(), MountOptions::default()).unwrap()
}

fn names(fs: &Fs, dir: u64) -> Vec<String> {
    let mut v: Vec<String> = fs
        .readdir(dir, 0)
        .unwrap()
        .into_iter()
        .map(|e| String::from_utf8(e.name).unwrap())
        .filter(|n| n != "." && n != "..")
        .collect();
    v.sort();
    v
}

#[test]
fn files_directories_and_data_survive_remount() {
    let dev = fresh(4096, 2, 64);
    let fs = mount(&dev);
    let d = fs.mkdir(None, ROOT, b"d", 0o755, ME).unwrap();
    let f = fs.create(None, d.ino, b"f", 0o644, ME).unwrap();
    let data: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    fs.write(None, f.ino, 3, &data).unwrap();
    fs.write(None, f.ino, 1 << 30, b"far").unwrap(); // sparse
    fs.symlink(None, d.ino, b"l", b"f", ME).unwrap();
    fs.unmount().unwrap();

    let fs = mount(&dev);
    assert_eq!(names(&fs, ROOT), ["d"]);
    assert_eq!(names(&fs, d.ino), ["f", "l"]);
    let got = fs.read(f.ino, 3, data.len()).unwrap();
    assert_eq!(got, data);
    assert_eq!(fs.read(f.ino, 1 << 30, 10).unwrap(), b"far");
    assert_eq!(fs.read(f.ino, 1 << 20, 4).unwrap(), [0; 4]);
    assert_eq!(fs.getattr(f.ino).unwrap().size, (1 << 30) + 3);
    assert_eq!(fs.getattr(d.ino).unwrap().nlink, 2);
    assert_eq!(fs.getattr(ROOT).unwrap().nlink, 3);
    let l = fs.lookup(d.ino, b"l").unwrap();
    assert_eq!(fs.readlink(l.ino).unwrap(), b"f");
    let r = fs.fsck();
    assert!(r.is_clean(), "{:?}", r.problems);
}

#[test]
fn rename_unlink_and_truncate_survive_a_crash_after_sync() {
    let dev = fresh(4096, 3, 64);
    let fs = mount(&dev);
    let a = fs.create(None, ROOT, b"a", 0o644, ME).unwrap();
    fs.write(None, a.ino, 0, &[7u8; 10_000]).unwrap();
    let b = fs.create(None, ROOT, b"b", 0o644, ME).unwrap();
    fs.rename(None, ROOT, b"a", ROOT, b"b", RenameFlags::default()).unwrap();
    assert!(matches!(fs.getattr(b.ino), Err(FsError::NotFound)));
    fs.setattr(None, a.ino, &SetAttr { size: Some(5000), ..SetAttr::default() }).unwrap();
    fs.setattr(None, a.ino, &SetAttr { size: Some(9000), ..SetAttr::default() }).unwrap();
    fs.sync().unwrap();
    drop(fs); // no unmount: recovery

    let fs = mount(&dev);
    assert_eq!(names(&fs, ROOT), ["b"]);
    let got = fs.read(a.ino, 0, 10_000).unwrap();
    assert_eq!(got.len(), 9000);
    assert!(got[..5000].iter().all(|&x| x == 7) && got[5000..].iter().all(|&x| x == 0));
    assert!(fs.fsck().is_clean());
}

#[test]
fn aborted_transaction_leaves_nothing_and_committed_one_everything() {
    let dev = fresh(4096, 2, 64);
    let fs = mount(&dev);
    let x = fs.create(None, ROOT, b"x", 0o644, ME).unwrap();
    fs.write(None, x.ino, 0, b"old").unwrap();
    let before = fs.getattr(ROOT).unwrap();

    let t = fs.begin().unwrap();
    fs.write(Some(&t), x.ino, 0, b"new!").unwrap();
    fs.create(Some(&t), ROOT, b"y", 0o644, ME).unwrap();
    fs.mkdir(Some(&t), ROOT, b"z", 0o755, ME).unwrap();
    assert_eq!(fs.read(x.ino, 0, 10).unwrap(), b"new!"); // visible at once
    fs.abort(t).unwrap();
    assert_eq!(fs.read(x.ino, 0, 10).unwrap(), b"old");
    assert_eq!(names(&fs, ROOT), ["x"]);
    assert_eq!(fs.getattr(ROOT).unwrap(), before);

    let t = fs.begin().unwrap();
    fs.write(Some(&t), x.ino, 0, b"new!").unwrap();
    let y = fs.create(Some(&t), ROOT, b"y", 0o644, ME).unwrap();
    fs.write(Some(&t), y.ino, 0, b"yy").unwrap();
    fs.commit_durable(t).unwrap();
    drop(fs);

    let fs = mount(&dev);
    assert_eq!(names(&fs, ROOT), ["x", "y"]);
    assert_eq!(fs.read(x.ino, 0, 10).unwrap(), b"new!");
    assert_eq!(fs.read(y.ino, 0, 10).unwrap(), b"yy");
    assert!(fs.fsck().is_clean());
}

#[test]
fn another_transaction_gets_busy_and_a_plain_operation_waits() {
    let dev = fresh(4096, 2, 64);
    let fs = Arc::new(mount(&dev));
    let x = fs.create(None, ROOT, b"x", 0o644, ME).unwrap();
    let t1 = fs.begin().unwrap();
    fs.write(Some(&t1), x.ino, 0, b"t1").unwrap();
    let t2 = fs.begin().unwrap();
    assert!(matches!(fs.write(Some(&t2), x.ino, 0, b"t2"), Err(FsError::Busy)));
    // Shared directory attributes do not conflict: both create in the root.
    fs.create(Some(&t2), ROOT, b"other", 0o644, ME).unwrap();
    let fs2 = fs.clone();
    let waiter = std::thread::spawn(move || fs2.write(None, x.ino, 0, b"plain").unwrap());
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(!waiter.is_finished());
    // The thread that holds t1 would wait for itself: it gets EBUSY instead.
    assert!(matches!(fs.write(None, x.ino, 0, b"self"), Err(FsError::Busy)));
    fs.commit(t1).unwrap();
    waiter.join().unwrap();
    fs.abort(t2).unwrap();
    assert_eq!(fs.read(x.ino, 0, 10).unwrap(), b"plain");
    fs.sync().unwrap();
    drop(fs);
    let fs = mount(&dev);
    assert_eq!(names(&fs, ROOT), ["x"]);
    assert_eq!(fs.read(x.ino, 0, 10).unwrap(), b"plain");
    assert_eq!(fs.getattr(ROOT).unwrap().nlink, 2);
    assert!(fs.fsck().is_clean());
}

#[test]
fn cleaning_frees_space_and_keeps_everything() {
    // A small device: rewriting one file over and over fills it unless cleaning works.
    let dev = fresh(600, 2, 16);
    let fs = mount(&dev);
    let keep = fs.create(None, ROOT, b"keep", 0o644, ME).unwrap();
    fs.write(None, keep.ino, 0, &[1u8; 8192]).unwrap();
    let f = fs.create(None, ROOT, b"f", 0o644, ME).unwrap();
    for i in 0..400u32 {
        fs.write(None, f.ino, 0, &i.to_le_bytes().repeat(1024)).unwrap();
        if i % 50 == 0 {
            let g = fs.create(None, ROOT, b"tmp", 0o644, ME).unwrap();
            fs.write(None, g.ino, 0, b"x").unwrap();
            fs.unlink(None, ROOT, b"tmp").unwrap();
        }
    }
    fs.sync().unwrap();
    assert!(fs.fsck().is_clean());
    drop(fs);
    let fs = mount(&dev);
    assert_eq!(fs.read(f.ino, 0, 4).unwrap(), 399u32.to_le_bytes());
    assert_eq!(fs.read(keep.ino, 0, 8192).unwrap(), [1u8; 8192]);
    assert_eq!(names(&fs, ROOT), ["f", "keep"]);
    let r = fs.fsck();
    assert!(r.is_clean(), "{:?}", r.problems);
}

#[test]
fn a_device_without_a_file_system_is_refused() {
    let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, 256).unwrap());
    assert!(Fs::mount(dev.clone(), MountOptions::default()).is_err());
    tally_log::Log::format(
        &*dev,
        &tally_log::LogConfig { streams: 1, segment_blocks: 16, ..Default::default() },
    )
    .unwrap();
    assert!(matches!(Fs::mount(dev, MountOptions::default()), Err(FsError::Corrupted { .. })));
}

/// Everything a user can observe, walked from the root.
fn dump(fs: &Fs) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![(ROOT, String::from("/"))];
    while let Some((ino, path)) = todo.pop() {
        let a = fs.getattr(ino).unwrap();
        let mut line = format!(
            "{path} {:?} {:o} {} {} {} {:?}",
            a.kind, a.perm, a.nlink, a.size, a.uid, a.mtime
        );
        match a.kind {
            tally_fs::FileKind::File => {
                line += &format!(
                    " data={:x}",
                    crc32c::crc32c(&fs.read(ino, 0, a.size as usize).unwrap())
                )
            }
            tally_fs::FileKind::Symlink => line += &format!(" -> {:?}", fs.readlink(ino).unwrap()),
            tally_fs::FileKind::Dir => {
                for e in fs.readdir(ino, 0).unwrap() {
                    if e.name != b"." && e.name != b".." {
                        line += &format!(" [{}@{}]", String::from_utf8_lossy(&e.name), e.offset);
                        todo.push((e.ino, format!("{path}{}/", String::from_utf8_lossy(&e.name))));
                    }
                }
            }
            _ => {}
        }
        for x in fs.listxattr(ino).unwrap() {
            line +=
                &format!(" {}={:?}", String::from_utf8_lossy(&x), fs.getxattr(ino, &x).unwrap());
        }
        out.push(line);
    }
    out.sort();
    out
}

#[test]
fn clean_unmount_snapshot_equals_a_full_replay_and_is_used_once() {
    let dev = fresh(4096, 3, 32);
    let fs = mount(&dev);
    for i in 0..40u32 {
        let d = fs.mkdir(None, ROOT, format!("d{i}").as_bytes(), 0o750, ME).unwrap();
        let f = fs.create(None, d.ino, b"f", 0o640, ME).unwrap();
        fs.write(None, f.ino, u64::from(i) * 777, &i.to_le_bytes().repeat(500)).unwrap();
        fs.setxattr(None, f.ino, b"user.i", &i.to_le_bytes(), tally_fs::XattrSet::Any).unwrap();
        if i % 3 == 0 {
            fs.unlink(None, d.ino, b"f").unwrap();
            fs.symlink(None, d.ino, b"f", b"gone", ME).unwrap();
        }
    }
    let _ = fs.clean(0, 1);
    let before = dump(&fs);
    assert!(!fs.mount_report().from_snapshot);
    fs.unmount().unwrap();

    let fs = mount(&dev);
    assert!(fs.mount_report().from_snapshot, "{:?}", fs.mount_report());
    assert_eq!(dump(&fs), before);
    assert!(fs.fsck().is_clean());
    let g = fs.create(None, ROOT, b"after", 0o600, ME).unwrap();
    fs.write(None, g.ino, 0, b"written after a snapshot mount").unwrap();
    fs.fsync(g.ino).unwrap();
    let after = dump(&fs);
    drop(fs); // crash: the snapshot was consumed, the log is scanned

    let fs = mount(&dev);
    let r = fs.mount_report();
    assert!(!r.from_snapshot && r.transactions_replayed > 0, "{r:?}");
    assert_eq!(
        dump(&fs),
        after,
        "replaying the log gives what the snapshot gave, plus what came after"
    );
    assert!(fs.fsck().is_clean());
}

#[test]
fn maintenance_makes_changes_durable_and_cleans_below_a_quarter_free() {
    let dev = fresh(800, 2, 16);
    let fs = Arc::new(mount(&dev));
    let f = fs.create(None, ROOT, b"f", 0o644, ME).unwrap();
    let total = 800 / 16;
    let mut i = 0u32;
    while fs.log().free_segments() * 100 >= total * 20 {
        fs.write(None, f.ino, 0, &i.to_le_bytes().repeat(1024)).unwrap();
        i += 1;
    }
    let flushes = fs.log().stats().flush_rounds;
    let r = fs.maintain().unwrap();
    assert!(r.synced && fs.log().stats().flush_rounds > flushes, "{r:?}");
    assert!(r.segments_freed > 0, "{r:?}");
    assert!(fs.log().free_segments() * 100 >= total * 25);
    assert_eq!(fs.maintain().unwrap(), tally_fs::MaintainReport::default(), "nothing left to do");

    // The thread does the same on its own.
    let m = tally_fs::Maintenance::spawn(&fs, std::time::Duration::from_millis(2));
    fs.write(None, f.ino, 0, b"last").unwrap();
    let flushes = fs.log().stats().flush_rounds;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while fs.log().stats().flush_rounds == flushes && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    assert!(fs.log().stats().flush_rounds > flushes, "the thread made the write durable");
    drop(m);
    drop(fs);
    let fs = mount(&dev);
    assert_eq!(fs.read(f.ino, 0, 4).unwrap(), b"last");
    assert!(fs.fsck().is_clean());
}

/// Found by the model test: a transaction that adds an entry to a directory and also changes
/// the directory's own attributes must keep both in memory after commit.
#[test]
fn commit_keeps_a_chmod_of_a_directory_the_transaction_also_added_to() {
    let dev = fresh(4096, 1, 16);
    let fs = mount(&dev);
    let t = fs.begin().unwrap();
    fs.mknod(Some(&t), ROOT, b"c", tally_fs::FileKind::Fifo, 0o640, 0, ME).unwrap();
    fs.setattr(Some(&t), ROOT, &SetAttr { perm: Some(0o700), ..SetAttr::default() }).unwrap();
    fs.commit(t).unwrap();
    let a = fs.getattr(ROOT).unwrap();
    assert_eq!(a.perm, 0o700);
    fs.unmount().unwrap();
    let fs = mount(&dev);
    assert_eq!(fs.getattr(ROOT).unwrap(), a);
}

#[test]
fn a_full_file_system_says_enospc_stays_consistent_and_deletes_still_work() {
    let dev = fresh(1200, 2, 16);
    let fs = mount(&dev);
    let mut files = Vec::new();
    let mut full = None;
    for i in 0..10_000u32 {
        let name = format!("f{i}");
        let r = fs.create(None, ROOT, name.as_bytes(), 0o644, ME).and_then(|a| {
            files.push(name.clone());
            fs.write(None, a.ino, 0, &[i as u8; 3 * 4096]).map(|_| a)
        });
        if let Err(e) = r {
            full = Some(e);
            break;
        }
    }
    let e = full.expect("a 1200-block device fills up");
    assert!(matches!(e, FsError::NoSpace), "{e:?}");
    assert!(fs.fsck().is_clean(), "{:?}", fs.fsck().problems);
    // Deletes use the reserve and always work; then there is room again.
    for name in &files {
        fs.unlink(None, ROOT, name.as_bytes()).unwrap();
    }
    let g = fs.create(None, ROOT, b"again", 0o644, ME).unwrap();
    fs.write(None, g.ino, 0, &[1u8; 3 * 4096]).unwrap();
    fs.sync().unwrap();
    assert!(fs.fsck().is_clean());
    drop(fs);
    let fs = mount(&dev);
    assert_eq!(names(&fs, ROOT), ["again"]);
    assert!(fs.fsck().is_clean());
}

#[test]
fn files_reach_a_tebibyte_and_names_255_bytes() {
    let dev = fresh(4096, 2, 64);
    let fs = mount(&dev);
    let long = vec![b'n'; 255];
    let f = fs.create(None, ROOT, &long, 0o644, ME).unwrap();
    assert!(matches!(fs.create(None, ROOT, &[b'n'; 256], 0o644, ME), Err(FsError::NameTooLong)));
    let end = (1u64 << 40) + 4096;
    fs.write(None, f.ino, end - 5, b"tail!").unwrap();
    assert!(matches!(
        fs.write(None, f.ino, tally_fs::FILE_SIZE_MAX, b"x"),
        Err(FsError::FileTooBig)
    ));
    fs.unmount().unwrap();
    let fs = mount(&dev);
    let f = fs.lookup(ROOT, &long).unwrap();
    assert_eq!(f.size, end);
    assert_eq!(fs.read(f.ino, end - 5, 10).unwrap(), b"tail!");
    assert_eq!(fs.read(f.ino, 1 << 39, 3).unwrap(), [0, 0, 0]);
    assert_eq!(fs.allocated_blocks(f.ino).unwrap(), 1, "sparse: only the block written");
}

/// A million inodes (1,000 directories of 1,000 files, created 1,000 per explicit
/// transaction), then a clean remount and a crash remount. Slow in debug builds; scripts/test
/// runs it (`cargo test --profile ci -p tally-fs --test basic -- --ignored a_million`).
#[test]
#[ignore = "a million inodes: about a minute optimised; scripts/test runs it (docs/FS.md has the figures)"]
fn a_million_inodes() {
    let dev = fresh(1 << 20, 4, 1024);
    let fs = mount(&dev);
    let t0 = std::time::Instant::now();
    for d in 0..1000u32 {
        let dir = fs.mkdir(None, ROOT, format!("d{d}").as_bytes(), 0o755, ME).unwrap();
        let t = fs.begin().unwrap();
        for f in 0..1000u32 {
            fs.create(Some(&t), dir.ino, format!("f{f}").as_bytes(), 0o644, ME).unwrap();
        }
        fs.commit(t).unwrap();
    }
    fs.sync().unwrap();
    let created = t0.elapsed();
    assert_eq!(fs.statfs().files, 1_001_001);
    let t1 = std::time::Instant::now();
    fs.unmount().unwrap();
    let unmounted = t1.elapsed();
    let fs = mount(&dev);
    let snap = fs.mount_report();
    assert!(snap.from_snapshot);
    assert_eq!(fs.statfs().files, 1_001_001);
    drop(fs);
    let fs = mount(&dev);
    let scan = fs.mount_report();
    assert_eq!(fs.statfs().files, 1_001_001);
    assert!(fs.fsck().is_clean());
    eprintln!(
        "a million inodes: created in {created:?}; unmount (snapshot) {unmounted:?}; mount from snapshot {:?} ({} blocks); mount by scan {:?} ({} blocks, {} transactions)",
        snap.time, snap.blocks_read, scan.time, scan.blocks_read, scan.transactions_replayed
    );
}

/// Found by the model test: cleaning drops a directory's superseded attribute records and
/// relocates an older live entry of it with its old version; mount must still find the
/// directory before applying the entry (and a file before its older data).
#[test]
fn records_relocated_by_cleaning_older_than_their_inode_still_mount() {
    let dev = fresh(1024, 1, 16);
    let fs = mount(&dev);
    let b = fs.create(None, ROOT, b"b", 0o644, ME).unwrap();
    fs.write(None, b.ino, 0, &[1u8; 6 * 4096]).unwrap();
    fs.write(None, b.ino, 0, &[2u8; 6 * 4096]).unwrap();
    fs.create(None, ROOT, b"c", 0o644, ME).unwrap();
    fs.setattr(None, b.ino, &SetAttr { perm: Some(0o600), ..SetAttr::default() }).unwrap();
    let report = fs.clean(0, 1).unwrap();
    assert!(report.records_relocated > 0, "{report:?}");
    let before = dump(&fs);
    fs.sync().unwrap();
    drop(fs);
    let fs = mount(&dev);
    assert_eq!(dump(&fs), before);
    assert!(fs.fsck().is_clean());
}

/// Cleaning reads a transaction's adjacent live data blocks in one request, not one request
/// each (a segment of small files was thousands of 4 KiB reads under the state lock).
#[test]
fn cleaning_reads_adjacent_live_blocks_together() {
    let dev = fresh(4096, 1, 64);
    let fs = mount(&dev);
    let f = fs.create(None, ROOT, b"f", 0o644, ME).unwrap();
    fs.write(None, f.ino, 0, &[7u8; 32 * 4096]).unwrap();
    // Later segments, so that the first is no longer the stream's current one.
    let g = fs.create(None, ROOT, b"g", 0o644, ME).unwrap();
    for i in 0..4u8 {
        fs.write(None, g.ino, 0, &[i; 40 * 4096]).unwrap();
    }
    fs.sync().unwrap();
    let before = dev.stats();
    let report = fs.clean(0, 1).unwrap();
    let reads = dev.stats().reads - before.reads;
    assert!(report.data_blocks_relocated >= 32, "{report:?}");
    // One read of the segment's transactions and one of f's 32 blocks, give or take.
    assert!(
        reads * 4 < report.data_blocks_relocated,
        "{reads} reads to relocate {} data blocks",
        report.data_blocks_relocated
    );
    let before = dump(&fs);
    fs.sync().unwrap();
    drop(fs);
    let fs = mount(&dev);
    assert_eq!(dump(&fs), before);
    assert_eq!(fs.read(f.ino, 0, 32 * 4096).unwrap(), vec![7u8; 32 * 4096]);
    assert!(fs.fsck().is_clean());
}

#[test]
fn maintenance_moves_mostly_dead_segments_and_leaves_live_ones() {
    // Plenty of free space: only the liveness rule can make maintenance clean.
    let dev = fresh(4096, 1, 16);
    let fs = mount(&dev);
    // The oldest segments: one file written once, never changed (live).
    let keep = fs.create(None, ROOT, b"keep", 0o644, ME).unwrap();
    fs.write(None, keep.ino, 0, &[9u8; 40 * 4096]).unwrap();
    let r = fs.maintain().unwrap();
    assert_eq!(r.mostly_dead_cleaned, 0, "a live oldest segment is left alone: {r:?}");
    // Then a file rewritten in place many times: its old blocks die.
    let hot = fs.create(None, ROOT, b"hot", 0o644, ME).unwrap();
    for i in 0..200u32 {
        fs.write(None, hot.ino, 0, &i.to_le_bytes().repeat(1024)).unwrap();
    }
    let r = fs.maintain().unwrap();
    assert_eq!(r.mostly_dead_cleaned, 0, "the oldest segment is still the live one: {r:?}");
    // Deleting the live file makes the oldest segments dead; now they are worth moving.
    fs.unlink(None, ROOT, b"keep").unwrap();
    let free = fs.log().free_segments();
    let r = fs.maintain().unwrap();
    assert!(r.mostly_dead_cleaned > 0 && fs.log().free_segments() > free, "{r:?}");
    drop(fs);
    let fs = mount(&dev);
    assert_eq!(names(&fs, ROOT), ["hot"]);
    assert_eq!(fs.read(hot.ino, 0, 4).unwrap(), 199u32.to_le_bytes());
    assert!(fs.fsck().is_clean());
}

#[test]
fn an_open_file_outlives_its_last_unlink_and_a_crash_frees_it() {
    let dev = fresh(4096, 2, 64);
    let fs = mount(&dev);
    let f = fs.create(None, ROOT, b"f", 0o644, ME).unwrap();
    fs.open(f.ino).unwrap();
    fs.unlink(None, ROOT, b"f").unwrap();
    fs.write(None, f.ino, 0, b"still here").unwrap();
    assert_eq!(fs.read(f.ino, 0, 20).unwrap(), b"still here");
    assert_eq!(fs.getattr(f.ino).unwrap().nlink, 0);
    assert!(fs.fsck().is_clean(), "an open orphan is not a problem");
    fs.sync().unwrap();
    drop(fs); // crash with the orphan

    let fs = mount(&dev);
    assert_eq!(fs.mount_report().orphans_freed, 1);
    assert!(matches!(fs.getattr(f.ino), Err(FsError::NotFound)));
    assert!(fs.fsck().is_clean());

    // Without a crash, the last release frees it.
    let g = fs.create(None, ROOT, b"g", 0o644, ME).unwrap();
    fs.open(g.ino).unwrap();
    fs.open(g.ino).unwrap();
    fs.unlink(None, ROOT, b"g").unwrap();
    fs.release(g.ino).unwrap();
    assert!(fs.getattr(g.ino).is_ok(), "one handle still open");
    fs.release(g.ino).unwrap();
    assert!(matches!(fs.getattr(g.ino), Err(FsError::NotFound)));
    fs.unmount().unwrap();
    let fs = mount(&dev);
    assert_eq!(fs.mount_report().orphans_freed, 0);
    assert!(fs.fsck().is_clean());
}

#[test]
fn a_corrupted_data_block_reads_as_eio_never_as_wrong_data_and_fsck_says_so() {
    let dev = fresh(1024, 1, 16);
    let fs = mount(&dev);
    let f = fs.create(None, ROOT, b"f", 0o644, ME).unwrap();
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 256) as u8).collect();
    fs.write(None, f.ino, 0, &pattern).unwrap();
    fs.write(None, f.ino, 4096, b"second block").unwrap();
    fs.unmount().unwrap();
    // Find the data block on the device and damage one byte.
    let mut at = None;
    for b in 0..1024 {
        let mut buf = vec![0u8; 4096];
        dev.read(b, &mut buf).unwrap();
        if buf == pattern {
            at = Some(b);
        }
    }
    let at = at.expect("the data block is on the device");
    let mut buf = pattern.clone();
    buf[100] ^= 0x10;
    dev.write_sync(
        vec![tally_media::Write::new(at, tally_media::IoBuf::from_slice(&buf))],
        tally_media::WriteFlags::NONE,
    )
    .unwrap();
    let fs = mount(&dev);
    assert!(matches!(fs.read(f.ino, 0, 10), Err(FsError::Io { .. })));
    assert_eq!(fs.read(f.ino, 4096, 12).unwrap(), b"second block", "other blocks still read");
    let r = fs.fsck();
    assert_eq!(r.problems.len(), 1, "{:?}", r.problems);
    assert!(r.problems[0].contains("block 0"), "{:?}", r.problems);
}

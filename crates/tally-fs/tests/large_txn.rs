//! Large explicit transactions (issue 15 part 1): a transaction is bounded by free space, not by
//! a log segment. Its data goes to the device while it runs (parts of a log run), it commits
//! with one flush, and an abort, a crash before the commit, or running out of space leaves the
//! file system as it was.

use std::sync::Arc;

use tally_fs::{Fs, FsError, Ino, MkfsOptions, MountOptions, Owner, ROOT};
use tally_media::{Device, MemDevice};

const ME: Owner = Owner { uid: 1000, gid: 1000 };
/// 4 MiB segments, as `tally mkfs` makes them.
const SEGMENT_BLOCKS: u32 = 1024;

fn fresh(mib: u64) -> Arc<dyn Device> {
    let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, mib * 256).unwrap());
    let opts = MkfsOptions { streams: 2, segment_blocks: SEGMENT_BLOCKS, uuid: None };
    Fs::mkfs(dev.clone(), &opts).unwrap();
    dev
}

fn mount(dev: &Arc<dyn Device>) -> Fs {
    Fs::mount(dev.clone(), MountOptions::default()).unwrap()
}

/// Contents of file `i` of a tree: `len` bytes that differ per file and per offset.
fn content(i: u64, len: usize) -> Vec<u8> {
    (0..len).map(|k| (k as u64).wrapping_mul(2_654_435_761).wrapping_add(i * 7919) as u8).collect()
}

/// Size of file `i` (2 to 40 KiB; file 0 is 12 MiB, three segments' worth).
fn size_of(i: u64) -> usize {
    if i == 0 {
        12 << 20
    } else {
        2048 + ((i * 7919) % 38) as usize * 1024
    }
}

/// Write `files` files in 30 directories inside `txn`, in 128 KiB writes as the kernel sends
/// them. Returns the bytes written, or the first error.
fn write_tree(fs: &Fs, txn: &tally_fs::Txn, top: &[u8], files: u64) -> Result<u64, FsError> {
    let top = fs.mkdir(Some(txn), ROOT, top, 0o755, ME)?.ino;
    let dirs: Vec<Ino> = (0..30)
        .map(|d| fs.mkdir(Some(txn), top, format!("d{d}").as_bytes(), 0o755, ME).map(|a| a.ino))
        .collect::<Result<_, _>>()?;
    let mut bytes = 0u64;
    for i in 0..files {
        let dir = dirs[(i % 30) as usize];
        let ino = fs.create(Some(txn), dir, format!("f{i}").as_bytes(), 0o644, ME)?.ino;
        let data = content(i, size_of(i));
        for (k, chunk) in data.chunks(128 << 10).enumerate() {
            fs.write(Some(txn), ino, (k as u64) << 17, chunk)?;
        }
        bytes += data.len() as u64;
    }
    Ok(bytes)
}

/// Every file of the tree under `top` has its contents.
fn check_tree(fs: &Fs, top: &[u8], files: u64) {
    let top = fs.lookup(ROOT, top).unwrap().ino;
    for i in 0..files {
        let dir = fs.lookup(top, format!("d{}", i % 30).as_bytes()).unwrap().ino;
        let f = fs.lookup(dir, format!("f{i}").as_bytes()).unwrap();
        let want = content(i, size_of(i));
        assert_eq!(f.size, want.len() as u64, "size of f{i}");
        assert!(fs.read(f.ino, 0, want.len()).unwrap() == want, "contents of f{i}");
    }
}

fn names(fs: &Fs) -> Vec<Vec<u8>> {
    let mut n: Vec<Vec<u8>> = fs.readdir(ROOT, 0).unwrap().into_iter().map(|e| e.name).collect();
    n.sort();
    n
}

/// 3,000 files (some 74 MiB, one of them 12 MiB, three segments) in one transaction: the data
/// goes out while it is written (no flush before the commit), the commit costs one flush, and
/// everything is there after a crash (no unmount) and a remount.
#[test]
fn a_tree_of_many_segments_commits_with_one_flush() {
    let dev = fresh(320);
    let fs = mount(&dev);
    let before = dev.stats();
    let txn = fs.begin().unwrap();
    let bytes = write_tree(&fs, &txn, b"tree", 3000).unwrap();
    let written = dev.stats() - before;
    assert!(bytes > 64 << 20, "tree of {bytes} bytes");
    assert_eq!(written.flushes, 0, "no flush while the transaction runs");
    assert!(
        written.bytes_written >= bytes / 2,
        "data goes out while written: {} of {bytes} bytes on the device before the commit",
        written.bytes_written
    );
    let at_commit = dev.stats();
    fs.commit_durable(txn).unwrap();
    let commit = dev.stats() - at_commit;
    assert_eq!(commit.flushes, 1, "one flush for the commit");
    println!(
        "tree {} MiB: {} MiB written before the commit, {} KiB at it, {} flush(es)",
        bytes >> 20,
        written.bytes_written >> 20,
        commit.bytes_written >> 10,
        commit.flushes
    );
    check_tree(&fs, b"tree", 3000);
    drop(fs); // a crash: no unmount, no snapshot
    let fs = mount(&dev);
    check_tree(&fs, b"tree", 3000);
}

/// Explicit transactions do not hold their contents in DRAM: 256 MiB written in one
/// transaction (four times the data the file system keeps in memory before it writes it out
/// itself): the data held in memory stays within that limit and a write (64 MiB, a quarter of
/// the transaction), and everything is there after the commit and after a crash.
#[test]
fn a_transaction_four_times_the_cache_is_not_held_in_memory() {
    const MIB: u64 = 1 << 20;
    let dev = fresh(640);
    let fs = mount(&dev);
    let txn = fs.begin().unwrap();
    let ino = fs.create(Some(&txn), ROOT, b"big", 0o644, ME).unwrap().ino;
    let mut held_max = 0;
    for i in 0..256u64 {
        fs.write(Some(&txn), ino, i * MIB, &content(i, MIB as usize)).unwrap();
        held_max = held_max.max(fs.data_bytes_in_memory());
    }
    println!("256 MiB in one transaction: at most {} MiB of data held in memory", held_max >> 20);
    assert!(held_max <= 80 * MIB, "{held_max} bytes held in memory");
    fs.commit_durable(txn).unwrap();
    let check = |fs: &Fs| {
        for i in [0, 1, 127, 255] {
            assert!(fs.read(ino, i * MIB, MIB as usize).unwrap() == content(i, MIB as usize));
        }
    };
    check(&fs);
    drop(fs); // a crash: no unmount, no snapshot
    let fs = mount(&dev);
    check(&fs);
}

/// An abort after parts went out (and were even made durable by a sync) leaves nothing: not
/// in memory, not after a remount; the file the transaction overwrote keeps its contents.
#[test]
fn an_abort_after_parts_leaves_nothing() {
    let dev = fresh(160);
    let fs = mount(&dev);
    let keep = fs.create(None, ROOT, b"keep", 0o644, ME).unwrap().ino;
    let old = content(99, 3 << 20);
    fs.write(None, keep, 0, &old).unwrap();
    fs.sync().unwrap();
    let before = names(&fs);
    let txn = fs.begin().unwrap();
    write_tree(&fs, &txn, b"tree", 400).unwrap();
    fs.write(Some(&txn), keep, 0, &content(7, 3 << 20)).unwrap();
    fs.sync().unwrap(); // the parts written so far are durable
    fs.abort(txn).unwrap();
    assert_eq!(names(&fs), before);
    assert!(fs.read(keep, 0, old.len()).unwrap() == old);
    drop(fs);
    let fs = mount(&dev);
    assert_eq!(names(&fs), before);
    assert!(fs.read(keep, 0, old.len()).unwrap() == old);
}

/// A crash while the transaction runs, after its parts are durable: nothing of it survives,
/// and its parts are garbage: free at once in `statfs`, and that space can be written (cleaning
/// reclaims the dead parts when it is needed).
#[test]
fn a_crash_before_the_commit_leaves_nothing() {
    let dev = fresh(160);
    let fs = mount(&dev);
    fs.create(None, ROOT, b"before", 0o644, ME).unwrap();
    let before = names(&fs);
    fs.sync().unwrap();
    let free_before = fs.statfs().blocks_free;
    let written_before = dev.stats().bytes_written;
    let txn = fs.begin().unwrap();
    write_tree(&fs, &txn, b"tree", 400).unwrap();
    fs.sync().unwrap();
    let stats = fs.log().stats();
    assert!(stats.commits > 10, "parts were committed to the log: {stats:?}");
    // The crash: the file system goes away with the transaction still open (`Txn` is a
    // handle; nothing ends the transaction when it is dropped).
    let _ = txn;
    let parts_blocks = (dev.stats().bytes_written - written_before) / 4096;
    drop(fs);
    let fs = mount(&dev);
    assert_eq!(names(&fs), before);
    // Free as before, up to the unused ends of the two streams' current segments (reserved,
    // and moved by the parts' writes): far less than the parts took.
    let free_after = fs.statfs().blocks_free;
    println!("free {free_before} blocks before, {free_after} after ({parts_blocks} in parts)");
    let ends = 2 * u64::from(SEGMENT_BLOCKS);
    assert!(parts_blocks > 2 * ends, "the parts took {parts_blocks} blocks");
    assert!(
        free_after + ends >= free_before,
        "free {free_before} blocks before, {free_after} after the crash ({parts_blocks} in parts)"
    );
    // What statfs calls free, down to 2 % of the capacity, is written: more than the free
    // segments the file system lets data use (at least five are kept from it: the two
    // streams' next ones, two reserve segments, the unmount snapshot's room), so the parts'
    // dead segments are cleaned and reused.
    let ino = fs.create(None, ROOT, b"fill", 0o644, ME).unwrap().ino;
    let chunk = vec![0x5A_u8; 1 << 20];
    let space = fs.space().unwrap();
    let fill_blocks = free_after - space.capacity_blocks / 50;
    let usable = space.free_segment_blocks - 5 * u64::from(SEGMENT_BLOCKS);
    println!("filling {fill_blocks} blocks, {usable} usable in free segments");
    assert!(fill_blocks > usable, "the fill would not need the parts' space");
    for i in 0..fill_blocks / 256 {
        if let Err(e) = fs.write(None, ino, i << 20, &chunk) {
            panic!("writing MiB {i} of {}: {e} ({:?})", fill_blocks / 256, fs.space());
        }
    }
    fs.sync().unwrap();
    assert!(fs.fsck().is_clean());
}

/// A transaction larger than the free space fails with `ENOSPC` (a write inside it, or its
/// commit), and once aborted the file system is as it was, with its space back.
#[test]
fn a_transaction_larger_than_free_space_fails_cleanly() {
    let dev = fresh(80);
    let fs = mount(&dev);
    let keep = fs.create(None, ROOT, b"keep", 0o644, ME).unwrap().ino;
    fs.write(None, keep, 0, &content(5, 1 << 20)).unwrap();
    let before = names(&fs);
    let txn = fs.begin().unwrap();
    let err = write_tree(&fs, &txn, b"tree", 3000).expect_err("74 MiB do not fit in 80 MiB");
    assert!(matches!(err, FsError::NoSpace), "{err:?}");
    fs.abort(txn).unwrap();
    assert_eq!(names(&fs), before);
    assert!(fs.read(keep, 0, 1 << 20).unwrap() == content(5, 1 << 20));
    // The abandoned parts are garbage: ordinary writes find room again (after cleaning).
    let after = fs.create(None, ROOT, b"after", 0o644, ME).unwrap().ino;
    fs.write(None, after, 0, &content(6, 8 << 20)).unwrap();
    fs.sync().unwrap();
    drop(fs);
    let fs = mount(&dev);
    assert!(fs.read(keep, 0, 1 << 20).unwrap() == content(5, 1 << 20));
    assert_eq!(fs.lookup(ROOT, b"after").unwrap().size, 8 << 20);
    assert!(fs.lookup(ROOT, b"tree").is_err());
}

/// A maintenance round (the mount's every 5 s) while a transaction's parts are out flushes
/// nothing for them: they are flushed with the close. A change outside the transaction is
/// still made durable by the next round.
#[test]
fn maintenance_rounds_do_not_flush_a_running_transactions_parts() {
    let dev = fresh(160);
    let fs = mount(&dev);
    fs.sync().unwrap();
    assert!(!fs.maintain().unwrap().synced, "nothing to make durable");
    let txn = fs.begin().unwrap();
    write_tree(&fs, &txn, b"tree", 200).unwrap();
    let before = dev.stats();
    let r = fs.maintain().unwrap();
    assert!(!r.synced, "{r:?}");
    assert_eq!((dev.stats() - before).flushes, 0, "a round flushed a transaction's parts");
    let outside = fs.create(None, ROOT, b"outside", 0o644, ME).unwrap().ino;
    fs.write(None, outside, 0, b"mine").unwrap();
    let r = fs.maintain().unwrap();
    assert!(r.synced, "a change outside the transaction waits for no commit: {r:?}");
    assert_eq!((dev.stats() - before).flushes, 1);
    let at_commit = dev.stats();
    fs.commit_durable(txn).unwrap();
    assert_eq!((dev.stats() - at_commit).flushes, 1);
    check_tree(&fs, b"tree", 200);
}

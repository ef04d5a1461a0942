//! Abort restores the DRAM state exactly, block map included, when a transaction changed a big
//! file in many ways (overwrite, append, truncate, punch, xattrs, unlink) — the undo list keeps
//! the old value of every block-map key an operation touches rather than a copy of the whole
//! inode, so one forgotten key would show here as a wrong byte or block count. Also a
//! microbenchmark (ignored by default) of the CPU per 4 KiB append as a file grows.

use std::sync::Arc;

use tally_fs::{
    Attr, FallocFlags, Fs, FsError, Ino, MkfsOptions, MountOptions, Owner, RenameFlags, SetAttr,
    XattrSet, ROOT,
};
use tally_media::{Device, MemDevice};

const ME: Owner = Owner { uid: 1000, gid: 1000 };
const BS: u64 = 4096;

fn fresh(blocks: u64) -> (Arc<dyn Device>, Fs) {
    let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, blocks).unwrap());
    Fs::mkfs(dev.clone(), &MkfsOptions { streams: 2, segment_blocks: 1024, uuid: None }).unwrap();
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    (dev, fs)
}

/// Bytes that differ per block and per byte, so a block restored at the wrong index shows.
fn pattern(block: u64, salt: u8) -> Vec<u8> {
    (0..BS).map(|i| (block as u8).wrapping_mul(31) ^ (i as u8) ^ salt).collect()
}

/// Everything a reader can see of one inode.
#[derive(Debug, PartialEq, Eq)]
struct FileView {
    attr: Attr,
    allocated: u64,
    bytes: Vec<u8>,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

fn view(fs: &Fs, ino: Ino) -> FileView {
    let attr = fs.getattr(ino).unwrap();
    let mut names = fs.listxattr(ino).unwrap();
    names.sort();
    let xattrs = names.into_iter().map(|n| (n.clone(), fs.getxattr(ino, &n).unwrap())).collect();
    FileView {
        attr,
        allocated: fs.allocated_blocks(ino).unwrap(),
        bytes: fs.read(ino, 0, attr.size as usize).unwrap(),
        xattrs,
    }
}

/// Entries with their readdir offsets and attributes.
fn dir_view(fs: &Fs, dir: Ino) -> Vec<(Vec<u8>, Ino, u64, Attr)> {
    let mut v: Vec<_> = fs
        .readdir(dir, 0)
        .unwrap()
        .into_iter()
        .map(|e| {
            let a = fs.getattr(e.ino).unwrap();
            (e.name, e.ino, e.offset, a)
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

const BIG_BLOCKS: u64 = 600;

/// A big file with committed blocks (some durable, some still cached), a hole, a partial last
/// block and xattrs; a second file; a directory with entries.
fn setup(fs: &Fs) -> (Ino, Ino, Ino) {
    let big = fs.create(None, ROOT, b"big", 0o644, ME).unwrap().ino;
    for b in 0..BIG_BLOCKS / 2 {
        fs.write(None, big, b * BS, &pattern(b, 1)).unwrap();
    }
    fs.sync().unwrap(); // these blocks are durable: their bytes left memory
    for b in BIG_BLOCKS / 2..BIG_BLOCKS {
        if b % 7 != 3 {
            fs.write(None, big, b * BS, &pattern(b, 2)).unwrap(); // b % 7 == 3: holes
        }
    }
    fs.write(None, big, BIG_BLOCKS * BS, b"partial tail").unwrap();
    fs.setxattr(None, big, b"user.a", b"one", XattrSet::Any).unwrap();
    fs.setxattr(None, big, b"user.b", b"two", XattrSet::Any).unwrap();
    let other = fs.create(None, ROOT, b"other", 0o600, ME).unwrap().ino;
    fs.write(None, other, 0, &vec![9u8; 5 * BS as usize]).unwrap();
    let d = fs.mkdir(None, ROOT, b"d", 0o755, ME).unwrap().ino;
    for i in 0..50u32 {
        fs.create(None, d, format!("e{i}").as_bytes(), 0o644, ME).unwrap();
    }
    (big, other, d)
}

/// Every kind of change to the big file's block map (and the rest), several times over the
/// same blocks, inside `txn`.
fn churn(fs: &Fs, txn: &tally_fs::Txn, big: Ino, other: Ino, d: Ino) {
    let t = Some(txn);
    // Overwrite whole blocks, durable and cached ones, and fill a hole.
    for b in [0, 1, 150, 299, 300, 301, 3 + 7 * 50, 599] {
        fs.write(t, big, b * BS, &pattern(b, 7)).unwrap();
    }
    // Partial overwrites straddling blocks.
    fs.write(t, big, 10 * BS + 100, &vec![0xAB; 2 * BS as usize]).unwrap();
    // Append past the end, with a gap.
    fs.write(t, big, (BIG_BLOCKS + 5) * BS + 17, &vec![0xCD; 3 * BS as usize]).unwrap();
    // Punch whole and partial blocks, including ones just written.
    let punch = FallocFlags { keep_size: true, punch_hole: true, ..FallocFlags::default() };
    fs.fallocate(t, big, 149 * BS + 9, 3 * BS, punch).unwrap();
    fs.fallocate(t, big, 20 * BS, 10 * BS, punch).unwrap();
    // Truncate into the middle (a partial block), extend, write again past the cut.
    fs.setattr(t, big, &SetAttr { size: Some(400 * BS + 123), ..SetAttr::default() }).unwrap();
    fs.setattr(t, big, &SetAttr { size: Some(1000 * BS), ..SetAttr::default() }).unwrap();
    fs.write(t, big, 450 * BS, &pattern(450, 9)).unwrap();
    fs.write(t, big, 0, b"again").unwrap();
    // Attributes and xattrs.
    fs.setattr(t, big, &SetAttr { perm: Some(0o600), uid: Some(7), ..SetAttr::default() }).unwrap();
    fs.setxattr(t, big, b"user.a", b"changed", XattrSet::Replace).unwrap();
    fs.removexattr(t, big, b"user.b").unwrap();
    fs.setxattr(t, big, b"user.c", b"new", XattrSet::Create).unwrap();
    // A file written, then freed with its blocks; a new file; a renamed, then removed entry.
    fs.write(t, other, BS, &pattern(1, 3)).unwrap();
    fs.unlink(t, ROOT, b"other").unwrap();
    let n = fs.create(t, d, b"new", 0o644, ME).unwrap().ino;
    fs.write(t, n, 0, b"fresh").unwrap();
    fs.rename(t, d, b"e3", ROOT, b"moved", RenameFlags::default()).unwrap();
    fs.unlink(t, d, b"e4").unwrap();
    fs.rename(t, ROOT, b"d", ROOT, b"d2", RenameFlags::default()).unwrap();
}

#[test]
fn abort_restores_a_big_file_and_its_directory_exactly() {
    let (dev, fs) = fresh(16 * 1024);
    let (big, other, d) = setup(&fs);
    let before = (view(&fs, big), view(&fs, other), dir_view(&fs, ROOT), dir_view(&fs, d));
    let holes = (BIG_BLOCKS / 2..BIG_BLOCKS).filter(|b| b % 7 == 3).count() as u64;
    assert_eq!(before.0.allocated, BIG_BLOCKS - holes + 1);

    let t = fs.begin().unwrap();
    churn(&fs, &t, big, other, d);
    assert_ne!(view(&fs, big), before.0, "the transaction changed nothing visible");
    fs.abort(t).unwrap();

    let after = (view(&fs, big), view(&fs, other), dir_view(&fs, ROOT), dir_view(&fs, d));
    assert_eq!(after.0.allocated, before.0.allocated, "block count of the big file");
    assert!(after.0.bytes == before.0.bytes, "contents of the big file differ after abort");
    assert_eq!(after, before);

    // Nothing of it reached the log, and later operations on the same objects work.
    fs.write(None, big, 0, b"later").unwrap();
    fs.sync().unwrap();
    drop(fs);
    let fs = Fs::mount(dev, MountOptions::default()).unwrap();
    let mut want = before.0;
    want.bytes[..5].copy_from_slice(b"later");
    let got = view(&fs, big);
    assert_eq!(
        (got.allocated, &got.bytes, &got.xattrs),
        (want.allocated, &want.bytes, &want.xattrs)
    );
    assert_eq!(view(&fs, other).bytes, before.1.bytes);
    assert_eq!(dir_view(&fs, d).len(), before.3.len());
    let r = fs.fsck();
    assert!(r.is_clean(), "{:?}", r.problems);
}

/// The same churn committed, then compared after a remount with the DRAM state it left: the
/// per-key undo must not leave anything behind that the log does not hold either.
#[test]
fn committed_churn_matches_after_remount() {
    let (dev, fs) = fresh(16 * 1024);
    let (big, other, d) = setup(&fs);
    let t = fs.begin().unwrap();
    churn(&fs, &t, big, other, d);
    fs.commit_durable(t).unwrap();
    let dram = (view(&fs, big), dir_view(&fs, ROOT));
    assert!(matches!(fs.getattr(other), Err(FsError::NotFound)));
    drop(fs);
    let fs = Fs::mount(dev, MountOptions::default()).unwrap();
    assert_eq!((view(&fs, big), dir_view(&fs, ROOT)), dram);
    let r = fs.fsck();
    assert!(r.is_clean(), "{:?}", r.problems);
}

/// A plain operation rolled back (here: `EBUSY` after it changed blocks, because a second
/// inode it needs is locked) leaves the file as it was.
#[test]
fn a_failed_plain_operation_leaves_the_block_map_alone() {
    let (_dev, fs) = fresh(16 * 1024);
    let (big, _other, d) = setup(&fs);
    let before = view(&fs, big);
    let t = fs.begin().unwrap();
    fs.write(Some(&t), big, 0, b"held").unwrap();
    // Another transaction touching the held file gets EBUSY and must leave nothing.
    let t2 = fs.begin().unwrap();
    fs.create(Some(&t2), d, b"x", 0o644, ME).unwrap();
    assert!(matches!(fs.write(Some(&t2), big, 5 * BS, &pattern(5, 5)), Err(FsError::Busy)));
    fs.abort(t2).unwrap();
    fs.abort(t).unwrap();
    assert_eq!(view(&fs, big), before);
}

fn median_spread(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize];
    (at(0.5), at(0.1), at(0.9))
}

/// CPU per 4 KiB append (one operation, one log transaction each) as one file grows to 64 MiB,
/// on a memory device. A timing check, so not in the default suite: scripts/test runs it with
/// `--ignored` (`--nocapture` shows the table). With a whole-inode undo copy the cost grows with
/// the file; it must stay flat.
#[test]
#[ignore = "a timing check (64 MiB of appends); scripts/test runs it"]
fn append_cost_as_the_file_grows() {
    let total: u64 = 64 << 20;
    // Each append is one log transaction: its data block, its records, the header.
    let (_dev, fs) = fresh(6 * total / BS + 4096);
    let f = fs.create(None, ROOT, b"log", 0o644, ME).unwrap().ino;
    let buf = vec![0x5Au8; BS as usize];
    let window = 1024u64; // appends per reported window (4 MiB)
    let mut per_window = Vec::new();
    let mut samples = Vec::with_capacity(window as usize);
    for i in 0..total / BS {
        let t0 = std::time::Instant::now();
        fs.write(None, f, i * BS, &buf).unwrap();
        samples.push(t0.elapsed().as_secs_f64() * 1e6);
        if (i + 1) % window == 0 {
            let (m, lo, hi) = median_spread(std::mem::take(&mut samples));
            per_window.push((((i + 1) * BS) >> 20, m, lo, hi));
        }
    }
    println!("file size MiB | append µs median (p10-p90)");
    for (mib, m, lo, hi) in &per_window {
        println!("{mib:>13} | {m:.2} ({lo:.2}-{hi:.2})");
    }
    let first = per_window[0].1;
    let last = per_window[per_window.len() - 1].1;
    println!("last window / first window: {:.2}x", last / first);
    // A whole-inode undo copy made the last window 18-19x the first (same machine); per-key
    // undo keeps it about 1x. A ratio within one run, so a loaded machine moves both ends.
    assert!(last / first < 4.0, "append cost grows with the file: {:.2}x", last / first);
}

//! A file system filled to 75 % or 90 % of its free space keeps accepting random 4 KiB
//! overwrites: cleaning must always win back the space an overwrite takes, with `maintain` run
//! periodically and with operations left to clean for themselves. Contents are checked against
//! an in-memory copy, by `fsck`, and across a clean remount and a crash (drop) remount.
//!
//! The shape is the cleaning benchmark's (`tally bench fs-peers`): 64 MiB, 4 streams, segments
//! of 256 blocks, files of 992 KiB written 124 KiB at a time.

use std::sync::Arc;

use tally_fs::{Fs, FsError, MkfsOptions, MountOptions, Owner, ROOT};
use tally_media::{Device, MemDevice};

const ME: Owner = Owner { uid: 1000, gid: 1000 };
const BS: usize = 4096;
const FILL_WRITE: usize = 31 * BS;
const FILE_BYTES: usize = 8 * FILL_WRITE;

struct Files {
    inos: Vec<u64>,
    /// The expected contents of each file.
    copy: Vec<Vec<u8>>,
}

fn fill(fs: &Fs, fraction: f64) -> Files {
    let free_at_start = fs.statfs().blocks_free as f64;
    let mut files = Files { inos: Vec::new(), copy: Vec::new() };
    while fs.statfs().blocks_free as f64 > (1.0 - fraction) * free_at_start {
        let n = files.inos.len();
        let a = fs.create(None, ROOT, format!("f{n}").as_bytes(), 0o644, ME).unwrap();
        let content: Vec<u8> = (0..FILE_BYTES).map(|i| (i % 251) as u8 ^ n as u8).collect();
        for off in (0..FILE_BYTES).step_by(FILL_WRITE) {
            fs.write(None, a.ino, off as u64, &content[off..off + FILL_WRITE]).unwrap();
        }
        fs.sync().unwrap();
        files.inos.push(a.ino);
        files.copy.push(content);
    }
    files
}

fn check(fs: &Fs, files: &Files, when: &str) {
    for (ino, want) in files.inos.iter().zip(&files.copy) {
        let got = fs.read(*ino, 0, FILE_BYTES).unwrap();
        assert!(got == *want, "{when}: inode {ino} differs from the in-memory copy");
    }
    let r = fs.fsck();
    assert!(r.is_clean(), "{when}: {:?}", r.problems);
}

/// Fill to `fraction`, then `rounds` × (blocks of the files) random 4 KiB overwrites, calling
/// `maintain` every `maintain_every` of them (never if `None`).
fn run(fraction: f64, rounds: f64, maintain_every: Option<u64>, seed: u64) {
    run_on(fraction, rounds, maintain_every, seed, usize::MAX);
}

/// As [`run`], overwriting only the last `hot` files made (the rest stay as written: cold);
/// `rounds` counts in blocks of the hot files.
fn run_on(fraction: f64, rounds: f64, maintain_every: Option<u64>, seed: u64, hot: usize) {
    let dev: Arc<dyn Device> = Arc::new(MemDevice::new(BS as u32, 16_384).unwrap());
    Fs::mkfs(dev.clone(), &MkfsOptions { streams: 4, segment_blocks: 256, uuid: None }).unwrap();
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    let mut files = fill(&fs, fraction);
    let blocks_per_file = FILE_BYTES / BS;
    let hot_blocks = files.inos.len().min(hot) * blocks_per_file;
    let writes = (hot_blocks as f64 * rounds) as u64;
    let mut rng = fastrand::Rng::with_seed(seed);
    let before = dev.stats().bytes_written;
    let t0 = std::time::Instant::now();
    for n in 0..writes {
        let n_files = files.inos.len();
        let f = rng.usize(n_files.saturating_sub(hot)..n_files);
        let off = rng.usize(..blocks_per_file) * BS;
        // Distinct bytes per write, so a block read from a stale or wrong place shows.
        let mut data: Vec<u8> = (0..BS).map(|i| (i as u64 ^ n) as u8).collect();
        data[..8].copy_from_slice(&n.to_le_bytes());
        match fs.write(None, files.inos[f], off as u64, &data) {
            Ok(_) => {}
            Err(FsError::NoSpace) => {
                panic!(
                    "ENOSPC at {fraction} full after {n} of {writes} overwrites ({} free segments)",
                    fs.log().free_segments()
                )
            }
            Err(e) => panic!("overwrite {n}: {e}"),
        }
        files.copy[f][off..off + BS].copy_from_slice(&data);
        if maintain_every.is_some_and(|m| (n + 1) % m == 0) {
            fs.maintain().unwrap();
        }
    }
    let amplification = (dev.stats().bytes_written - before) as f64 / (writes * BS as u64) as f64;
    eprintln!(
        "{fraction} full, maintain every {maintain_every:?}: {writes} overwrites, write \
         amplification {amplification:.2}, {:.2} s",
        t0.elapsed().as_secs_f64()
    );
    check(&fs, &files, "after the overwrites");
    fs.sync().unwrap();
    drop(fs); // crash: no unmount, the log (with its relocations) is scanned
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    check(&fs, &files, "after a crash remount");
    fs.unmount().unwrap();
    let fs = Fs::mount(dev, MountOptions::default()).unwrap();
    check(&fs, &files, "after a clean remount");
}

#[test]
fn overwrites_at_75_percent_with_maintain() {
    run(0.75, 2.0, Some(256), 1);
}

#[test]
fn overwrites_at_90_percent_with_maintain() {
    run(0.90, 1.0, Some(256), 2);
}

#[test]
fn overwrites_at_75_percent_without_maintain() {
    run(0.75, 2.0, None, 3);
}

#[test]
fn overwrites_at_90_percent_without_maintain() {
    run(0.90, 1.0, None, 4);
}

/// Cold data at the head of every stream's chain must not stop the cleaning of the dead space
/// behind it: one hot file is overwritten while the rest of a 75 % full file system stays as
/// written.
#[test]
fn overwrites_of_one_hot_file_behind_cold_data() {
    run_on(0.75, 40.0, None, 5, 1);
}

//! Damaged images at the library level, fast: random bit flips across a small image, each
//! mounted (recovery on a copy-on-write overlay, as `tally fsck` does) and checked. Nothing may
//! panic, whatever the bytes; and a flip inside a live data block must always be found (mount
//! refuses, or fsck names a problem). One seed replays a run: `TALLY_BITFLIP_SEED=N`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use tally_fs::{Fs, FsMutant, MkfsOptions, MountOptions, Owner, ROOT};
use tally_media::{Device, Image, MemDevice, OverlayDevice};

const BLOCK_SIZE: u32 = 4096;
const BLOCK_COUNT: u64 = 1024;
/// Each data block of the test files starts with this, then its file and block number.
const MARKER: &[u8] = b"BITFLIP-DATA:";
/// Damaged images per starting image (crashed, cleanly unmounted).
const FLIPPED_IMAGES: u32 = 3000;

/// A small file system with files, directories, links, xattrs and data in several blocks.
/// `clean`: unmounted (the image holds a snapshot); else left as after a crash (after a sync).
fn make_image(clean: bool) -> Image {
    let dev = Arc::new(MemDevice::new(BLOCK_SIZE, BLOCK_COUNT).unwrap());
    let opts = MkfsOptions { streams: 2, segment_blocks: 64, uuid: Some([7; 16]) };
    Fs::mkfs(dev.clone(), &opts).unwrap();
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    let me = Owner { uid: 1000, gid: 1000 };
    let d = fs.mkdir(None, ROOT, b"dir", 0o755, me).unwrap();
    for f in 0..6u32 {
        let parent = if f % 2 == 0 { ROOT } else { d.ino };
        let a = fs.create(None, parent, format!("file{f}").as_bytes(), 0o644, me).unwrap();
        let blocks = 1 + f % 3;
        let mut data = Vec::new();
        for b in 0..blocks {
            let mut block = format!("{}{f}:{b}:", String::from_utf8_lossy(MARKER)).into_bytes();
            let mut rng = fastrand::Rng::with_seed(u64::from(f * 16 + b));
            block.extend((block.len()..BLOCK_SIZE as usize).map(|_| rng.u8(..)));
            data.extend(block);
        }
        fs.write(None, a.ino, 0, &data).unwrap();
        if f == 3 {
            fs.link(None, a.ino, ROOT, b"hardlink").unwrap();
            fs.setxattr(None, a.ino, b"user.k", b"v", tally_fs::XattrSet::Any).unwrap();
        }
    }
    fs.symlink(None, ROOT, b"sym", b"dir/file1", me).unwrap();
    fs.rename(None, ROOT, b"file0", d.ino, b"moved", tally_fs::RenameFlags::default()).unwrap();
    fs.sync().unwrap();
    if clean {
        fs.unmount().unwrap();
    } else {
        drop(fs);
    }
    dev.image()
}

/// What one damaged image did.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// Mount refused it with a typed error.
    Refused,
    /// Mounted, fsck clean.
    Clean,
    /// Mounted, fsck found problems.
    Problems,
}

fn mount_and_check(image: Image, mutant: Option<FsMutant>) -> Outcome {
    let base: Arc<dyn Device> = Arc::new(MemDevice::from_image(image));
    let dev: Arc<dyn Device> = Arc::new(OverlayDevice::new(base));
    match Fs::mount(dev, MountOptions { mutant, ..MountOptions::default() }) {
        Err(_) => Outcome::Refused,
        Ok(fs) => {
            let report = fs.fsck();
            // Reading every file through the normal path must not panic either.
            for name in [&b"file2"[..], b"file4", b"hardlink", b"sym"] {
                if let Ok(a) = fs.lookup(ROOT, name) {
                    let _ = fs.read(a.ino, 0, 3 * BLOCK_SIZE as usize);
                }
            }
            if report.is_clean() {
                Outcome::Clean
            } else {
                Outcome::Problems
            }
        }
    }
}

fn seed() -> u64 {
    std::env::var("TALLY_BITFLIP_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed)
}

/// Flip 1–3 random bits, in a written block most of the time (flips in never-written blocks
/// are checked too, but they are most of the image and mostly dead space).
fn flip_random(image: &Image, rng: &mut fastrand::Rng) -> (Image, Vec<(u64, usize)>) {
    let written: Vec<u64> = image.written_blocks().map(|(b, _)| b).collect();
    let mut out = image.clone();
    let mut flips = Vec::new();
    for _ in 0..rng.usize(1..=3) {
        let block = if rng.u8(..) < 220 {
            written[rng.usize(..written.len())]
        } else {
            rng.u64(..BLOCK_COUNT)
        };
        let bit = rng.usize(..BLOCK_SIZE as usize * 8);
        let mut data = out.block(block).to_vec();
        data[bit / 8] ^= 1 << (bit % 8);
        out.set_block(block, data.into());
        flips.push((block, bit));
    }
    (out, flips)
}

#[test]
fn random_bit_flips_never_panic_mount_or_fsck() {
    let seed = seed();
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut panics = Vec::new();
    for clean in [false, true] {
        let image = make_image(clean);
        assert_eq!(mount_and_check(image.clone(), None), Outcome::Clean, "the undamaged image");
        let mut counts = [0u32; 3];
        for i in 0..FLIPPED_IMAGES {
            let (damaged, flips) = flip_random(&image, &mut rng);
            match catch_unwind(AssertUnwindSafe(|| mount_and_check(damaged, None))) {
                Ok(o) => counts[o as usize] += 1,
                Err(_) => panics.push(format!("seed {seed} clean={clean} image {i}: {flips:?}")),
            }
        }
        eprintln!(
            "clean={clean}: {} refused by mount, {} clean, {} with problems found by fsck",
            counts[0], counts[1], counts[2]
        );
        // Flips land in checked structures often enough that some must be caught.
        assert!(counts[0] + counts[2] > 0, "{FLIPPED_IMAGES} damaged images and nothing noticed");
    }
    assert!(panics.is_empty(), "panics (replay with TALLY_BITFLIP_SEED={seed}):\n{panics:#?}");
}

/// Blocks of the image holding live file data (found by their marker).
fn data_blocks(image: &Image) -> Vec<u64> {
    image.written_blocks().filter(|(_, d)| d.starts_with(MARKER)).map(|(b, _)| b).collect()
}

/// Every single-bit flip placed in a live data block of a cleanly unmounted image is found.
/// Returns how many of `tries` were missed. (After a crash, a damaged block of a transaction
/// after the checkpoint makes that transaction fail its crc, and recovery drops it and the
/// rest of its stream as torn by the crash: the log cannot tell damage from a torn write
/// there, and the mount is consistent, so fsck is clean. docs/CLI.md says so.)
fn missed_data_flips(mutant: Option<FsMutant>, tries: usize) -> usize {
    let mut rng = fastrand::Rng::with_seed(seed() ^ 0xda7a);
    let mut missed = 0;
    {
        let image = make_image(true);
        let blocks = data_blocks(&image);
        assert!(blocks.len() >= 12, "the test files' blocks are on the image: {}", blocks.len());
        for _ in 0..tries {
            let block = blocks[rng.usize(..blocks.len())];
            let bit = rng.usize(..BLOCK_SIZE as usize * 8);
            let mut damaged = image.clone();
            let mut data = damaged.block(block).to_vec();
            data[bit / 8] ^= 1 << (bit % 8);
            damaged.set_block(block, data.into());
            if mount_and_check(damaged, mutant) == Outcome::Clean {
                missed += 1;
            }
        }
    }
    missed
}

#[test]
fn a_flip_in_any_live_data_block_is_found() {
    assert_eq!(missed_data_flips(None, 100), 0);
}

/// The check above can fail: an fsck that does not read the data blocks passes damaged data.
#[cfg(feature = "mutants")]
#[test]
fn an_fsck_that_skips_data_blocks_is_caught() {
    let missed = missed_data_flips(Some(FsMutant::FsckSkipsDataBlocks), 20);
    assert!(missed > 0, "the mutant fsck-skips-data-blocks was not caught");
}

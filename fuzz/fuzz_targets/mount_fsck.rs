//! Mount and fsck of a hostile image must return (an error or a report), never panic.
//!
//! Input: `b"RAW"` then a whole image (padded to whole blocks); otherwise patches over a valid
//! image with files, directories and a crash left to recover: each 5 bytes are a little-endian
//! byte offset (modulo the image size) and a byte to xor there. Patches reach the superblocks,
//! the log's units and the data blocks far more often than random whole images do.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use tally_fs::{Fs, MkfsOptions, MountOptions, Owner, ROOT};
use tally_media::{Device, Image, MemDevice, OverlayDevice};

const BLOCK_SIZE: u32 = 4096;
const BLOCK_COUNT: u64 = 512;

/// A small file system left as after a crash (synced, never unmounted).
fn seed_image() -> &'static Image {
    static IMAGE: OnceLock<Image> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let dev = Arc::new(MemDevice::new(BLOCK_SIZE, BLOCK_COUNT).expect("geometry"));
        let opts = MkfsOptions { streams: 2, segment_blocks: 32, uuid: Some([1; 16]) };
        Fs::mkfs(dev.clone(), &opts).expect("mkfs");
        let fs = Fs::mount(dev.clone(), MountOptions::default()).expect("mount");
        let me = Owner { uid: 0, gid: 0 };
        let d = fs.mkdir(None, ROOT, b"d", 0o755, me).expect("mkdir");
        for i in 0..4u8 {
            let a = fs.create(None, d.ino, &[b'f', b'0' + i], 0o644, me).expect("create");
            fs.write(None, a.ino, 0, &vec![i; 5000]).expect("write");
        }
        fs.symlink(None, ROOT, b"s", b"d/f0", me).expect("symlink");
        fs.sync().expect("sync");
        dev.image()
    })
}

fn image_from(data: &[u8]) -> Option<Image> {
    if let Some(raw) = data.strip_prefix(b"RAW") {
        let blocks = (raw.len() as u64).div_ceil(u64::from(BLOCK_SIZE)).clamp(2, 64);
        let dev = MemDevice::new(BLOCK_SIZE, blocks).ok()?;
        let mut image = dev.image();
        for (i, chunk) in raw.chunks(BLOCK_SIZE as usize).take(blocks as usize).enumerate() {
            let mut block = vec![0u8; BLOCK_SIZE as usize];
            block[..chunk.len()].copy_from_slice(chunk);
            image.set_block(i as u64, block.into());
        }
        return Some(image);
    }
    let mut image = seed_image().clone();
    let size = BLOCK_COUNT * u64::from(BLOCK_SIZE);
    for patch in data.chunks_exact(5) {
        let offset = u64::from(u32::from_le_bytes([patch[0], patch[1], patch[2], patch[3]])) % size;
        let block = offset / u64::from(BLOCK_SIZE);
        let mut bytes = image.block(block).to_vec();
        bytes[(offset % u64::from(BLOCK_SIZE)) as usize] ^= patch[4];
        image.set_block(block, bytes.into());
    }
    Some(image)
}

fuzz_target!(|data: &[u8]| {
    let Some(image) = image_from(data) else { return };
    let base: Arc<dyn Device> = Arc::new(MemDevice::from_image(image));
    let dev: Arc<dyn Device> = Arc::new(OverlayDevice::new(base));
    if let Ok(fs) = Fs::mount(dev, MountOptions::default()) {
        let _ = fs.fsck();
        if let Ok(d) = fs.lookup(ROOT, b"d") {
            if let Ok(entries) = fs.readdir(d.ino, 0) {
                for e in entries {
                    let _ = fs.read(e.ino, 0, 8192);
                }
            }
        }
    }
});

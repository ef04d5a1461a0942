//! Helpers shared by the crash-device tests: blocks filled with one byte, and images described
//! as one byte per atomic unit so sets of images can be written out literally.
#![allow(dead_code)]

use std::collections::BTreeSet;

use tally_media::{Device, Geometry, Image, IoBuf, Write, WriteFlags};
use tally_sim::{CrashConfig, CrashDevice, CrashImages, CrashOptions};

/// A geometry of `block_count` blocks of `block_size` bytes, atomic unit `atomic`.
pub fn geometry(block_size: u32, block_count: u64, atomic: u32) -> Geometry {
    Geometry::new(block_size, block_count, atomic).unwrap()
}

/// A crash device of 16 blocks of 4 KiB, atomic 4 KiB, seed 1.
pub fn device() -> CrashDevice {
    CrashDevice::new(geometry(4096, 16, 4096), CrashConfig::with_seed(1))
}

/// `blocks` blocks of `block_size` bytes, all `byte`.
pub fn fill(block_size: u32, blocks: usize, byte: u8) -> IoBuf {
    IoBuf::from_slice(&vec![byte; block_size as usize * blocks])
}

/// One write of one block of `byte` at `block`, with the device's block size.
pub fn w(dev: &CrashDevice, block: u64, byte: u8) -> Write {
    Write::new(block, fill(dev.geometry().block_size, 1, byte))
}

/// Submit and wait for one single-block write.
pub fn write_sync(dev: &CrashDevice, block: u64, byte: u8, flags: WriteFlags) {
    dev.write_sync(vec![w(dev, block, byte)], flags).unwrap();
}

/// Blocks `0..blocks` of `image`, one byte per unit of `unit` bytes (each unit must be uniform).
pub fn tags(image: &Image, blocks: u64, unit: usize) -> Vec<Vec<u8>> {
    (0..blocks)
        .map(|b| {
            image
                .block(b)
                .chunks(unit)
                .map(|u| {
                    assert!(u.iter().all(|&x| x == u[0]), "unit not uniform in block {b}");
                    u[0]
                })
                .collect()
        })
        .collect()
}

/// Blocks `0..blocks` of `image`, one byte per block (each block must be uniform).
pub fn block_tags(image: &Image, blocks: u64) -> Vec<u8> {
    let bs = image.geometry().block_size as usize;
    tags(image, blocks, bs).into_iter().map(|b| b[0]).collect()
}

/// Every image of `images`, as [`block_tags`], checking they are all distinct.
pub fn block_tag_set(images: CrashImages, blocks: u64) -> BTreeSet<Vec<u8>> {
    let list: Vec<Vec<u8>> = images.map(|i| block_tags(&i, blocks)).collect();
    let set: BTreeSet<Vec<u8>> = list.iter().cloned().collect();
    assert_eq!(set.len(), list.len(), "an image was yielded twice");
    set
}

/// A set from literal rows.
pub fn set_of<const N: usize>(rows: &[[u8; N]]) -> BTreeSet<Vec<u8>> {
    rows.iter().map(|r| r.to_vec()).collect()
}

/// Default options.
pub fn opts() -> CrashOptions {
    CrashOptions::default()
}

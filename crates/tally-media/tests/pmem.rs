//! `PmemDevice` on a file under /dev/shm (persistent memory emulated on DRAM): the byte API
//! through the `Pmem` trait, the block view through `Device`, threads on disjoint ranges, and
//! contents surviving a reopen. Skipped, with a printed reason, where /dev/shm is missing.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tally_media::{
    Device, IoBuf, Pmem, PmemDevice, PmemError, PmemMode, PmemOptions, Write, WriteFlags,
};

struct ShmFile(PathBuf);

impl ShmFile {
    fn new(tag: &str) -> Option<Self> {
        let dir = Path::new("/dev/shm");
        if !dir.is_dir() {
            println!("skipped: /dev/shm is missing, so there is no emulated persistent memory");
            return None;
        }
        Some(ShmFile(dir.join(format!("tally-pmem-it-{}-{tag}", std::process::id()))))
    }
}

impl Drop for ShmFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A program written against the trait, as the log on persistent memory will be: a record
/// copied non-temporally, a header stored cached, then an 8-byte tail published after a fence.
fn append(pm: &dyn Pmem, off: u64, payload: &[u8]) -> Result<u64, PmemError> {
    let header = (payload.len() as u32).to_le_bytes();
    pm.write(off, &header)?;
    pm.memcpy_nt(off + 4, payload)?;
    pm.flush(off, 4)?;
    pm.fence();
    let tail = off + 4 + payload.len() as u64;
    pm.store_u64_atomic(0, tail)?;
    pm.flush(0, 8)?;
    pm.fence();
    Ok(tail)
}

#[test]
fn trait_program_on_dev_shm_survives_reopen() {
    let Some(file) = ShmFile::new("trait") else { return };
    let dev = PmemDevice::create(&file.0, 1 << 16, PmemOptions::default()).unwrap();
    assert_eq!(dev.mode(), PmemMode::Emulated, "a file on tmpfs is emulated pmem");
    let mut tail = 64;
    for n in 1..20u8 {
        let payload = vec![n; usize::from(n) * 13];
        tail = append(&dev, tail, &payload).unwrap();
    }
    let stats = dev.pmem_stats();
    assert_eq!((stats.fences, stats.atomic_stores), (38, 19));
    drop(dev);
    let dev = PmemDevice::open(&file.0, PmemOptions::default()).unwrap();
    let mut word = [0u8; 8];
    Pmem::read(&dev, 0, &mut word).unwrap();
    assert_eq!(u64::from_le_bytes(word), tail);
    let mut at = 64;
    for n in 1..20u8 {
        let mut header = [0u8; 4];
        dev.read(at, &mut header).unwrap();
        let len = u32::from_le_bytes(header);
        assert_eq!(len, u32::from(n) * 13);
        let mut payload = vec![0u8; len as usize];
        dev.read(at + 4, &mut payload).unwrap();
        assert!(payload.iter().all(|&b| b == n), "record {n}");
        at += 4 + u64::from(len);
    }
    assert_eq!(at, tail);
    assert!(matches!(append(&dev, (1 << 16) - 8, b"too long"), Err(PmemError::OutOfRange { .. })));
}

#[test]
fn threads_on_disjoint_blocks_and_ranges() {
    let Some(file) = ShmFile::new("threads") else { return };
    let dev = Arc::new(PmemDevice::create(&file.0, 64 * 4096, PmemOptions::default()).unwrap());
    let threads: Vec<_> = (0..4u8)
        .map(|t| {
            let dev = dev.clone();
            std::thread::spawn(move || {
                for round in 0..50u8 {
                    // Blocks 0..32 through the Device view, 8 per thread.
                    let block = u64::from(t) * 8 + u64::from(round % 8);
                    let data = IoBuf::from_slice(&[t.wrapping_add(round); 4096]);
                    dev.write_sync(vec![Write::new(block, data)], WriteFlags::NONE).unwrap();
                    // Bytes of blocks 32..64 through the byte API, 8 blocks per thread.
                    let off = (32 + u64::from(t) * 8) * 4096 + u64::from(round) * 77;
                    dev.memcpy_nt(off, &[t + 1; 77]).unwrap();
                    dev.fence();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    Device::flush(&*dev).unwrap();
    for t in 0..4u8 {
        for slot in 0..8u8 {
            let last_round = (42..50u8).find(|r| r % 8 == slot).unwrap();
            let mut block = vec![0u8; 4096];
            Device::read(&*dev, u64::from(t) * 8 + u64::from(slot), &mut block).unwrap();
            assert!(block.iter().all(|&b| b == t.wrapping_add(last_round)), "thread {t} {slot}");
        }
        let mut bytes = vec![0u8; 50 * 77];
        // Through an Arc, `dev.read` would resolve to `Device::read` (blocks): name the byte API.
        PmemDevice::read(&dev, (32 + u64::from(t) * 8) * 4096, &mut bytes).unwrap();
        assert!(bytes.iter().all(|&b| b == t + 1), "thread {t} byte range");
    }
    let stats = dev.stats();
    assert_eq!((stats.writes, stats.submissions), (200, 200));
}

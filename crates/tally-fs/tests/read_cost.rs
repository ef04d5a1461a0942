//! What a read or a small write costs on the device stays bounded by what it touches, whatever
//! the file's size and history (issue 14 items 4 and 5): data written by one large write is
//! read back in one device request per MiB (not one per 4 KiB block), and after thousands of
//! overwrites a 4 KiB read or a partial-block write still costs at most one device read.
//! Counted with the device's own counters, after `sync` (which drops the data bytes the file
//! system keeps in memory until they are durable, so every read below goes to the device).

use std::sync::Arc;

use tally_fs::{Fs, MkfsOptions, MountOptions, Owner, ROOT};
use tally_media::{Device, MemDevice};

const ME: Owner = Owner { uid: 1000, gid: 1000 };
const BS: usize = 4096;
const MIB: usize = 1 << 20;

fn fs(blocks: u64) -> (Arc<dyn Device>, Fs) {
    let dev: Arc<dyn Device> = Arc::new(MemDevice::new(BS as u32, blocks).unwrap());
    Fs::mkfs(dev.clone(), &MkfsOptions::default()).unwrap();
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    (dev, fs)
}

fn pattern(seed: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i.wrapping_mul(31) ^ seed.wrapping_mul(7919)) as u8).collect()
}

/// Device reads made by `f`.
fn reads_of<T>(dev: &Arc<dyn Device>, f: impl FnOnce() -> T) -> (u64, T) {
    let before = dev.stats().reads;
    let out = f();
    (dev.stats().reads - before, out)
}

#[test]
fn a_file_written_in_large_writes_is_read_in_large_requests_whatever_its_size() {
    for mibs in [1usize, 4, 16] {
        let (dev, fs) = fs(65536);
        let ino = fs.create(None, ROOT, b"big", 0o644, ME).unwrap().ino;
        let data = pattern(mibs, mibs * MIB);
        for (i, chunk) in data.chunks(MIB).enumerate() {
            assert_eq!(fs.write(None, ino, (i * MIB) as u64, chunk).unwrap(), MIB);
        }
        fs.sync().unwrap();
        let mut back = Vec::new();
        let (reads, ()) = reads_of(&dev, || {
            for i in 0..mibs {
                back.extend(fs.read(ino, (i * MIB) as u64, MIB).unwrap());
            }
        });
        assert!(back == data, "{mibs} MiB read back differ");
        assert_eq!(reads, mibs as u64, "{mibs} MiB in 1 MiB reads: one device read each");
        // Read in 128 KiB pieces (the kernel's read-ahead), unaligned to the writes.
        let (reads, ()) = reads_of(&dev, || {
            let mut at = 4096u64;
            while at < data.len() as u64 {
                let got = fs.read(ino, at, 128 << 10).unwrap();
                let end = (at as usize + got.len()).min(data.len());
                assert!(got == data[at as usize..end], "at {at}");
                at += 128 << 10;
            }
        });
        let pieces = (data.len() - 4096).div_ceil(128 << 10) as u64;
        assert!(reads <= pieces + mibs as u64, "{reads} device reads for {pieces} pieces");
    }
}

#[test]
fn small_reads_and_writes_cost_the_same_after_long_histories() {
    let (dev, fs) = fs(65536);
    let ino = fs.create(None, ROOT, b"db", 0o644, ME).unwrap().ino;
    let file_blocks = 2048usize; // 8 MiB
    let mut copy = pattern(1, file_blocks * BS);
    for (i, chunk) in copy.chunks(MIB).enumerate() {
        fs.write(None, ino, (i * MIB) as u64, chunk).unwrap();
    }
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut costs = Vec::new();
    for round in 0..3 {
        // History: a thousand more page overwrites, made durable (cleaning may run).
        for _ in 0..1000 {
            let b = (next() % file_blocks as u64) as usize;
            let page = pattern(round * 100_000 + b, BS);
            fs.write(None, ino, (b * BS) as u64, &page).unwrap();
            copy[b * BS..(b + 1) * BS].copy_from_slice(&page);
        }
        fs.sync().unwrap();
        fs.maintain().unwrap();
        fs.sync().unwrap();
        // The same probes every round: 4 KiB reads, and 100-byte writes inside a block (which
        // must read the rest of the block).
        let mut probe = 0x9e37_79b9u64;
        let (reads, ()) = reads_of(&dev, || {
            for _ in 0..200 {
                probe = probe.wrapping_mul(6364136223846793005).wrapping_add(1);
                let b = ((probe >> 33) % file_blocks as u64) as usize;
                let got = fs.read(ino, (b * BS) as u64, BS).unwrap();
                assert!(got == copy[b * BS..(b + 1) * BS], "block {b}");
            }
        });
        let (write_reads, ()) = reads_of(&dev, || {
            for i in 0..200usize {
                let at = ((i * 977) % file_blocks) * BS + 1000;
                let bytes = pattern(i, 100);
                fs.write(None, ino, at as u64, &bytes).unwrap();
                copy[at..at + 100].copy_from_slice(&bytes);
            }
        });
        assert!(reads <= 200, "round {round}: {reads} device reads for 200 block reads");
        assert!(write_reads <= 200, "round {round}: {write_reads} device reads for 200 writes");
        costs.push((reads, write_reads));
    }
    assert!(fs.read(ino, 0, file_blocks * BS).unwrap() == copy);
    assert!(fs.fsck().is_clean());
    eprintln!("device reads per round (200 reads, 200 partial writes): {costs:?}");
}

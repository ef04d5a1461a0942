use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use super::*;
use crate::{Device, IoBuf, MediaError, Ticket, Write, WriteFlags};

/// A fresh path on tmpfs when there is one, else in the temp directory; removed on drop.
struct TempPath(PathBuf);

impl TempPath {
    fn new(tag: &str) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = Path::new("/dev/shm");
        let dir = if dir.is_dir() { dir.to_path_buf() } else { std::env::temp_dir() };
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        TempPath(dir.join(format!("tally-pmem-unit-{}-{tag}-{n}", std::process::id())))
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn emulated(tag: &str, len: u64) -> (TempPath, PmemDevice) {
    let path = TempPath::new(tag);
    let dev = PmemDevice::create(&path.0, len, PmemOptions::default()).unwrap();
    (path, dev)
}

#[test]
fn bytes_round_trip_and_survive_reopen() {
    let (path, dev) = emulated("reopen", 8192);
    assert_eq!((dev.len(), dev.is_empty()), (8192, false));
    if Path::new("/dev/shm").is_dir() {
        assert_eq!(dev.mode(), PmemMode::Emulated, "{}", dev.map_note());
        assert_eq!(dev.flush_kind(), cpu_flush_kind());
    }
    dev.write(100, b"hello").unwrap();
    dev.store_u64_atomic(4096, 0x0102_0304_0506_0708).unwrap();
    dev.memcpy_nt(5000, &[7u8; 300]).unwrap();
    dev.persist(0, 8192).unwrap();
    drop(dev);
    let dev = PmemDevice::open(&path.0, PmemOptions::default()).unwrap();
    let mut buf = [0u8; 5];
    dev.read(100, &mut buf).unwrap();
    assert_eq!(&buf, b"hello");
    let mut word = [0u8; 8];
    dev.read(4096, &mut word).unwrap();
    assert_eq!(u64::from_le_bytes(word), 0x0102_0304_0506_0708);
    let mut copy = vec![0u8; 302];
    dev.read(4999, &mut copy).unwrap();
    assert_eq!((copy[0], copy[301]), (0, 0), "the copy stays inside its range");
    assert!(copy[1..301].iter().all(|&b| b == 7));
}

#[test]
fn bad_requests_are_refused_without_effect() {
    let (_path, dev) = emulated("bad", 4096);
    let mut buf = [0u8; 16];
    assert!(matches!(dev.read(4090, &mut buf), Err(PmemError::OutOfRange { .. })));
    assert!(matches!(dev.read(u64::MAX, &mut buf), Err(PmemError::OutOfRange { .. })));
    assert!(matches!(dev.write(4081, &buf), Err(PmemError::OutOfRange { .. })));
    assert!(matches!(dev.memcpy_nt(4000, &[1u8; 97]), Err(PmemError::OutOfRange { .. })));
    assert!(matches!(dev.flush(0, 4097), Err(PmemError::OutOfRange { .. })));
    assert!(matches!(dev.flush(1, u64::MAX), Err(PmemError::OutOfRange { .. })));
    assert!(matches!(dev.store_u64_atomic(4, 1), Err(PmemError::Misaligned { off: 4, align: 8 })));
    assert!(matches!(dev.store_u64_atomic(4096, 1), Err(PmemError::OutOfRange { .. })));
    dev.write(4096, &[]).unwrap();
    dev.flush(4096, 0).unwrap();
    let mut all = vec![1u8; 4096];
    dev.read(0, &mut all).unwrap();
    assert!(all.iter().all(|&b| b == 0), "refused requests wrote nothing");
    let path = TempPath::new("zero");
    let zero = PmemDevice::create(&path.0, 0, PmemOptions::default());
    assert!(matches!(zero, Err(PmemError::BadSize { .. })));
    let small = PmemDevice::create(&path.0, 100, PmemOptions::default());
    assert!(matches!(small, Err(PmemError::BadSize { .. })));
    let odd = PmemOptions { block_size: 1000, ..PmemOptions::default() };
    assert!(matches!(PmemDevice::create(&path.0, 4096, odd), Err(PmemError::BadSize { .. })));
    let missing = PmemDevice::open(Path::new("/nonexistent/tally-pmem"), PmemOptions::default());
    assert!(matches!(missing, Err(PmemError::Open { .. })));
}

#[test]
fn failed_region_refuses_writes_but_reads() {
    let (_path, dev) = emulated("failed", 4096);
    dev.write(0, b"x").unwrap();
    dev.fail_for_test("injected msync error");
    assert!(matches!(dev.write(0, b"y"), Err(PmemError::Failed { .. })));
    assert!(matches!(dev.memcpy_nt(0, b"y"), Err(PmemError::Failed { .. })));
    assert!(matches!(dev.store_u64_atomic(0, 1), Err(PmemError::Failed { .. })));
    assert!(matches!(dev.flush(0, 1), Err(PmemError::Failed { .. })));
    let block = IoBuf::zeroed(4096);
    let submitted = dev.submit(vec![Write::new(0, block)], WriteFlags::NONE);
    assert!(matches!(submitted, Err(MediaError::Failed { .. })));
    assert!(matches!(Device::flush(&dev), Err(MediaError::Failed { .. })));
    let mut buf = [0u8; 1];
    dev.read(0, &mut buf).unwrap();
    assert_eq!(&buf, b"x");
}

#[cfg(target_arch = "x86_64")]
#[test]
fn nt_copy_flushes_exactly_the_unaligned_head_and_tail_lines() {
    let (_path, dev) = emulated("nt", 4096);
    // (offset, length) -> (lines flushed, bytes stored non-temporally)
    let cases = [
        ((0u64, 64usize), (0u64, 64u64)), // aligned both ends: all non-temporal
        ((3, 100), (2, 88)),              // head 3..8 in line 0, tail 96..103 in line 1
        ((8, 61), (1, 56)),               // aligned head, tail 64..69
        ((1, 7), (1, 0)),                 // inside one word: all head
        ((130, 3), (1, 0)),               // inside one word, not at its end
        ((200, 16), (0, 16)),             // aligned words
    ];
    for ((off, len), (lines, nt)) in cases {
        let before = dev.pmem_stats();
        let src: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(7).wrapping_add(1)).collect();
        dev.memcpy_nt(off, &src).unwrap();
        dev.fence();
        let d = dev.pmem_stats() - before;
        assert_eq!((d.lines_flushed, d.bytes_nt), (lines, nt), "copy of {len} bytes at {off}");
        assert_eq!(d.bytes_stored + d.bytes_nt, len as u64);
        let mut back = vec![0u8; len];
        dev.read(off, &mut back).unwrap();
        assert_eq!(back, src, "copy of {len} bytes at {off}");
    }
}

#[test]
fn flush_counts_every_overlapping_line() {
    let (_path, dev) = emulated("lines", 4096);
    if dev.flush_kind() == FlushKind::Msync {
        return; // no line instruction on this target
    }
    for ((off, len), lines) in [((0u64, 64u64), 1u64), ((63, 2), 2), ((10, 0), 0), ((0, 4096), 64)]
    {
        let before = dev.pmem_stats();
        dev.flush(off, len).unwrap();
        assert_eq!((dev.pmem_stats() - before).lines_flushed, lines, "flush({off}, {len})");
    }
}

#[test]
fn msync_mode_persists_with_msync() {
    let path = TempPath::new("msync");
    let options = PmemOptions { force_msync: true, ..PmemOptions::default() };
    let dev = PmemDevice::create(&path.0, 8192, options).unwrap();
    assert_eq!((dev.mode(), dev.flush_kind()), (PmemMode::Msync, FlushKind::Msync));
    dev.write(10, b"abc").unwrap();
    dev.flush(10, 3).unwrap();
    dev.memcpy_nt(5000, &[9u8; 50]).unwrap();
    dev.flush(0, 0).unwrap();
    let s = dev.pmem_stats();
    assert_eq!((s.msyncs, s.lines_flushed, s.bytes_nt), (2, 0, 0));
    Device::flush(&dev).unwrap();
    assert_eq!(dev.pmem_stats().msyncs, 3);
    drop(dev);
    let bytes = std::fs::read(&path.0).unwrap();
    assert_eq!(&bytes[10..13], b"abc");
    assert!(bytes[5000..5050].iter().all(|&b| b == 9));
}

#[test]
fn file_outside_tmpfs_says_msync() {
    let dir = std::env::temp_dir();
    let path = TempPath(dir.join(format!("tally-pmem-unit-{}-disk", std::process::id())));
    let dev = PmemDevice::create(&path.0, 4096, PmemOptions::default()).unwrap();
    let file = File::open(&path.0).unwrap();
    if map::on_tmpfs(&file).unwrap() {
        assert_eq!(dev.mode(), PmemMode::Emulated);
    } else if dev.mode() != PmemMode::Dax {
        assert_eq!((dev.mode(), dev.flush_kind()), (PmemMode::Msync, FlushKind::Msync));
        assert!(!dev.map_note().is_empty(), "the note says why MAP_SYNC was not used");
    }
}

#[test]
fn block_device_view_round_trips() {
    let (_path, dev) = emulated("block", 16 * 4096);
    let g = Device::geometry(&dev);
    assert_eq!((g.block_size, g.block_count, g.atomic_write_size), (4096, 16, 8));
    let t1 = dev
        .submit(
            vec![
                Write::new(2, IoBuf::from_slice(&[1u8; 4096])),
                Write::new(5, IoBuf::from_slice(&[2u8; 8192])),
            ],
            WriteFlags::NONE,
        )
        .unwrap();
    let t2 = dev.submit(vec![Write::new(2, IoBuf::from_slice(&[3u8; 4096]))], WriteFlags::FUA);
    dev.wait(t2.unwrap()).unwrap();
    dev.wait(t1).unwrap();
    Device::flush(&dev).unwrap();
    let mut buf = vec![0u8; 5 * 4096];
    Device::read(&dev, 2, &mut buf).unwrap();
    assert!(buf[..4096].iter().all(|&b| b == 3));
    assert!(buf[4096..3 * 4096].iter().all(|&b| b == 0));
    assert!(buf[3 * 4096..].iter().all(|&b| b == 2));
    let s = dev.stats();
    assert_eq!((s.writes, s.bytes_written, s.fua_writes, s.flushes), (3, 4 * 4096, 1, 1));
    if dev.flush_kind() != FlushKind::Msync {
        let p = dev.pmem_stats();
        // Whole blocks go non-temporal: no line flushes, one fence per submission and flush.
        assert_eq!((p.lines_flushed, p.fences), (0, 3), "non-temporal copies, one fence each");
        assert_eq!((p.bytes_nt, p.bytes_stored), (4 * 4096, 0));
    }
    assert!(matches!(Device::read(&dev, 16, &mut buf), Err(MediaError::OutOfRange { .. })));
    let late = dev.submit(vec![Write::new(15, IoBuf::zeroed(8192))], WriteFlags::NONE);
    assert!(matches!(late, Err(MediaError::OutOfRange { .. })));
    assert!(matches!(dev.wait(Ticket(99)), Err(MediaError::UnknownTicket(99))));
}

//! `FileDevice` on temporary files: both engines, both direct modes, counters, bad input.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use tally_media::{
    Device, DirectMode, Engine, EngineKind, FileDevice, FileOptions, IoBuf, MediaError, Ticket,
    Write, WriteFlags,
};

const BLOCK: usize = 4096;

/// A file under the temp dir, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(tag: &str, len: u64) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir()
            .join(format!("tally-file-device-{}-{n}-{tag}", std::process::id()));
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(len).unwrap();
        TempFile(path)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn options(engine: Engine, direct: DirectMode) -> FileOptions {
    FileOptions { engine, direct, ..FileOptions::default() }
}

fn filled(blocks: usize, byte: u8) -> IoBuf {
    let mut buf = IoBuf::zeroed(blocks * BLOCK);
    for (i, chunk) in buf.chunks_mut(BLOCK).enumerate() {
        chunk.fill(byte);
        chunk[..8].copy_from_slice(&(i as u64).to_le_bytes());
    }
    buf
}

/// Open with the given modes, or `None` (with the reason printed) where this machine cannot.
fn open_or_skip(path: &Path, engine: Engine, direct: DirectMode) -> Option<FileDevice> {
    match FileDevice::open(path, options(engine, direct)) {
        Ok(device) => Some(device),
        Err(err) if engine == Engine::IoUring || direct == DirectMode::On => {
            println!("SKIP {engine:?}/{direct:?} on {}: {err}", path.display());
            None
        }
        Err(err) => panic!("open {engine:?}/{direct:?}: {err}"),
    }
}

fn round_trip(engine: Engine, direct: DirectMode) {
    let file = TempFile::new("round-trip", 64 * BLOCK as u64);
    let Some(dev) = open_or_skip(file.path(), engine, direct) else {
        return;
    };
    let expected_engine = match engine {
        Engine::Threads => EngineKind::Threads,
        _ => EngineKind::IoUring,
    };
    if engine != Engine::Auto {
        assert_eq!(dev.engine(), expected_engine);
    }
    match direct {
        DirectMode::On => assert!(dev.direct()),
        DirectMode::Off => assert!(!dev.direct()),
        DirectMode::Auto => assert_eq!(dev.direct(), dev.direct_fallback().is_none()),
    }
    let geometry = dev.geometry();
    assert_eq!(
        (geometry.block_size, geometry.block_count, geometry.atomic_write_size),
        (4096, 64, 512)
    );

    let ticket = dev
        .submit(
            vec![Write::new(3, filled(2, 0xa1)), Write::new(10, filled(1, 0xb2))],
            WriteFlags::NONE,
        )
        .unwrap();
    dev.wait(ticket).unwrap();
    dev.wait(ticket).unwrap();
    dev.write_sync(vec![Write::new(4, filled(1, 0xc3))], WriteFlags::FUA).unwrap();
    dev.flush().unwrap();

    // Aligned read straight into an IoBuf.
    let mut aligned = IoBuf::zeroed(8 * BLOCK);
    dev.read(3, &mut aligned).unwrap();
    assert_eq!(&aligned[..BLOCK], &filled(2, 0xa1)[..BLOCK]);
    assert_eq!(&aligned[BLOCK..2 * BLOCK], &filled(1, 0xc3)[..]);
    assert!(aligned[2 * BLOCK..7 * BLOCK].iter().all(|&b| b == 0));
    assert_eq!(&aligned[7 * BLOCK..], &filled(1, 0xb2)[..]);

    // A deliberately misaligned buffer: bounced under O_DIRECT, direct otherwise.
    let mut backing = vec![0u8; 8 * BLOCK + 1];
    let unaligned = &mut backing[1..];
    dev.read(3, unaligned).unwrap();
    assert_eq!(unaligned, &aligned[..]);

    let stats = dev.stats();
    assert_eq!((stats.writes, stats.bytes_written, stats.fua_writes), (3, 4 * BLOCK as u64, 1));
    assert_eq!((stats.flushes, stats.reads, stats.bytes_read), (1, 2, 16 * BLOCK as u64));
    assert_eq!(stats.submissions, 2);
    drop(dev);

    // The bytes are in the file itself.
    let bytes = std::fs::read(file.path()).unwrap();
    assert_eq!(&bytes[4 * BLOCK..5 * BLOCK], &filled(1, 0xc3)[..]);
}

#[test]
fn round_trip_io_uring_buffered() {
    round_trip(Engine::IoUring, DirectMode::Off);
}

#[test]
fn round_trip_io_uring_direct() {
    round_trip(Engine::IoUring, DirectMode::On);
}

#[test]
fn round_trip_threads_buffered() {
    round_trip(Engine::Threads, DirectMode::Off);
}

#[test]
fn round_trip_threads_direct() {
    round_trip(Engine::Threads, DirectMode::On);
}

#[test]
fn round_trip_auto() {
    round_trip(Engine::Auto, DirectMode::Auto);
}

fn many_in_flight(engine: Engine, direct: DirectMode) {
    let file = TempFile::new("in-flight", 256 * BLOCK as u64);
    let Some(dev) = open_or_skip(file.path(), engine, direct) else {
        return;
    };
    // 30 submissions of 3 one-block writes: 90 writes, under the room one stream may take
    // (three quarters of the default in-flight bound of 128: `uring.rs`), so io_uring needs
    // exactly one io_uring_enter per submission however slowly the writes complete.
    let tickets: Vec<(Ticket, u64)> = (0..30u64)
        .map(|i| {
            let writes =
                (0..3u64).map(|j| Write::new(i * 3 + j, filled(1, (i * 3 + j) as u8))).collect();
            (dev.submit(writes, WriteFlags::NONE).unwrap(), i)
        })
        .collect();
    for pair in tickets.windows(2) {
        assert!(pair[0].0 < pair[1].0, "tickets increase");
    }
    for (ticket, _) in tickets.iter().rev() {
        dev.wait(*ticket).unwrap();
    }
    let stats = dev.stats();
    assert_eq!((stats.submissions, stats.writes, stats.bytes_written), (30, 90, 90 * BLOCK as u64));
    let syscalls_expected = match dev.engine() {
        EngineKind::IoUring => 30,
        EngineKind::Threads => 90,
    };
    assert_eq!(stats.submit_syscalls, syscalls_expected, "{:?}", dev.engine());
    assert_eq!((stats.flushes, stats.fua_writes), (0, 0));
    let mut buf = IoBuf::zeroed(90 * BLOCK);
    dev.read(0, &mut buf).unwrap();
    for (block, chunk) in buf.chunks(BLOCK).enumerate() {
        assert_eq!(chunk, &filled(1, block as u8)[..], "block {block}");
    }
}

#[test]
fn many_in_flight_io_uring() {
    many_in_flight(Engine::IoUring, DirectMode::Auto);
}

#[test]
fn many_in_flight_threads() {
    many_in_flight(Engine::Threads, DirectMode::Auto);
}

/// More writes than the ring and the in-flight bound hold, from several threads at once.
#[test]
fn bounded_queue_under_pressure() {
    for engine in [Engine::IoUring, Engine::Threads] {
        let file = TempFile::new("pressure", 512 * BLOCK as u64);
        let opts =
            FileOptions { engine, queue_depth: 4, thread_count: 2, ..FileOptions::default() };
        let dev = match FileDevice::open(file.path(), opts) {
            Ok(dev) => dev,
            Err(err) => {
                println!("SKIP {engine:?}: {err}");
                continue;
            }
        };
        std::thread::scope(|scope| {
            for t in 0..4u64 {
                let dev = &dev;
                scope.spawn(move || {
                    let mut tickets = Vec::new();
                    for i in 0..16u64 {
                        // Each submission is 2 writes of 2 blocks; thread t owns blocks t*128.. .
                        let base = t * 128 + i * 4;
                        let writes = vec![
                            Write::new(base, filled(2, base as u8)),
                            Write::new(base + 2, filled(2, (base + 2) as u8)),
                        ];
                        tickets.push(dev.submit(writes, WriteFlags::NONE).unwrap());
                    }
                    for ticket in tickets.into_iter().rev() {
                        dev.wait(ticket).unwrap();
                    }
                });
            }
        });
        let stats = dev.stats();
        assert_eq!((stats.submissions, stats.writes), (64, 128));
        assert!(stats.submit_syscalls >= 64, "{stats:?}");
        for t in 0..4u64 {
            let base = t * 128 + 8;
            let mut buf = IoBuf::zeroed(2 * BLOCK);
            dev.read(base, &mut buf).unwrap();
            assert_eq!(&buf[..], &filled(2, base as u8)[..]);
        }
    }
}

#[test]
fn flush_and_fua_are_counted() {
    for engine in [Engine::IoUring, Engine::Threads] {
        let file = TempFile::new("flush", 16 * BLOCK as u64);
        let Some(dev) = open_or_skip(file.path(), engine, DirectMode::Auto) else {
            continue;
        };
        let before = dev.stats();
        dev.write_sync(
            vec![Write::new(0, filled(1, 1)), Write::new(5, filled(3, 2))],
            WriteFlags::FUA,
        )
        .unwrap();
        dev.write_sync(vec![Write::new(1, filled(1, 3))], WriteFlags::NONE).unwrap();
        dev.flush().unwrap();
        dev.flush().unwrap();
        let empty = dev.submit(Vec::new(), WriteFlags::NONE).unwrap();
        dev.wait(empty).unwrap();
        let d = dev.stats() - before;
        assert_eq!((d.writes, d.bytes_written, d.fua_writes), (3, 5 * BLOCK as u64, 2));
        assert_eq!((d.flushes, d.submissions, d.reads), (2, 3, 0));
        let syscalls = if dev.engine() == EngineKind::IoUring { 2 } else { 3 };
        assert_eq!(d.submit_syscalls, syscalls, "{engine:?}: an empty submission costs nothing");
    }
}

#[test]
fn dropping_with_writes_in_flight_finishes_them() {
    for engine in [Engine::IoUring, Engine::Threads] {
        let file = TempFile::new("drop", 64 * BLOCK as u64);
        let Some(dev) = open_or_skip(file.path(), engine, DirectMode::Auto) else {
            continue;
        };
        for block in 0..64u64 {
            dev.submit(vec![Write::new(block, filled(1, 0x5a))], WriteFlags::NONE).unwrap();
        }
        drop(dev);
        let bytes = std::fs::read(file.path()).unwrap();
        for chunk in bytes.chunks(BLOCK) {
            assert_eq!(chunk, &filled(1, 0x5a)[..], "{engine:?}");
        }
    }
}

#[test]
fn bad_input_is_a_typed_error() {
    let missing = std::env::temp_dir().join(format!("tally-no-such-file-{}", std::process::id()));
    match FileDevice::open(&missing, FileOptions::default()) {
        Err(MediaError::Open { path, source }) => {
            assert_eq!(path, missing);
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("expected Open error, got {other:?}"),
    }
    assert!(matches!(
        FileDevice::open(std::env::temp_dir(), FileOptions::default()),
        Err(MediaError::Open { .. })
    ));
    for len in [0, 100, BLOCK as u64 - 1] {
        let small = TempFile::new("small", len);
        match FileDevice::open(small.path(), FileOptions::default()) {
            Err(MediaError::TooSmall { size_bytes, block_size: 4096 }) => {
                assert_eq!(size_bytes, len)
            }
            other => panic!("expected TooSmall for {len} bytes, got {other:?}"),
        }
    }
    let bad_block = TempFile::new("bad-block", 8 * BLOCK as u64);
    let opts = FileOptions { block_size: Some(3000), ..FileOptions::default() };
    assert!(matches!(
        FileDevice::open(bad_block.path(), opts),
        Err(MediaError::InvalidGeometry { .. })
    ));

    for engine in [Engine::IoUring, Engine::Threads] {
        // A trailing partial block is not part of the device.
        let file = TempFile::new("bad-input", 4 * BLOCK as u64 + 100);
        let Some(dev) = open_or_skip(file.path(), engine, DirectMode::Auto) else {
            continue;
        };
        assert_eq!(dev.geometry().block_count, 4);
        let mut odd = vec![0u8; 100];
        assert!(matches!(dev.read(0, &mut odd), Err(MediaError::Misaligned { .. })));
        let mut two = IoBuf::zeroed(2 * BLOCK);
        assert!(matches!(dev.read(3, &mut two), Err(MediaError::OutOfRange { .. })));
        assert!(matches!(dev.read(u64::MAX, &mut two), Err(MediaError::OutOfRange { .. })));
        let past_end = dev.submit(vec![Write::new(4, filled(1, 1))], WriteFlags::NONE);
        assert!(matches!(past_end, Err(MediaError::OutOfRange { .. })));
        let misaligned = dev.submit(vec![Write::new(0, IoBuf::zeroed(512))], WriteFlags::NONE);
        assert!(matches!(misaligned, Err(MediaError::Misaligned { .. })));
        // A bad write anywhere refuses the whole submission.
        let mixed = dev.submit(
            vec![Write::new(0, filled(1, 9)), Write::new(3, filled(2, 9))],
            WriteFlags::NONE,
        );
        assert!(matches!(mixed, Err(MediaError::OutOfRange { .. })));
        let stats = dev.stats();
        assert_eq!(
            (stats.writes, stats.submissions, stats.reads),
            (0, 0, 0),
            "refused = uncounted"
        );
        assert!(matches!(dev.wait(Ticket(0)), Err(MediaError::UnknownTicket(0))));
        assert!(matches!(dev.wait(Ticket(7)), Err(MediaError::UnknownTicket(7))));
        let ticket = dev.submit(vec![Write::new(0, filled(1, 9))], WriteFlags::NONE).unwrap();
        dev.wait(ticket).unwrap();
        assert!(matches!(dev.wait(Ticket(ticket.0 + 1)), Err(MediaError::UnknownTicket(_))));

        // The file shrinks under the device: a read past its end is an I/O error, not a panic.
        std::fs::OpenOptions::new()
            .write(true)
            .open(file.path())
            .unwrap()
            .set_len(BLOCK as u64)
            .unwrap();
        let mut block = IoBuf::zeroed(BLOCK);
        match dev.read(2, &mut block) {
            Err(MediaError::Io { op: "pread", source }) => {
                assert_eq!(source.kind(), std::io::ErrorKind::UnexpectedEof);
            }
            other => panic!("expected a pread EOF error, got {other:?}"),
        }
    }
}

#[test]
fn explicit_block_size_and_atomic_unit() {
    let file = TempFile::new("block-size", 64 * 1024);
    let opts = FileOptions {
        block_size: Some(8192),
        atomic_write_size: 4096,
        direct: DirectMode::Off,
        ..FileOptions::default()
    };
    let dev = FileDevice::open(file.path(), opts).unwrap();
    let g = dev.geometry();
    assert_eq!((g.block_size, g.block_count, g.atomic_write_size), (8192, 8, 4096));
    dev.write_sync(vec![Write::new(7, IoBuf::from_slice(&[7u8; 8192]))], WriteFlags::NONE).unwrap();
    let mut buf = vec![0u8; 8192];
    dev.read(7, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 7));
}

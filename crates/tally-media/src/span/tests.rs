use std::sync::atomic::AtomicBool;

use super::*;
use crate::MemDevice;

const BS: u32 = 512;

fn mems(count: usize, blocks: u64) -> Vec<Arc<MemDevice>> {
    (0..count).map(|_| Arc::new(MemDevice::new(BS, blocks).unwrap())).collect()
}

fn dyns(mems: &[Arc<MemDevice>]) -> Vec<Arc<dyn Device>> {
    mems.iter().map(|m| m.clone() as Arc<dyn Device>).collect()
}

const LAYOUT: SpanLayout = SpanLayout { stripe_blocks: 4, lead_blocks: 2 };

fn span_error_of(r: Result<SpanDevice>) -> SpanError {
    match r {
        Err(MediaError::Span { source }) => *source,
        Err(e) => panic!("not a span error: {e}"),
        Ok(_) => panic!("opened"),
    }
}

#[test]
fn geometry_and_placement() {
    // 3 targets of 20 blocks: header 1, lead 2, 17 left = 4 stripes of 4 each.
    let m = mems(3, 20);
    let span = SpanDevice::format(dyns(&m), LAYOUT).unwrap();
    assert_eq!(span.geometry().block_count, 2 + 3 * 4 * 4);
    assert_eq!(span.locate(0), (0, 1, 2));
    assert_eq!(span.locate(1), (0, 2, 1));
    assert_eq!(span.locate(2), (0, 3, 4)); // stripe 0: target 0, row 0
    assert_eq!(span.locate(6), (1, 3, 4)); // stripe 1: target 1
    assert_eq!(span.locate(11), (2, 4, 3)); // stripe 2, second block
    assert_eq!(span.locate(13), (2, 6, 1)); // stripe 2, last block
    assert_eq!(span.locate(14), (0, 7, 4)); // stripe 3: target 0, row 1
    let last = span.geometry().block_count - 1;
    assert_eq!(span.locate(last), (2, 1 + 2 + 3 * 4 + 3, 1));
    assert!(span.locate(last).1 < 20);
}

#[test]
fn writes_and_reads_cross_stripes_and_targets() {
    let m = mems(3, 20);
    let span = SpanDevice::format(dyns(&m), LAYOUT).unwrap();
    let n = span.geometry().block_count;
    let mut data = IoBuf::zeroed((n as usize) * BS as usize);
    for (i, b) in data.iter_mut().enumerate() {
        *b = (i / BS as usize) as u8 ^ (i as u8);
    }
    let t = span.submit_stream(1, vec![Write::new(0, data.clone())], WriteFlags::NONE).unwrap();
    span.wait(t).unwrap();
    span.wait(t).unwrap();
    span.flush().unwrap();
    let mut back = vec![0u8; data.len()];
    span.read(0, &mut back).unwrap();
    assert_eq!(&back[..], &data[..]);
    // Each image block is where locate says, and no target's header was touched.
    for b in 0..n {
        let (target, local, _) = span.locate(b);
        let mut one = vec![0u8; BS as usize];
        m[target].read(local, &mut one).unwrap();
        let at = (b * u64::from(BS)) as usize;
        assert_eq!(&one[..], &data[at..at + BS as usize], "block {b}");
    }
    let reopened = SpanDevice::open(dyns(&m)).unwrap();
    assert_eq!(reopened.headers()[2].target_index, 2);
    assert!(matches!(span.read(n, &mut [0u8; 512]), Err(MediaError::OutOfRange { .. })));
    let past = span.submit(vec![Write::new(n - 1, IoBuf::zeroed(1024))], WriteFlags::NONE);
    assert!(matches!(past, Err(MediaError::OutOfRange { .. })));
}

#[test]
fn a_flush_round_flushes_every_target_written_and_only_those() {
    let m = mems(3, 20);
    let span = SpanDevice::format(dyns(&m), LAYOUT).unwrap();
    let before: Vec<u64> = m.iter().map(|d| d.stats().flushes).collect();
    let flushes =
        || -> Vec<u64> { m.iter().zip(&before).map(|(d, b)| d.stats().flushes - b).collect() };
    span.flush().unwrap();
    assert_eq!(flushes(), [0, 0, 0], "nothing written, nothing flushed");
    // Blocks 6 (target 1) and 10 (target 2).
    let t = span
        .submit(
            vec![Write::new(6, IoBuf::zeroed(512)), Write::new(10, IoBuf::zeroed(512))],
            WriteFlags::NONE,
        )
        .unwrap();
    span.wait(t).unwrap();
    span.flush().unwrap();
    assert_eq!(flushes(), [0, 1, 1]);
    span.flush().unwrap();
    assert_eq!(flushes(), [0, 1, 1], "a clean target is not flushed again");
}

/// A target whose writes or flushes fail on demand.
struct Faulty {
    inner: MemDevice,
    fail_flush: AtomicBool,
    fail_write: AtomicBool,
    fail_read: AtomicBool,
}

impl Device for Faulty {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn read(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        if self.fail_read.load(Ordering::SeqCst) {
            return Err(MediaError::Injected { op: "read", nth: 1 });
        }
        self.inner.read(block, buf)
    }
    fn submit(&self, writes: Vec<Write>, flags: WriteFlags) -> Result<Ticket> {
        if self.fail_write.load(Ordering::SeqCst) {
            return Err(MediaError::Injected { op: "write", nth: 1 });
        }
        self.inner.submit(writes, flags)
    }
    fn wait(&self, ticket: Ticket) -> Result<()> {
        self.inner.wait(ticket)
    }
    fn flush(&self) -> Result<()> {
        if self.fail_flush.load(Ordering::SeqCst) {
            return Err(MediaError::Injected { op: "flush", nth: 1 });
        }
        self.inner.flush()
    }
    fn stats(&self) -> DeviceStats {
        self.inner.stats()
    }
}

fn faulty() -> Arc<Faulty> {
    Arc::new(Faulty {
        inner: MemDevice::new(BS, 20).unwrap(),
        fail_flush: AtomicBool::new(false),
        fail_write: AtomicBool::new(false),
        fail_read: AtomicBool::new(false),
    })
}

#[test]
fn one_target_failing_fails_the_device() {
    let bad = faulty();
    let targets: Vec<Arc<dyn Device>> =
        vec![Arc::new(MemDevice::new(BS, 20).unwrap()), bad.clone()];
    let span = SpanDevice::format(targets.clone(), LAYOUT).unwrap();
    let t = span.submit(vec![Write::new(6, IoBuf::zeroed(512))], WriteFlags::NONE).unwrap();
    span.wait(t).unwrap();
    bad.fail_flush.store(true, Ordering::SeqCst);
    assert!(matches!(span.flush(), Err(MediaError::Injected { op: "flush", .. })));
    bad.fail_flush.store(false, Ordering::SeqCst);
    assert!(matches!(span.flush(), Err(MediaError::Failed { .. })), "never retried");
    let later = span.submit(vec![Write::new(2, IoBuf::zeroed(512))], WriteFlags::NONE);
    assert!(matches!(later, Err(MediaError::Failed { .. })));

    let span = SpanDevice::open(targets).unwrap();
    bad.fail_write.store(true, Ordering::SeqCst);
    let w = span.submit(vec![Write::new(6, IoBuf::zeroed(512))], WriteFlags::NONE);
    assert!(matches!(w, Err(MediaError::Injected { op: "write", .. })));
    let w = span.submit(vec![Write::new(2, IoBuf::zeroed(512))], WriteFlags::NONE);
    assert!(matches!(w, Err(MediaError::Failed { .. })));
}

#[test]
fn missing_swapped_repeated_and_foreign_targets_are_refused() {
    let m = mems(3, 20);
    let d = dyns(&m);
    SpanDevice::format(d.clone(), LAYOUT).unwrap();
    let e = span_error_of(SpanDevice::open(vec![d[0].clone(), d[2].clone()]));
    assert_eq!(e, SpanError::Count { recorded: 3, given: 2, missing: vec![2] });
    let e = span_error_of(SpanDevice::open(vec![d[0].clone(), d[1].clone()]));
    assert_eq!(e, SpanError::Count { recorded: 3, given: 2, missing: vec![3] });
    assert!(e.to_string().contains("missing: target 3"), "{e}");
    let e = span_error_of(SpanDevice::open(vec![d[1].clone(), d[0].clone(), d[2].clone()]));
    assert_eq!(e, SpanError::Swapped { position: 1, recorded: 2 });
    let e = span_error_of(SpanDevice::open(vec![d[0].clone(), d[0].clone(), d[2].clone()]));
    assert_eq!(e, SpanError::Repeated { first: 1, position: 2 });
    // A target of another image, even in the same place.
    let other = mems(3, 20);
    SpanDevice::format(dyns(&other), LAYOUT).unwrap();
    let e = span_error_of(SpanDevice::open(vec![d[0].clone(), other[1].clone(), d[2].clone()]));
    assert!(matches!(e, SpanError::Foreign { position: 2, .. }), "{e:?}");
    // A blank target, and a damaged header.
    let blank: Arc<dyn Device> = Arc::new(MemDevice::new(BS, 20).unwrap());
    let e = span_error_of(SpanDevice::open(vec![d[0].clone(), d[1].clone(), blank]));
    assert_eq!(e, SpanError::NotATarget { position: 3 });
    let mut block = vec![0u8; 512];
    m[1].read(0, &mut block).unwrap();
    block[40] ^= 1;
    m[1].write_sync(vec![Write::new(0, IoBuf::from_slice(&block))], WriteFlags::NONE).unwrap();
    let e = span_error_of(SpanDevice::open(d.clone()));
    assert!(matches!(e, SpanError::Damaged { position: 2, .. }), "{e:?}");
    // Too small to format, and different block sizes.
    let e = span_error_of(SpanDevice::format(dyns(&mems(2, 6)), LAYOUT));
    assert!(matches!(e, SpanError::Shape { .. }), "{e:?}");
    let mixed: Vec<Arc<dyn Device>> = vec![
        Arc::new(MemDevice::new(512, 20).unwrap()),
        Arc::new(MemDevice::new(1024, 20).unwrap()),
    ];
    let e = span_error_of(SpanDevice::format(mixed, LAYOUT));
    assert!(matches!(e, SpanError::Shape { position: 2, .. }), "{e:?}");
}

#[test]
fn concurrent_flushes_share_rounds_and_cover_every_target() {
    let m = mems(3, 200);
    let span = SpanDevice::format(dyns(&m), LAYOUT).unwrap();
    let before: Vec<u64> = m.iter().map(|d| d.stats().flushes).collect();
    std::thread::scope(|scope| {
        for t in 0..6u64 {
            let span = &span;
            scope.spawn(move || {
                for i in 0..200u64 {
                    // Thread t writes in stripe t: target t % 3.
                    let block = 2 + t * 4 + i % 4;
                    let w = Write::new(block, IoBuf::from_slice(&[t as u8; 512]));
                    let ticket = span.submit_stream(t as u16, vec![w], WriteFlags::NONE).unwrap();
                    span.wait(ticket).unwrap();
                    span.flush().unwrap();
                }
            });
        }
    });
    let flushes: Vec<u64> = m.iter().zip(&before).map(|(d, b)| d.stats().flushes - b).collect();
    assert!(flushes.iter().all(|&f| f >= 1), "{flushes:?}");
    assert!(flushes.iter().all(|&f| f <= 1200), "{flushes:?}");
}

/// A target whose reads wait (up to 2 s) until every target has a read in progress: a large
/// read over several targets completes at once only if they are read concurrently.
struct Gate {
    inner: MemDevice,
    arrived: Arc<(std::sync::Mutex<usize>, std::sync::Condvar)>,
    parties: usize,
    all_met: Arc<AtomicBool>,
}

impl Device for Gate {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn read(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        // Headers are read one target at a time at open: only gate the image's reads.
        if block > 0 {
            let (count, changed) = &*self.arrived;
            let mut n = count.lock().unwrap();
            *n += 1;
            changed.notify_all();
            let (n, timeout) = changed
                .wait_timeout_while(n, std::time::Duration::from_secs(2), |n| *n < self.parties)
                .unwrap();
            if timeout.timed_out() && *n < self.parties {
                self.all_met.store(false, Ordering::SeqCst);
            }
        }
        self.inner.read(block, buf)
    }
    fn submit(&self, writes: Vec<Write>, flags: WriteFlags) -> Result<Ticket> {
        self.inner.submit(writes, flags)
    }
    fn wait(&self, ticket: Ticket) -> Result<()> {
        self.inner.wait(ticket)
    }
    fn flush(&self) -> Result<()> {
        self.inner.flush()
    }
    fn stats(&self) -> DeviceStats {
        self.inner.stats()
    }
}

#[test]
fn a_read_over_several_targets_reads_them_concurrently_and_reports_a_failure() {
    let arrived = Arc::new((std::sync::Mutex::new(0usize), std::sync::Condvar::new()));
    let all_met = Arc::new(AtomicBool::new(true));
    let gates: Vec<Arc<dyn Device>> = (0..3)
        .map(|_| {
            Arc::new(Gate {
                inner: MemDevice::new(BS, 20).unwrap(),
                arrived: arrived.clone(),
                parties: 3,
                all_met: all_met.clone(),
            }) as Arc<dyn Device>
        })
        .collect();
    let span = SpanDevice::format(gates, LAYOUT).unwrap();
    // Blocks 2..14: stripes 0, 1 and 2, one on each target.
    let mut back = vec![0u8; 12 * BS as usize];
    let start = std::time::Instant::now();
    span.read(2, &mut back).unwrap();
    assert!(all_met.load(Ordering::SeqCst), "the targets were read one after another");
    assert!(start.elapsed() < std::time::Duration::from_secs(2), "{:?}", start.elapsed());

    // One target's read fails: the read fails with its error; the others' bytes are moot.
    let bad = faulty();
    let targets: Vec<Arc<dyn Device>> =
        vec![Arc::new(MemDevice::new(BS, 20).unwrap()), bad.clone()];
    let span = SpanDevice::format(targets, LAYOUT).unwrap();
    bad.fail_read.store(true, Ordering::SeqCst);
    let mut back = vec![0u8; 8 * BS as usize];
    assert!(matches!(span.read(2, &mut back), Err(MediaError::Injected { op: "read", .. })));
    bad.fail_read.store(false, Ordering::SeqCst);
    span.read(2, &mut back).unwrap();
}

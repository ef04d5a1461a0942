//! Fail-stop: after a failed write or flush the log refuses new commits until it is reopened,
//! and reopening recovers a consistent prefix. Uses the crash device's fault injection.

use std::sync::Arc;

use tally_log::{Log, LogConfig, LogError, OpenOptions, Transaction};
use tally_media::{Device, Geometry, MemDevice};
use tally_sim::{CrashConfig, CrashDevice, CrashOptions, FaultPlan};

fn setup(faults: FaultPlan) -> (Arc<CrashDevice>, Log) {
    let g = Geometry::new(1024, 2 + 8 * 16, 512).unwrap();
    let dev = Arc::new(CrashDevice::new(g, CrashConfig::with_seed(3)));
    Log::format(&*dev, &LogConfig { streams: 2, segment_blocks: 16, uuid: [3; 16] }).unwrap();
    let (log, _) = Log::open(dev.clone(), OpenOptions::default()).unwrap();
    dev.set_faults(faults);
    (dev, log)
}

fn tx(tag: u8) -> Transaction {
    let mut t = Transaction::new(0);
    t.record(vec![tag; 16]);
    t
}

fn nth_from_now(dev: &CrashDevice, stat: impl Fn(&tally_media::DeviceStats) -> u64, n: u64) -> u64 {
    stat(&dev.stats()) + n
}

#[test]
fn failed_write_stops_every_later_commit() {
    let (dev, log) = setup(FaultPlan::none());
    log.commit_durable(tx(1)).unwrap();
    let nth = nth_from_now(&dev, |s| s.writes, 1);
    dev.set_faults(FaultPlan { write_eio_nth: Some(nth), ..FaultPlan::none() });
    assert!(log.commit_durable(tx(2)).is_err(), "the failed write must be reported");
    for tag in 3..5 {
        assert!(
            matches!(log.commit(tx(tag)), Err(LogError::Failed { .. })),
            "commits after a failure must be refused"
        );
    }
    assert!(log.sync().is_err());
    drop(log);
    // Reopen on what a power failure leaves: the acknowledged commit is there, nothing else.
    for image in dev.crash_images(CrashOptions::default()) {
        let (_, rec) =
            Log::open(Arc::new(MemDevice::from_image(image)), OpenOptions::default()).unwrap();
        assert_eq!(rec.streams[0].txs.len(), 1);
        assert_eq!(rec.streams[0].txs[0].records[0], vec![1; 16]);
    }
}

#[test]
fn failed_flush_is_not_retried_and_nothing_is_acknowledged() {
    let (dev, log) = setup(FaultPlan::none());
    let nth = nth_from_now(&dev, |s| s.flushes, 1);
    dev.set_faults(FaultPlan { flush_eio_nth: Some(nth), ..FaultPlan::none() });
    assert!(log.commit_durable(tx(1)).is_err());
    let flushes = dev.stats().flushes;
    assert!(matches!(log.commit_durable(tx(2)), Err(LogError::Failed { .. })));
    assert!(log.wait_durable(tally_log::TxId { stream: 0, seq: 1 }).is_err());
    assert_eq!(dev.stats().flushes, flushes, "a failed flush must not be retried");
    assert_eq!(log.durable_seq(0), 0, "nothing was made durable");
}

#[test]
fn read_errors_and_bit_flips_at_open_are_reported_not_panicked_on() {
    let (dev, log) = setup(FaultPlan::none());
    log.commit_durable(tx(1)).unwrap();
    drop(log);
    let reads = dev.stats().reads;
    dev.set_faults(FaultPlan { read_eio_nth: Some(reads + 1), ..FaultPlan::none() });
    assert!(matches!(Log::open(dev.clone(), OpenOptions::default()), Err(LogError::Media(_))));
    // A flipped bit in a superblock copy: the other copy is used; in a unit: the chain ends
    // there (the transaction is not whole). Either way, open succeeds or fails cleanly.
    for nth in 1..=8 {
        let reads = dev.stats().reads;
        dev.set_faults(FaultPlan { read_flip_nth: Some(reads + nth), ..FaultPlan::none() });
        match Log::open(dev.clone(), OpenOptions::default()) {
            Ok((_, rec)) => assert!(rec.streams[0].txs.len() <= 1),
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    }
}

#[test]
fn ignored_flushes_are_caught_by_the_durability_check() {
    // The device lies about flushes: an acknowledged commit can vanish at a crash. This is
    // what the explorer's I4 check exists to catch; here we show the lie is observable.
    let (dev, log) = setup(FaultPlan { ignore_flushes: true, ..FaultPlan::none() });
    log.commit_durable(tx(1)).unwrap();
    let lost = dev.crash_images(CrashOptions::default()).any(|image| {
        let (_, rec) =
            Log::open(Arc::new(MemDevice::from_image(image)), OpenOptions::default()).unwrap();
        rec.streams[0].txs.is_empty()
    });
    assert!(lost, "with flushes ignored, some crash image must lose the acknowledged commit");
}

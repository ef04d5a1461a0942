//! The log on a simulated disk (`tally-sim`'s crash device), crashed at every device operation
//! of a run of commits: whatever a crash leaves, reopening recovers a prefix of what was
//! committed — consecutive sequence numbers from the first, each transaction's records as
//! written — that holds every transaction acknowledged durable before the crash.
//!
//! The explorers of `tally-crash` check the same invariants on generated workloads; this test
//! is the log's own, one workload chosen by hand. The check is shown able to fail with two
//! broken protocols (`mutants` feature): a durable commit acknowledged without a flush, and a
//! recovery that keeps transactions after a missing one.

use std::sync::Arc;

use tally_log::{CommitMode, Log, LogConfig, OpenOptions, Recovery, Transaction};
use tally_media::{Geometry, MemDevice};
use tally_sim::{CrashConfig, CrashDevice, CrashOptions, CrashPoint, RecordingDevice};

/// Transactions committed durably before the crash points are recorded.
const DURABLE_BEFORE: u64 = 3;
/// Ordered commits (not waited for) while the points are recorded.
const ORDERED_COUNT: u64 = 5;

/// The one record of the transaction with sequence number `seq` (seqs start at 1).
fn record_of(seq: u64) -> Vec<u8> {
    let mut record = seq.to_le_bytes().to_vec();
    // Longer than a block: each transaction spans blocks (and atomic units) that a crash can
    // keep one without the other.
    record.extend(std::iter::repeat_n(u8::try_from(seq % 251).unwrap(), 1500));
    record
}

fn tx(seq: u64) -> Transaction {
    let mut t = Transaction::new(0);
    t.record(record_of(seq));
    t
}

/// A crash point and how many transactions were acknowledged durable when it was taken.
struct Point {
    point: CrashPoint,
    acknowledged: u64,
}

/// Commit `DURABLE_BEFORE` transactions durably, then record a crash point at every device
/// operation of `ORDERED_COUNT` ordered commits and one durable commit; the last point is taken
/// after that durable commit returned.
fn run(mutant: Option<tally_log::Mutant>) -> Vec<Point> {
    let geometry = Geometry::new(1024, 2 + 8 * 16, 512).unwrap();
    let dev = RecordingDevice::new(CrashDevice::new(geometry, CrashConfig::with_seed(11)));
    Log::format(&*dev, &LogConfig { streams: 1, segment_blocks: 16, uuid: [7; 16] }).unwrap();
    let (log, _) =
        Log::open(dev.clone(), OpenOptions { mutant, ..OpenOptions::default() }).unwrap();
    for seq in 1..=DURABLE_BEFORE {
        log.commit_durable(tx(seq)).unwrap();
    }
    dev.set_recording(true);
    let last = DURABLE_BEFORE + ORDERED_COUNT + 1;
    for seq in DURABLE_BEFORE + 1..last {
        log.commit_with(tx(seq), CommitMode::Ordered).unwrap();
    }
    log.commit_durable(tx(last)).unwrap();
    let mut points: Vec<Point> = dev
        .take_points()
        .into_iter()
        .map(|point| Point { point, acknowledged: DURABLE_BEFORE })
        .collect();
    points.push(Point { point: dev.inner().crash_point(), acknowledged: last });
    drop(log);
    points
}

/// What is wrong with `recovery` after a crash at a point with `acknowledged` durable
/// transactions, if anything.
fn check(recovery: &Recovery, acknowledged: u64) -> Option<String> {
    let txs = &recovery.streams[0].txs;
    for (i, t) in txs.iter().enumerate() {
        let seq = u64::try_from(i).unwrap() + 1;
        if t.id.seq != seq {
            return Some(format!("recovered seq {} at place {seq}: not a prefix", t.id.seq));
        }
        if t.records != [record_of(seq)] {
            return Some(format!("transaction {seq} recovered with other records"));
        }
    }
    let recovered = u64::try_from(txs.len()).unwrap();
    (recovered < acknowledged)
        .then(|| format!("{recovered} recovered, {acknowledged} acknowledged durable"))
}

/// Every image every point can leave (torn writes included); the first failure, if any.
fn first_failure(points: &[Point], mutant: Option<tally_log::Mutant>) -> Option<String> {
    let options = CrashOptions { tearing: true, samples: 64, ..CrashOptions::default() };
    for (n, p) in points.iter().enumerate() {
        for image in p.point.crash_images(options.clone()) {
            let dev = Arc::new(MemDevice::from_image(image));
            let opened = Log::open(dev, OpenOptions { mutant, ..OpenOptions::default() });
            let failure = match opened {
                Ok((_, recovery)) => check(&recovery, p.acknowledged),
                Err(e) => Some(format!("recovery failed: {e}")),
            };
            if let Some(failure) = failure {
                return Some(format!("crash point {n} of {}: {failure}", points.len()));
            }
        }
    }
    None
}

#[test]
fn every_crash_recovers_a_prefix_holding_the_acknowledged() {
    let points = run(None);
    // Every commit submits, waits and (the durable one) flushes: enough points to mean something.
    assert!(points.len() > usize::try_from(ORDERED_COUNT).unwrap() * 2, "{}", points.len());
    assert!(
        points.iter().any(|p| p.point.uncertain_count() >= 2),
        "no point has two uncertain writes: nothing can be lost out of order"
    );
    assert_eq!(first_failure(&points, None), None, "crash device seed 11");
}

#[cfg(feature = "mutants")]
#[test]
fn the_check_catches_a_skipped_flush_and_a_kept_gap() {
    use tally_log::Mutant;
    for (mutant, symptom) in
        [(Mutant::FlushSkipped, "acknowledged durable"), (Mutant::NoPrefixCut, "not a prefix")]
    {
        let failure = first_failure(&run(Some(mutant)), Some(mutant));
        let failure = failure.unwrap_or_else(|| panic!("{} not caught", mutant.name()));
        assert!(failure.contains(symptom), "{}: {failure}", mutant.name());
    }
}

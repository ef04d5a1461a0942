//! Several threads commit in every mode while another syncs, on a crash device that completes
//! writes out of order. Whenever the log acknowledges durability, the worst crash at that
//! instant (every uncertain write lost) must still recover the acknowledged transaction.
//!
//! This is a stress test, not a model check: it samples interleavings, it does not enumerate
//! them. Its check is shown able to fail with the `flush-skipped` mutant, and it catches the
//! one race found in review so far (`orderless-submit-untracked`).

use std::sync::{Arc, Mutex};

use tally_log::{CommitMode, Log, LogConfig, OpenOptions, Transaction, TxId};
use tally_media::{Geometry, MemDevice};
use tally_sim::{CompletionPolicy, CrashConfig, CrashDevice, CrashPoint};

/// Acknowledged transactions and the crash state at the moment of their acknowledgement.
type Acks = Mutex<Vec<(TxId, CrashPoint)>>;

fn run(mutant: Option<tally_log::Mutant>, seed: u64) -> Vec<String> {
    let geometry = Geometry::new(1024, 2 + 64 * 16, 512).unwrap();
    let config =
        CrashConfig { completion: CompletionPolicy::Shuffle, ..CrashConfig::with_seed(seed) };
    let dev = Arc::new(CrashDevice::new(geometry, config));
    Log::format(&*dev, &LogConfig { streams: 3, segment_blocks: 16, uuid: [9; 16] }).unwrap();
    let (log, _) =
        Log::open(dev.clone(), OpenOptions { mutant, ..OpenOptions::default() }).unwrap();
    let acks: Acks = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            let (log, dev, acks) = (&log, &dev, &acks);
            scope.spawn(move || {
                let mut rng = fastrand::Rng::with_seed(seed ^ (t << 32));
                for i in 0..120u64 {
                    let mut tx = Transaction::new((t % 3) as u16);
                    tx.record(((t << 32) | i).to_le_bytes().to_vec());
                    let mode = [CommitMode::Ordered, CommitMode::Orderless, CommitMode::Count]
                        [rng.usize(..3)];
                    let Ok(info) = log.commit_with(tx, mode) else { return };
                    let durable = mode == CommitMode::Count
                        || (rng.bool() && log.wait_durable(info.ticket).is_ok());
                    if durable {
                        acks.lock().unwrap().push((info.ticket, dev.crash_point()));
                    }
                }
            });
        }
        let (log, dev, acks) = (&log, &dev, &acks);
        scope.spawn(move || {
            for _ in 0..40 {
                if log.sync().is_ok() {
                    // Everything at or below the durable watermarks is claimed durable now.
                    let claimed: Vec<TxId> =
                        (0..3).map(|s| TxId { stream: s, seq: log.durable_seq(s) }).collect();
                    let point = dev.crash_point();
                    let mut acks = acks.lock().unwrap();
                    acks.extend(
                        claimed.into_iter().filter(|t| t.seq > 0).map(|t| (t, point.clone())),
                    );
                }
                std::thread::yield_now();
            }
        });
    });
    drop(log);
    let acks = acks.into_inner().unwrap();
    assert!(acks.len() > 100, "the workload acknowledged too little to test anything");
    let mut failures = Vec::new();
    for (ticket, point) in acks {
        let image = point.durable_image().clone();
        // A recovery that refuses the image (it proves a durable transaction lost) also fails
        // the acknowledgement: the commit is not readable.
        let rec = match Log::open(Arc::new(MemDevice::from_image(image)), OpenOptions::default()) {
            Ok((_, rec)) => rec,
            Err(e) => {
                failures.push(format!(
                    "seed {seed}: {}:{} acknowledged durable, recovery after the worst crash \
                     refused the image: {e}",
                    ticket.stream, ticket.seq
                ));
                continue;
            }
        };
        let survived =
            rec.streams[usize::from(ticket.stream)].txs.iter().any(|t| t.id.seq >= ticket.seq);
        if !survived {
            failures.push(format!(
                "seed {seed}: {}:{} acknowledged durable, lost by the worst crash at that moment",
                ticket.stream, ticket.seq
            ));
        }
    }
    failures
}

#[test]
fn acknowledged_commits_survive_the_worst_crash_under_concurrency() {
    for seed in 1..=6 {
        let failures = run(None, seed);
        assert!(failures.is_empty(), "{failures:#?}");
    }
}

#[cfg(feature = "mutants")]
#[test]
fn the_check_catches_a_log_that_skips_its_flush() {
    let failures: Vec<String> =
        (1..=3).flat_map(|seed| run(Some(tally_log::Mutant::FlushSkipped), seed)).collect();
    assert!(!failures.is_empty(), "flush-skipped must lose an acknowledged commit");
}

#[cfg(feature = "mutants")]
#[test]
fn the_check_catches_the_orderless_submission_race() {
    let caught = (1..=40)
        .find(|&seed| !run(Some(tally_log::Mutant::OrderlessSubmitUntracked), seed).is_empty());
    assert!(
        caught.is_some(),
        "orderless-submit-untracked must lose an acknowledged commit in 40 seeds"
    );
    println!("orderless-submit-untracked caught at seed {}", caught.unwrap_or(0));
}

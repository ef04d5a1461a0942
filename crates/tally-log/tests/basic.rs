//! Behaviour of the log on a device that never crashes.

use std::sync::Arc;

use tally_log::{CommitMode, Log, LogConfig, LogError, OpenOptions, Transaction, TxId};
use tally_media::{Device, MemDevice};

fn fresh(blocks: u64, streams: u16, segment_blocks: u32) -> Arc<MemDevice> {
    let dev = Arc::new(MemDevice::new(512, blocks).unwrap());
    Log::format(&*dev, &LogConfig { streams, segment_blocks, uuid: [7; 16] }).unwrap();
    dev
}

fn reopen(dev: &Arc<MemDevice>) -> (Log, tally_log::Recovery) {
    Log::open(dev.clone(), OpenOptions::default()).unwrap()
}

fn tx(stream: u16, tag: &str) -> Transaction {
    let mut t = Transaction::new(stream);
    t.record(tag.as_bytes().to_vec());
    t
}

fn records(r: &tally_log::Recovery, stream: usize) -> Vec<String> {
    r.streams[stream]
        .txs
        .iter()
        .flat_map(|t| t.records.iter().map(|r| String::from_utf8_lossy(r).into_owned()))
        .collect()
}

#[test]
fn committed_transactions_come_back_in_order_with_their_data() {
    let dev = fresh(256, 2, 16);
    let (log, r) = reopen(&dev);
    assert!(r.streams.iter().all(|s| s.txs.is_empty()));
    let mut with_data = tx(0, "a");
    with_data.data(vec![0xAB; 512]);
    with_data.data(vec![0xCD; 100]);
    let a = log.commit_durable(with_data).unwrap();
    log.commit_with(tx(0, "b"), CommitMode::Ordered).unwrap();
    log.commit_with(tx(1, "x"), CommitMode::Classic).unwrap();
    log.commit_with(tx(1, "y"), CommitMode::Orderless).unwrap();
    log.sync().unwrap();
    drop(log);
    let (_log, r) = reopen(&dev);
    assert_eq!(records(&r, 0), ["a", "b"]);
    assert_eq!(records(&r, 1), ["x", "y"]);
    let first = &r.streams[0].txs[0];
    assert_eq!((first.data_start, first.data_count), (a.data_start, 2));
    let mut block = vec![0u8; 512];
    dev.read(first.data_start + 1, &mut block).unwrap();
    assert!(block[..100].iter().all(|&b| b == 0xCD) && block[100..].iter().all(|&b| b == 0));
}

#[test]
fn transactions_cross_segment_boundaries_and_large_bodies_span_units() {
    let dev = fresh(512, 2, 8);
    let (log, _) = reopen(&dev);
    let mut expect = Vec::new();
    for i in 0..40 {
        let mut t = tx(0, &format!("t{i}"));
        if i % 3 == 0 {
            t.record(vec![i as u8; 900]); // three units of 448 payload bytes
        }
        for _ in 0..(i % 4) {
            t.data(vec![i as u8; 512]);
        }
        log.commit(t).unwrap();
        expect.push(format!("t{i}"));
    }
    log.sync().unwrap();
    drop(log);
    let (_log, r) = reopen(&dev);
    let got: Vec<_> = r.streams[0]
        .txs
        .iter()
        .map(|t| String::from_utf8_lossy(&t.records[0]).into_owned())
        .collect();
    assert_eq!(got, expect);
    assert_eq!(r.streams[0].txs[3].records[1], vec![3u8; 900]);
}

#[test]
fn a_transaction_larger_than_a_segment_is_refused_cleanly() {
    let dev = fresh(256, 2, 8);
    let (log, _) = reopen(&dev);
    let mut t = tx(0, "big");
    for _ in 0..8 {
        t.data(vec![1; 512]);
    }
    assert!(matches!(log.commit(t), Err(LogError::TooLarge { .. })));
    log.commit_durable(tx(0, "after")).unwrap();
    let mut bad = tx(0, "oversized block");
    bad.data(vec![0; 513]);
    assert!(matches!(log.commit(bad), Err(LogError::Invalid(_))));
    assert!(matches!(log.commit(tx(9, "no stream")), Err(LogError::Invalid(_))));
}

#[test]
fn out_of_space_is_a_clean_error_and_checkpoint_frees_segments() {
    // 2 + 6 segments of 4 blocks: 2 streams hold 4, 2 free.
    let dev = fresh(2 + 6 * 4, 2, 4);
    let (log, _) = reopen(&dev);
    let mut last = 0;
    let err = loop {
        match log.commit_durable(tx(0, "fill")) {
            Ok(info) => last = info.ticket.seq,
            Err(e) => break e,
        }
    };
    assert!(matches!(err, LogError::NoSpace { stream: 0 }), "{err}");
    assert_eq!(log.free_segments(), 0);
    log.checkpoint(0, last).unwrap();
    assert!(log.free_segments() > 0);
    log.commit_durable(tx(0, "after checkpoint")).unwrap();
    drop(log);
    let (_log, r) = reopen(&dev);
    assert_eq!(records(&r, 0), ["after checkpoint"]);
    assert_eq!(r.streams[0].checkpoint_seq, last);
}

#[test]
fn dependencies_are_recorded_until_durable() {
    let dev = fresh(256, 2, 16);
    let (log, _) = reopen(&dev);
    let a = log.commit(tx(0, "a")).unwrap();
    let mut b = tx(1, "b");
    b.depend_on(a.ticket);
    log.commit(b).unwrap();
    log.sync().unwrap();
    let mut c = tx(1, "c");
    c.depend_on(a.ticket); // durable by now: not recorded
    log.commit_durable(c).unwrap();
    drop(log);
    let (_log, r) = reopen(&dev);
    assert_eq!(r.streams[1].txs[0].deps, [TxId { stream: 0, seq: a.ticket.seq }]);
    assert!(r.streams[1].txs[1].deps.is_empty());
}

#[test]
fn parallel_durable_commits_all_survive_with_at_most_one_flush_each() {
    let dev = fresh(4096, 2, 64);
    let (log, _) = reopen(&dev);
    let log = Arc::new(log);
    let before = log.stats();
    std::thread::scope(|s| {
        for t in 0..8u16 {
            let log = log.clone();
            s.spawn(move || {
                for i in 0..50 {
                    log.commit_durable(tx(t % 2, &format!("{t}/{i}"))).unwrap();
                }
            });
        }
    });
    let after = log.stats();
    assert_eq!(after.commits - before.commits, 400);
    let flushes = after.device.flushes - before.device.flushes;
    assert!(flushes <= 400, "never more than one flush per commit: {flushes}");
    drop(log);
    let (_log, r) = reopen(&dev);
    assert_eq!(r.streams[0].txs.len() + r.streams[1].txs.len(), 400);
}

#[test]
fn reopen_is_idempotent_and_bumps_epochs() {
    let dev = fresh(256, 2, 16);
    let (log, r1) = reopen(&dev);
    log.commit_durable(tx(0, "a")).unwrap();
    drop(log);
    let (log, r2) = reopen(&dev);
    drop(log);
    let (log, r3) = reopen(&dev);
    assert_eq!(records(&r2, 0), records(&r3, 0));
    assert!(r3.streams[0].epoch > r2.streams[0].epoch && r2.streams[0].epoch > r1.streams[0].epoch);
    log.commit_durable(tx(0, "b")).unwrap();
    drop(log);
    let (_log, r4) = reopen(&dev);
    assert_eq!(records(&r4, 0), ["a", "b"]);
}

#[test]
fn garbage_devices_are_refused_not_panicked_on() {
    let dev = Arc::new(MemDevice::new(512, 64).unwrap());
    assert!(matches!(
        Log::open(dev.clone(), OpenOptions::default()),
        Err(LogError::NotFormatted { .. })
    ));
    let small = MemDevice::new(512, 8).unwrap();
    assert!(matches!(Log::format(&small, &LogConfig::default()), Err(LogError::Invalid(_))));
}

#[test]
fn checkpoint_inside_a_segment_keeps_the_rest_of_it() {
    let dev = fresh(512, 2, 8);
    let (log, _) = reopen(&dev);
    // Four 2-block transactions fill the first 8-block segment; the fifth moves on.
    let mut seqs = Vec::new();
    for i in 0..5 {
        let mut t = tx(0, &format!("t{i}"));
        t.data(vec![i as u8; 512]);
        seqs.push(log.commit_durable(t).unwrap().ticket.seq);
    }
    log.checkpoint(0, seqs[0]).unwrap();
    drop(log);
    let (_log, r) = reopen(&dev);
    assert_eq!(records(&r, 0), ["t1", "t2", "t3", "t4"]);
}

#[test]
fn cleaning_relocates_live_records_and_frees_segments() {
    let dev = fresh(2 + 12 * 8, 2, 8);
    let (log, _) = reopen(&dev);
    // 12 one-block transactions: segments of 8 blocks, so the chain spans two segments.
    let mut infos = Vec::new();
    for i in 0..12 {
        infos.push(log.commit_durable(tx(0, &format!("r{i}"))).unwrap());
    }
    // Everything but r3 and r5 is dead.
    for (i, info) in infos.iter().enumerate() {
        if i != 3 && i != 5 {
            log.mark_dead(info.ticket, 1).unwrap();
        }
    }
    let usage = log.segment_usage(0).unwrap();
    assert_eq!(usage[0].records, 8);
    assert_eq!(usage[0].dead_records, 6);
    let free_before = log.free_segments();
    let report = log
        .clean(0, 1, |t| {
            let name = String::from_utf8_lossy(&t.records[0]).into_owned();
            Ok((name == "r3" || name == "r5").then(|| {
                let mut moved = Transaction::new(0);
                moved.record(t.records[0].clone());
                moved
            }))
        })
        .unwrap();
    assert_eq!((report.transactions_read, report.transactions_relocated), (8, 2));
    assert_eq!(report.segments_freed, 1);
    assert_eq!(log.free_segments(), free_before + 1);
    drop(log);
    let (_log, r) = reopen(&dev);
    assert_eq!(records(&r, 0), ["r8", "r9", "r10", "r11", "r3", "r5"]);
}

#[test]
fn cleaning_that_does_not_fit_changes_nothing() {
    // 2 streams, 5 segments of 4 blocks: stream 0 fills its own two and the free one.
    let dev = fresh(2 + 5 * 4, 2, 4);
    let (log, _) = reopen(&dev);
    let mut n = 0;
    while log.commit_durable(tx(0, &format!("r{n}"))).is_ok() {
        n += 1;
    }
    let relocate_all = |t: &tally_log::RecoveredTx| {
        let mut moved = Transaction::new(0);
        moved.record(t.records[0].clone());
        Ok(Some(moved))
    };
    assert!(matches!(log.clean(0, 1, relocate_all), Err(LogError::NoSpace { stream: 0 })));
    drop(log);
    let (_log, r) = reopen(&dev);
    let expect: Vec<String> = (0..n).map(|i| format!("r{i}")).collect();
    assert_eq!(records(&r, 0), expect, "a failed clean must not leave relocated duplicates");
}

//! Large transactions (runs of parts that commit together, `docs/FORMAT.md`, "Large
//! transactions"): a run spans several segments, other transactions of the stream come between
//! its parts, and it survives whole or not at all; checkpoints, cleaning and checkpoint
//! snapshots never split an open run.

use std::sync::Arc;

use tally_log::{Log, LogConfig, LogError, OpenOptions, Recovery, RunRole, Transaction};
use tally_media::MemDevice;

const SEGMENT_BLOCKS: u32 = 8;

fn fresh(blocks: u64) -> Arc<MemDevice> {
    let dev = Arc::new(MemDevice::new(512, blocks).unwrap());
    let config = LogConfig { streams: 2, segment_blocks: SEGMENT_BLOCKS, uuid: [3; 16] };
    Log::format(&*dev, &config).unwrap();
    dev
}

fn reopen(dev: &Arc<MemDevice>) -> (Log, Recovery) {
    Log::open(dev.clone(), OpenOptions::default()).unwrap()
}

/// A transaction with one record `tag` and `data` full data blocks.
fn tx(tag: &str, data: usize) -> Transaction {
    let mut t = Transaction::new(0);
    t.record(tag.as_bytes().to_vec());
    for i in 0..data {
        t.data(vec![i as u8; 512]);
    }
    t
}

fn records(r: &Recovery) -> Vec<String> {
    r.streams[0]
        .txs
        .iter()
        .flat_map(|t| t.records.iter().map(|r| String::from_utf8_lossy(r).into_owned()))
        .collect()
}

/// Commits parts "p0".."p{n-1}" of a new run, each with 6 data blocks (most of a segment),
/// with an ordinary transaction "o{k}" after each part; returns the run's name.
fn parts(log: &Log, n: usize) -> u64 {
    let mut run = None;
    for k in 0..n {
        let mut p = tx(&format!("p{k}"), 6);
        p.run_part(run);
        let info = log.commit(p).unwrap();
        run.get_or_insert(info.ticket.seq);
        log.commit(tx(&format!("o{k}"), 0)).unwrap();
    }
    run.unwrap()
}

fn segments_spanned(log: &Log) -> usize {
    log.segment_usage(0).unwrap().iter().filter(|u| u.transactions > 0).count()
}

#[test]
fn a_closed_run_across_segments_survives_whole_with_what_came_between() {
    let dev = fresh(256);
    let (log, _) = reopen(&dev);
    let run = parts(&log, 4);
    let mut close = tx("close", 1);
    close.run_close(run);
    log.commit(close).unwrap();
    assert!(segments_spanned(&log) >= 3, "the run spans {} segments", segments_spanned(&log));
    log.sync().unwrap();
    drop(log);
    let (_log, r) = reopen(&dev);
    assert_eq!(records(&r), ["p0", "o0", "p1", "o1", "p2", "o2", "p3", "o3", "close"]);
    let close = r.streams[0].txs.last().unwrap().run.unwrap();
    assert_eq!((close.role, close.seq, close.index), (RunRole::Close, run, 4));
}

#[test]
fn a_run_never_closed_leaves_nothing_but_what_came_between() {
    for abandon in [false, true] {
        let dev = fresh(256);
        let (log, _) = reopen(&dev);
        let run = parts(&log, 4);
        if abandon {
            log.abandon_run(0, run);
            // Given up: its name is no longer open.
            let mut late = tx("late", 0);
            late.run_part(Some(run));
            assert!(matches!(log.commit(late), Err(LogError::Invalid(_))));
        }
        log.commit(tx("after", 0)).unwrap();
        log.sync().unwrap();
        drop(log); // a crash (everything written is on the memory device) before any close
        let (log, r) = reopen(&dev);
        assert_eq!(records(&r), ["o0", "o1", "o2", "o3", "after"], "abandon {abandon}");
        // The parts keep their places in the chain, empty: nothing after them was lost.
        assert_eq!(r.streams[0].txs.len(), 9);
        // A close written now, for the run of an earlier life, is refused.
        let mut close = tx("close", 0);
        close.run_close(run);
        assert!(matches!(log.commit(close), Err(LogError::Invalid(_))));
        drop(log);
        let (_log, r) = reopen(&dev);
        assert_eq!(records(&r), ["o0", "o1", "o2", "o3", "after"], "again, abandon {abandon}");
    }
}

#[test]
fn checkpoints_cleaning_and_snapshots_never_split_an_open_run() {
    let dev = fresh(256);
    let (log, _) = reopen(&dev);
    log.commit(tx("before", 0)).unwrap();
    let run = parts(&log, 3);
    log.sync().unwrap();
    let first_part = run;
    assert!(matches!(log.checkpoint(0, first_part), Err(LogError::Invalid(_))));
    assert!(!log.checkpoint_snapshot(b"state").unwrap(), "no checkpoint snapshot over a run");
    // Cleaning the oldest segments stops before the run's first part: "before" only.
    let report = log
        .clean(0, 3, |t| {
            Ok(Some({
                let mut m = Transaction::new(0);
                for r in &t.records {
                    m.record(r.clone());
                }
                m
            }))
        })
        .unwrap();
    assert!(report.checkpointed_seq.is_none_or(|s| s < first_part), "{report:?}");
    let mut close = tx("close", 0);
    close.run_close(run);
    log.commit(close).unwrap();
    // Closed: cleaning may now take the parts, relocating their records as ordinary ones.
    let mut relocated = Vec::new();
    let report = log
        .clean(0, 2, |t| {
            let mut m = Transaction::new(0);
            for r in &t.records {
                relocated.push(String::from_utf8_lossy(r).into_owned());
                m.record(r.clone());
            }
            Ok(Some(m))
        })
        .unwrap();
    assert!(report.checkpointed_seq.is_some_and(|s| s >= first_part), "{report:?}");
    assert!(relocated.iter().any(|r| r == "p0"), "parts read with their records: {relocated:?}");
    drop(log);
    let (_log, r) = reopen(&dev);
    let got = records(&r);
    for want in ["p1", "p2", "close", "o2"] {
        assert!(got.iter().any(|g| g == want), "{want} missing from {got:?}");
    }
}

#[test]
fn cleaning_reads_an_unclosed_run_as_empty() {
    let dev = fresh(256);
    let (log, _) = reopen(&dev);
    let run = parts(&log, 3);
    log.abandon_run(0, run);
    log.commit(tx("after", 0)).unwrap();
    let mut seen = Vec::new();
    log.clean(0, 2, |t| {
        seen.extend(t.records.iter().map(|r| String::from_utf8_lossy(r).into_owned()));
        Ok(None)
    })
    .unwrap();
    assert!(
        seen.iter().all(|s| s.starts_with('o')),
        "abandoned parts handed to cleaning: {seen:?}"
    );
    assert!(seen.iter().any(|s| s == "o0"), "cleaning read nothing: {seen:?}");
}

/// Cleaning may checkpoint into the middle of a run that was given up: the parts after the
/// checkpoint stay uncommitted (no close), after any number of reopens.
#[test]
fn an_abandoned_run_split_by_a_checkpoint_stays_uncommitted() {
    let dev = fresh(256);
    let (log, _) = reopen(&dev);
    let run = parts(&log, 4);
    log.abandon_run(0, run);
    log.sync().unwrap();
    // The oldest segment holds the first part (and "o0"): cleaning it checkpoints past them.
    let report = log.clean(0, 1, |_| Ok(None)).unwrap();
    let upto = report.checkpointed_seq.expect("cleaned");
    assert!(upto >= run && upto < run + 6, "checkpoint {upto} inside the run from {run}");
    drop(log);
    for _ in 0..2 {
        let (log, r) = reopen(&dev);
        let got = records(&r);
        assert!(got.iter().all(|g| g.starts_with('o')), "abandoned parts came back: {got:?}");
        drop(log);
    }
}

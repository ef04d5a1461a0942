//! Write-behind (`OpenOptions::write_behind`): ordered commits wait in memory and go out merged
//! at durability requests, past a stream's or the memory threshold, after the commit interval,
//! or at `Log::write_out`; reads see buffered blocks; dropping the log discards the buffer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tally_log::{Log, LogConfig, OpenOptions, Transaction, WriteBehind};
use tally_media::{Device, MemDevice};

const BS: u32 = 512;

fn fresh(streams: u16) -> Arc<MemDevice> {
    let dev = Arc::new(MemDevice::new(BS, 1024).unwrap());
    Log::format(&*dev, &LogConfig { streams, segment_blocks: 64, uuid: [3; 16] }).unwrap();
    dev
}

/// Write-behind with no flusher thread and thresholds far away unless given.
fn behind(stream_bytes_max: u64, memory_bytes_max: u64) -> OpenOptions {
    OpenOptions {
        write_behind: Some(WriteBehind {
            interval: None,
            stream_bytes_max,
            memory_bytes_max,
            write_bytes_max: 1 << 20,
        }),
        ..OpenOptions::default()
    }
}

fn open(dev: &Arc<MemDevice>, opts: OpenOptions) -> (Log, tally_log::Recovery) {
    Log::open(dev.clone(), opts).unwrap()
}

fn tx(stream: u16, tag: &str) -> Transaction {
    let mut t = Transaction::new(stream);
    t.record(tag.as_bytes().to_vec());
    t
}

fn tags(r: &tally_log::Recovery, stream: usize) -> Vec<String> {
    r.streams[stream]
        .txs
        .iter()
        .flat_map(|t| t.records.iter().map(|r| String::from_utf8_lossy(r).into_owned()))
        .collect()
}

#[test]
fn ordered_commits_wait_in_memory_and_a_sync_writes_them_out_merged() {
    let dev = fresh(2);
    let (log, _) = open(&dev, behind(1 << 20, 1 << 30));
    let before = dev.stats();
    for i in 0..20 {
        log.commit(tx(0, &format!("a{i}"))).unwrap();
        log.commit(tx(1, &format!("b{i}"))).unwrap();
    }
    assert_eq!(dev.stats().submissions, before.submissions, "an ordered commit wrote");
    assert_eq!(log.stats().buffered_bytes, 40 * u64::from(BS));
    log.sync().unwrap();
    let spent = dev.stats() - before;
    // One write-out per stream (each stream's 20 transactions are contiguous), one flush.
    assert_eq!((spent.submissions, spent.writes, spent.flushes), (2, 2, 1), "{spent:?}");
    assert_eq!(log.stats().buffered_bytes, 0);
    drop(log);
    let (_, r) = open(&dev, OpenOptions::default());
    assert_eq!(tags(&r, 0), (0..20).map(|i| format!("a{i}")).collect::<Vec<_>>());
    assert_eq!(tags(&r, 1), (0..20).map(|i| format!("b{i}")).collect::<Vec<_>>());
}

#[test]
fn a_durable_commit_writes_out_only_up_to_what_it_needs() {
    let dev = fresh(2);
    let (log, _) = open(&dev, behind(1 << 20, 1 << 30));
    log.commit(tx(0, "a")).unwrap();
    log.commit(tx(1, "b")).unwrap();
    let before = dev.stats();
    log.commit_durable(tx(0, "A")).unwrap();
    // Its stream's prefix up to it, and nothing of stream 1: it depends on nothing there.
    let spent = dev.stats() - before;
    assert_eq!((spent.submissions, spent.flushes), (1, 1), "{spent:?}");
    assert_eq!(log.stats().buffered_bytes, u64::from(BS));
    assert_eq!((log.durable_seq(0), log.durable_seq(1)), (2, 0));
    log.commit(tx(0, "later")).unwrap();
    assert_eq!(log.stats().buffered_bytes, 2 * u64::from(BS));
    drop(log); // discards "b" and "later": they were never promised durable
    let (_, r) = open(&dev, OpenOptions::default());
    assert_eq!(tags(&r, 0), ["a", "A"]);
    assert!(tags(&r, 1).is_empty());
}

/// A durable commit makes its dependency closure durable with it, transitively: stream 1's `B`
/// depends on stream 0's `x`, whose stream prefix holds `w`, which depends on stream 1's `v`.
/// Stream 0's watermark stops at `x` (its later commit was not asked for).
#[test]
fn a_durable_commit_makes_its_dependencies_on_other_streams_durable_and_nothing_else() {
    let dev = fresh(2);
    let (log, _) = open(&dev, behind(1 << 20, 1 << 30));
    let v = log.commit(tx(1, "v")).unwrap().ticket;
    let mut w = tx(0, "w");
    w.depend_on(v);
    log.commit(w).unwrap();
    let x = log.commit(tx(0, "x")).unwrap().ticket;
    log.commit(tx(0, "after")).unwrap();
    let mut b = tx(1, "B");
    b.depend_on(x);
    let before = dev.stats();
    log.commit_durable(b).unwrap();
    let spent = dev.stats() - before;
    assert_eq!(spent.flushes, 1, "{spent:?}");
    // Stream 0 up to x (not "after", which may have shared x's write), stream 1 up to B.
    assert_eq!((log.durable_seq(0), log.durable_seq(1)), (x.seq, 2));
    drop(log);
    let (_, r) = open(&dev, OpenOptions::default());
    assert_eq!(tags(&r, 0)[..2], ["w", "x"]);
    assert_eq!(tags(&r, 1), ["v", "B"]);
}

#[test]
fn a_stream_past_its_threshold_is_written_out() {
    let dev = fresh(2);
    let (log, _) = open(&dev, behind(4 * u64::from(BS), 1 << 30));
    let before = dev.stats().submissions;
    for i in 0..3 {
        log.commit(tx(0, &format!("a{i}"))).unwrap();
    }
    assert_eq!(dev.stats().submissions, before);
    log.commit(tx(0, "a3")).unwrap();
    assert_eq!(dev.stats().submissions, before + 1, "4 blocks reached the threshold");
    assert_eq!(log.stats().buffered_bytes, 0);
}

#[test]
fn memory_pressure_writes_out_every_stream() {
    let dev = fresh(2);
    let (log, _) = open(&dev, behind(1 << 20, 4 * u64::from(BS)));
    let before = dev.stats().submissions;
    log.commit(tx(0, "a0")).unwrap();
    log.commit(tx(1, "b0")).unwrap();
    log.commit(tx(0, "a1")).unwrap();
    assert_eq!(dev.stats().submissions, before);
    log.commit(tx(1, "b1")).unwrap();
    assert_eq!(dev.stats().submissions, before + 2, "both streams written out");
    assert_eq!(log.stats().buffered_bytes, 0);
}

#[test]
fn the_flusher_thread_writes_out_after_the_commit_interval() {
    let dev = fresh(2);
    let opts = OpenOptions {
        write_behind: Some(WriteBehind::with_interval(Duration::from_millis(50))),
        ..OpenOptions::default()
    };
    let (log, _) = open(&dev, opts);
    let before = dev.stats();
    let started = Instant::now();
    log.commit(tx(0, "a")).unwrap();
    while log.stats().buffered_bytes > 0 {
        assert!(started.elapsed() < Duration::from_secs(10), "never written out");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(started.elapsed() >= Duration::from_millis(50), "written out before the interval");
    let spent = dev.stats() - before;
    assert_eq!((spent.submissions, spent.flushes), (1, 0), "the interval writes out, no flush");
    drop(log); // joins the thread
    let (_, r) = open(&dev, OpenOptions::default());
    assert_eq!(tags(&r, 0), ["a"]);
}

#[test]
fn reads_of_buffered_blocks_come_from_memory() {
    let dev = fresh(1);
    let (log, _) = open(&dev, behind(1 << 20, 1 << 30));
    let mut t = tx(0, "with data");
    t.data(vec![0xAB; BS as usize]);
    t.data(vec![0xCD; 10]);
    let info = log.commit(t).unwrap();
    let mut buf = vec![0u8; 2 * BS as usize];
    dev.read(info.data_start, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0), "the device already holds the data");
    let reads = dev.stats().reads;
    log.read(info.data_start, &mut buf).unwrap();
    assert_eq!(dev.stats().reads, reads, "read from the device");
    assert!(buf[..BS as usize].iter().all(|&b| b == 0xAB));
    assert_eq!(
        &buf[BS as usize..BS as usize + 11],
        &[0xCD; 10].iter().chain(&[0]).copied().collect::<Vec<_>>()[..]
    );
    // A range reaching past the buffered blocks: the rest comes from the device.
    let mut wide = vec![1u8; 3 * BS as usize];
    log.read(info.data_start, &mut wide).unwrap();
    assert_eq!(&wide[..2 * BS as usize], &buf[..]);
    assert!(wide[2 * BS as usize..].iter().all(|&b| b == 0));
    log.write_out().unwrap();
    let mut again = vec![0u8; 2 * BS as usize];
    log.read(info.data_start, &mut again).unwrap();
    assert_eq!(again, buf);
    dev.read(info.data_start, &mut again).unwrap();
    assert_eq!(again, buf, "write_out submitted the buffer");
}

#[test]
fn without_write_behind_each_ordered_commit_is_submitted_at_once() {
    let dev = fresh(1);
    let (log, _) = open(&dev, OpenOptions::default());
    let before = dev.stats().submissions;
    for i in 0..5 {
        log.commit(tx(0, &format!("a{i}"))).unwrap();
    }
    assert_eq!(dev.stats().submissions, before + 5);
    assert_eq!(log.stats().buffered_bytes, 0);
}

/// `commit_deferred` places a commit and leaves the write-out it makes due to
/// `submit_deferred` (the file system submits once its state lock is given up): nothing is
/// submitted before, the due streams are after, and a durable wait on a deferred commit
/// writes it out itself.
#[test]
fn a_deferred_commit_is_submitted_by_submit_deferred_or_its_durable_wait() {
    // Without write-behind every commit makes its stream's write-out due.
    let dev = fresh(2);
    let (log, _) = open(&dev, OpenOptions::default());
    let before = dev.stats().submissions;
    log.commit_deferred(tx(0, "a0")).unwrap();
    log.commit_deferred(tx(0, "a1")).unwrap();
    log.commit_deferred(tx(1, "b0")).unwrap();
    assert_eq!(dev.stats().submissions, before, "a deferred commit was submitted");
    assert_eq!(log.stats().buffered_bytes, 3 * u64::from(BS));
    log.submit_deferred().unwrap();
    assert_eq!(dev.stats().submissions, before + 2, "one write-out per due stream");
    assert_eq!(log.stats().buffered_bytes, 0);
    log.submit_deferred().unwrap();
    assert_eq!(dev.stats().submissions, before + 2, "nothing left to submit");
    let t = log.commit_deferred(tx(1, "b1")).unwrap();
    log.wait_durable(t.ticket).unwrap();
    assert_eq!(log.stats().buffered_bytes, 0);
    drop(log);
    let (_, r) = open(&dev, OpenOptions::default());
    assert_eq!(tags(&r, 0), ["a0", "a1"]);
    assert_eq!(tags(&r, 1), ["b0", "b1"]);

    // With write-behind, only a stream past its threshold is due.
    let dev = fresh(2);
    let (log, _) = open(&dev, behind(2 * u64::from(BS), 1 << 30));
    let before = dev.stats().submissions;
    log.commit_deferred(tx(0, "a0")).unwrap();
    log.submit_deferred().unwrap();
    assert_eq!(dev.stats().submissions, before, "below the threshold nothing is due");
    log.commit_deferred(tx(0, "a1")).unwrap();
    assert_eq!(dev.stats().submissions, before);
    log.submit_deferred().unwrap();
    assert_eq!(dev.stats().submissions, before + 1, "the threshold's write-out");
}

/// `submit_deferred_of(s)` submits stream `s`'s due write-out and leaves other streams' noted
/// for their own committers (a small commit does not drive a stream streaming megabytes):
/// they go out with their own `submit_deferred_of`, or anyone's `submit_deferred`. When the
/// write-behind's memory bound made every stream's write-out due, it submits them all.
#[test]
fn a_committer_submits_its_own_streams_write_out() {
    let dev = fresh(3);
    let (log, _) = open(&dev, OpenOptions::default());
    let before = dev.stats().submissions;
    log.commit_deferred(tx(0, "a0")).unwrap();
    log.commit_deferred(tx(1, "b0")).unwrap();
    log.commit_deferred(tx(2, "c0")).unwrap();
    log.submit_deferred_of(1).unwrap();
    assert_eq!(dev.stats().submissions, before + 1, "stream 1's write-out alone");
    assert_eq!(log.stats().buffered_bytes, 2 * u64::from(BS), "streams 0 and 2 still buffered");
    log.submit_deferred_of(1).unwrap();
    assert_eq!(dev.stats().submissions, before + 1, "nothing of stream 1 left");
    log.submit_deferred_of(0).unwrap();
    assert_eq!(dev.stats().submissions, before + 2);
    log.submit_deferred().unwrap();
    assert_eq!(dev.stats().submissions, before + 3, "anyone's submit_deferred takes the rest");
    assert_eq!(log.stats().buffered_bytes, 0);
    drop(log);
    let (_, r) = open(&dev, OpenOptions::default());
    assert_eq!(tags(&r, 0), ["a0"]);
    assert_eq!(tags(&r, 1), ["b0"]);
    assert_eq!(tags(&r, 2), ["c0"]);

    // Past the write-behind's memory bound every stream is due, whoever submits.
    let dev = fresh(3);
    let (log, _) = open(&dev, behind(1 << 30, 2 * u64::from(BS)));
    let before = dev.stats().submissions;
    log.commit_deferred(tx(0, "a0")).unwrap();
    log.commit_deferred(tx(2, "c0")).unwrap();
    log.commit_deferred(tx(1, "b0")).unwrap();
    log.submit_deferred_of(1).unwrap();
    assert_eq!(log.stats().buffered_bytes, 0, "the memory bound's write-out is everyone's");
    assert!(dev.stats().submissions > before);
}

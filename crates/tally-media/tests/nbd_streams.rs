//! Streams over connections (issue 18 item 2, RIO's stream-to-queue mapping): the log hands
//! each stream's submissions to the device with the stream's id, and an `NbdDevice` with one
//! connection per stream keeps each stream on its own connection, so one stream's slow
//! requests never hold up another's submission.

mod nbd_common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nbd_common::{have, Nbdkit, Scratch};
use tally_log::{CommitMode, Log, LogConfig, OpenOptions, Transaction};
use tally_media::{
    Device, DeviceStats, Geometry, IoBuf, MemDevice, NbdDevice, NbdOptions, Result, Ticket, Write,
    WriteFlags,
};

/// A memory device that records the stream hint of every submission (`None`: plain submit).
struct Recording {
    inner: MemDevice,
    hints: Mutex<Vec<Option<u16>>>,
}

impl Recording {
    fn take(&self) -> Vec<Option<u16>> {
        std::mem::take(&mut *self.hints.lock().unwrap())
    }
}

impl Device for Recording {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn read(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        self.inner.read(block, buf)
    }
    fn submit(&self, writes: Vec<Write>, flags: WriteFlags) -> Result<Ticket> {
        self.hints.lock().unwrap().push(None);
        self.inner.submit(writes, flags)
    }
    fn submit_stream(&self, stream: u16, writes: Vec<Write>, flags: WriteFlags) -> Result<Ticket> {
        self.hints.lock().unwrap().push(Some(stream));
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
fn the_log_submits_each_streams_writes_with_its_stream_id() {
    let rec = Arc::new(Recording {
        inner: MemDevice::new(4096, 4096).unwrap(),
        hints: Mutex::new(Vec::new()),
    });
    let config = LogConfig { streams: 3, segment_blocks: 64, uuid: [3; 16] };
    Log::format(&*rec, &config).unwrap();
    let (log, _) = Log::open(rec.clone(), OpenOptions::default()).unwrap();
    rec.take();
    for mode in [CommitMode::Ordered, CommitMode::Orderless, CommitMode::Count, CommitMode::Classic]
    {
        for stream in [2u16, 0, 1] {
            for i in 0..5u8 {
                let mut tx = Transaction::new(stream);
                tx.record(vec![i; 40]);
                tx.data(vec![i; 4096]);
                log.commit_with(tx, mode).unwrap();
            }
            log.sync().unwrap();
            let hints = rec.take();
            let hinted: Vec<u16> = hints.iter().flatten().copied().collect();
            assert!(!hinted.is_empty(), "{mode:?}: stream {stream}'s commits carried no hint");
            // Plain submissions (superblock writes) carry no stream and are not checked.
            assert!(
                hinted.iter().all(|&h| h == stream),
                "{mode:?}: stream {stream}'s commits were submitted as {hints:?}"
            );
        }
    }
}

/// Submit one 4 KiB write for `stream` and return how long `submit_stream` itself took.
fn timed_submit(dev: &NbdDevice, stream: u16, block: u64) -> (Ticket, Duration) {
    let start = Instant::now();
    let write = vec![Write::new(block, IoBuf::zeroed(4096))];
    let ticket = dev.submit_stream(stream, write, WriteFlags::NONE).unwrap();
    (ticket, start.elapsed())
}

/// Stream 0 fills its connection's queue with writes the server holds for `delay`; how long
/// does stream 1's submission then wait, and on which connections did requests go?
fn second_stream_wait(connection_count: u32, delay: Duration) -> (Duration, Vec<u64>) {
    let dir = Scratch::new("nbd-streams");
    let delay_param = format!("delay-write={}ms", delay.as_millis());
    let server =
        Nbdkit::start(&dir.path("s.sock"), &["delay"], &["memory", "16M", delay_param.as_str()]);
    let options = NbdOptions {
        connection_count,
        queue_depth: 2,
        timeout: Duration::from_secs(10),
        ..NbdOptions::default()
    };
    let dev = NbdDevice::open_uri(&server.uri, options).unwrap();
    assert_eq!(dev.connection_count(), connection_count as usize, "memory allows multi-conn");
    let (a, _) = timed_submit(&dev, 0, 0);
    let (b, _) = timed_submit(&dev, 0, 1);
    let (c, waited) = timed_submit(&dev, 1, 2);
    for t in [a, b, c] {
        dev.wait(t).unwrap();
    }
    (waited, dev.requests_per_connection())
}

#[test]
fn one_streams_slow_requests_do_not_hold_another_streams_submission() {
    if !have("nbdkit") {
        return;
    }
    let delay = Duration::from_millis(400);
    // Per-stream connections: stream 1's write goes out at once on its own connection.
    let (waited, per_conn) = second_stream_wait(2, delay);
    assert_eq!(per_conn, vec![2, 1], "each stream on its own connection");
    assert!(waited < delay / 2, "stream 1 waited {waited:?} behind stream 0 on its own connection");
    // The broken variant the mapping exists to avoid: one connection shared by both streams,
    // whose queue stream 0 has filled. Stream 1 waits for stream 0's slow writes.
    let (waited, per_conn) = second_stream_wait(1, delay);
    assert_eq!(per_conn, vec![3]);
    assert!(waited >= delay / 2, "one shared queue, yet stream 1 waited only {waited:?}");
}

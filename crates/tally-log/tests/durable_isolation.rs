//! A durable wait on one stream does not queue behind another stream's flush round (issue 16,
//! fsync isolation): rounds on disjoint streams run at once. Here stream 0's write is held at
//! the device, so a round making stream 0 durable cannot finish; a durable wait on stream 1,
//! whose transaction depends on nothing of stream 0, must still return. A durable wait whose
//! transaction depends on stream 0 must not: it waits for that round (its dependency closure
//! meets a stream the round has claimed).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use tally_log::{Log, LogConfig, OpenOptions, Transaction};
use tally_media::{Device, DeviceStats, Geometry, MemDevice, Ticket, Write, WriteFlags};

/// A memory device whose writes submitted while `holding` is set do not complete until
/// [`Gate::release`].
struct Gate {
    inner: MemDevice,
    holding: AtomicBool,
    held: Mutex<(HashSet<u64>, bool)>,
    released: Condvar,
    /// Set once a wait on a held write has begun.
    waiting_on_held: AtomicBool,
}

impl Gate {
    fn release(&self) {
        self.held.lock().unwrap().1 = true;
        self.released.notify_all();
    }
}

impl Device for Gate {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn read(&self, block: u64, buf: &mut [u8]) -> tally_media::Result<()> {
        self.inner.read(block, buf)
    }
    fn submit(&self, writes: Vec<Write>, flags: WriteFlags) -> tally_media::Result<Ticket> {
        let ticket = self.inner.submit(writes, flags)?;
        if self.holding.load(Ordering::SeqCst) {
            self.held.lock().unwrap().0.insert(ticket.0);
        }
        Ok(ticket)
    }
    fn wait(&self, ticket: Ticket) -> tally_media::Result<()> {
        let mut held = self.held.lock().unwrap();
        if held.0.contains(&ticket.0) {
            self.waiting_on_held.store(true, Ordering::SeqCst);
            while !held.1 {
                held = self.released.wait(held).unwrap();
            }
        }
        drop(held);
        self.inner.wait(ticket)
    }
    fn flush(&self) -> tally_media::Result<()> {
        self.inner.flush()
    }
    fn stats(&self) -> DeviceStats {
        self.inner.stats()
    }
}

fn tx(stream: u16, tag: &[u8]) -> Transaction {
    let mut t = Transaction::new(stream);
    t.record(tag.to_vec());
    t
}

/// Run `f` on a thread; its result if it returns within `limit`, `None` if not.
fn within<T: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> (Option<T>, std::thread::JoinHandle<()>) {
    let (send, recv) = mpsc::channel();
    let handle = std::thread::spawn(move || {
        let _ = send.send(f());
    });
    (recv.recv_timeout(limit).ok(), handle)
}

#[test]
fn a_durable_wait_does_not_queue_behind_another_streams_round() {
    let dev = Arc::new(Gate {
        inner: MemDevice::new(512, 2048).unwrap(),
        holding: AtomicBool::new(false),
        held: Mutex::new((HashSet::new(), false)),
        released: Condvar::new(),
        waiting_on_held: AtomicBool::new(false),
    });
    Log::format(&*dev, &LogConfig { streams: 2, segment_blocks: 64, uuid: [5; 16] }).unwrap();
    let d: Arc<dyn Device> = dev.clone();
    let (log, _) = Log::open(d, OpenOptions::default()).unwrap();
    let log = Arc::new(log);

    // Stream 0's transaction is written while the gate holds: its round cannot finish.
    dev.holding.store(true, Ordering::SeqCst);
    let stuck = log.commit(tx(0, b"large file")).unwrap();
    dev.holding.store(false, Ordering::SeqCst);
    let l = log.clone();
    let round0 = std::thread::spawn(move || l.wait_durable(stuck.ticket));
    while !dev.waiting_on_held.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(1));
    }

    // Stream 1, independent: its own round, at once.
    let small = log.commit(tx(1, b"small file")).unwrap();
    let l = log.clone();
    let (done, h) = within(Duration::from_secs(10), move || l.wait_durable(small.ticket));
    assert!(
        matches!(done, Some(Ok(()))),
        "a durable wait on stream 1 queued behind stream 0's round: {done:?}"
    );
    h.join().unwrap();
    assert!(log.durable_seq(1) >= small.ticket.seq);
    assert!(log.durable_seq(0) < stuck.ticket.seq, "stream 0 durable with its write held");

    // Stream 1 again, now depending on stream 0's held transaction: it must wait for it.
    let mut t = tx(1, b"depends on the large file");
    t.depend_on(stuck.ticket);
    let dependent = log.commit(t).unwrap();
    let l = log.clone();
    let (early, h) = within(Duration::from_millis(300), move || l.wait_durable(dependent.ticket));
    assert!(early.is_none(), "a wait whose dependency is held returned: {early:?}");

    dev.release();
    h.join().unwrap();
    round0.join().unwrap().unwrap();
    assert!(log.durable_seq(0) >= stuck.ticket.seq);
    assert!(log.durable_seq(1) >= dependent.ticket.seq);
}

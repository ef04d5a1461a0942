//! The thread-pool write engine: the fallback where io_uring is unavailable.
//!
//! Invariants:
//! - a bounded channel (`queue_depth` jobs) feeds `thread_count` workers, so a submitter blocks
//!   rather than queue without limit;
//! - each job is one contiguous write issued as one `pwritev2` (more only on a short write), and
//!   its buffer is owned by the job until the call returned;
//! - every job sent is completed on the tracker exactly once, also when it fails;
//! - shutdown drops the only sender; workers drain the queue and exit; it then joins them, so
//!   no write is in flight once `shutdown` returns.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use super::sys::pwrite_all;
use super::tracker::{Failure, Tracker};
use crate::{Counters, IoBuf, MediaError, Result, Ticket};

struct Job {
    ticket: Ticket,
    offset: u64,
    data: IoBuf,
    fua: bool,
}

/// A small pool of threads doing `pwritev2`.
pub(crate) struct ThreadPool {
    sender: Option<SyncSender<Job>>,
    workers: Vec<JoinHandle<()>>,
    tracker: Arc<Tracker>,
}

impl ThreadPool {
    /// Start `thread_count` workers writing to `file`.
    pub(crate) fn start(
        file: Arc<File>,
        tracker: Arc<Tracker>,
        counters: Arc<Counters>,
        thread_count: usize,
        queue_depth: usize,
    ) -> Result<Self> {
        assert!(thread_count > 0 && queue_depth > 0, "pool needs threads and queue room");
        let (sender, receiver) = mpsc::sync_channel::<Job>(queue_depth);
        let receiver = Arc::new(Mutex::new(receiver));
        let mut pool = ThreadPool { sender: Some(sender), workers: Vec::new(), tracker };
        for index in 0..thread_count {
            let (file, tracker, counters) =
                (Arc::clone(&file), Arc::clone(&pool.tracker), Arc::clone(&counters));
            let receiver = Arc::clone(&receiver);
            let spawned = std::thread::Builder::new()
                .name(format!("tally-pwrite-{index}"))
                .spawn(move || worker(&file, &receiver, &tracker, &counters));
            match spawned {
                Ok(handle) => pool.workers.push(handle),
                // Dropping `pool` shuts down the workers already started.
                Err(source) => return Err(MediaError::Io { op: "spawn writer thread", source }),
            }
        }
        Ok(pool)
    }

    /// Queue the writes of `ticket`; blocks while the queue is full.
    pub(crate) fn submit(&self, ticket: Ticket, writes: Vec<(u64, IoBuf)>, fua: bool) {
        let count = writes.len();
        for (index, (offset, data)) in writes.into_iter().enumerate() {
            let job = Job { ticket, offset, data, fua };
            let sent = match &self.sender {
                Some(sender) => sender.send(job).is_ok(),
                None => false,
            };
            if !sent {
                // Only reachable if every worker died (a panic): fail the unsent writes so no
                // waiter hangs.
                let failure = Failure::other(
                    "queue write",
                    std::io::ErrorKind::BrokenPipe,
                    "writer threads are gone".to_string(),
                );
                for _ in index..count {
                    self.tracker.complete(ticket, Err(failure.clone()));
                }
                return;
            }
        }
    }

    /// Let the workers finish every queued write, then join them. Idempotent.
    pub(crate) fn shutdown(&mut self) {
        self.sender = None;
        for handle in self.workers.drain(..) {
            if handle.join().is_err() {
                tracing::error!("a writer thread panicked");
            }
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn worker(file: &File, receiver: &Mutex<Receiver<Job>>, tracker: &Tracker, counters: &Counters) {
    loop {
        // Holding the lock while blocked in recv is the point: idle workers queue on the lock.
        let job = receiver.lock().unwrap_or_else(PoisonError::into_inner).recv();
        let Ok(job) = job else { return };
        let outcome = pwrite_all(file.as_raw_fd(), &job.data, job.offset, job.fua, counters);
        tracker.complete(job.ticket, outcome);
    }
}

//! The io_uring write engine.
//!
//! Design: one ring per device. Submitters push SQEs under `sq_lock` (so at most one
//! `SubmissionQueue` exists at a time) and make one `io_uring_enter` per submission. A dedicated
//! reaper thread is the only one that ever creates a `CompletionQueue`; it blocks in
//! `io_uring_enter(GETEVENTS)` and completes tickets on the tracker.
//!
//! Invariants:
//! - every SQE's `user_data` is a key of `ops.table`, whose `Op` owns the buffer the SQE points
//!   into; the reaper removes the `Op` only after reading the SQE's CQE, so no buffer is freed
//!   or moved while the kernel may still read it (an `IoBuf`'s heap block never moves);
//! - `ops.table.len() <= in_flight_max <= cq capacity`, so the completion queue cannot overflow;
//! - lock order: `sq_lock` before `ops`; the reaper takes `ops` only;
//! - shutdown waits for `ops.table` to empty, then posts a NOP with `SHUTDOWN_USER_DATA`; the
//!   reaper exits on reading it.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use io_uring::{opcode, register::Probe, types, IoUring};

use super::sys::{pwrite_all, RW_COUNT_MAX};
use super::tracker::{Failure, Tracker};
use crate::{Counters, IoBuf, Result, Ticket};

/// `user_data` of the NOP that tells the reaper to exit; op ids count up from 0 and never reach it.
const SHUTDOWN_USER_DATA: u64 = u64::MAX;
/// `IORING_ENTER_GETEVENTS`: wait for completions.
const ENTER_GETEVENTS: u32 = 1;
/// Attempts at `io_uring_enter` while the kernel answers EAGAIN/EBUSY before giving up.
const ENTER_BUSY_RETRY_MAX: u32 = 10_000;

struct Op {
    ticket: Ticket,
    offset: u64,
    data: IoBuf,
    fua: bool,
}

struct Ops {
    op_next: u64,
    table: HashMap<u64, Op>,
}

struct Shared {
    ring: IoUring,
    sq_lock: Mutex<()>,
    ops: Mutex<Ops>,
    /// Signalled whenever an op leaves `ops.table`.
    space: Condvar,
    in_flight_max: usize,
    file: Arc<File>,
    tracker: Arc<Tracker>,
    counters: Arc<Counters>,
}

/// An io_uring with its reaper thread.
pub(crate) struct Uring {
    shared: Arc<Shared>,
    reaper: Option<JoinHandle<()>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves its data consistent between statements that can panic.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Uring {
    /// Set up a ring of `entries` SQEs for writing to `file`, or say why io_uring is unusable.
    pub(crate) fn start(
        file: Arc<File>,
        tracker: Arc<Tracker>,
        counters: Arc<Counters>,
        entries: u32,
    ) -> io::Result<Self> {
        let ring = IoUring::new(entries)?;
        let mut probe = Probe::new();
        ring.submitter().register_probe(&mut probe)?;
        if !probe.is_supported(opcode::Write::CODE) || !probe.is_supported(opcode::Nop::CODE) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "kernel's io_uring lacks IORING_OP_WRITE",
            ));
        }
        let sq_capacity = ring.params().sq_entries() as usize;
        let cq_capacity = ring.params().cq_entries() as usize;
        let shared = Arc::new(Shared {
            in_flight_max: sq_capacity.min(cq_capacity).max(1),
            ring,
            sq_lock: Mutex::new(()),
            ops: Mutex::new(Ops { op_next: 0, table: HashMap::new() }),
            space: Condvar::new(),
            file,
            tracker,
            counters,
        });
        let reaper_shared = Arc::clone(&shared);
        let reaper = std::thread::Builder::new()
            .name("tally-uring-reaper".to_string())
            .spawn(move || reaper_shared.reap())?;
        Ok(Uring { shared, reaper: Some(reaper) })
    }

    /// Queue the writes of `ticket` and submit them with one `io_uring_enter` (more only when
    /// the submission is larger than the ring or the in-flight bound).
    pub(crate) fn submit(
        &self,
        ticket: Ticket,
        writes: Vec<(u64, IoBuf)>,
        fua: bool,
    ) -> Result<()> {
        let shared = &*self.shared;
        let _sq_guard = lock(&shared.sq_lock);
        let count = writes.len();
        let mut unsubmitted = 0usize;
        for (index, (offset, data)) in writes.into_iter().enumerate() {
            if let Err(failure) = shared.push(ticket, offset, data, fua, &mut unsubmitted) {
                // The writes not yet pushed will never run: complete them, failed, so that
                // waiters do not hang. Those already pushed complete through the reaper.
                for _ in index..count {
                    shared.tracker.complete(ticket, Err(failure.clone()));
                }
                return Err(failure.to_error());
            }
        }
        if unsubmitted > 0 {
            shared.enter_submit().map_err(|failure| failure.to_error())?;
        }
        Ok(())
    }

    /// Wait for every write in flight, then stop the reaper. Idempotent.
    pub(crate) fn shutdown(&mut self) {
        let Some(reaper) = self.reaper.take() else {
            return;
        };
        let shared = &*self.shared;
        {
            let _sq_guard = lock(&shared.sq_lock);
            // Entries left in the SQ by a failed enter still own buffers: give them to the kernel.
            if let Err(failure) = shared.enter_submit() {
                tracing::warn!(%failure, "could not submit leftover entries at shutdown");
            }
        }
        let mut ops = lock(&shared.ops);
        while !ops.table.is_empty() {
            if reaper.is_finished() {
                tracing::error!(left = ops.table.len(), "reaper exited with writes in flight");
                return;
            }
            ops = shared
                .space
                .wait_timeout(ops, Duration::from_millis(100))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        drop(ops);
        let nop = opcode::Nop::new().build().user_data(SHUTDOWN_USER_DATA);
        let posted = {
            let _sq_guard = lock(&shared.sq_lock);
            // SAFETY: `sq_lock` is held, so no other SubmissionQueue exists; a NOP points at
            // no memory.
            let pushed = unsafe { shared.ring.submission_shared().push(&nop) };
            pushed.is_ok() && shared.enter_submit().is_ok()
        };
        if posted {
            if reaper.join().is_err() {
                tracing::error!("the io_uring reaper thread panicked");
            }
        } else {
            // Cannot wake the reaper: leave it blocked (it holds its own Arc of the ring) rather
            // than hang the dropping thread.
            tracing::error!("could not post the shutdown NOP; leaving the reaper thread behind");
        }
    }
}

impl Drop for Uring {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Shared {
    /// Register one write in the op table and push its SQE; submits first when the ring or the
    /// in-flight bound is full. Caller holds `sq_lock`.
    fn push(
        &self,
        ticket: Ticket,
        offset: u64,
        data: IoBuf,
        fua: bool,
        unsubmitted: &mut usize,
    ) -> std::result::Result<(), Failure> {
        let mut ops = lock(&self.ops);
        while ops.table.len() >= self.in_flight_max {
            if *unsubmitted > 0 {
                // Our own pushed entries count as in flight: hand them to the kernel before
                // waiting for room, or nothing would ever complete.
                drop(ops);
                self.enter_submit()?;
                *unsubmitted = 0;
                ops = lock(&self.ops);
                continue;
            }
            ops = self.space.wait(ops).unwrap_or_else(PoisonError::into_inner);
        }
        let id = ops.op_next;
        ops.op_next += 1;
        debug_assert!(id != SHUTDOWN_USER_DATA);
        let len = u32::try_from(data.len().min(RW_COUNT_MAX)).unwrap_or(u32::MAX);
        let op = ops.table.entry(id).or_insert(Op { ticket, offset, data, fua });
        let entry = opcode::Write::new(types::Fd(self.file.as_raw_fd()), op.data.as_ptr(), len)
            .offset(offset)
            .rw_flags(if fua { libc::RWF_DSYNC } else { 0 })
            .build()
            .user_data(id);
        drop(ops);
        loop {
            // SAFETY: the caller holds `sq_lock`, so this is the only SubmissionQueue. The entry
            // points at `len` bytes of the IoBuf now owned by `ops.table[id]`, which stays there
            // (its heap block unmoved) until the reaper has read this entry's CQE.
            let pushed = unsafe { self.ring.submission_shared().push(&entry) };
            if pushed.is_ok() {
                *unsubmitted += 1;
                return Ok(());
            }
            // SQ full: hand what is queued to the kernel and retry.
            if let Err(failure) = self.enter_submit() {
                lock(&self.ops).table.remove(&id);
                self.space.notify_all();
                return Err(failure);
            }
            *unsubmitted = 0;
        }
    }

    /// `io_uring_enter` until the SQ is empty; each call counted. Caller holds `sq_lock`.
    /// A hard error fails the device (entries left in the SQ go in at the next enter).
    fn enter_submit(&self) -> std::result::Result<(), Failure> {
        let mut busy_count = 0u32;
        loop {
            // SAFETY: caller holds `sq_lock`, so no other SubmissionQueue exists.
            let queued = unsafe { self.ring.submission_shared().len() };
            if queued == 0 {
                return Ok(());
            }
            self.counters.syscalls(1);
            let error = match self.ring.submit() {
                Ok(consumed) if consumed > 0 => continue,
                // Nothing taken: treat like EAGAIN, so this loop cannot spin without bound.
                Ok(_) => io::Error::from_raw_os_error(libc::EAGAIN),
                Err(error) => error,
            };
            match error.raw_os_error() {
                Some(libc::EINTR) => {}
                Some(libc::EAGAIN | libc::EBUSY) if busy_count < ENTER_BUSY_RETRY_MAX => {
                    // The kernel is short of resources or completions must be reaped first.
                    busy_count += 1;
                    std::thread::sleep(Duration::from_micros(100));
                }
                _ => {
                    let failure = Failure::from_io("io_uring_enter", &error);
                    self.tracker.fail_stop(&failure);
                    return Err(failure);
                }
            }
        }
    }

    /// The reaper thread: wait for completions and finish their ops until told to stop.
    fn reap(&self) {
        let mut done: Vec<(u64, i32)> = Vec::with_capacity(self.in_flight_max + 1);
        loop {
            // SAFETY: to_submit 0 with GETEVENTS only waits; no argument pointer is passed.
            let entered = unsafe {
                self.ring.submitter().enter::<libc::sigset_t>(0, 1, ENTER_GETEVENTS, None)
            };
            if let Err(error) = entered {
                if error.raw_os_error() != Some(libc::EINTR) {
                    tracing::error!(%error, "io_uring_enter(GETEVENTS) failed; retrying");
                    std::thread::sleep(Duration::from_millis(1));
                }
                continue;
            }
            done.clear();
            {
                // SAFETY: this thread is the only one that ever creates a CompletionQueue.
                let cq = unsafe { self.ring.completion_shared() };
                done.extend(cq.map(|cqe| (cqe.user_data(), cqe.result())));
            }
            let mut stop = false;
            for &(id, result) in &done {
                if id == SHUTDOWN_USER_DATA {
                    stop = true;
                } else {
                    self.finish(id, result);
                }
            }
            if stop {
                return;
            }
        }
    }

    /// Complete op `id` whose write returned `result`; finish a short write synchronously.
    fn finish(&self, id: u64, result: i32) {
        let op = lock(&self.ops).table.remove(&id);
        self.space.notify_all();
        let Some(op) = op else {
            tracing::error!(id, "completion for an unknown io_uring op");
            return;
        };
        let outcome = match usize::try_from(result) {
            Err(_) => Err(Failure::from_errno("io_uring write", -result)),
            Ok(written) if written >= op.data.len() => Ok(()),
            // Short write (or a write above RW_COUNT_MAX): finish the rest with pwritev2.
            Ok(written) => pwrite_all(
                self.file.as_raw_fd(),
                &op.data[written..],
                op.offset + written as u64,
                op.fua,
                &self.counters,
            ),
        };
        self.tracker.complete(op.ticket, outcome);
    }
}

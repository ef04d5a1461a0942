//! The io_uring write engine.
//!
//! Design: one ring per device. A submitter first takes room for its writes in the op table
//! (waiting there, with no lock held, when there is none), then pushes their SQEs under
//! `sq_lock` (so at most one `SubmissionQueue` exists at a time) and makes one
//! `io_uring_enter` per submission. A dedicated reaper thread is the only one that ever creates
//! a `CompletionQueue`; it blocks in `io_uring_enter(GETEVENTS)` and completes tickets on the
//! tracker.
//!
//! Room is shared between the log's streams ([`Shared::admits`]): a stream holding a quarter
//! of the writes in flight or more (a heavy one, such as a program streaming large writes)
//! may fill the table to three quarters only, so a light stream's write-out — a small write's,
//! an fsync's — always finds room and never waits for a heavy stream's writes to complete. Before
//! this, a 4 KiB write's write-out beside a program streaming 1 MiB writes waited up to 42 ms
//! for room (docs/bench/fs.md, 28 Nov), and held `sq_lock` while it waited, so every other
//! submitter waited too.
//!
//! Invariants:
//! - every SQE's `user_data` is a key of `ops.table`, whose `Op` owns the buffer the SQE points
//!   into; the reaper removes the `Op` only after reading the SQE's CQE, so no buffer is freed
//!   or moved while the kernel may still read it (an `IoBuf`'s heap block never moves);
//! - `ops.table.len() <= in_flight_max <= cq capacity`, so the completion queue cannot overflow;
//! - lock order: `sq_lock` before `ops` before the tracker's lock; the reaper takes `ops` only;
//!   nobody waits for room while holding `sq_lock`, and an op is in the table before its SQE is
//!   pushed;
//! - `ops.held` counts each stream's ops in the table;
//! - shutdown waits for `ops.table` to empty, then posts a NOP with `SHUTDOWN_USER_DATA`; the
//!   reaper exits on reading it;
//! - every wait is bounded: shutdown gives up on writes that make no progress for
//!   `shutdown_stall_max` (an SQE a failed `io_uring_enter` left behind may never reach the
//!   kernel), and the reaper gives up after `reap_error_max` failed waits for completions in a
//!   row. Giving up *abandons* the writes left ([`Shared::abandon`]): the device fails (fail-stop),
//!   their tickets complete failed so no waiter hangs, and their buffers are leaked, never
//!   freed, since the kernel may still read them.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
/// How long shutdown waits while no write in flight completes before abandoning them. A write
/// the kernel accepted completes or fails well within this on a working device.
const SHUTDOWN_STALL_MAX: Duration = Duration::from_secs(10);
/// Failed waits for completions in a row (1 ms apart) before the reaper abandons the device.
const REAP_ERROR_MAX: u32 = 1000;
/// The stream of writes submitted without one (superblocks, checkpoints, tests): a stream of
/// its own for the sharing of room.
pub(crate) const NO_STREAM: u16 = u16::MAX;

/// The bounds on waiting (constants, shortened by tests).
#[derive(Debug, Clone, Copy)]
struct Limits {
    shutdown_stall_max: Duration,
    reap_error_max: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { shutdown_stall_max: SHUTDOWN_STALL_MAX, reap_error_max: REAP_ERROR_MAX }
    }
}

/// Injected failures of `io_uring_enter`, for the tests of the bounds.
#[cfg(test)]
#[derive(Default)]
struct Faults {
    /// Submitting fails with EIO (the SQEs stay queued).
    enter_fails: std::sync::atomic::AtomicBool,
    /// Waiting for completions fails with EIO.
    getevents_fails: std::sync::atomic::AtomicBool,
    /// The reaper leaves completions unread (their ops stay in the table) while set.
    reap_paused: std::sync::atomic::AtomicBool,
}

struct Op {
    ticket: Ticket,
    stream: u16,
    offset: u64,
    data: IoBuf,
    fua: bool,
}

struct Ops {
    op_next: u64,
    table: HashMap<u64, Op>,
    /// Ops in the table per stream (streams with none are removed).
    held: HashMap<u16, usize>,
    /// Set when the writes in flight were abandoned: no write is accepted after it.
    abandoned: Option<Failure>,
}

impl Ops {
    fn held(&self, stream: u16) -> usize {
        self.held.get(&stream).copied().unwrap_or(0)
    }

    /// Take op `id` out of the table.
    fn remove(&mut self, id: u64) -> Option<Op> {
        let op = self.table.remove(&id)?;
        if let std::collections::hash_map::Entry::Occupied(mut held) = self.held.entry(op.stream) {
            *held.get_mut() = held.get().saturating_sub(1);
            if *held.get() == 0 {
                held.remove();
            }
        }
        Some(op)
    }
}

struct Shared {
    ring: IoUring,
    sq_lock: Mutex<()>,
    ops: Mutex<Ops>,
    /// Signalled whenever an op leaves `ops.table`.
    space: Condvar,
    in_flight_max: usize,
    /// A stream holding this many ops in flight or more is heavy ([`Shared::admits`]).
    heavy_from: usize,
    /// Heavy streams add ops only while the table holds fewer than this.
    heavy_room: usize,
    file: Arc<File>,
    tracker: Arc<Tracker>,
    counters: Arc<Counters>,
    limits: Limits,
    #[cfg(test)]
    faults: Faults,
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
        Self::start_with(file, tracker, counters, entries, Limits::default())
    }

    fn start_with(
        file: Arc<File>,
        tracker: Arc<Tracker>,
        counters: Arc<Counters>,
        entries: u32,
        limits: Limits,
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
        let in_flight_max = sq_capacity.min(cq_capacity).max(1);
        let shared = Arc::new(Shared {
            in_flight_max,
            heavy_from: (in_flight_max / 4).max(1),
            heavy_room: (in_flight_max - in_flight_max / 4).max(1),
            ring,
            sq_lock: Mutex::new(()),
            ops: Mutex::new(Ops {
                op_next: 0,
                table: HashMap::new(),
                held: HashMap::new(),
                abandoned: None,
            }),
            space: Condvar::new(),
            file,
            tracker,
            counters,
            limits,
            #[cfg(test)]
            faults: Faults::default(),
        });
        let reaper_shared = Arc::clone(&shared);
        let reaper = std::thread::Builder::new()
            .name("tally-uring-reaper".to_string())
            .spawn(move || reaper_shared.reap())?;
        Ok(Uring { shared, reaper: Some(reaper) })
    }

    /// Queue the writes of `ticket`, made for log stream `stream` ([`NO_STREAM`] for none),
    /// and submit them with one `io_uring_enter` (more only when they do not all fit in the
    /// room the stream may take: then as much as fits, the rest once room is made).
    pub(crate) fn submit(
        &self,
        ticket: Ticket,
        stream: u16,
        writes: Vec<(u64, IoBuf)>,
        fua: bool,
    ) -> Result<()> {
        let shared = &*self.shared;
        let mut writes = writes.into_iter();
        while writes.len() > 0 {
            let admitted = match shared.admit(ticket, stream, &mut writes, fua) {
                Ok(admitted) => admitted,
                Err(failure) => {
                    // The writes not yet admitted will never run: complete them, failed, so
                    // that waiters do not hang. Those already pushed complete through the
                    // reaper.
                    for _ in 0..writes.len() {
                        shared.tracker.complete(ticket, Err(failure.clone()));
                    }
                    return Err(failure.to_error());
                }
            };
            let _sq_guard = lock(&shared.sq_lock);
            let mut admitted = admitted.into_iter();
            while let Some((id, entry)) = admitted.next() {
                if let Err(failure) = shared.push(&entry) {
                    // This one and those admitted after it never reach the kernel.
                    let mut ops = lock(&shared.ops);
                    for id in std::iter::once(id).chain(admitted.map(|(id, _)| id)) {
                        if ops.remove(id).is_some() {
                            shared.tracker.complete(ticket, Err(failure.clone()));
                        }
                    }
                    for _ in 0..writes.len() {
                        shared.tracker.complete(ticket, Err(failure.clone()));
                    }
                    drop(ops);
                    shared.space.notify_all();
                    return Err(failure.to_error());
                }
            }
            if let Err(failure) = shared.enter_submit() {
                // What was pushed goes in at the next enter, or is abandoned at shutdown.
                for _ in 0..writes.len() {
                    shared.tracker.complete(ticket, Err(failure.clone()));
                }
                return Err(failure.to_error());
            }
        }
        Ok(())
    }

    /// Wait for every write in flight, then stop the reaper. Idempotent. Bounded: writes that
    /// make no progress for `shutdown_stall_max`, or outlive the reaper, are abandoned.
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
        let mut left = ops.table.len();
        let mut progress_at = Instant::now();
        while !ops.table.is_empty() {
            if ops.table.len() < left {
                left = ops.table.len();
                progress_at = Instant::now();
            }
            let stalled = progress_at.elapsed() >= shared.limits.shutdown_stall_max;
            if stalled || reaper.is_finished() {
                let why = if stalled {
                    format!("no write completed in {:?}", shared.limits.shutdown_stall_max)
                } else {
                    "the reaper thread exited".to_owned()
                };
                tracing::error!(left, "io_uring shutdown: {why}; abandoning the writes in flight");
                let failure = Failure::other("io_uring shutdown", io::ErrorKind::TimedOut, why);
                shared.abandon(&mut ops, &failure);
                break;
            }
            ops = shared
                .space
                .wait_timeout(ops, Duration::from_millis(100))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        drop(ops);
        if reaper.is_finished() {
            if reaper.join().is_err() {
                tracing::error!("the io_uring reaper thread panicked");
            }
            return;
        }
        let abandoned = lock(&shared.ops).abandoned.is_some();
        let nop = opcode::Nop::new().build().user_data(SHUTDOWN_USER_DATA);
        let posted = {
            let _sq_guard = lock(&shared.sq_lock);
            // SAFETY: `sq_lock` is held, so no other SubmissionQueue exists.
            let queued = unsafe { shared.ring.submission_shared().len() };
            // Entering would hand abandoned writes still queued to the kernel: not after the
            // device failed.
            // SAFETY: as above; a NOP points at no memory.
            (!abandoned || queued == 0)
                && unsafe { shared.ring.submission_shared().push(&nop) }.is_ok()
                && shared.enter_submit().is_ok()
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
    /// Whether a write of `stream` may enter the table now: there is room, and a heavy stream
    /// (one holding `heavy_from` ops or more) leaves the last quarter of it to the others, so
    /// a light stream never waits for a heavy one's writes to complete.
    fn admits(&self, ops: &Ops, stream: u16) -> bool {
        let len = ops.table.len();
        len < self.in_flight_max && (ops.held(stream) < self.heavy_from || len < self.heavy_room)
    }

    /// Take room in the op table for as many of `writes` (those not taken yet) as
    /// `stream` may have now, waiting for room with no other lock held while there is none for
    /// the first; returns each admitted op's id and its SQE, to be pushed under `sq_lock`.
    fn admit(
        &self,
        ticket: Ticket,
        stream: u16,
        writes: &mut std::vec::IntoIter<(u64, IoBuf)>,
        fua: bool,
    ) -> std::result::Result<Vec<(u64, io_uring::squeue::Entry)>, Failure> {
        let mut ops = lock(&self.ops);
        loop {
            if let Some(failure) = &ops.abandoned {
                return Err(failure.clone());
            }
            if self.admits(&ops, stream) {
                break;
            }
            // The ops in the table may be entries a failed enter left queued, which nothing
            // completes: on a failed device, refuse rather than wait for room.
            if let Some(failure) = self.tracker.first_failure() {
                return Err(failure);
            }
            ops = self
                .space
                .wait_timeout(ops, Duration::from_millis(100))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        let mut admitted = Vec::new();
        while self.admits(&ops, stream) {
            let Some((offset, data)) = writes.next() else { break };
            let id = ops.op_next;
            ops.op_next += 1;
            debug_assert!(id != SHUTDOWN_USER_DATA);
            let len = u32::try_from(data.len().min(RW_COUNT_MAX)).unwrap_or(u32::MAX);
            let op = ops.table.entry(id).or_insert(Op { ticket, stream, offset, data, fua });
            let entry = opcode::Write::new(types::Fd(self.file.as_raw_fd()), op.data.as_ptr(), len)
                .offset(offset)
                .rw_flags(if fua { libc::RWF_DSYNC } else { 0 })
                .build()
                .user_data(id);
            *ops.held.entry(stream).or_insert(0) += 1;
            admitted.push((id, entry));
        }
        Ok(admitted)
    }

    /// Push an admitted op's SQE (the op is in the table); submits what is queued first when the SQ
    /// is full. Caller holds `sq_lock`.
    fn push(&self, entry: &io_uring::squeue::Entry) -> std::result::Result<(), Failure> {
        loop {
            // SAFETY: the caller holds `sq_lock`, so this is the only SubmissionQueue. The entry
            // points at the bytes of the IoBuf owned by `ops.table[id]`, which stays there (its
            // heap block unmoved) until the reaper has read this entry's CQE.
            let pushed = unsafe { self.ring.submission_shared().push(entry) };
            if pushed.is_ok() {
                return Ok(());
            }
            // SQ full: hand what is queued to the kernel and retry.
            self.enter_submit()?;
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
            #[cfg(test)]
            if self.faults.enter_fails.load(std::sync::atomic::Ordering::Relaxed) {
                let failure = Failure::from_errno("io_uring_enter", libc::EIO);
                self.tracker.fail_stop(&failure);
                return Err(failure);
            }
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

    /// The reaper thread: wait for completions and finish their ops until told to stop, or
    /// until waiting has failed `reap_error_max` times in a row (then the device fails and the
    /// writes in flight are abandoned).
    fn reap(&self) {
        let mut done: Vec<(u64, i32)> = Vec::with_capacity(self.in_flight_max + 1);
        let mut error_count = 0u32;
        loop {
            // SAFETY: to_submit 0 with GETEVENTS only waits; no argument pointer is passed.
            let entered = unsafe {
                self.ring.submitter().enter::<libc::sigset_t>(0, 1, ENTER_GETEVENTS, None)
            };
            #[cfg(test)]
            let entered = if self.faults.getevents_fails.load(std::sync::atomic::Ordering::Relaxed)
            {
                Err(io::Error::from_raw_os_error(libc::EIO))
            } else {
                entered
            };
            if let Err(error) = entered {
                if error.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                error_count += 1;
                if error_count >= self.limits.reap_error_max {
                    let failure = Failure::from_io("io_uring_enter(GETEVENTS)", &error);
                    tracing::error!(%failure, error_count, "io_uring reaper gives up");
                    self.abandon(&mut lock(&self.ops), &failure);
                    return;
                }
                tracing::warn!(%error, error_count, "io_uring_enter(GETEVENTS) failed; retrying");
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            error_count = 0;
            #[cfg(test)]
            while self.faults.reap_paused.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(1));
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

    /// Give up on every write in `ops.table` (fail-stop): the device fails with `failure`, each
    /// write's ticket completes failed, and its buffer is leaked — the kernel may still read
    /// it, so it must never be freed. No write is accepted afterwards.
    fn abandon(&self, ops: &mut Ops, failure: &Failure) {
        self.tracker.fail_stop(failure);
        ops.abandoned.get_or_insert_with(|| failure.clone());
        ops.held.clear();
        for (_, op) in ops.table.drain() {
            self.tracker.complete(op.ticket, Err(failure.clone()));
            std::mem::forget(op.data);
        }
        self.space.notify_all();
    }

    /// Complete op `id` whose write returned `result`; finish a short write synchronously.
    fn finish(&self, id: u64, result: i32) {
        let op = lock(&self.ops).remove(id);
        self.space.notify_all();
        let Some(op) = op else {
            // Expected only for a write abandoned at a bounded shutdown.
            tracing::warn!(id, "completion for an unknown (abandoned?) io_uring op");
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;
    use std::sync::mpsc;

    /// A ring on a fresh scratch file with short bounds, or `None` where io_uring is unusable
    /// (said so; the engine's users fall back to the thread pool there).
    fn ring(tag: &str, limits: Limits) -> Option<(Uring, Arc<Tracker>, std::path::PathBuf)> {
        let path = std::env::temp_dir().join(format!("tally-uring-{tag}-{}", std::process::id()));
        let file = Arc::new(
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&path)
                .unwrap(),
        );
        file.set_len(1 << 20).unwrap();
        let tracker = Arc::new(Tracker::new());
        match Uring::start_with(file, tracker.clone(), Arc::default(), 8, limits) {
            Ok(uring) => Some((uring, tracker, path)),
            Err(e) => {
                // Under CI the engine must be tested, not skipped.
                assert!(std::env::var_os("CI").is_none_or(|v| v != "true"), "io_uring: {e}");
                eprintln!("skipped: io_uring unusable here: {e}");
                let _ = std::fs::remove_file(&path);
                None
            }
        }
    }

    /// Run `f` on a thread; panic if it has not returned within `within`.
    fn within<T: Send + 'static>(within: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (send, receive) = mpsc::channel();
        std::thread::spawn(move || send.send(f()).unwrap());
        receive.recv_timeout(within).expect("still waiting: the wait is unbounded")
    }

    fn write(tracker: &Tracker, uring: &Uring, offset: u64) -> (Ticket, Result<()>) {
        let ticket = tracker.begin(1).unwrap();
        (ticket, uring.submit(ticket, NO_STREAM, vec![(offset, IoBuf::zeroed(4096))], false))
    }

    /// Writes for `stream` at `offsets`, submitted on a thread: their ticket, and the
    /// submission's outcome once it returns.
    fn submit_on_thread(
        tracker: &Arc<Tracker>,
        uring: &Arc<Uring>,
        stream: u16,
        offsets: Vec<u64>,
    ) -> (Ticket, mpsc::Receiver<Result<()>>) {
        let ticket = tracker.begin(offsets.len()).unwrap();
        let writes = offsets.into_iter().map(|o| (o, IoBuf::zeroed(4096))).collect();
        let (send, receive) = mpsc::channel();
        let uring = Arc::clone(uring);
        std::thread::spawn(move || send.send(uring.submit(ticket, stream, writes, false)));
        (ticket, receive)
    }

    fn held(uring: &Uring) -> (usize, usize, usize) {
        let ops = lock(&uring.shared.ops);
        (ops.table.len(), ops.held(1), ops.held(2))
    }

    /// A stream filling the ring (its completions held back) leaves a quarter of the room to
    /// other streams: a light stream's write goes in at once instead of waiting for the heavy
    /// one's writes to complete. With the whole ring open to every stream (`heavy_room` =
    /// `in_flight_max`) the light write waits and this fails.
    #[test]
    fn a_light_stream_finds_room_beside_a_heavy_one() {
        let limits = Limits::default();
        let Some((uring, tracker, path)) = ring("share", limits) else { return };
        let uring = Arc::new(uring);
        let max = uring.shared.in_flight_max;
        assert_eq!(max, 8, "the ring's size this test assumes");
        uring.shared.faults.reap_paused.store(true, Relaxed);
        // Stream 1 submits a whole ring and more: it takes three quarters and waits.
        let (heavy, heavy_done) =
            submit_on_thread(&tracker, &uring, 1, (0..10).map(|i| i * 4096).collect());
        let deadline = Instant::now() + Duration::from_secs(10);
        while held(&uring).1 < uring.shared.heavy_room {
            assert!(Instant::now() < deadline, "the heavy stream never filled its room");
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(held(&uring), (6, 6, 0), "the heavy stream stops at three quarters");
        assert!(heavy_done.try_recv().is_err(), "and waits for room");
        // Stream 2 finds room for its two writes at once.
        let (light, light_done) = submit_on_thread(&tracker, &uring, 2, vec![64 * 4096, 65 * 4096]);
        let submitted = light_done.recv_timeout(Duration::from_secs(2));
        assert!(
            matches!(submitted, Ok(Ok(()))),
            "a light stream's writes wait for a heavy one's room: {submitted:?}"
        );
        assert_eq!(held(&uring), (8, 6, 2));
        uring.shared.faults.reap_paused.store(false, Relaxed);
        heavy_done.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
        tracker.wait(heavy).unwrap();
        tracker.wait(light).unwrap();
        assert_eq!(held(&uring), (0, 0, 0), "every op left the table and its stream's count");
        drop(uring);
        let _ = std::fs::remove_file(path);
    }

    /// A failed `io_uring_enter` leaves the write queued, never seen by the kernel: shutdown
    /// used to wait for it forever. Now it gives up after the stall bound, the device is
    /// failed, and the write's ticket completes failed instead of hanging its waiter.
    #[test]
    fn shutdown_after_a_failed_enter_is_bounded() {
        let limits = Limits { shutdown_stall_max: Duration::from_millis(300), reap_error_max: 5 };
        let Some((mut uring, tracker, path)) = ring("stall", limits) else { return };
        let (ok, result) = write(&tracker, &uring, 0);
        result.unwrap();
        tracker.wait(ok).unwrap();
        uring.shared.faults.enter_fails.store(true, Relaxed);
        let (stuck, result) = write(&tracker, &uring, 4096);
        assert!(result.is_err(), "the injected enter failure is reported");
        let started = Instant::now();
        let uring = within(Duration::from_secs(10), move || {
            uring.shutdown();
            uring
        });
        assert!(started.elapsed() >= limits.shutdown_stall_max, "gave up before the bound");
        let waited = {
            let tracker = tracker.clone();
            within(Duration::from_secs(5), move || tracker.wait(stuck))
        };
        assert!(waited.is_err(), "the abandoned write's ticket fails");
        assert!(tracker.check_alive().is_err(), "the device is failed (fail-stop)");
        assert!(lock(&uring.shared.ops).abandoned.is_some());
        assert!(lock(&uring.shared.ops).table.is_empty());
        drop(uring);
        let _ = std::fs::remove_file(path);
    }

    /// Waiting for completions that keeps failing: the reaper used to retry every millisecond
    /// forever. Now it gives up after `reap_error_max` failures in a row, fails the device and
    /// exits; later writes are refused and shutdown returns at once.
    #[test]
    fn a_reaper_whose_waits_keep_failing_gives_up() {
        let limits = Limits { shutdown_stall_max: Duration::from_secs(60), reap_error_max: 5 };
        let Some((mut uring, tracker, path)) = ring("reap", limits) else { return };
        uring.shared.faults.getevents_fails.store(true, Relaxed);
        // Wakes the reaper (it was already waiting); its next waits fail.
        let (first, result) = write(&tracker, &uring, 0);
        result.unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while tracker.check_alive().is_ok() {
            assert!(Instant::now() < deadline, "the reaper never gave up");
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = tracker.wait(first);
        assert!(lock(&uring.shared.ops).abandoned.is_some());
        assert!(tracker.begin(1).is_err(), "a failed device takes no more writes");
        let uring = within(Duration::from_secs(5), move || {
            uring.shutdown();
            uring
        });
        assert!(uring.reaper.is_none());
        drop(uring);
        let _ = std::fs::remove_file(path);
    }
}

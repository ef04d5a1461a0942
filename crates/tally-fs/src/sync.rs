//! The locks the file system waits on. Built with `RUSTFLAGS="--cfg shuttle"`, they are
//! `shuttle`'s, so `tests/shuttle.rs` can explore the interleavings of operations and explicit
//! transactions (`scripts/test` runs it). The log below keeps `std`'s: under shuttle one thread
//! runs at a time and a thread switches only at these locks, so the log's own locks are never
//! contended and its condition variables never waited on by two threads at once.

#[cfg(shuttle)]
pub(crate) use shuttle::sync::{Condvar, Mutex, MutexGuard};
#[cfg(not(shuttle))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};

/// The calling thread (shuttle's tasks share OS threads, so under shuttle this is the task).
#[cfg(shuttle)]
pub(crate) fn current_thread() -> shuttle::thread::ThreadId {
    shuttle::thread::current().id()
}
/// The calling thread.
#[cfg(not(shuttle))]
pub(crate) fn current_thread() -> std::thread::ThreadId {
    std::thread::current().id()
}

/// What [`current_thread`] returns.
#[cfg(shuttle)]
pub(crate) type ThreadId = shuttle::thread::ThreadId;
/// What [`current_thread`] returns.
#[cfg(not(shuttle))]
pub(crate) type ThreadId = std::thread::ThreadId;

/// Wait on `cv` for at most `limit` (under shuttle, which has no clock, until notified);
/// `None` when the lock was poisoned meanwhile (the caller fails stop).
#[cfg(not(shuttle))]
pub(crate) fn wait_timeout<'a, T>(
    cv: &Condvar,
    guard: MutexGuard<'a, T>,
    limit: std::time::Duration,
) -> Option<MutexGuard<'a, T>> {
    cv.wait_timeout(guard, limit).ok().map(|(g, _)| g)
}
/// Wait on `cv` (shuttle has no clock: until notified); `None` when the lock was poisoned.
#[cfg(shuttle)]
pub(crate) fn wait_timeout<'a, T>(
    cv: &Condvar,
    guard: MutexGuard<'a, T>,
    _limit: std::time::Duration,
) -> Option<MutexGuard<'a, T>> {
    cv.wait(guard).ok()
}

//! Ticket bookkeeping shared by both write engines of [`super::FileDevice`] and by
//! [`crate::NbdDevice`].
//!
//! Invariants:
//! - tickets are issued in increasing order from 1; `next_ticket - 1` is the highest issued;
//! - a ticket is in `pending` exactly while some of its writes have not completed; when its last
//!   write completes it leaves `pending`, and enters `failed` if any of its writes failed. A
//!   ticket issued, not pending and not failed completed without error, so completed-ok tickets
//!   cost no memory;
//! - `first_failure` is set by the first failed write or flush and never cleared (fail-stop);
//! - every state change is followed by `notify_all` on `changed`.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

use crate::{MediaError, NbdError, Result, Ticket};

/// A failed operation, kept so that every later `wait` on its ticket reports the same error
/// (`io::Error` is not `Clone`, so the error is rebuilt from these parts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    op: &'static str,
    errno: Option<i32>,
    kind: io::ErrorKind,
    message: String,
    /// The typed error of a network device, handed back as [`MediaError::Nbd`].
    nbd: Option<Box<NbdError>>,
}

impl Failure {
    /// A failure from an OS error.
    pub(crate) fn from_io(op: &'static str, error: &io::Error) -> Self {
        Failure {
            op,
            errno: error.raw_os_error(),
            kind: error.kind(),
            message: error.to_string(),
            nbd: None,
        }
    }

    /// A failure of a network block device request or connection.
    pub(crate) fn from_nbd(op: &'static str, error: &NbdError) -> Self {
        Failure {
            op,
            errno: None,
            kind: error.io_kind(),
            message: error.to_string(),
            nbd: Some(Box::new(error.clone())),
        }
    }

    /// A failure from a negative errno (as io_uring reports them).
    pub(crate) fn from_errno(op: &'static str, errno: i32) -> Self {
        Self::from_io(op, &io::Error::from_raw_os_error(errno))
    }

    /// A failure that is not an OS error, e.g. a write that made no progress.
    pub(crate) fn other(op: &'static str, kind: io::ErrorKind, message: String) -> Self {
        Failure { op, errno: None, kind, message, nbd: None }
    }

    /// The error to hand to a caller.
    pub(crate) fn to_error(&self) -> MediaError {
        if let Some(nbd) = &self.nbd {
            return MediaError::Nbd { op: self.op, source: nbd.clone() };
        }
        let source = match self.errno {
            Some(errno) => io::Error::from_raw_os_error(errno),
            None => io::Error::new(self.kind, self.message.clone()),
        };
        MediaError::Io { op: self.op, source }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {}", self.op, self.message)
    }
}

struct Pending {
    remaining: usize,
    error: Option<Failure>,
}

struct State {
    next_ticket: u64,
    pending: HashMap<u64, Pending>,
    failed: HashMap<u64, Failure>,
    first_failure: Option<Failure>,
}

/// Tickets in flight, tickets that failed, and the device's fail-stop state.
pub(crate) struct Tracker {
    state: Mutex<State>,
    changed: Condvar,
}

impl Tracker {
    /// A tracker that has issued no ticket.
    pub(crate) fn new() -> Self {
        Tracker {
            state: Mutex::new(State {
                next_ticket: 1,
                pending: HashMap::new(),
                failed: HashMap::new(),
                first_failure: None,
            }),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is updated in single assignments; a panic elsewhere cannot leave it torn.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn refuse(failure: &Failure) -> MediaError {
        MediaError::Failed { first_error: failure.to_string() }
    }

    /// `Ok` unless the device has failed.
    pub(crate) fn check_alive(&self) -> Result<()> {
        match &self.lock().first_failure {
            Some(failure) => Err(Self::refuse(failure)),
            None => Ok(()),
        }
    }

    /// The device's first failure, if it has failed.
    pub(crate) fn first_failure(&self) -> Option<Failure> {
        self.lock().first_failure.clone()
    }

    /// Issue a ticket for `write_count` writes, unless the device has failed.
    pub(crate) fn begin(&self, write_count: usize) -> Result<Ticket> {
        let mut state = self.lock();
        if let Some(failure) = &state.first_failure {
            return Err(Self::refuse(failure));
        }
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        if write_count > 0 {
            state.pending.insert(ticket, Pending { remaining: write_count, error: None });
        }
        Ok(Ticket(ticket))
    }

    /// Record that the device failed (idempotent: the first failure is kept).
    pub(crate) fn fail_stop(&self, failure: &Failure) {
        let mut state = self.lock();
        if state.first_failure.is_none() {
            tracing::error!(%failure, "device failed; refusing further writes and flushes");
            state.first_failure = Some(failure.clone());
        }
        drop(state);
        self.changed.notify_all();
    }

    /// One write of `ticket` completed with `outcome`.
    pub(crate) fn complete(&self, ticket: Ticket, outcome: std::result::Result<(), Failure>) {
        let mut state = self.lock();
        if let Err(failure) = &outcome {
            if state.first_failure.is_none() {
                tracing::error!(%failure, ticket = ticket.0, "write failed; device is now failed");
                state.first_failure = Some(failure.clone());
            }
        }
        let finished = match state.pending.get_mut(&ticket.0) {
            Some(pending) => {
                debug_assert!(pending.remaining > 0, "a pending ticket has writes left");
                pending.remaining = pending.remaining.saturating_sub(1);
                if let Err(failure) = outcome {
                    pending.error.get_or_insert(failure);
                }
                pending.remaining == 0
            }
            None => {
                // A completion for a ticket that is not pending is a bookkeeping bug; report it
                // rather than panic on the completion thread, which would hang every waiter.
                debug_assert!(false, "completion for ticket {} that is not pending", ticket.0);
                tracing::error!(ticket = ticket.0, "completion for a ticket that is not pending");
                false
            }
        };
        if finished {
            if let Some(Pending { error: Some(failure), .. }) = state.pending.remove(&ticket.0) {
                state.failed.insert(ticket.0, failure);
            }
        }
        drop(state);
        self.changed.notify_all();
    }

    /// Block until every write of `ticket` completed; its first error, if any.
    pub(crate) fn wait(&self, ticket: Ticket) -> Result<()> {
        let mut state = self.lock();
        if ticket.0 == 0 || ticket.0 >= state.next_ticket {
            return Err(MediaError::UnknownTicket(ticket.0));
        }
        while state.pending.contains_key(&ticket.0) {
            state = self.changed.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
        match state.failed.get(&ticket.0) {
            Some(failure) => Err(failure.to_error()),
            None => Ok(()),
        }
    }

    /// Number of tickets with writes still in flight.
    pub(crate) fn pending_count(&self) -> usize {
        self.lock().pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_complete_out_of_order_and_keep_errors() {
        let tracker = Tracker::new();
        let a = tracker.begin(2).unwrap();
        let b = tracker.begin(1).unwrap();
        let empty = tracker.begin(0).unwrap();
        assert!(a < b && b < empty);
        tracker.wait(empty).unwrap();
        tracker.complete(b, Ok(()));
        tracker.wait(b).unwrap();
        assert_eq!(tracker.pending_count(), 1);
        tracker.complete(a, Err(Failure::from_errno("pwritev2", libc::EIO)));
        tracker.complete(a, Ok(()));
        for _ in 0..2 {
            let err = tracker.wait(a).unwrap_err();
            assert!(matches!(err, MediaError::Io { op: "pwritev2", .. }), "{err}");
        }
        tracker.wait(b).unwrap();
        assert!(matches!(tracker.begin(1), Err(MediaError::Failed { .. })));
        assert!(matches!(tracker.check_alive(), Err(MediaError::Failed { .. })));
        assert!(matches!(tracker.wait(Ticket(0)), Err(MediaError::UnknownTicket(0))));
        assert!(matches!(tracker.wait(Ticket(99)), Err(MediaError::UnknownTicket(99))));
    }

    #[test]
    fn first_failure_is_kept() {
        let tracker = Tracker::new();
        tracker.fail_stop(&Failure::from_errno("fdatasync", libc::EIO));
        tracker.fail_stop(&Failure::from_errno("pwritev2", libc::ENOSPC));
        match tracker.check_alive() {
            Err(MediaError::Failed { first_error }) => assert!(first_error.contains("fdatasync")),
            other => panic!("expected Failed, got {other:?}"),
        }
    }
}

//! Answering without sending the caller to another CPU.
//!
//! A program waiting for an answer sleeps; the ring thread's commit of the answer wakes it
//! (`fuse_request_end`, a plain `wake_up`). At that moment the thread still runs on the
//! caller's CPU, so the scheduler looks for an idle CPU to wake the caller on
//! (`select_idle_sibling`) and, when one is idle, moves the caller there. On a virtual
//! machine a wake on an idle virtual CPU is a halt exit and a host wake-up: 105 us for a pipe
//! round trip between two CPUs of the 2-vCPU VM against 9 us on one CPU (docs/bench/mount.md,
//! 28 Nov). An untar woke `tar` on the other CPU in 38 % of its wake-ups (a quarter of its
//! requests).
//!
//! A CPU whose only runnable tasks are `SCHED_IDLE` counts as idle to that search
//! (`sched_idle_cpu`), and a task of a normal policy preempts a `SCHED_IDLE` one as it wakes.
//! So a thread waits for its next request at `SCHED_IDLE`: the system call that commits its
//! answer and waits (one `io_uring_enter`) runs at that policy, the caller is woken on this
//! CPU and runs at once, and when the next request (or an error) ends the wait the thread
//! goes back to its normal policy before it serves. Every request is served at the normal
//! policy, so nothing a thread holds while serving (the file system's locks) waits on a
//! thread the scheduler holds back; only its wake-up for the next request and the start of
//! its commit can wait behind other tasks on its CPU.
//!
//! Where the CPUs are busy anyway there is no idle CPU to lose the caller to, and the
//! hand-off costs: two system calls a request, and a thread woken at `SCHED_IDLE` does not
//! preempt the task running there. varmail (16 threads on 2 CPUs) lost about a fifth of its
//! operations/s that way. So a thread hands off only when no other request is being served by
//! the mount's ring threads as it answers ([`Handoff::before_wait`]): one program issuing one
//! request at a time (tar, git, a build step) gets it, many at once do not. Other programs
//! keeping the CPUs busy are not seen: beside two CPU-bound processes a create+write+close
//! loop was 1.5-1.7x slower with it (median per loop), and `-o cpu_handoff=off` is for such
//! machines.
//!
//! The way back needs the right to raise a thread's priority to its nice value
//! (`RLIMIT_NICE` at least 20 − nice, or `CAP_SYS_NICE`), which an unprivileged daemon may
//! lack: [`available`] tries it on a thread of its own first, and the hand-off is only used
//! where it succeeded.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// One ring thread's hand-off.
pub(crate) struct Handoff {
    /// Configured and allowed ([`available`]), and no policy change has failed since.
    on: bool,
    /// Requests the mount's ring threads are serving now (shared by all of them).
    serving: Arc<AtomicUsize>,
    /// Whether this thread is at `SCHED_IDLE` now.
    idle: bool,
}

impl Handoff {
    /// For one ring thread; `serving` is shared by every ring thread of the mount.
    pub(crate) fn new(on: bool, serving: Arc<AtomicUsize>) -> Handoff {
        Handoff { on, serving, idle: false }
    }

    /// A request came: it is being served until [`Handoff::served`].
    pub(crate) fn serving(&self) {
        self.serving.fetch_add(1, Ordering::Relaxed);
    }

    /// The request's answer is queued.
    pub(crate) fn served(&self) {
        self.serving.fetch_sub(1, Ordering::Relaxed);
    }

    /// Before the thread commits its answer and waits for the next request: `SCHED_IDLE`,
    /// if no other request is being served.
    pub(crate) fn before_wait(&mut self, qid: u16) {
        if !self.on || self.serving.load(Ordering::Relaxed) != 0 {
            return;
        }
        match idle() {
            Ok(()) => self.idle = true,
            Err(e) => {
                tracing::warn!(qid, "ring thread answers without handing over its CPU: {e}");
                self.on = false;
            }
        }
    }

    /// Once the wait ended (a request came, or an error): back to the normal policy, at
    /// which every request is served.
    pub(crate) fn after_wait(&mut self, qid: u16) {
        if !std::mem::take(&mut self.idle) {
            return;
        }
        if let Err(e) = normal() {
            // [`available`] found the way back open; only a changed limit closes it.
            tracing::error!(qid, "ring thread could not leave SCHED_IDLE and serves at it: {e}");
            self.on = false;
        }
    }
}

/// Whether a thread of this process, at the normal policy (`SCHED_OTHER`), may go to
/// `SCHED_IDLE` and back. Tried on a thread started for it, so that a failed way back leaves
/// no serving thread at the idle policy.
pub(crate) fn available() -> bool {
    std::thread::Builder::new()
        .name("tally-handoff-probe".into())
        .spawn(|| {
            // SAFETY: sched_getscheduler(0) reads the calling thread's policy; no memory is
            // passed.
            if unsafe { libc::sched_getscheduler(0) } != libc::SCHED_OTHER {
                return false;
            }
            idle().is_ok() && normal().is_ok()
        })
        .ok()
        .and_then(|t| t.join().ok())
        .unwrap_or(false)
}

/// Put the calling thread at `SCHED_IDLE`.
pub(crate) fn idle() -> io::Result<()> {
    set_policy(libc::SCHED_IDLE)
}

/// Put the calling thread back at `SCHED_OTHER` (its nice value is kept).
pub(crate) fn normal() -> io::Result<()> {
    set_policy(libc::SCHED_OTHER)
}

fn set_policy(policy: libc::c_int) -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `param` lives across the call and is only read.
    if unsafe { libc::sched_setscheduler(0, policy, &param) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The calling thread's scheduling policy.
#[cfg(test)]
pub(crate) fn policy() -> libc::c_int {
    // SAFETY: as in `available`.
    unsafe { libc::sched_getscheduler(0) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_goes_idle_and_back_to_normal() {
        // As root (CI) the way back is allowed; without CAP_SYS_NICE it takes RLIMIT_NICE.
        let back = available();
        if std::env::var_os("CI").is_some() {
            assert!(back, "root may take a thread back from SCHED_IDLE");
        }
        std::thread::spawn(move || {
            assert_eq!(policy(), libc::SCHED_OTHER);
            idle().unwrap();
            assert_eq!(policy(), libc::SCHED_IDLE);
            if back {
                normal().unwrap();
                assert_eq!(policy(), libc::SCHED_OTHER);
            } else {
                assert!(normal().is_err());
            }
        })
        .join()
        .unwrap();
        // The probe changed no thread but its own.
        assert_eq!(policy(), libc::SCHED_OTHER);
    }

    #[test]
    fn a_thread_hands_off_only_while_no_other_request_is_served() {
        if !available() {
            assert!(std::env::var_os("CI").is_none(), "root may take a thread back");
            return;
        }
        std::thread::spawn(|| {
            let serving = Arc::new(AtomicUsize::new(0));
            let mut h = Handoff::new(true, serving.clone());
            let other = Handoff::new(true, serving);
            // Alone: waits at SCHED_IDLE, serves at SCHED_OTHER.
            h.serving();
            h.served();
            h.before_wait(0);
            assert_eq!(policy(), libc::SCHED_IDLE);
            h.after_wait(0);
            assert_eq!(policy(), libc::SCHED_OTHER);
            // Another thread serving a request: no hand-off.
            other.serving();
            h.before_wait(0);
            assert_eq!(policy(), libc::SCHED_OTHER);
            h.after_wait(0);
            other.served();
            // Switched off: never.
            let mut off = Handoff::new(false, Arc::new(AtomicUsize::new(0)));
            off.before_wait(0);
            assert_eq!(policy(), libc::SCHED_OTHER);
        })
        .join()
        .unwrap();
    }
}

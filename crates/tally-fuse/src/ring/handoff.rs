//! Answering without sending the caller to another CPU.
//!
//! A program waiting for an answer sleeps; the ring thread's commit of the answer wakes it
//! (`fuse_request_end`, a plain `wake_up`). At that moment the thread still runs on the
//! caller's CPU, so the scheduler looks for an idle CPU to wake the caller on
//! (`select_idle_sibling`) and, when one is idle, moves the caller there. On a virtual
//! machine a wake on an idle virtual CPU is a halt exit and a host wake-up: 105 us for a pipe
//! round trip between two CPUs of the 2-vCPU VM against 9 us on one CPU (docs/bench/mount.md,
//! 28 Nov). An untar woke `tar` on the other CPU after about 40 % of its requests.
//!
//! A CPU whose only runnable tasks are `SCHED_IDLE` counts as idle to that search
//! (`sched_idle_cpu`), and a task of a normal policy preempts a `SCHED_IDLE` one as it wakes.
//! So a thread switches to `SCHED_IDLE` just for the system call that commits its answer: the
//! caller is woken on this CPU and runs at once; the thread switches back to its normal
//! policy as soon as it runs again, before it waits for the next request. It serves every
//! request at its normal policy, so nothing it holds (the file system's locks) waits on a
//! thread the scheduler holds back; a thread woken while still idle by a request that came
//! before it switched back waits at most until the running task's time slice ends (EEVDF
//! runs an eligible task woken with no lag then; measured beside two CPU hogs: no slower).
//!
//! The way back needs the right to raise a thread's priority to its nice value
//! (`RLIMIT_NICE` at least 20 − nice, or `CAP_SYS_NICE`), which an unprivileged daemon may
//! lack: [`available`] tries it on a thread of its own first, and the hand-off is only used
//! where it succeeded.

use std::io;

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
}

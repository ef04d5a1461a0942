//! Ring threads hand their CPU to the caller they answer (`-o cpu_handoff`, on by default):
//! a thread waiting for a request is at `SCHED_IDLE` (when it answered with no other request
//! being served), so the kernel wakes the caller of the answer it commits on the same CPU; a
//! thread serving a request is at the normal policy, so
//! what it holds meanwhile (the file system's locks) is never held by a thread the scheduler
//! holds back. With `cpu_handoff=off` every ring thread stays at the normal policy.
//!
//! Needs root, a usable /dev/fuse and a kernel that offers FUSE over io_uring; otherwise the
//! test skips, saying why (under CI it fails instead).

mod common;

use std::fs::{self, File};
use std::process::Command;
use std::time::Duration;

use tally_fuse::{IoUring, MountConfig, Unmounted};

use common::{require_fuse, wait_until, Scratch};

/// `SCHED_OTHER` and `SCHED_IDLE`, as `/proc/PID/task/TID/stat` shows a thread's policy.
const OTHER: u32 = 0;
const IDLE: u32 = 5;

/// The policy of each ring thread of this process (the mount is served in it).
fn ring_policies() -> Vec<u32> {
    fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| {
            let dir = t.ok()?.path();
            let comm = fs::read_to_string(dir.join("comm")).ok()?;
            if !comm.starts_with("tally-ring") {
                return None;
            }
            let stat = fs::read_to_string(dir.join("stat")).ok()?;
            // Fields after the parenthesised name: state is field 3, policy field 41.
            let rest = &stat[stat.rfind(')')? + 2..];
            rest.split(' ').nth(41 - 3)?.parse().ok()
        })
        .collect()
}

/// Mount with the ring and `cpu_handoff`; `None` (after skipping) if the kernel does not
/// offer the ring.
fn serve(s: &Scratch, cpu_handoff: bool) -> Option<common::Served> {
    let cfg = MountConfig {
        threads: 4,
        io_uring: IoUring::On,
        cpu_handoff,
        txn_wait: Duration::from_secs(5),
        ..MountConfig::default()
    };
    // The transport is the test's, whatever TALLY_FUSE_IO_URING says for the run: the
    // hand-off is the ring's.
    let fs = s.open_fs();
    match tally_fuse::mount(fs, &s.dir(), &cfg) {
        Ok(m) => Some(common::Served::run_with_chosen_transport(m, s.dir())),
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains("enable_uring"), "mount failed: {msg}");
            common::skip(&format!("the kernel does not offer FUSE over io_uring: {msg}"));
            None
        }
    }
}

#[test]
fn ring_threads_wait_idle_serve_normal_and_stay_normal_without_the_hand_off() {
    require_fuse!();
    let s = Scratch::new("handoff", "on");
    let Some(m) = serve(&s, true) else { return };
    // As root the way back from SCHED_IDLE is open, so the hand-off is used: a thread that
    // answered while no other request was being served waits at SCHED_IDLE (most of them on
    // a mount used by one caller at a time; all that registered and never served).
    fs::write(m.path("warm"), "a request on each side of the wait\n").unwrap();
    wait_until("ring threads wait at SCHED_IDLE", Duration::from_secs(5), || {
        ring_policies().contains(&IDLE)
    });

    // A request that waits in the daemon: a write to a file an open transaction holds, from
    // another process. The thread serving it must be at the normal policy meanwhile.
    let owner = File::create(m.path("anchor")).unwrap();
    tally_client::begin(&owner).unwrap();
    fs::write(m.path("held"), "in the transaction\n").unwrap();
    let held = m.path("held");
    let mut waiter = Command::new("sh")
        .arg("-c")
        .arg(format!("echo waiter >> {}", held.display()))
        .spawn()
        .unwrap();
    wait_until(
        "a ring thread serves the waiting write at SCHED_OTHER",
        Duration::from_secs(4),
        || ring_policies().contains(&OTHER),
    );
    tally_client::commit(&owner).unwrap();
    assert!(waiter.wait().unwrap().success(), "the waiting write went through after the commit");
    assert_eq!(fs::read_to_string(&held).unwrap(), "in the transaction\nwaiter\n");
    drop(owner);
    assert_eq!(m.unmount(), Unmounted::Clean);

    // Without the hand-off (in the same test: the policies are read from every ring thread
    // of this process, so no other mount may be served beside it).
    let s = Scratch::new("handoff", "off");
    let Some(m) = serve(&s, false) else { return };
    for i in 0..50 {
        fs::write(m.path(&format!("f{i}")), "x").unwrap();
    }
    let p = ring_policies();
    assert!(!p.is_empty(), "no ring thread found");
    assert!(p.iter().all(|&p| p == OTHER), "policies {p:?}");
    assert_eq!(m.unmount(), Unmounted::Clean);
}

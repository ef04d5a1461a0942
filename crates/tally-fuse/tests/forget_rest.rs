//! With FUSE over io_uring serving, `/dev/fuse` carries only `FORGET` and `INTERRUPT`: one
//! thread reads it, and it rests after forgets, so that the kernel's forgets (one per removed
//! file) queue without waking it each time and arrive in batches. Through `/dev/fuse` alone
//! (`TALLY_FUSE_IO_URING=off`, or a kernel without the ring) every request thread reads it.
//!
//! Needs root and a usable /dev/fuse (the test skips without, saying why; under CI it fails).

mod common;

use std::fs;
use std::time::{Duration, Instant};

use tally_fuse::{MountConfig, Opcode, Unmounted};

use common::{require_fuse, Scratch};

/// Files created and removed: a `FORGET` each.
const FILE_COUNT: u64 = 3000;
/// Rounds of [`FILE_COUNT`] tried before the machine counts as too slow for the check.
const ROUND_COUNT_MAX: usize = 3;
/// Request threads asked for.
const THREAD_COUNT: usize = 4;

/// This process's threads reading `/dev/fuse` (fuser names them `fuser-N`), with their
/// context switches so far (voluntary and not).
fn dev_fuse_threads() -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for task in fs::read_dir("/proc/self/task").unwrap() {
        let path = task.unwrap().path();
        let Ok(comm) = fs::read_to_string(path.join("comm")) else { continue };
        if !comm.starts_with("fuser-") {
            continue;
        }
        let Ok(status) = fs::read_to_string(path.join("status")) else { continue };
        let switches = status
            .lines()
            .filter(|l| l.starts_with("voluntary_ctxt_switches") || l.starts_with("nonvoluntary"))
            .map(|l| l.split_whitespace().last().unwrap().parse::<u64>().unwrap())
            .sum();
        out.push((comm.trim().to_owned(), switches));
    }
    out
}

fn switches(threads: &[(String, u64)]) -> u64 {
    threads.iter().map(|(_, s)| s).sum()
}

/// The distinct names among `threads` (a thread started by a `fuser-N` thread without a name
/// of its own shows the same name).
fn names(threads: &[(String, u64)]) -> Vec<&str> {
    let mut names: Vec<&str> = threads.iter().map(|(n, _)| n.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    names
}

#[test]
fn beside_the_ring_one_dev_fuse_thread_takes_forgets_in_batches() {
    require_fuse!();
    let s = Scratch::new("forget-rest-test", "forgets");
    let served = s.serve(&MountConfig { threads: THREAD_COUNT, ..MountConfig::default() });
    // A first request: the ring (if it serves) has every queue's entries by the time it is
    // answered over it.
    fs::write(served.path("first"), b"x").unwrap();
    let over_ring = served.requests().ring() > 0;
    let mut threads = dev_fuse_threads();
    if !over_ring {
        // fuser names the threads it starts `fuser-N`; the one serving the session may be the
        // caller's, named otherwise: every request thread but that one is a `fuser-N`. On a
        // loaded machine the first request can be answered before fuser has started them all
        // (CI once saw fuser-0 and fuser-1 of 4): they get a few seconds to appear.
        let deadline = Instant::now() + Duration::from_secs(5);
        while names(&threads).len() < THREAD_COUNT - 1 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
            threads = dev_fuse_threads();
        }
        assert!(names(&threads).len() >= THREAD_COUNT - 1, "/dev/fuse alone: {threads:?}");
        assert_eq!(served.unmount(), Unmounted::Clean);
        return;
    }
    // The same on a loaded machine: the ring can answer before fuser has started its thread
    // (CI saw none yet, 7 of 60 runs on a busy VM).
    let deadline = Instant::now() + Duration::from_secs(5);
    while threads.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        threads = dev_fuse_threads();
    }
    assert_eq!(names(&threads), ["fuser-0"], "beside the ring, one /dev/fuse thread: {threads:?}");

    // Resting, the thread switches a few times per rest (its sleep, the read it blocks in,
    // maybe a preemption) however many forgets came meanwhile, and a rest lasts 2 ms: at most
    // 2 switches a millisecond. Woken per forget, it switches about once per forget. The
    // check tells the two apart only if the forgets came faster than that bound: a round too
    // slow for it (a loaded machine) is run again, a few times.
    let mut rounds = Vec::new();
    for round in 0..ROUND_COUNT_MAX {
        // The files are made before the clock starts: only their removals (an UNLINK and a
        // FORGET each) are timed, so the forgets come as fast as the machine can remove.
        let paths: Vec<_> =
            (0..FILE_COUNT).map(|i| served.path(&format!("r{round}-f{i}"))).collect();
        for p in &paths {
            fs::write(p, b"x").unwrap();
        }
        let forgets_before = served.requests().get(Opcode::Forget);
        let switches_before = switches(&dev_fuse_threads());
        let start = Instant::now();
        for p in &paths {
            fs::remove_file(p).unwrap();
        }
        // The last forgets may wait for the end of a rest.
        common::wait_until("every forget is served", Duration::from_secs(10), || {
            served.requests().get(Opcode::Forget) - forgets_before >= FILE_COUNT
        });
        let elapsed = start.elapsed();
        let woken = switches(&dev_fuse_threads()) - switches_before;
        let resting_max = 2 * u64::try_from(elapsed.as_millis()).unwrap() + 20;
        eprintln!(
            "{FILE_COUNT} forgets in {elapsed:?}: the /dev/fuse thread switched {woken} times \
             (resting: at most {resting_max})"
        );
        rounds.push((elapsed, woken));
        if resting_max < FILE_COUNT * 4 / 5 {
            assert!(
                woken <= resting_max,
                "the /dev/fuse thread switched {woken} times for {FILE_COUNT} forgets in \
                 {elapsed:?}: woken per forget, not resting"
            );
            assert_eq!(served.unmount(), Unmounted::Clean);
            return;
        }
    }
    panic!("every round too slow to tell resting from waking per forget: {rounds:?}");
}

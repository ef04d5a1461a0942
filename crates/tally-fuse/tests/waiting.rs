//! Requests that wait in the daemon leave threads for the rest: a request that waits (an
//! `fsync` for the device, a write to a file a transaction holds) holds a request thread (a
//! ring entry of its caller's CPU's queue), and the kernel never hands a request to another
//! queue. With the default threads, callers on one CPU may have several requests waiting
//! and still be served.
//!
//! Needs root and a usable /dev/fuse (CI has both); otherwise the test prints why it skips.

mod common;

use std::fs::{self, File};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use tally_fuse::{MountConfig, Unmounted};

use common::{require_fuse, Scratch};

/// Waiters: below what the default gives a queue on a machine of up to 4 CPUs (8), above the
/// 2 a queue (and 2 `/dev/fuse` threads) the default gave a 2-CPU machine before.
const WAITERS: usize = 6;

/// How long a request outside the transaction waits for it before `EBUSY`.
const TXN_WAIT: Duration = Duration::from_secs(6);

/// The CPUs this thread may run on.
fn allowed_cpus() -> Vec<usize> {
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: a zeroed cpu_set_t is an empty set; the call gets the set's real size and
    // CPU_ISSET stays below CPU_SETSIZE.
    unsafe {
        let mut allowed: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(libc::sched_getaffinity(0, size, &mut allowed), 0);
        (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &allowed)).collect()
    }
}

/// Run the calling thread (and the processes it starts from now on) on `cpu` only: its
/// requests land on that CPU's ring queue.
fn pin_to(cpu: usize) {
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: as in `allowed_cpus`; `cpu` came from it, so it is below CPU_SETSIZE.
    unsafe {
        let mut only: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut only);
        assert_eq!(libc::sched_setaffinity(0, size, &only), 0);
    }
}

/// Configured CPUs: the ring's queue count.
fn cpus_configured() -> usize {
    // SAFETY: sysconf has no preconditions.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }).unwrap_or(1).max(1)
}

/// The transaction begins on one CPU; then, from another, `WAITERS` processes outside it
/// write the file it holds (each request waits in the daemon for it to end) and the commit
/// follows on that CPU, so on the ring it needs a thread of the queue the waiters hold
/// (Tally answers a request served on the daemon thread that began a transaction `EBUSY` at
/// once instead of letting it wait: the begin is kept on another queue so that the waiters
/// really wait). With too few threads a queue the commit waits until the waiters give up.
/// Through `/dev/fuse` any thread serves any request, so there the test shows only that the
/// commit is not held up.
#[test]
fn requests_waiting_for_a_transaction_leave_threads_for_its_commit() {
    require_fuse!();
    let cpus = allowed_cpus();
    if cpus.len() < 2 {
        let why = "needs two CPUs to keep the waiters off the transaction's queue";
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
        eprintln!("skipped: {why}");
        return;
    }
    let s = Scratch::new("waiting", "txn");
    let mut cfg = MountConfig { txn_wait: TXN_WAIT, ..MountConfig::default() };
    // Beyond 4 CPUs the default spreads its threads thinner than one queue needs here: ask
    // for 8 a queue, which the layout must then give.
    if cpus_configured() > 4 {
        cfg.threads = 8 * cpus_configured();
    }
    let m = s.serve(&cfg);
    pin_to(cpus[0]);
    let owner = File::create(m.path("anchor")).unwrap();
    tally_client::begin(&owner).unwrap();
    // One file a waiter: the kernel lets one write at a time into an inode, so waiters on
    // one file would wait in the kernel, not in the daemon.
    for i in 0..WAITERS {
        fs::write(m.path(&format!("held{i}")), "in the transaction\n").unwrap();
    }

    // Other processes (outside the transaction, which is bound to this one) append to the
    // held file: each request waits in the daemon for the transaction to end.
    pin_to(cpus[1]);
    let waiters: Vec<Child> = (0..WAITERS)
        .map(|i| {
            let held = m.path(&format!("held{i}"));
            Command::new("sh")
                .arg("-c")
                .arg(format!("echo waiter >> {}", held.display()))
                .spawn()
                .unwrap()
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));

    let started = Instant::now();
    tally_client::commit(&owner).unwrap();
    let commit_took = started.elapsed();
    let succeeded =
        waiters.into_iter().filter_map(|mut c| c.wait().unwrap().success().then_some(())).count();
    assert!(
        commit_took < TXN_WAIT / 2,
        "the commit took {commit_took:?} ({succeeded} of {WAITERS} waiters succeeded): the \
         waiting requests held every thread of the queue until they gave up"
    );
    // Each file holds what the transaction wrote, then its waiter's line if it succeeded.
    let appended: usize = (0..WAITERS)
        .map(|i| {
            let content = fs::read_to_string(m.path(&format!("held{i}"))).unwrap();
            assert!(content.starts_with("in the transaction\n"), "held{i}: {content:?}");
            content.lines().count() - 1
        })
        .sum();
    assert_eq!(appended, succeeded);
    drop(owner);
    assert_eq!(m.unmount(), Unmounted::Clean);
}

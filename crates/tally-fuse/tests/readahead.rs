//! Large reads through the mount (issue 14 item 4): the mount's read-ahead is raised to
//! `-o read_ahead_kb` (1 MiB by default) once the kernel is initialised, so a sequential read
//! of a file reaches the daemon as 1 MiB `READ`s; and the pages of a file stay cached from one
//! open to the next (a second read sends no `READ`).
//!
//! Needs root and a usable /dev/fuse (CI has both); otherwise each test prints why it skips.

mod common;

use std::time::Duration;

use tally_fuse::{MountConfig, Opcode};

use common::{require_fuse, Scratch};

/// The mount's read-ahead in KiB, from sysfs. The mount's device number is read from
/// `/proc/self/mountinfo` (its third field), which sends the daemon no request.
fn read_ahead_kb(dir: &std::path::Path) -> u32 {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let at = dir.to_str().unwrap();
    let dev = info
        .lines()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .filter(|f| f.get(4) == Some(&at))
        .filter_map(|f| f.get(2).map(|d| d.to_string()))
        .next_back()
        .unwrap_or_else(|| panic!("{at} is not in /proc/self/mountinfo"));
    let path = format!("/sys/class/bdi/{dev}/read_ahead_kb");
    std::fs::read_to_string(&path).unwrap().trim().parse().unwrap()
}

#[test]
fn sequential_reads_arrive_in_large_requests_and_stay_cached() {
    require_fuse!();
    let s = Scratch::new("readahead-test", "default");
    let m = s.mount();
    assert_eq!(read_ahead_kb(&m.dir), 1024);
    let data: Vec<u8> = (0..16u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(m.path("f"), &data).unwrap();
    // Drop the pages the writes left, so the first read comes from the daemon.
    let f = std::fs::File::open(m.path("f")).unwrap();
    // SAFETY: posix_fadvise on an open descriptor; DONTNEED only drops clean cached pages.
    let rc = unsafe {
        libc::posix_fadvise(std::os::fd::AsRawFd::as_raw_fd(&f), 0, 0, libc::POSIX_FADV_DONTNEED)
    };
    assert_eq!(rc, 0);
    drop(f);
    let before = m.requests().get(Opcode::Read);
    assert!(std::fs::read(m.path("f")).unwrap() == data);
    let reads = m.requests().get(Opcode::Read) - before;
    // 16 MiB in 1 MiB requests; some slack for the first, smaller read-ahead window.
    assert!(reads <= 24, "{reads} READs for 16 MiB (128 KiB read-ahead would send 128)");
    let before = m.requests().get(Opcode::Read);
    assert!(std::fs::read(m.path("f")).unwrap() == data);
    assert_eq!(m.requests().get(Opcode::Read) - before, 0, "a second open reads from cache");
}

/// The read-ahead is in place when `mount` returns, before any program can open a file there
/// (a file's read-ahead is fixed when it is opened), and raising it made no request to the
/// daemon's own mount. It used to be raised from a thread once the first request arrived, so
/// `dd` of a large file right after `tally mount` read in 128 KiB requests (`bench/largeio.sh`:
/// 2,048 `READ`s for 256 MiB). Before that, the thread `stat`ed the mount's root to wait for
/// `INIT`, and a daemon killed with SIGKILL while it held that `GETATTR` could never exit (the
/// `stat` waits out an answer no thread gives, and keeps `/dev/fuse` open), so its image stayed
/// locked: a full `bench/run.sh` met it as "in use" on a remount.
#[test]
fn read_ahead_is_raised_before_mount_returns_without_a_request() {
    require_fuse!();
    let s = Scratch::new("readahead-test", "own");
    let m = s.mount();
    assert_eq!(read_ahead_kb(&m.dir), 1024, "read-ahead when the mount is handed over");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(m.requests().total(), 0, "requests nobody here sent: {}", m.requests());
}

#[test]
fn read_ahead_kb_zero_leaves_the_kernels() {
    require_fuse!();
    let s = Scratch::new("readahead-test", "zero");
    let m = s.serve(&MountConfig { read_ahead_kb: 0, ..MountConfig::default() });
    std::fs::write(m.path("f"), b"x").unwrap();
    assert_eq!(read_ahead_kb(&m.dir), 128, "the kernel's default for FUSE");
    let s2 = Scratch::new("readahead-test", "512");
    let m2 = s2.serve(&MountConfig { read_ahead_kb: 512, ..MountConfig::default() });
    assert_eq!(read_ahead_kb(&m2.dir), 512);
}

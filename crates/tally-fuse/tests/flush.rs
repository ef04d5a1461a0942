//! Which closes cost a `FLUSH` round trip, and the F2FS atomic writes that need one: a file
//! opened to be rewritten in place (`O_RDWR`, as SQLite opens its databases) gets `FLUSH`, where
//! an atomic write its dying process left open is aborted before the kernel drops the process's
//! POSIX locks; a file opened with `O_EXCL`, `O_TRUNC` or `O_APPEND` (tar, git, cp, `>`,
//! appenders) gets `FOPEN_NOFLUSH`, and no atomic write can start through it.
//!
//! Needs root and a usable /dev/fuse (fails under `CI=true` without them).

mod common;

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

use tally_fuse::{Opcode, Unmounted};

use common::{require_fuse, wait_until, Scratch};

/// `F2FS_IOC_START_ATOMIC_WRITE`.
const START: libc::c_ulong = 0xf501;

#[test]
fn only_a_close_of_a_file_open_to_rewrite_in_place_sends_flush() {
    require_fuse!();
    let s = Scratch::new("flush-test", "count");
    let m = s.mount();
    let before = m.requests();
    // Each of these opens for writing and closes; none sends FLUSH.
    let mut f = OpenOptions::new().write(true).create_new(true).open(m.path("excl")).unwrap();
    f.write_all(b"tar, git, cp").unwrap();
    drop(f);
    let mut f = File::create(m.path("trunc")).unwrap();
    f.write_all(b"File::create, >").unwrap();
    drop(f);
    let mut f = OpenOptions::new().append(true).open(m.path("trunc")).unwrap();
    f.write_all(b", >>").unwrap();
    drop(f);
    wait_until("three releases", Duration::from_secs(5), || {
        m.requests().since(&before).get(Opcode::Release) == 3
    });
    let d = m.requests().since(&before);
    assert_eq!(d.get(Opcode::Flush), 0, "{d}");
    // An open to rewrite in place (SQLite's database) sends one.
    let f = OpenOptions::new().read(true).write(true).open(m.path("excl")).unwrap();
    drop(f);
    let d = m.requests().since(&before);
    assert_eq!(d.get(Opcode::Flush), 1, "{d}");
    assert_eq!(fs::read(m.path("trunc")).unwrap(), b"File::create, >, >>");
    assert_eq!(m.unmount(), Unmounted::Clean);
}

/// In a forked child: create `path` with `flags`, write "old contents", start an atomic
/// write, overwrite the start with "NEW", and exit without closing. Exit status: 0 when the
/// atomic write started, 10 + errno (capped) when start failed, 1 for any other failure.
fn child_dies_inside_an_atomic_write(path: &Path, flags: libc::c_int) -> i32 {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: the child calls only async-signal-safe functions (open, write, ioctl, pwrite,
    // _exit) on memory prepared before the fork; the parent waits for it.
    unsafe {
        let pid = libc::fork();
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            let fd = libc::open(c.as_ptr(), flags, 0o644);
            if fd < 0 || libc::write(fd, b"old contents".as_ptr().cast(), 12) != 12 {
                libc::_exit(1);
            }
            if libc::ioctl(fd, START as _) != 0 {
                let e = *libc::__errno_location();
                libc::_exit(10 + e.min(100));
            }
            if libc::pwrite(fd, b"NEW".as_ptr().cast(), 3, 0) != 3 {
                libc::_exit(1);
            }
            // Dies with the atomic write open: the kernel closes the file in do_exit.
            libc::_exit(0);
        }
        let mut status = 0;
        assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
        assert!(libc::WIFEXITED(status), "child status {status:#x}");
        libc::WEXITSTATUS(status)
    }
}

#[test]
fn an_atomic_write_its_process_dies_in_is_aborted_before_its_locks_go() {
    require_fuse!();
    let s = Scratch::new("flush-test", "abort");
    let m = s.mount();
    let before = m.requests();
    // SQLite creating its database: O_RDWR | O_CREAT. The kernel sends FLUSH as the dying
    // child closes the file (before it drops the child's POSIX locks), and the atomic write is
    // aborted there: once the child is reaped, the file is as it was before the start.
    let db = m.path("db");
    assert_eq!(child_dies_inside_an_atomic_write(&db, libc::O_RDWR | libc::O_CREAT), 0);
    let d = m.requests().since(&before);
    assert_eq!(d.get(Opcode::F2fsStartAtomicWrite), 1, "{d}");
    assert_eq!(d.get(Opcode::Flush), 1, "the dying child's close: {d}");
    assert_eq!(fs::read(&db).unwrap(), b"old contents", "aborted by the time the child is gone");
    // A file created with O_EXCL gets no FLUSH: the start is refused (SQLite would journal),
    // and the file keeps what was written.
    let excl = m.path("excl");
    let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL;
    assert_eq!(child_dies_inside_an_atomic_write(&excl, flags), 10 + libc::EOPNOTSUPP);
    assert_eq!(fs::read(&excl).unwrap(), b"old contents");
    let d = m.requests().since(&before);
    assert_eq!(d.get(Opcode::F2fsStartAtomicWrite), 2, "{d}");
    assert_eq!(d.get(Opcode::Flush), 1, "{d}");
    assert_eq!(m.unmount(), Unmounted::Clean);
    let m = s.mount();
    assert_eq!(fs::read(m.path("db")).unwrap(), b"old contents");
    assert_eq!(m.unmount(), Unmounted::Clean);
}

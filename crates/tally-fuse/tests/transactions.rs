//! Transactions through the kernel: `tally-client`'s ioctls on a mounted image, ordinary file
//! calls in between, checked at once (the kernel's caches) and after a remount (the media).
//! Each check also runs against the adapter mutant it is meant to catch.
//!
//! Needs root and a usable /dev/fuse (CI has both); otherwise each test prints why it skips.

mod common;

use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::process::Command;
use std::time::{Duration, Instant};

use tally_fuse::{FuseMutant, Unmounted};

use common::{require_fuse, wait_until, Scratch, Served};

/// Size and content of `name`, or `None` when it does not exist. The size comes from a `stat`
/// made before the content is read (a read refreshes the kernel's attributes), and another
/// `stat` after, so the kernel's cache holds attributes when this returns.
fn state(m: &Served, name: &str) -> Option<(u64, Vec<u8>)> {
    let size = fs::metadata(m.path(name)).ok()?.size();
    let content = fs::read(m.path(name)).ok()?;
    let _ = fs::metadata(m.path(name));
    Some((size, content))
}

fn old(content: &str) -> Option<(u64, Vec<u8>)> {
    Some((content.len() as u64, content.as_bytes().to_vec()))
}

/// Note in `wrong`, each prefixed by `when`, the files of [`abort_two_files`] that a reader of
/// `m` does not see as they were before the transaction.
fn check_aborted(m: &Served, when: &str, wrong: &mut Vec<String>) {
    for (name, want) in [("a", old("old a")), ("b", None), ("gone", old("keep me"))] {
        let got = state(m, name);
        if got != want {
            wrong.push(format!("{when}: {name} is {got:?}, want {want:?}"));
        }
    }
}

/// Unmount cleanly; then what went wrong, if anything.
fn finish(m: Served, wrong: Vec<String>) -> Result<(), String> {
    assert_eq!(m.unmount(), Unmounted::Clean);
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

/// Two files with old contents, changed (one rewritten longer, one created, one removed) in
/// a transaction begun on the mount's root directory, and aborted. Returns what a reader sees
/// right after the abort and after a remount, compared with the old state.
fn abort_two_files(mutant: Option<FuseMutant>) -> Result<(), String> {
    let s = Scratch::new("txn-test", "abort");
    let m = s.mount_with(None);
    fs::write(m.path("a"), "old a").unwrap();
    fs::write(m.path("gone"), "keep me").unwrap();
    assert_eq!(m.unmount(), Unmounted::Clean);

    let m = s.mount_with(mutant);
    let dir = File::open(&m.dir).unwrap();
    let id = tally_client::begin(&dir).unwrap();
    assert_ne!(id, 0);
    fs::write(m.path("a"), "new a, longer than before").unwrap();
    fs::write(m.path("b"), "new b").unwrap();
    fs::remove_file(m.path("gone")).unwrap();
    // Readers see changes as they happen (as in a page cache); the kernel caches them now.
    assert_eq!(state(&m, "a"), old("new a, longer than before"));
    assert_eq!(state(&m, "b"), old("new b"));
    assert!(state(&m, "gone").is_none());
    tally_client::abort(&dir).unwrap();
    let mut wrong = Vec::new();
    check_aborted(&m, "at once", &mut wrong);
    drop(dir);
    assert_eq!(m.unmount(), Unmounted::Clean);
    let m = s.mount_with(None);
    check_aborted(&m, "after remount", &mut wrong);
    finish(m, wrong)
}

/// The failure a check reported against a mutant (printed); panics when it passed.
#[cfg(feature = "mutants")]
fn caught(check: Result<(), String>) -> String {
    let e = check.unwrap_err();
    eprintln!("caught: {e}");
    e
}

#[test]
fn abort_restores_both_files_at_once_and_on_media() {
    require_fuse!();
    abort_two_files(None).unwrap();
}

#[test]
#[cfg(feature = "mutants")]
fn abort_test_catches_a_mount_that_routes_nothing() {
    require_fuse!();
    let e = caught(abort_two_files(Some(FuseMutant::RouteNothing)));
    assert!(e.contains("after remount"), "{e}");
}

#[test]
#[cfg(feature = "mutants")]
fn abort_test_catches_stale_kernel_caches() {
    require_fuse!();
    let e = caught(abort_two_files(Some(FuseMutant::NoInvalidation)));
    assert!(e.contains("at once") && !e.contains("after remount"), "{e}");
}

#[test]
fn commit_keeps_both_files_and_closing_the_owner_aborts() {
    require_fuse!();
    let s = Scratch::new("txn-test", "commit");
    let m = s.mount_with(None);
    let f = File::create(m.path("anchor")).unwrap();
    tally_client::begin(&f).unwrap();
    assert!(tally_client::current(&f).unwrap().is_some());
    fs::write(m.path("x"), "x1").unwrap();
    fs::write(m.path("y"), "y1").unwrap();
    // Another open file owns nothing; a second begin by the same process is refused.
    let other = File::open(&m.dir).unwrap();
    assert!(matches!(tally_client::commit(&other), Err(tally_client::Error::NoTransaction)));
    assert!(matches!(tally_client::begin(&other), Err(tally_client::Error::Busy)));
    tally_client::commit(&f).unwrap();
    assert_eq!(tally_client::current(&f).unwrap(), None);
    assert!(matches!(tally_client::commit(&f), Err(tally_client::Error::NoTransaction)));

    // A transaction whose open file is closed is aborted (the kernel's release comes a
    // moment after close).
    tally_client::begin(&f).unwrap();
    fs::write(m.path("x"), "x2 lost").unwrap();
    drop(f);
    wait_until("closing the owner aborted", Duration::from_secs(5), || {
        tally_client::current(&other).unwrap().is_none()
    });
    assert_eq!(fs::read(m.path("x")).unwrap(), b"x1");
    drop(other);
    assert_eq!(m.unmount(), Unmounted::Clean);
    let m = s.mount_with(None);
    assert_eq!(fs::read(m.path("x")).unwrap(), b"x1");
    assert_eq!(fs::read(m.path("y")).unwrap(), b"y1");
    assert_eq!(m.unmount(), Unmounted::Clean);
}

/// A transaction bound to a process tree: a root shell (a child subreaper that began the
/// transaction before exec, as `tally atomic` does) runs a shell that writes two files and
/// leaves a grandchild writing a third after that shell exited; meanwhile a process outside
/// the tree (a child of this test, not of the root) writes an unrelated file and tries to
/// write a file the transaction holds. Then this test aborts through its copy of the open
/// file. Returns what went wrong.
fn tree_abort(mutant: Option<FuseMutant>) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;

    let s = Scratch::new("txn-test", "tree");
    let m = s.mount_with(None);
    fs::write(m.path("held"), "old").unwrap();
    assert_eq!(m.unmount(), Unmounted::Clean);
    let m = s.mount_with(mutant);
    let dir = File::open(&m.dir).unwrap();
    let fd = dir.as_raw_fd();
    let d = m.dir.display().to_string();
    let inner = format!(
        "echo new > {d}/held; echo child > {d}/child; \
         (sleep 0.3; echo late > {d}/late; touch {d}/late.done) & exit 0"
    );
    let root_script = format!("sh -c '{inner}'; while [ ! -e {d}/late.done ]; do sleep 0.05; done");
    let mut root = Command::new("sh");
    root.arg("-c").arg(&root_script);
    // SAFETY: only async-signal-safe calls (prctl, ioctl) between fork and exec.
    unsafe {
        root.pre_exec(move || {
            if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let mut id: u64 = 0;
            if libc::ioctl(fd, tally_client::ioctl::BEGIN_TREE as _, &mut id) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut root = root.spawn().unwrap();
    wait_until("the tree started writing", Duration::from_secs(10), || m.path("child").exists());
    let outside = format!(
        "echo other > {d}/other; if echo x > {d}/held; then echo wrote > {d}/other.res; \
         else echo refused > {d}/other.res; fi"
    );
    let started = Instant::now();
    let status = Command::new("sh").arg("-c").arg(&outside).status().unwrap();
    let outsider_took = started.elapsed();
    assert!(status.success());
    assert!(root.wait().unwrap().success());
    let mut wrong = Vec::new();
    let res = fs::read_to_string(m.path("other.res")).unwrap_or_default();
    if res.trim() != "refused" {
        wrong.push(format!("the outsider's write to a held file: {res:?}"));
    }
    if outsider_took > Duration::from_secs(5) {
        wrong.push(format!("the outsider waited {outsider_took:?}"));
    }
    if fs::read_to_string(m.path("late")).ok().as_deref() != Some("late\n") {
        wrong.push("the grandchild's write was not seen before the abort".into());
    }
    tally_client::abort(&dir).unwrap();
    for (name, want) in [
        ("held", Some("old")),
        ("child", None),
        ("late", None),
        ("late.done", None),
        ("other", Some("other\n")),
        ("other.res", Some("refused\n")),
    ] {
        let got = fs::read_to_string(m.path(name)).ok();
        if got.as_deref() != want {
            wrong.push(format!("{name} is {got:?}, want {want:?}"));
        }
    }
    drop(dir);
    finish(m, wrong)
}

#[test]
fn a_tree_transaction_takes_in_late_children_and_leaves_outsiders_alone() {
    require_fuse!();
    tree_abort(None).unwrap();
}

#[test]
#[cfg(feature = "mutants")]
fn the_tree_test_catches_a_mount_that_routes_nothing() {
    require_fuse!();
    let e = caught(tree_abort(Some(FuseMutant::RouteNothing)));
    assert!(e.contains("late is Some") && e.contains("child is Some"), "{e}");
}

#[test]
fn barrier_and_unknown_ioctls() {
    require_fuse!();
    let s = Scratch::new("txn-test", "barrier");
    let m = s.mount_with(None);
    let mut f = File::create(m.path("f")).unwrap();
    f.write_all(b"ordered").unwrap();
    tally_client::barrier(&f).unwrap();
    tally_client::barrier(&File::open(&m.dir).unwrap()).unwrap();
    // An ioctl Tally does not know (FS_IOC_GETVERSION): ENOTTY, as for any file system.
    let mut v: libc::c_long = 0;
    // SAFETY: a valid fd and a pointer to a long, which this request writes.
    let rc = unsafe {
        libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&f), libc::FS_IOC_GETVERSION, &mut v)
    };
    assert_eq!(rc, -1);
    let e = std::io::Error::last_os_error().raw_os_error();
    assert!(matches!(e, Some(libc::ENOTTY | libc::ENOSYS | libc::EOPNOTSUPP)), "{e:?}");
    drop(f);
    assert_eq!(m.unmount(), Unmounted::Clean);
}

//! Transactions through the kernel: `tally-client`'s ioctls on a mounted image, ordinary file
//! calls in between, checked at once (the kernel's caches) and after a remount (the media).
//! Each check also runs against the adapter mutant it is meant to catch.
//!
//! Needs root and a usable /dev/fuse (CI has both); otherwise each test prints why it skips.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tally_fs::{Fs, MkfsOptions, MountOptions};
use tally_fuse::{FuseMutant, MountConfig, Unmounted};
use tally_media::{Device, FileDevice, FileOptions};

fn fuse_unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not running as root".into());
    }
    if let Err(e) = OpenOptions::new().read(true).write(true).open("/dev/fuse") {
        return Some(format!("/dev/fuse unusable: {e}"));
    }
    None
}

macro_rules! require_fuse {
    () => {
        if let Some(why) = fuse_unavailable() {
            eprintln!("skipped: {why}");
            return;
        }
    };
}

/// A temporary image and mount directory, removed on drop.
struct Scratch {
    root: PathBuf,
}

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let root = std::env::temp_dir()
            .join(format!("tally-txn-test-{}-{tag}-{nanos}", std::process::id()));
        fs::create_dir_all(root.join("mnt")).unwrap();
        let image = root.join("image");
        File::create(&image).unwrap().set_len(256 << 20).unwrap();
        Fs::mkfs(device(&image), &MkfsOptions::default()).unwrap();
        Scratch { root }
    }

    fn dir(&self) -> PathBuf {
        self.root.join("mnt")
    }

    fn mount(&self, mutant: Option<FuseMutant>) -> Served {
        let fs = Fs::mount(device(&self.root.join("image")), MountOptions::default()).unwrap();
        let cfg = MountConfig { threads: 4, mutant, ..MountConfig::default() };
        let mounted = tally_fuse::mount(fs, &self.dir(), &cfg).unwrap();
        let thread = std::thread::spawn(move || mounted.run().unwrap());
        Served { dir: self.dir(), thread: Some(thread) }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = tally_fuse::unmount_dir(&self.dir(), true);
        let _ = fs::remove_dir_all(&self.root);
    }
}

fn device(path: &Path) -> Arc<dyn Device> {
    Arc::new(FileDevice::open(path, FileOptions::default()).unwrap())
}

/// A mount being served on a thread.
struct Served {
    dir: PathBuf,
    thread: Option<JoinHandle<Unmounted>>,
}

impl Served {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Unmount through the kernel and wait for the session to write its snapshot.
    fn unmount(mut self) -> Unmounted {
        let mut tries = 0;
        while let Err(e) = tally_fuse::unmount_dir(&self.dir, false) {
            tries += 1;
            assert!(tries < 100, "unmount of {} failed: {e}", self.dir.display());
            std::thread::sleep(Duration::from_millis(20));
        }
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if self.thread.is_some() {
            let _ = tally_fuse::unmount_dir(&self.dir, true);
        }
    }
}

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

/// Two files with old contents, changed (one rewritten longer, one created, one removed) in
/// a transaction begun on the mount's root directory, and aborted. Returns what a reader sees
/// right after the abort and after a remount, compared with the old state.
fn abort_two_files(mutant: Option<FuseMutant>) -> Result<(), String> {
    let s = Scratch::new("abort");
    let m = s.mount(None);
    fs::write(m.path("a"), "old a").unwrap();
    fs::write(m.path("gone"), "keep me").unwrap();
    assert_eq!(m.unmount(), Unmounted::Clean);

    let m = s.mount(mutant);
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
    for (name, want) in [("a", old("old a")), ("b", None), ("gone", old("keep me"))] {
        let got = state(&m, name);
        if got != want {
            wrong.push(format!("at once: {name} is {got:?}, want {want:?}"));
        }
    }
    drop(dir);
    assert_eq!(m.unmount(), Unmounted::Clean);
    let m = s.mount(None);
    for (name, want) in [("a", old("old a")), ("b", None), ("gone", old("keep me"))] {
        let got = state(&m, name);
        if got != want {
            wrong.push(format!("after remount: {name} is {got:?}, want {want:?}"));
        }
    }
    assert_eq!(m.unmount(), Unmounted::Clean);
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
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
    let e = abort_two_files(Some(FuseMutant::RouteNothing)).unwrap_err();
    eprintln!("caught: {e}");
    assert!(e.contains("after remount"), "{e}");
}

#[test]
#[cfg(feature = "mutants")]
fn abort_test_catches_stale_kernel_caches() {
    require_fuse!();
    let e = abort_two_files(Some(FuseMutant::NoInvalidation)).unwrap_err();
    eprintln!("caught: {e}");
    assert!(e.contains("at once") && !e.contains("after remount"), "{e}");
}

#[test]
fn commit_keeps_both_files_and_closing_the_owner_aborts() {
    require_fuse!();
    let s = Scratch::new("commit");
    let m = s.mount(None);
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
    let deadline = Instant::now() + Duration::from_secs(5);
    while tally_client::current(&other).unwrap().is_some() {
        assert!(Instant::now() < deadline, "closing the owner did not abort");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(fs::read(m.path("x")).unwrap(), b"x1");
    drop(other);
    assert_eq!(m.unmount(), Unmounted::Clean);
    let m = s.mount(None);
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

    let s = Scratch::new("tree");
    let m = s.mount(None);
    fs::write(m.path("held"), "old").unwrap();
    assert_eq!(m.unmount(), Unmounted::Clean);
    let m = s.mount(mutant);
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
    let deadline = Instant::now() + Duration::from_secs(10);
    while !m.path("child").exists() {
        assert!(Instant::now() < deadline, "the tree did not start writing");
        std::thread::sleep(Duration::from_millis(10));
    }
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
    assert_eq!(m.unmount(), Unmounted::Clean);
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
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
    let e = tree_abort(Some(FuseMutant::RouteNothing)).unwrap_err();
    eprintln!("caught: {e}");
    assert!(e.contains("late is Some") && e.contains("child is Some"), "{e}");
}

#[test]
fn barrier_and_unknown_ioctls() {
    require_fuse!();
    let s = Scratch::new("barrier");
    let m = s.mount(None);
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

//! Helpers shared by the CLI's integration tests: the built `tally` binary, scratch
//! directories, FUSE availability, `tally mount` daemons and their recovered images.

// Each test binary compiles this module on its own and uses only some of it.
#![allow(dead_code)]

use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tally_fs::{Fs, MountOptions};
use tally_media::{Device, FileDevice, FileOptions};

/// A new empty directory `tally-{file}-{pid}-{nanos}-{tag}`; `file` names the test file, so
/// tests in different files never share one. The clock's nanoseconds keep a later process
/// that reuses the pid (pid_max is 32,768 on small machines) off a directory whose daemons or
/// NBD servers an earlier, killed run left behind: with the pid alone, a test suite run beside
/// another found its NBD targets' locks held ("is in use: another tally mount serves it").
pub fn scratch(file: &str, tag: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir =
        std::env::temp_dir().join(format!("tally-{file}-{}-{nanos}-{tag}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// The built `tally` binary, ready for arguments.
pub fn tally_command() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tally"))
}

/// Run `tally ARGS PATHS` to completion.
pub fn tally(args: &[&str], paths: &[&Path]) -> Output {
    tally_command().args(args).args(paths).output().unwrap()
}

/// The exit code, -1 when killed by a signal.
pub fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

/// Standard output as text.
pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Standard error as text.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Standard output then standard error, for failure messages.
pub fn text(out: &Output) -> String {
    format!("{}{}", stdout(out), stderr(out))
}

/// Why FUSE cannot be used here, if it cannot.
pub fn fuse_unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not running as root".into());
    }
    if let Err(e) = OpenOptions::new().read(true).write(true).open("/dev/fuse") {
        return Some(format!("/dev/fuse unusable: {e}"));
    }
    None
}

/// Whether tests needing FUSE must run: under CI (`CI` set, as CI services do) or with
/// `TALLY_REQUIRE_FUSE` set, a test that cannot run fails instead of skipping ("", "0" and
/// "false" count as unset).
pub fn fuse_required() -> bool {
    let set =
        |name: &str| std::env::var(name).is_ok_and(|v| !matches!(v.as_str(), "" | "0" | "false"));
    set("CI") || set("TALLY_REQUIRE_FUSE")
}

/// Skip the calling test, saying why — or fail it where FUSE tests must run ([`fuse_required`]).
/// Returns true (the caller returns).
pub fn skip(why: &str) -> bool {
    assert!(
        !fuse_required(),
        "cannot run ({why}), and CI or TALLY_REQUIRE_FUSE requires this test to run"
    );
    eprintln!("skipped: {why}");
    true
}

/// True, after printing why, when a test needing FUSE must skip; fails the test instead where
/// FUSE tests must run ([`fuse_required`]).
pub fn skip_without_fuse() -> bool {
    match fuse_unavailable() {
        Some(why) => skip(&why),
        None => false,
    }
}

/// In `dir`: an image made by `tally mkfs --size SIZE` (which must succeed), an empty mount
/// point, and a path for the daemon's log, in that order.
pub fn mkfs_in(dir: &Path, size: &str) -> (PathBuf, PathBuf, PathBuf) {
    let (image, mnt, log) = (dir.join("image"), dir.join("mnt"), dir.join("log"));
    fs::create_dir_all(&mnt).unwrap();
    let out = tally(&["mkfs", "--size", size], &[&image]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    (image, mnt, log)
}

/// Return from the calling test, saying why, when FUSE cannot be used here (fail it instead
/// under CI or `TALLY_REQUIRE_FUSE`).
// The allows: unused in the test binaries that never mount.
#[allow(unused_macros)]
macro_rules! require_fuse {
    () => {
        if $crate::common::skip_without_fuse() {
            return;
        }
    };
}
#[allow(unused_imports)]
pub(crate) use require_fuse;

/// Detaches the mount when the test ends, however it ends.
pub struct Unmount(pub PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).output();
    }
}

/// `tally mount --log LOG IMAGE MNT`, which must succeed; its output and a guard on the mount.
pub fn mount_daemon(image: &Path, mnt: &Path, log: &Path) -> (Output, Unmount) {
    let out = tally(&["mount", "--log"], &[log, image, mnt]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    (out, Unmount(mnt.to_path_buf()))
}

/// [`mount_daemon`], and the daemon's pid that `tally mount` printed.
pub fn mount_daemon_pid(image: &Path, mnt: &Path, log: &Path) -> (i32, Unmount) {
    let (out, guard) = mount_daemon(image, mnt, log);
    (daemon_pid(&out), guard)
}

/// The daemon's pid in what `tally mount` printed ("… (daemon pid N, …)").
pub fn daemon_pid(out: &Output) -> i32 {
    let stdout = stdout(out);
    stdout
        .split("daemon pid ")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|digits| digits.parse().ok())
        .unwrap_or_else(|| panic!("no daemon pid in {stdout:?}"))
}

/// Kill the daemon `pid` with SIGKILL.
pub fn sigkill(pid: i32) {
    // SAFETY: kill on the daemon this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
}

/// `tally umount --lazy MNT`, which must succeed (the way to detach a killed daemon's mount).
pub fn umount_lazy(mnt: &Path) {
    let out = tally(&["umount", "--lazy"], &[mnt]);
    assert_eq!(code(&out), 0, "{}", text(&out));
}

/// The image mounted as a library after a SIGKILL: recovered from its log, not a snapshot.
pub fn recovered(image: &Path) -> Fs {
    let dev: Arc<dyn Device> = Arc::new(FileDevice::open(image, FileOptions::default()).unwrap());
    let fs = Fs::mount(dev, MountOptions::default()).unwrap();
    assert!(!fs.mount_report().from_snapshot, "no snapshot after SIGKILL");
    fs
}

/// fsck must find `fs` clean; then it is unmounted.
pub fn check_clean_and_unmount(fs: Fs) {
    let report = fs.fsck();
    assert!(report.is_clean(), "{:?}", report.problems);
    fs.unmount().unwrap();
}

/// Poll `cond` every 20 ms until it holds; fail after `within`.
pub fn wait_until(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

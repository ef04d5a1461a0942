//! `tally sync` makes a mount durable where `sync(1)` cannot: Linux (up to at least 6.18) does
//! not forward `sync`/`syncfs` to a FUSE server, and with write-behind the daemon holds changes
//! in memory for up to the commit interval. On both FUSE transports: changes nobody fsynced
//! (a file written, a directory made, a rename, an unlink), then `tally sync MNT`, then the
//! daemon SIGKILLed at once, then a remount: every change is there.
//!
//! The check can fail: the broken variant runs plain `sync` instead of `tally sync` and must see
//! changes lost (the maintenance round makes them durable every 5 s, so a try whose kill came
//! after one can keep them; the variant tries up to five times and needs one loss).

mod common;

use std::fs;
use std::path::Path;
use std::process::Command;

use common::{code, mkfs_in, require_fuse, scratch, sigkill, tally, text, umount_lazy};

/// What the workload leaves, checked after the remount.
const BIG: usize = 300 * 1024;

fn big_bytes() -> Vec<u8> {
    (0..BIG).map(|i| (i * 7 % 251) as u8).collect()
}

/// Mount with write-behind held long (60 s), on `transport`; the daemon's pid.
fn mount(image: &Path, mnt: &Path, log: &Path, transport: &str) -> i32 {
    let opts = format!("commit_ms=60000,io_uring={transport}");
    let out = tally(&["mount", "-o", &opts, "--log"], &[log, image, mnt]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let stdout = common::stdout(&out);
    stdout
        .split("daemon pid ")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|digits| digits.parse().ok())
        .unwrap_or_else(|| panic!("no daemon pid in {stdout:?}"))
}

/// One round: `gone` was made durable first (fsync of the file and its directory), then the
/// changes under test, then `how_to_sync`, SIGKILL, remount. Which changes survived.
fn round(dir: &Path, transport: &str, how_to_sync: &dyn Fn(&Path)) -> Vec<&'static str> {
    let (image, mnt, log) = mkfs_in(dir, "128M");
    let pid = mount(&image, &mnt, &log, transport);
    let gone = mnt.join("gone");
    fs::write(&gone, b"old").unwrap();
    fs::File::open(&gone).unwrap().sync_all().unwrap();
    fs::File::open(&mnt).unwrap().sync_all().unwrap();

    fs::write(mnt.join("big"), big_bytes()).unwrap();
    fs::create_dir(mnt.join("d")).unwrap();
    fs::write(mnt.join("d/tmp"), b"renamed").unwrap();
    fs::rename(mnt.join("d/tmp"), mnt.join("d/final")).unwrap();
    fs::remove_file(&gone).unwrap();
    how_to_sync(&mnt);
    sigkill(pid);
    umount_lazy(&mnt);

    let pid = mount(&image, &mnt, &log, transport);
    let mut kept = Vec::new();
    if fs::read(mnt.join("big")).is_ok_and(|b| b == big_bytes()) {
        kept.push("big");
    }
    if fs::read(mnt.join("d/final")).is_ok_and(|b| b == b"renamed") {
        kept.push("rename");
    }
    if !mnt.join("d/tmp").exists() && mnt.join("d").is_dir() {
        kept.push("mkdir");
    }
    if !gone.exists() {
        kept.push("unlink");
    }
    let out = tally(&["umount"], &[&mnt]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let _ = pid;
    let fsck = tally(&["fsck"], &[&image]);
    assert_eq!(code(&fsck), 0, "fsck after the kill: {}", text(&fsck));
    let _ = fs::remove_dir_all(dir);
    kept
}

fn tally_sync(mnt: &Path) {
    let out = tally(&["sync"], &[mnt]);
    assert_eq!(code(&out), 0, "{}", text(&out));
}

/// `tally sync` without a path: every Tally mount (found among the FUSE mounts), then sync(2).
fn tally_sync_all(_mnt: &Path) {
    let out = tally(&["sync"], &[]);
    assert_eq!(code(&out), 0, "{}", text(&out));
}

fn plain_sync(_mnt: &Path) {
    let out = Command::new("sync").output().unwrap();
    assert!(out.status.success());
}

const ALL: [&str; 4] = ["big", "rename", "mkdir", "unlink"];

#[test]
fn tally_sync_makes_unfsynced_changes_survive_a_daemon_kill() {
    require_fuse!();
    let ring = fs::read_to_string("/sys/module/fuse/parameters/enable_uring")
        .is_ok_and(|v| v.trim() == "Y");
    // Under CI the ring must be there (`.ci/run` switches it on); elsewhere it may be off.
    let transports: &[&str] =
        if ring || common::fuse_required() { &["on", "off"] } else { &["off"] };
    for &transport in transports {
        let dir = scratch("sync-cli", transport);
        let kept = round(&dir, transport, &tally_sync);
        assert_eq!(kept, ALL, "io_uring={transport}: after tally sync MNT and SIGKILL");
        let kept = round(&dir, transport, &tally_sync_all);
        assert_eq!(kept, ALL, "io_uring={transport}: after tally sync and SIGKILL");
    }
}

#[test]
fn plain_sync_is_not_enough_the_check_catches_it() {
    require_fuse!();
    for attempt in 0..5 {
        let dir = scratch("sync-cli-broken", &attempt.to_string());
        let kept = round(&dir, "off", &plain_sync);
        if kept.len() < ALL.len() {
            eprintln!("try {attempt}: plain sync kept only {kept:?}");
            return;
        }
    }
    panic!("plain sync kept every change in 5 tries: the check cannot tell");
}

#[test]
fn tally_sync_outside_a_mount_falls_back_to_syncfs_and_bad_paths_fail() {
    let dir = scratch("sync-cli", "plain");
    let out = tally(&["sync"], &[&dir]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let out = tally(&["sync"], &[&dir.join("missing")]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    assert!(text(&out).contains("missing"), "{}", text(&out));
    let _ = fs::remove_dir_all(&dir);
}

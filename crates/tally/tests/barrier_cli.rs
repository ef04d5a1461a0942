//! `tally barrier FILE…` as a user runs it: refused outside a Tally mount, accepted for files
//! and directories on a `tally mount` daemon (which needs root and /dev/fuse; the test says so
//! when it skips). What a barrier orders across a crash is the file-system crash explorer's
//! business (docs/FS-CRASH-TESTING.md); here only that the ioctl reaches the mount.

mod common;

use std::fs;

use common::{require_fuse, scratch, stderr, tally, Unmount};

#[test]
fn outside_a_tally_mount_a_barrier_is_refused_with_exit_1() {
    let dir = scratch("barrier-cli", "outside");
    let file = dir.join("f");
    fs::write(&file, b"x").unwrap();
    let out = tally(&["barrier"], &[&file]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains(&file.display().to_string()), "{}", stderr(&out));
    let missing = tally(&["barrier"], &[&dir.join("missing")]);
    assert_eq!(missing.status.code(), Some(1), "{}", stderr(&missing));
    let none = tally(&["barrier"], &[]);
    assert_eq!(none.status.code(), Some(2), "no FILE is a usage error");
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn on_a_tally_mount_files_and_directories_take_barriers() {
    require_fuse!();
    let dir = scratch("barrier-cli", "mount");
    let (image, mnt) = (dir.join("image"), dir.join("mnt"));
    fs::create_dir_all(&mnt).unwrap();
    let made = tally(&["mkfs", "--size", "64M"], &[&image]);
    assert!(made.status.success(), "{}", stderr(&made));
    let mounted = tally(&["mount"], &[&image, &mnt]);
    assert!(mounted.status.success(), "{}", stderr(&mounted));
    let guard = Unmount(mnt.clone());

    let log = mnt.join("journal");
    fs::write(&log, b"one\n").unwrap();
    let out = tally(&["barrier"], &[&log, &mnt]);
    assert!(out.status.success(), "{}", stderr(&out));
    // One missing file fails the command, the others still get their barrier.
    let out = tally(&["barrier"], &[&mnt.join("missing"), &log]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("missing"), "{}", stderr(&out));

    let unmounted = tally(&["umount"], &[&mnt]);
    assert!(unmounted.status.success(), "{}", stderr(&unmounted));
    std::mem::forget(guard);
    let checked = tally(&["fsck"], &[&image]);
    assert!(checked.status.success(), "fsck after barriers: {}", stderr(&checked));
    let _ = fs::remove_dir_all(&dir);
}

//! `tally mkfs`, `tally mount` and `tally umount` as a user runs them: the built binary on
//! temporary paths. The mount part needs root and /dev/fuse, and says so when it skips.

mod common;

use std::fs::{self, File};
use std::time::Duration;

use common::{code, require_fuse, scratch, stderr, stdout, tally, text, wait_until};

#[test]
fn mkfs_makes_sparse_images_and_refuses_to_overwrite() {
    let dir = scratch("mount-cli", "mkfs");
    let image = dir.join("image");

    let out = tally(&["mkfs"], &[&image]);
    assert_eq!(code(&out), 2, "a new image needs --size: {}", stderr(&out));
    assert!(stderr(&out).contains("--size"), "{}", stderr(&out));

    let out = tally(&["mkfs", "--size", "64M"], &[&image]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(fs::metadata(&image).unwrap().len(), 64 << 20);
    assert!(String::from_utf8_lossy(&out.stdout).contains("made a Tally file system"));

    let out = tally(&["mkfs"], &[&image]);
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    assert!(stderr(&out).contains("holds a Tally file system"), "{}", stderr(&out));
    let out = tally(&["mkfs", "--force", "--streams", "2"], &[&image]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));

    // An ext4 superblock magic, or any data, is refused too.
    let ext4 = dir.join("ext4");
    let f = File::create(&ext4).unwrap();
    f.set_len(64 << 20).unwrap();
    std::os::unix::fs::FileExt::write_at(&f, &0xEF53u16.to_le_bytes(), 1080).unwrap();
    let out = tally(&["mkfs"], &[&ext4]);
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    assert!(stderr(&out).contains("ext2/3/4"), "{}", stderr(&out));
    let data = dir.join("data");
    fs::write(&data, vec![7u8; 64 << 20]).unwrap();
    let out = tally(&["mkfs"], &[&data]);
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    assert!(stderr(&out).contains("holds data"), "{}", stderr(&out));

    // An empty existing file takes the size given.
    let empty = dir.join("empty");
    File::create(&empty).unwrap();
    let out = tally(&["mkfs", "--size", "64M"], &[&empty]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(fs::metadata(&empty).unwrap().len(), 64 << 20);

    // Too small for its streams: bad input, said so.
    let small = dir.join("small");
    let out = tally(&["mkfs", "--size", "8M"], &[&small]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("segments"), "{}", stderr(&out));
    assert!(!small.exists(), "a failed mkfs removes the file it created");

    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn mount_daemon_serves_until_umount_and_refuses_a_second_mount() {
    require_fuse!();
    let dir = scratch("mount-cli", "mount");
    let (image, mnt, mnt2, log) =
        (dir.join("image"), dir.join("mnt"), dir.join("mnt2"), dir.join("log"));
    fs::create_dir_all(&mnt).unwrap();
    fs::create_dir_all(&mnt2).unwrap();
    assert_eq!(code(&tally(&["mkfs", "--size", "128M"], &[&image])), 0);

    let (_, guard) = common::mount_daemon(&image, &mnt, &log);
    fs::write(mnt.join("hello"), b"world").unwrap();

    // The image is locked while served.
    let out = tally(&["mount", "--log"], &[&log, &image, &mnt2]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("in use"), "{}", stderr(&out));

    let out = tally(&["umount"], &[&mnt]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(!mnt.join("hello").exists());
    let text = fs::read_to_string(&log).unwrap();
    assert!(text.contains("unmounted cleanly"), "{text}");

    // Not a mount any more.
    assert_eq!(code(&tally(&["umount"], &[&mnt])), 2);

    // Served again, from the snapshot, in the foreground this time.
    let mut child = common::tally_command()
        .args(["mount", "--foreground"])
        .args([&image, &mnt])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("the foreground mount appeared", Duration::from_secs(30), || {
        mnt.join("hello").exists()
    });
    assert_eq!(fs::read(mnt.join("hello")).unwrap(), b"world");
    // SIGTERM unmounts cleanly.
    // SAFETY: kill on the pid of a child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(!mnt.join("hello").exists());
    drop(guard);
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn a_daemon_killed_with_sigkill_keeps_what_was_fsynced() {
    require_fuse!();
    let dir = scratch("mount-cli", "sigkill");
    let (image, mnt, log) = common::mkfs_in(&dir, "128M");
    let (pid, guard) = common::mount_daemon_pid(&image, &mnt, &log);

    for i in 0..20 {
        let mut f = File::create(mnt.join(format!("kept{i}"))).unwrap();
        std::io::Write::write_all(&mut f, format!("fsynced {i}").as_bytes()).unwrap();
        f.sync_all().unwrap();
    }
    fs::create_dir(mnt.join("d")).unwrap();
    File::open(&mnt).unwrap().sync_all().unwrap();
    fs::write(mnt.join("d/maybe"), b"not fsynced").unwrap();

    common::sigkill(pid);
    // The mount stays, disconnected, until unmounted; umount returns once the lock is free.
    common::umount_lazy(&mnt);

    // Recovered by scanning the log: everything fsynced is there, the file system is whole.
    let fs = common::recovered(&image);
    for i in 0..20 {
        let a = fs.lookup(tally_fs::ROOT, format!("kept{i}").as_bytes()).unwrap();
        assert_eq!(fs.read(a.ino, 0, 100).unwrap(), format!("fsynced {i}").as_bytes());
    }
    fs.lookup(tally_fs::ROOT, b"d").unwrap();
    common::check_clean_and_unmount(fs);
    drop(guard);
    let _ = fs::remove_dir_all(&dir);
}

/// A daemon killed after it wrote a checkpoint snapshot (while serving) must not be reported
/// as having written its unmount snapshot: the superblock points at a snapshot either way, and
/// only its checkpoint flag tells them apart. fsck says which it mounted from.
#[test]
fn a_killed_daemon_with_a_checkpoint_snapshot_is_not_said_to_have_written_its_own() {
    require_fuse!();
    let dir = scratch("mount-cli", "sigkill-checkpoint");
    let (image, mnt, log) = common::mkfs_in(&dir, "128M");
    // A 1 MiB replay budget: the 4 MiB written below takes at least one checkpoint snapshot.
    let out = tally(&["mount", "-o", "replay_budget_mib=1", "--log"], &[&log, &image, &mnt]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let guard = common::Unmount(mnt.clone());
    let pid = common::daemon_pid(&out);
    let chunk = vec![7u8; 1 << 20];
    for i in 0..4 {
        fs::write(mnt.join(format!("f{i}")), &chunk).unwrap();
    }
    let out = tally(&["sync"], &[&mnt]);
    assert_eq!(code(&out), 0, "{}", text(&out));

    common::sigkill(pid);
    let out = tally(&["umount", "--lazy"], &[&mnt]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(stdout(&out).contains("exited without a snapshot"), "{}", text(&out));
    assert!(!stdout(&out).contains("written its snapshot"), "{}", text(&out));
    assert!(stderr(&out).contains("checkpoint snapshot"), "{}", text(&out));
    drop(guard);

    let out = tally(&["fsck"], &[&image]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(stdout(&out).contains("mounted from a checkpoint snapshot"), "{}", text(&out));
    let out = tally(&["fsck", "--json"], &[&image]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["mount"]["from_checkpoint"], true, "{v}");
    let dev: std::sync::Arc<dyn tally_media::Device> = std::sync::Arc::new(
        tally_media::FileDevice::open(&image, tally_media::FileOptions::default()).unwrap(),
    );
    let fs = tally_fs::Fs::mount(dev, tally_fs::MountOptions::default()).unwrap();
    assert!(fs.mount_report().from_checkpoint, "{:?}", fs.mount_report());
    for i in 0..4 {
        let a = fs.lookup(tally_fs::ROOT, format!("f{i}").as_bytes()).unwrap();
        assert_eq!(fs.read(a.ino, 0, 1 << 20).unwrap(), chunk);
    }
    common::check_clean_and_unmount(fs);
    let _ = fs::remove_dir_all(&dir);
}

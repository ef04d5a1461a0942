//! `tally mkfs`, `tally mount` and `tally umount` as a user runs them: the built binary on
//! temporary paths. The mount part needs root and /dev/fuse, and says so when it skips.

use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tally-mount-cli-{}-{tag}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

fn tally(args: &[&str], paths: &[&Path]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tally")).args(args).args(paths).output().unwrap()
}

fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn mkfs_makes_sparse_images_and_refuses_to_overwrite() {
    let dir = scratch("mkfs");
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

#[test]
fn mount_daemon_serves_until_umount_and_refuses_a_second_mount() {
    if let Some(why) = fuse_unavailable() {
        eprintln!("skipped: {why}");
        return;
    }
    let dir = scratch("mount");
    let (image, mnt, mnt2, log) =
        (dir.join("image"), dir.join("mnt"), dir.join("mnt2"), dir.join("log"));
    fs::create_dir_all(&mnt).unwrap();
    fs::create_dir_all(&mnt2).unwrap();
    assert_eq!(code(&tally(&["mkfs", "--size", "128M"], &[&image])), 0);

    let out = tally(&["mount", "--log"], &[&log, &image, &mnt]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let guard = Unmount(mnt.clone());
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
    let mut child = Command::new(env!("CARGO_BIN_EXE_tally"))
        .args(["mount", "--foreground"])
        .args([&image, &mnt])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !mnt.join("hello").exists() {
        assert!(std::time::Instant::now() < deadline, "the foreground mount did not appear");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
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

/// Detach the mount if the test fails half way.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).output();
    }
}

#[test]
fn a_daemon_killed_with_sigkill_keeps_what_was_fsynced() {
    if let Some(why) = fuse_unavailable() {
        eprintln!("skipped: {why}");
        return;
    }
    let dir = scratch("sigkill");
    let (image, mnt, log) = (dir.join("image"), dir.join("mnt"), dir.join("log"));
    fs::create_dir_all(&mnt).unwrap();
    assert_eq!(code(&tally(&["mkfs", "--size", "128M"], &[&image])), 0);
    let out = tally(&["mount", "--log"], &[&log, &image, &mnt]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let guard = Unmount(mnt.clone());
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let pid: i32 = stdout
        .split("daemon pid ")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|digits| digits.parse().ok())
        .unwrap_or_else(|| panic!("no daemon pid in {stdout:?}"));

    for i in 0..20 {
        let mut f = File::create(mnt.join(format!("kept{i}"))).unwrap();
        std::io::Write::write_all(&mut f, format!("fsynced {i}").as_bytes()).unwrap();
        f.sync_all().unwrap();
    }
    fs::create_dir(mnt.join("d")).unwrap();
    File::open(&mnt).unwrap().sync_all().unwrap();
    fs::write(mnt.join("d/maybe"), b"not fsynced").unwrap();

    // SAFETY: kill on the daemon this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    // The mount stays, disconnected, until unmounted; umount returns once the lock is free.
    let out = tally(&["umount", "--lazy"], &[&mnt]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));

    // Recovered by scanning the log: everything fsynced is there, the file system is whole.
    let dev: std::sync::Arc<dyn tally_media::Device> = std::sync::Arc::new(
        tally_media::FileDevice::open(&image, tally_media::FileOptions::default()).unwrap(),
    );
    let fs = tally_fs::Fs::mount(dev, tally_fs::MountOptions::default()).unwrap();
    assert!(!fs.mount_report().from_snapshot, "no snapshot after SIGKILL");
    for i in 0..20 {
        let a = fs.lookup(tally_fs::ROOT, format!("kept{i}").as_bytes()).unwrap();
        assert_eq!(fs.read(a.ino, 0, 100).unwrap(), format!("fsynced {i}").as_bytes());
    }
    fs.lookup(tally_fs::ROOT, b"d").unwrap();
    let report = fs.fsck();
    assert!(report.is_clean(), "{:?}", report.problems);
    fs.unmount().unwrap();
    drop(guard);
    let _ = fs::remove_dir_all(&dir);
}

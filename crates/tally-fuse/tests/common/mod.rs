//! Helpers shared by the adapter's tests through the kernel: FUSE availability, a scratch
//! image with its mount directory, a mount served on a thread, polling.

// Each test binary compiles this module on its own and uses only some of it.
#![allow(dead_code)]

use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tally_fs::{Fs, MkfsOptions, MountOptions};
use tally_fuse::{FuseMutant, MountConfig, RequestCounts, RequestSnapshot, Unmounted};
use tally_media::{Device, FileDevice, FileOptions};

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

/// Return from the calling test, saying why, when FUSE cannot be used here (fail it instead
/// under CI or `TALLY_REQUIRE_FUSE`).
macro_rules! require_fuse {
    () => {
        if $crate::common::skip_without_fuse() {
            return;
        }
    };
}
pub(crate) use require_fuse;

/// A temporary image and mount directory, removed on drop.
pub struct Scratch {
    /// The directory holding `image` and `mnt`.
    pub root: PathBuf,
}

impl Scratch {
    /// A new 256 MiB image under `tally-{file}-{pid}-{tag}-{nanos}`; `file` names the test
    /// file, so tests in different files never share a directory.
    pub fn new(file: &str, tag: &str) -> Scratch {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let root =
            std::env::temp_dir().join(format!("tally-{file}-{}-{tag}-{nanos}", std::process::id()));
        fs::create_dir_all(root.join("mnt")).unwrap();
        let image = root.join("image");
        File::create(&image).unwrap().set_len(256 << 20).unwrap();
        Fs::mkfs(device(&image), &MkfsOptions::default()).unwrap();
        Scratch { root }
    }

    /// The image file.
    pub fn image(&self) -> PathBuf {
        self.root.join("image")
    }

    /// The mount directory.
    pub fn dir(&self) -> PathBuf {
        self.root.join("mnt")
    }

    /// Mount the image through the kernel, 4 threads, open to other users (`allow_other`).
    pub fn mount(&self) -> Served {
        self.serve(&MountConfig { allow_other: true, threads: 4, ..MountConfig::default() })
    }

    /// Mount the image through the kernel, 4 threads, with the adapter mutant `mutant` if any.
    pub fn mount_with(&self, mutant: Option<FuseMutant>) -> Served {
        self.serve(&MountConfig { threads: 4, mutant, ..MountConfig::default() })
    }

    /// Mount the image through the kernel with `cfg`, served on a thread.
    /// The transport is `cfg`'s unless `TALLY_FUSE_IO_URING` (`auto`, `on`, `off`) says
    /// otherwise for the whole run: CI runs the tests once with the ring and once through
    /// `/dev/fuse`.
    pub fn serve(&self, cfg: &MountConfig) -> Served {
        let mut cfg = cfg.clone();
        if let Ok(how) = std::env::var("TALLY_FUSE_IO_URING") {
            tally_fuse::parse_options(&format!("io_uring={how}"), &mut cfg).unwrap();
        }
        let fs = Fs::mount(device(&self.image()), MountOptions::default()).unwrap();
        Served::run(tally_fuse::mount(fs, &self.dir(), &cfg).unwrap(), self.dir())
    }

    /// Mount the image without FUSE, to look at it directly.
    pub fn open_fs(&self) -> Fs {
        Fs::mount(device(&self.image()), MountOptions::default()).unwrap()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = tally_fuse::unmount_dir(&self.dir(), true);
        let _ = fs::remove_dir_all(&self.root);
    }
}

/// The image file at `path` as a device.
fn device(path: &Path) -> Arc<dyn Device> {
    Arc::new(FileDevice::open(path, FileOptions::default()).unwrap())
}

/// A mount being served on a thread.
pub struct Served {
    /// The mount directory.
    pub dir: PathBuf,
    thread: Option<JoinHandle<Unmounted>>,
    requests: Arc<RequestCounts>,
    /// The test chose the transport itself, whatever `TALLY_FUSE_IO_URING` says.
    transport_chosen: bool,
}

impl Served {
    /// Serve `mounted` (mounted on `dir`, with the run's transport) on a thread.
    pub fn run(mounted: tally_fuse::Mounted, dir: PathBuf) -> Served {
        let requests = mounted.requests();
        let thread = std::thread::spawn(move || mounted.run().unwrap());
        Served { dir, thread: Some(thread), requests, transport_chosen: false }
    }

    /// As [`Served::run`], for a mount whose transport the test chose itself (the ring's own
    /// tests run it in the `/dev/fuse` pass too).
    pub fn run_with_chosen_transport(mounted: tally_fuse::Mounted, dir: PathBuf) -> Served {
        let mut served = Served::run(mounted, dir);
        served.transport_chosen = true;
        served
    }

    /// `name` inside the mount.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The kernel's requests to the mount so far.
    pub fn requests(&self) -> RequestSnapshot {
        self.requests.snapshot()
    }

    /// The kernel's number for this mount's FUSE connection (the minor of its device), which
    /// names its directory under `/sys/fs/fuse/connections`.
    pub fn connection(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        libc::minor(fs::metadata(&self.dir).unwrap().dev()).into()
    }

    /// End connection `connection` as `fusectl` does (every request waiting on it fails with
    /// `ENOTCONN`): how a test that found the mount hung frees the processes stuck in it.
    pub fn abort_connection(connection: u64) {
        let at = format!("/sys/fs/fuse/connections/{connection}/abort");
        if let Err(e) = fs::write(&at, "1") {
            eprintln!("could not abort FUSE connection {connection} ({at}): {e}");
        }
    }

    /// Unmount through the kernel and wait for the session to write its snapshot.
    pub fn unmount(mut self) -> Unmounted {
        let mut tries = 0;
        while let Err(e) = tally_fuse::unmount_dir(&self.dir, false) {
            // A release of a just-closed file may still be in flight: EBUSY for a moment.
            tries += 1;
            assert!(tries < 100, "unmount of {} failed: {e}", self.dir.display());
            std::thread::sleep(Duration::from_millis(20));
        }
        let outcome = self.thread.take().unwrap().join().unwrap();
        if !self.transport_chosen && std::env::var("TALLY_FUSE_IO_URING").is_ok_and(|v| v == "off")
        {
            assert_eq!(self.requests.ring(), 0, "io_uring=off, yet requests came over the ring");
        }
        outcome
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if self.thread.is_some() {
            let _ = tally_fuse::unmount_dir(&self.dir, true);
        }
    }
}

/// Poll `cond` every 10 ms until it holds; fail after `within`.
pub fn wait_until(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// An ext4 file system on a loop device, mounted beside a Tally mount so a test can run the
/// same commands on both; unmounted (and its loop device detached) on drop.
pub struct Ext4 {
    /// The mount directory.
    pub dir: PathBuf,
}

impl Ext4 {
    /// A 64 MiB ext4 image in `root`, mounted with `options` (`-o loop,OPTIONS`). Needs root,
    /// `mkfs.ext4` and loop devices: a test that compares with ext4 fails without them (they
    /// are as much a part of it as FUSE).
    pub fn new(root: &Path, options: &str) -> Ext4 {
        let image = root.join("ext4.img");
        let dir = root.join("ext4");
        fs::create_dir_all(&dir).unwrap();
        File::create(&image).unwrap().set_len(64 << 20).unwrap();
        let run = |args: &[&str]| {
            let out = std::process::Command::new(args[0]).args(&args[1..]).output().unwrap();
            assert!(
                out.status.success(),
                "{args:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        };
        let image_s = image.display().to_string();
        let dir_s = dir.display().to_string();
        run(&["mkfs.ext4", "-q", "-F", &image_s]);
        run(&["mount", "-o", &format!("loop,{options}"), &image_s, &dir_s]);
        Ext4 { dir }
    }
}

impl Drop for Ext4 {
    fn drop(&mut self) {
        // `mount -o loop` made the loop device auto-clearing: unmounting detaches it.
        let _ = std::process::Command::new("umount").arg(&self.dir).status();
    }
}

/// Run `script` with `sh -c` in `dir`, with umask 022; its standard output and error together,
/// and whether it succeeded.
pub fn sh_in(dir: &Path, script: &str) -> (String, bool) {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("umask 022; cd '{}' && {{ {script}\n}} 2>&1", dir.display()))
        .output()
        .unwrap();
    (String::from_utf8_lossy(&out.stdout).into_owned(), out.status.success())
}

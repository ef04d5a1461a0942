//! `tally atomic` of a package-sized tree through the mount (issue 15, large transactions):
//! a tar of some 3,000 files and 70 MiB, one file larger than a log segment, extracted inside
//! one transaction on a `tally mount` daemon.
//!
//! - Committed: every file is there with its bytes, and the whole transaction took one device
//!   flush (the daemon's device counters, logged on SIGUSR1, before and after).
//! - The same command failing at its end (`tar …; exit 1`): nothing of it is left.
//! - The daemon killed with SIGKILL at a random moment of the run (a few rounds, seeded; the
//!   seed is printed): after recovery nothing of the transaction is there (or all of it, if
//!   the kill fell inside the commit), everything committed before it is intact, fsck clean.
//!   Broken variant (`--features mutants`): the same crash recovered by a log that keeps a
//!   large transaction's parts without its close (`Mutant::RunUnclosedKept`) is caught.
//! - Larger than free space: `tally atomic` exits 1 (the command's ENOSPC) with the message
//!   of the abort; the file system is as it was (contents, fsck clean).
//!
//! Needs root and /dev/fuse (skips otherwise, fails under CI).

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{code, require_fuse, scratch, stderr, text};
use tally_fs::{Fs, ROOT};

/// A small deterministic generator (xorshift64*): the tree and the kill points from a seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Files in the tree, and the size of the one file larger than a segment (4 MiB).
const FILE_COUNT: usize = 3_000;
const BIG_FILE_BYTES: usize = 6 << 20;

/// The tree's files, relative paths and their bytes.
fn tree_files(seed: u64) -> Vec<(PathBuf, Vec<u8>)> {
    let mut rng = Rng(seed | 1);
    let mut files = Vec::with_capacity(FILE_COUNT + 1);
    for i in 0..FILE_COUNT {
        let dir = PathBuf::from(format!("pkg/m{:02}/s{}", i % 60, (i / 60) % 4));
        // Mostly small files, some medium, a few large (as a Python package's tree).
        let len = match rng.below(100) {
            0..=69 => 200 + rng.below(8 << 10),
            70..=95 => (8 << 10) + rng.below(56 << 10),
            _ => (64 << 10) + rng.below(448 << 10),
        };
        let mut bytes = vec![0u8; usize::try_from(len).unwrap()];
        for chunk in bytes.chunks_mut(8) {
            let word = rng.next().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
        files.push((dir.join(format!("f{i:04}.py")), bytes));
    }
    let big: Vec<u8> =
        (0..BIG_FILE_BYTES).map(|i| (i as u64).wrapping_mul(seed | 3) as u8).collect();
    files.push((PathBuf::from("pkg/data/big.bin"), big));
    files
}

/// Write the tree under `src` and tar it to `tar`; returns the files and the bytes in them.
fn make_tar(src: &Path, tar: &Path, seed: u64) -> (Vec<(PathBuf, Vec<u8>)>, usize) {
    let files = tree_files(seed);
    for (rel, bytes) in &files {
        let path = src.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, bytes).unwrap();
    }
    let out =
        Command::new("tar").arg("cf").arg(tar).arg("-C").arg(src).arg("pkg").output().unwrap();
    assert!(out.status.success(), "tar cf: {}", text(&out));
    let total = files.iter().map(|f| f.1.len()).sum();
    (files, total)
}

/// `tally atomic DIR -- sh -c SCRIPT`, not yet run.
fn atomic_command(dir: &Path, script: &str) -> Command {
    let mut cmd = common::tally_command();
    cmd.arg("atomic").arg(dir).args(["--", "sh", "-c", script]);
    cmd
}

/// The device's flush count of the daemon `pid`, from the counters it logs on SIGUSR1.
fn daemon_flushes(pid: i32, log: &Path) -> u64 {
    let lines = |log: &Path| {
        fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("device since open:"))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let before = lines(log).len();
    // SAFETY: kill on the daemon this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGUSR1) }, 0);
    common::wait_until("the daemon logged its counters", Duration::from_secs(10), || {
        lines(log).len() > before
    });
    let last = lines(log).pop().unwrap();
    last.split("flushes ")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|d| d.parse().ok())
        .unwrap_or_else(|| panic!("no flush count in {last:?}"))
}

/// `tally sync DIR`, which must succeed.
fn tally_sync(dir: &Path) {
    let out = common::tally(&["sync"], &[dir]);
    assert_eq!(code(&out), 0, "{}", text(&out));
}

/// Every file of `files` under `root` (on the mount) with its bytes.
fn assert_tree_on_mount(root: &Path, files: &[(PathBuf, Vec<u8>)]) {
    for (rel, bytes) in files {
        let got = fs::read(root.join(rel)).unwrap_or_else(|e| panic!("{}: {e}", rel.display()));
        assert!(
            got == *bytes,
            "{}: {} bytes read, {} expected",
            rel.display(),
            got.len(),
            bytes.len()
        );
    }
}

/// The inode at `path` (components) in a library-mounted `fs`.
fn lookup(fs: &Fs, path: &Path) -> Option<tally_fs::Attr> {
    let mut attr = fs.getattr(ROOT).ok()?;
    for name in path.iter() {
        attr = fs.lookup(attr.ino, name.as_encoded_bytes()).ok()?;
    }
    Some(attr)
}

/// The bytes of the file at `path` in `fs`.
fn read_lib(fs: &Fs, path: &Path) -> Option<Vec<u8>> {
    let attr = lookup(fs, path)?;
    fs.read(attr.ino, 0, usize::try_from(attr.size).ok()?).ok()
}

/// What a recovery must show: the files committed before (`kept`) with their bytes; of the
/// transaction's tree under `txn_dir`, nothing, or everything when `may_be_whole`. Returns the
/// first violation, and whether the tree was there (whole).
fn check_recovered(
    fs: &Fs,
    kept: &[(PathBuf, Vec<u8>)],
    txn_dir: &Path,
    txn_files: &[(PathBuf, Vec<u8>)],
    may_be_whole: bool,
) -> Result<bool, String> {
    for (rel, bytes) in kept {
        match read_lib(fs, rel) {
            Some(got) if got == *bytes => {}
            Some(got) => {
                return Err(format!(
                    "{}: {} bytes, {} expected",
                    rel.display(),
                    got.len(),
                    bytes.len()
                ))
            }
            None => return Err(format!("{} lost", rel.display())),
        }
    }
    let whole = if lookup(fs, txn_dir).is_none() {
        false
    } else if !may_be_whole {
        return Err(format!("{} survived without its commit", txn_dir.display()));
    } else {
        for (rel, bytes) in txn_files {
            if read_lib(fs, &txn_dir.join(rel)).as_ref() != Some(bytes) {
                return Err(format!(
                    "{} partly committed: {} wrong",
                    txn_dir.display(),
                    rel.display()
                ));
            }
        }
        true
    };
    let report = fs.fsck();
    if !report.is_clean() {
        return Err(format!("fsck: {:?}", report.problems));
    }
    Ok(whole)
}

/// The seed: `TALLY_TEST_SEED` to replay a run, else from the clock.
fn seed() -> u64 {
    std::env::var("TALLY_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
            as u64
    })
}

/// Mount options for the flush count: no online checkpoint snapshot (`replay_budget_mib=0`)
/// right after the commit, whose own flushes would land in the count.
fn mount(image: &Path, mnt: &Path, log: &Path, options: &[&str]) -> (i32, common::Unmount) {
    let mut cmd = common::tally_command();
    cmd.arg("mount").arg("--log").arg(log);
    for o in options {
        cmd.args(["-o", o]);
    }
    let out = cmd.arg(image).arg(mnt).output().unwrap();
    assert_eq!(code(&out), 0, "{}", text(&out));
    (common::daemon_pid(&out), common::Unmount(mnt.to_path_buf()))
}

/// Wait for `child` up to `within`; its exit code, or `None` if it is still running.
fn wait_for(child: &mut Child, within: Duration) -> Option<i32> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status.code().unwrap_or(-1));
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_package_sized_tree_commits_with_one_flush_and_a_failure_or_a_kill_leaves_nothing() {
    require_fuse!();
    let seed = seed();
    eprintln!("seed {seed} (TALLY_TEST_SEED={seed} replays the tree and the kill points)");
    let dir = scratch("atomic-large", "tree");
    let tar = dir.join("pkg.tar");
    let (files, bytes) = make_tar(&dir.join("src"), &tar, seed);
    assert!((64 << 20..=128 << 20).contains(&bytes), "tree of {bytes} bytes");
    let (image, mnt, log) = common::mkfs_in(&dir, "768M");
    let m = mnt.display().to_string();
    let t = tar.display().to_string();

    // Committed before the transaction, durably: must survive everything below.
    let (daemon, guard) = mount(&image, &mnt, &log, &["replay_budget_mib=0"]);
    let kept: Vec<(PathBuf, Vec<u8>)> = (0..20)
        .map(|i| (PathBuf::from(format!("etc/c{i}.conf")), format!("setting {i}\n").into_bytes()))
        .collect();
    fs::create_dir(mnt.join("etc")).unwrap();
    for (rel, b) in &kept {
        fs::write(mnt.join(rel), b).unwrap();
    }
    fs::create_dir(mnt.join("a")).unwrap();
    tally_sync(&mnt);

    // Committed: the whole tree, one flush.
    let flushes_before = daemon_flushes(daemon, &log);
    let started = Instant::now();
    let out = atomic_command(&mnt, &format!("tar xf {t} -C {m}/a")).output().unwrap();
    let run_time = started.elapsed();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let flushes = daemon_flushes(daemon, &log) - flushes_before;
    eprintln!(
        "tally atomic of {} files, {:.1} MiB: {run_time:.2?}, {flushes} device flush(es)",
        files.len(),
        bytes as f64 / f64::from(1 << 20)
    );
    assert_eq!(flushes, 1, "a durable atomic commit of the tree takes one flush");
    assert_tree_on_mount(&mnt.join("a"), &files);

    // Failing at the end: nothing kept, however much was written.
    let out = atomic_command(&mnt, &format!("mkdir {m}/b && tar xf {t} -C {m}/b && exit 1"))
        .output()
        .unwrap();
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(stderr(&out).contains("nothing it changed is kept"), "{}", stderr(&out));
    assert!(!mnt.join("b").exists(), "the failed command's tree is still there");
    assert_tree_on_mount(&mnt.join("a"), &files[..50]);

    // Killed at random moments of the run: nothing of it after recovery (or all of it when the
    // kill fell inside the commit), the rest intact.
    let mut kept_all = kept.clone();
    kept_all.extend(files.iter().map(|(rel, b)| (Path::new("a").join(rel), b.clone())));
    let mut rng = Rng(seed ^ 0x9e37_79b9_7f4a_7c15);
    let mut daemon = daemon;
    let mut guard = guard;
    let mut nothing_left = 0;
    #[cfg(feature = "mutants")]
    let mut mutant_caught = false;
    // Kill points scale with the first run's time, but later runs are faster (the tarball and
    // the tree in the page cache): each round whose command had already finished halves the
    // window of the next, and rounds go on (up to 8) until one kill fell inside a run.
    let mut millis = u64::try_from(run_time.as_millis()).unwrap().max(100);
    let mut round = 0;
    while round < 3 || (nothing_left == 0 && round < 8) {
        let txn_dir = PathBuf::from(format!("k{round}"));
        // Between a tenth and nine tenths of the window.
        let delay = Duration::from_millis(millis / 10 + rng.below(millis * 8 / 10));
        let mut running = atomic_command(
            &mnt,
            &format!("mkdir {m}/{0} && tar xf {t} -C {m}/{0}", txn_dir.display()),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
        let finished = wait_for(&mut running, delay);
        common::sigkill(daemon);
        common::umount_lazy(&mnt);
        let _ = running.wait();
        drop(guard);
        eprintln!("round {round}: daemon killed after {delay:?} (atomic finished: {finished:?})");
        if finished.is_some() {
            millis = (millis / 2).max(20);
        }

        #[cfg(feature = "mutants")]
        if finished.is_none() {
            let copy = dir.join("image.mutant");
            fs::copy(&image, &copy).unwrap();
            let verdict = match recovered_with(&copy, Some(tally_log::Mutant::RunUnclosedKept)) {
                Err(e) => Err(format!("mount failed: {e}")),
                Ok(fs) => {
                    let r = check_recovered(&fs, &kept_all, &txn_dir, &files, false);
                    let _ = fs.unmount();
                    r.map(|_| ())
                }
            };
            let caught = verdict.is_err();
            eprintln!("round {round}: run-unclosed-kept: {verdict:?}");
            mutant_caught |= caught;
            let _ = fs::remove_file(&copy);
        }

        let fs = common::recovered(&image);
        // A kill inside the commit may leave the whole tree; never a part of it.
        let whole = check_recovered(&fs, &kept_all, &txn_dir, &files, true)
            .unwrap_or_else(|e| panic!("round {round} (seed {seed}): {e}"));
        if finished == Some(0) {
            assert!(whole, "round {round}: committed before the kill, yet not all there");
        }
        if !whole {
            nothing_left += 1;
        }
        fs.unmount().unwrap();
        (daemon, guard) = mount(&image, &mnt, &log, &["replay_budget_mib=0"]);
        // What the recovered file system holds is served again.
        assert_tree_on_mount(&mnt.join("a"), &files[..50]);
        if whole {
            let out =
                atomic_command(&mnt, &format!("rm -r {m}/{}", txn_dir.display())).output().unwrap();
            assert_eq!(code(&out), 0, "{}", stderr(&out));
        }
        round += 1;
    }
    assert!(nothing_left > 0, "every kill fell after the commit: the crash case was not tested");
    #[cfg(feature = "mutants")]
    assert!(mutant_caught, "a log keeping a transaction's parts without its close went unnoticed");
    let _ = daemon;
    let out = common::tally(&["umount"], &[&mnt]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    drop(guard);
    let out = common::tally(&["fsck"], &[&image]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let _ = fs::remove_dir_all(&dir);
}

/// The image mounted as a library after a SIGKILL, by a log with `mutant` (recovery only).
#[cfg(feature = "mutants")]
fn recovered_with(image: &Path, mutant: Option<tally_log::Mutant>) -> Result<Fs, String> {
    use std::sync::Arc;
    use tally_media::{Device, FileDevice, FileOptions};
    let dev = FileDevice::open(image, FileOptions::default()).map_err(|e| e.to_string())?;
    let dev: Arc<dyn Device> = Arc::new(dev);
    let opts = tally_fs::MountOptions { log_mutant: mutant, ..Default::default() };
    Fs::mount(dev, opts).map_err(|e| e.to_string())
}

#[test]
fn a_transaction_larger_than_free_space_fails_with_enospc_and_changes_nothing() {
    require_fuse!();
    let seed = seed();
    let dir = scratch("atomic-large", "enospc");
    let tar = dir.join("pkg.tar");
    let (files, bytes) = make_tar(&dir.join("src"), &tar, seed);
    // Some 40 MiB free for a tree of 70 MiB.
    let (image, mnt, log) = common::mkfs_in(&dir, "96M");
    let (m, t) = (mnt.display().to_string(), tar.display().to_string());
    let (_daemon, guard) = mount(&image, &mnt, &log, &[]);
    fs::create_dir(mnt.join("etc")).unwrap();
    let kept: Vec<(PathBuf, Vec<u8>)> = (0..10)
        .map(|i| (PathBuf::from(format!("etc/c{i}.conf")), vec![b'a' + i as u8; 3000 * (i + 1)]))
        .collect();
    for (rel, b) in &kept {
        fs::write(mnt.join(rel), b).unwrap();
    }
    tally_sync(&mnt);
    let free_before = statvfs_free(&mnt);
    assert!(
        (free_before as usize) < bytes,
        "{free_before} bytes free: the {bytes}-byte tree ({} files) would fit",
        files.len()
    );

    let out =
        atomic_command(&mnt, &format!("mkdir {m}/pkg && tar xf {t} -C {m}/pkg")).output().unwrap();
    let err = stderr(&out);
    assert_eq!(code(&out), 2, "tar's exit status is passed on: {err}");
    assert!(err.contains("No space left on device"), "{err}");
    assert!(err.contains("aborted, nothing it changed is kept"), "{err}");
    assert!(!mnt.join("pkg").exists(), "part of the transaction is still there");
    for (rel, b) in &kept {
        assert_eq!(fs::read(mnt.join(rel)).unwrap(), *b, "{}", rel.display());
    }
    // The space its parts took is free again (dead, for cleaning): a file of a few MiB fits.
    let free_after = statvfs_free(&mnt);
    assert!(free_after + (1 << 20) >= free_before, "free {free_before} -> {free_after} bytes");
    fs::write(mnt.join("after"), vec![7u8; 3 << 20]).unwrap();
    fs::remove_file(mnt.join("after")).unwrap();

    let out = common::tally(&["umount"], &[&mnt]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    drop(guard);
    let out = common::tally(&["fsck"], &[&image]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let (_daemon, guard) = mount(&image, &mnt, &log, &[]);
    for (rel, b) in &kept {
        assert_eq!(fs::read(mnt.join(rel)).unwrap(), *b, "{}", rel.display());
    }
    assert!(!mnt.join("pkg").exists());
    let out = common::tally(&["umount"], &[&mnt]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    drop(guard);
    let _ = fs::remove_dir_all(&dir);
}

/// Bytes free for unprivileged use under `dir`, as `df` shows them.
fn statvfs_free(dir: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
    // SAFETY: statvfs fills the struct it is given; the path is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(path.as_ptr(), &mut st) }, 0);
    st.f_bavail * st.f_frsize
}

//! `tally atomic DIR -- CMD` as a user runs it, on a `tally mount` daemon: commands that
//! succeed, fail, are killed, leave children writing after they exit, or whose `tally atomic`
//! is killed; another process writing meanwhile; then the daemon killed with SIGKILL and the
//! image recovered from its log, to see what was made durable. The mount part needs root and
//! /dev/fuse, and says so when it skips.

mod common;

use std::fs;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{code, require_fuse, scratch, stderr, tally, wait_until};

/// `tally atomic DIR -- sh -c SCRIPT`, not yet run.
fn atomic_command(dir: &Path, script: &str) -> Command {
    let mut cmd = common::tally_command();
    cmd.arg("atomic").arg(dir).args(["--", "sh", "-c", script]);
    cmd
}

/// `tally atomic DIR -- sh -c SCRIPT`, run to completion.
fn atomic(dir: &Path, script: &str) -> Output {
    atomic_command(dir, script).output().unwrap()
}

/// How long a command on the mount gets to reach a step.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);

fn read(p: &Path) -> Option<String> {
    fs::read_to_string(p).ok()
}

#[test]
fn outside_a_tally_mount_it_refuses_to_run_the_command() {
    let dir = scratch("atomic-cli", "refuse");
    let marker = dir.join("ran");
    let out = atomic(&dir, &format!("touch {}", marker.display()));
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert!(stderr(&out).contains("not a file on a Tally mount"), "{}", stderr(&out));
    assert!(!marker.exists(), "the command ran without a transaction");
    let out = tally(&["atomic"], &[&dir]);
    assert_eq!(code(&out), 2, "a command is required: {}", stderr(&out));
    let out = tally(&["atomic", "--help"], &[]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("Exit status"));
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn commands_commit_on_success_and_abort_otherwise() {
    require_fuse!();
    let dir = scratch("atomic-cli", "mount");
    let (image, mnt, log) = common::mkfs_in(&dir, "128M");
    let (daemon, guard) = common::mount_daemon_pid(&image, &mnt, &log);
    let m = mnt.display().to_string();
    fs::create_dir(mnt.join("etc")).unwrap();
    fs::write(mnt.join("etc/a.conf"), "a=1\n").unwrap();
    fs::write(mnt.join("etc/b.conf"), "b=1\n").unwrap();

    // Exit 0: every change kept.
    let out = atomic(
        &mnt,
        &format!(
            "echo a=2 > {m}/etc/a.conf && echo b=2 > {m}/etc/b.conf && echo c=2 > {m}/etc/c.conf \
             && mv {m}/etc/c.conf {m}/etc/c2.conf"
        ),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(read(&mnt.join("etc/a.conf")).as_deref(), Some("a=2\n"));
    assert_eq!(read(&mnt.join("etc/c2.conf")).as_deref(), Some("c=2\n"));

    // Exit 1 half way: nothing kept, the command's status passed on.
    let out = atomic(&mnt, &format!("echo a=3 > {m}/etc/a.conf; rm {m}/etc/b.conf; exit 1"));
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(stderr(&out).contains("aborted"), "{}", stderr(&out));
    assert_eq!(read(&mnt.join("etc/a.conf")).as_deref(), Some("a=2\n"));
    assert_eq!(read(&mnt.join("etc/b.conf")).as_deref(), Some("b=2\n"));

    // Killed by a signal: nothing kept, 128 + 9.
    let out = atomic(&mnt, &format!("echo a=4 > {m}/etc/a.conf; kill -9 $$"));
    assert_eq!(code(&out), 137, "{}", stderr(&out));
    assert_eq!(read(&mnt.join("etc/a.conf")).as_deref(), Some("a=2\n"));

    // A child writing after its parent exited is inside: waited for, then committed …
    let out = atomic(
        &mnt,
        &format!("(sleep 0.5; echo late > {m}/late) & echo early > {m}/early; exit 0"),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stderr(&out).contains("waiting for the processes"), "{}", stderr(&out));
    assert_eq!(read(&mnt.join("late")).as_deref(), Some("late\n"));
    assert_eq!(read(&mnt.join("early")).as_deref(), Some("early\n"));
    // … or aborted with the rest.
    let out = atomic(
        &mnt,
        &format!("(sleep 0.5; echo late > {m}/late2) & echo early > {m}/early2; exit 3"),
    );
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    assert!(read(&mnt.join("late2")).is_none() && read(&mnt.join("early2")).is_none());

    // Another process writing an unrelated file meanwhile keeps its change; a file the
    // transaction holds is refused to it (EBUSY after the mount's 100 ms) instead of blocking.
    let mut running = atomic_command(
        &mnt,
        &format!("echo in > {m}/in; echo a=5 > {m}/etc/a.conf; sleep 1; exit 1"),
    )
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    wait_until("the command wrote", STEP_TIMEOUT, || mnt.join("in").exists());
    fs::write(mnt.join("outside"), "mine\n").unwrap();
    let started = Instant::now();
    let refused = fs::write(mnt.join("etc/a.conf"), "a=outside\n").unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EBUSY), "{refused}");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert_eq!(running.wait().unwrap().code(), Some(1));
    assert_eq!(read(&mnt.join("outside")).as_deref(), Some("mine\n"));
    assert!(read(&mnt.join("in")).is_none());
    assert_eq!(read(&mnt.join("etc/a.conf")).as_deref(), Some("a=2\n"));

    // `tally atomic` itself killed: its open file closes and the mount aborts.
    let mut doomed = atomic_command(&mnt, &format!("echo doomed > {m}/doomed; sleep 2"))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("the doomed command wrote", STEP_TIMEOUT, || mnt.join("doomed").exists());
    doomed.kill().unwrap();
    doomed.wait().unwrap();
    wait_until("the mount aborted", STEP_TIMEOUT, || !mnt.join("doomed").exists());

    // The daemon killed: only the durably committed transactions are on the media.
    common::sigkill(daemon);
    common::umount_lazy(&mnt);
    let fs = common::recovered(&image);
    let content = |path: &[&str]| -> Option<Vec<u8>> {
        let mut ino = tally_fs::ROOT;
        for name in path {
            ino = fs.lookup(ino, name.as_bytes()).ok()?.ino;
        }
        fs.read(ino, 0, 100).ok()
    };
    assert_eq!(content(&["etc", "a.conf"]).as_deref(), Some(&b"a=2\n"[..]));
    assert_eq!(content(&["etc", "b.conf"]).as_deref(), Some(&b"b=2\n"[..]));
    assert_eq!(content(&["etc", "c2.conf"]).as_deref(), Some(&b"c=2\n"[..]));
    assert_eq!(content(&["etc", "c.conf"]), None);
    assert_eq!(content(&["late"]).as_deref(), Some(&b"late\n"[..]));
    assert_eq!(content(&["early"]).as_deref(), Some(&b"early\n"[..]));
    for gone in ["late2", "early2", "in", "doomed"] {
        assert_eq!(content(&[gone]), None, "{gone} survived its abort");
    }
    common::check_clean_and_unmount(fs);
    drop(guard);
    let _ = fs::remove_dir_all(&dir);
}

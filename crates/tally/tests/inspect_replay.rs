//! `tally inspect` shows the replay budget and where the last checkpoint is (issue 15 part 2):
//! on an image left by a crash after a long write loop, with online checkpoints (a small
//! budget) and without them, it names the checkpoint snapshot and each stream's checkpoint,
//! and what a crash recovery reads, which the budget keeps short; and `tally mount -o
//! replay_budget_mib=N` sets the budget a daemon checkpoints by.

mod common;

use std::fs;
use std::path::Path;
use std::sync::Arc;

use common::{code, require_fuse, scratch, sigkill, stdout, tally, text, umount_lazy};
use tally_fs::{Fs, MountOptions, Owner, ROOT};
use tally_media::{Device, FileDevice, FileOptions};

const ME: Owner = Owner { uid: 0, gid: 0 };

/// `tally mkfs` an image, then through the library: 256 MiB of 64 KiB overwrites of one file
/// with `replay_budget` (bytes; 0: no online checkpoint), synced, and a crash (no unmount).
fn crashed_image(image: &Path, replay_budget: u64) {
    let out = tally(&["mkfs", "--size", "1G"], &[image]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let dev: Arc<dyn Device> = Arc::new(FileDevice::open(image, FileOptions::default()).unwrap());
    let opts = MountOptions { replay_budget: Some(replay_budget), ..MountOptions::default() };
    let fs = Fs::mount(dev, opts).unwrap();
    let ino = fs.create(None, ROOT, b"f", 0o644, ME).unwrap().ino;
    for i in 0..4096u64 {
        let chunk = vec![(i as u8) | 1; 64 << 10];
        fs.write(None, ino, (i % 16) * (64 << 10), &chunk).unwrap();
        // Synced, but no `maintain`: its cleaning would free the dead segments and so
        // shorten the log without any checkpoint snapshot.
        if i % 16 == 15 {
            fs.sync().unwrap();
        }
    }
    fs.sync().unwrap();
    drop(fs); // a crash: no unmount snapshot
}

/// `tally inspect --json` and `tally inspect` of `image`, which must succeed.
fn inspect(image: &Path) -> (serde_json::Value, String) {
    let out = tally(&["inspect", "--json"], &[image]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let json = serde_json::from_str(&stdout(&out)).unwrap();
    let out = tally(&["inspect"], &[image]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    (json, stdout(&out))
}

#[test]
fn inspect_shows_the_replay_budget_and_the_last_checkpoint() {
    let dir = scratch("inspect-replay", "budget");
    let with = dir.join("with-budget");
    let without = dir.join("without");
    crashed_image(&with, 1 << 20);
    crashed_image(&without, 0);
    let (a, a_text) = inspect(&with);
    let (b, b_text) = inspect(&without);

    // Where the last checkpoint is: the checkpoint snapshot (with a budget) and each stream's.
    let sb = &a["superblock"];
    assert!(sb["checkpoint_snapshot_generation"].is_u64(), "{sb}");
    let segment = sb["snapshot_segment"].as_u64().expect("the checkpoint snapshot's segment");
    assert!(a_text.contains("checkpoint snapshot (generation"), "{a_text}");
    assert!(a_text.contains(&format!("starts at segment {segment}")), "{a_text}");
    assert!(b["superblock"]["checkpoint_snapshot_generation"].is_null());
    for s in a["streams"].as_array().unwrap() {
        assert!(s["checkpoint"]["segment"].is_u64(), "{s}");
    }
    assert!(a_text.contains("  checkpoint: seq "), "{a_text}");
    // What each stream replays on top of the checkpoint snapshot: the transactions the mount
    // replayed, not 'nothing to replay' as after a clean unmount's snapshot.
    let kept: u64 = a["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["recovered"]["transactions"].as_u64().unwrap())
        .sum();
    assert_eq!(kept, a["mount"]["transactions_replayed"].as_u64().unwrap(), "{a}");
    assert!(a_text.contains("durable: [the checkpoint snapshot's state]["), "{a_text}");
    assert!(!a_text.contains("nothing to replay"), "{a_text}");

    // The replay budget, and what a crash recovery reads against it.
    let read = |v: &serde_json::Value| v["replay"]["recovery_read_bytes"].as_u64().unwrap();
    assert_eq!(a["replay"]["budget_default_mib"], 64);
    assert!(a_text.contains("replay budget 64 MiB by default"), "{a_text}");
    assert!(b_text.contains("replay budget 64 MiB by default"), "{b_text}");
    let (with_read, without_read) = (read(&a), read(&b));
    assert!(with_read > 0);
    assert_eq!(
        with_read,
        a["mount"]["blocks_read"].as_u64().unwrap() * 4096,
        "the recovery's read is the mount's"
    );
    // 256 MiB written: without a checkpoint the recovery reads all of it; with a 1 MiB
    // budget, the snapshot and the budget's log, in whole 4 MiB segments, and those around it.
    assert!(without_read > 200 << 20, "without a budget: {without_read} bytes read");
    assert!(with_read < without_read / 2, "with {with_read}, without {without_read}");
    assert!(a_text.contains(&format!("a crash recovery reads {} KiB", with_read.div_ceil(1024))));
    eprintln!("recovery reads {with_read} bytes with a 1 MiB budget, {without_read} without");
    eprintln!("{a_text}");
    let _ = fs::remove_dir_all(&dir);
}

/// `tally mount -o replay_budget_mib=N` (needs FUSE): `budget_mib` MiB, then 128 MiB of 1 MiB
/// overwrites of one file through the mount, fsynced every 4 MiB, and the daemon SIGKILLed.
fn killed_daemon_image(dir: &Path, name: &str, budget_mib: u64) -> std::path::PathBuf {
    let image = dir.join(name);
    let mnt = dir.join(format!("{name}-mnt"));
    let log = dir.join(format!("{name}.log"));
    fs::create_dir_all(&mnt).unwrap();
    let out = tally(&["mkfs", "--size", "1G"], &[&image]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let option = format!("replay_budget_mib={budget_mib}");
    let mut cmd = common::tally_command();
    cmd.arg("mount").arg("--log").arg(&log).args(["-o", &option]).arg(&image).arg(&mnt);
    let out = cmd.output().unwrap();
    assert_eq!(code(&out), 0, "{}", text(&out));
    let guard = common::Unmount(mnt.clone());
    let pid = common::daemon_pid(&out);
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut f = fs::File::create(mnt.join("f")).unwrap();
        for i in 0..128u64 {
            f.seek(SeekFrom::Start((i % 8) << 20)).unwrap();
            f.write_all(&vec![(i as u8) | 1; 1 << 20]).unwrap();
            if i % 4 == 3 {
                f.sync_all().unwrap();
            }
        }
    }
    sigkill(pid);
    umount_lazy(&mnt);
    drop(guard);
    image
}

#[test]
fn the_mount_option_sets_the_budget_the_daemon_checkpoints_by() {
    require_fuse!();
    let dir = scratch("inspect-replay", "mount-option");
    let small = killed_daemon_image(&dir, "budget-4", 4);
    let off = killed_daemon_image(&dir, "budget-0", 0);
    let (a, _) = inspect(&small);
    let (b, _) = inspect(&off);
    // With a 4 MiB budget the daemon wrote checkpoint snapshots; with 0 (online checkpoints
    // off) none, and the recovery reads the whole history.
    assert!(a["superblock"]["checkpoint_snapshot_generation"].is_u64(), "{}", a["superblock"]);
    assert!(b["superblock"]["checkpoint_snapshot_generation"].is_null(), "{}", b["superblock"]);
    let read = |v: &serde_json::Value| v["replay"]["recovery_read_bytes"].as_u64().unwrap();
    let (small_read, off_read) = (read(&a), read(&b));
    eprintln!(
        "after a SIGKILL: recovery reads {small_read} bytes (4 MiB budget), {off_read} (none)"
    );
    assert!(off_read >= 128 << 20, "without checkpoints: {off_read} bytes read");
    assert!(small_read < off_read, "4 MiB budget {small_read}, none {off_read}");
    let _ = fs::remove_dir_all(&dir);
}

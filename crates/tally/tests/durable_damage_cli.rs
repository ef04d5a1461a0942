//! Issue 12, finding 3, as a user meets it: five 4 KiB appends to one file through the mount,
//! each fsync'd; the daemon killed; one bit flipped in the second append's data block. The log
//! proves appends 2–5 durable, so this is corruption, not a torn tail: `tally fsck` must say so
//! (exit 4, image unchanged), `tally mount` must refuse, and `tally fsck --salvage --force` must
//! keep the safe prefix, say what it dropped, and leave an image that checks clean.

mod common;

use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::time::Duration;

use common::{code, require_fuse, stdout, tally, text};

const APPEND: usize = 4096;

/// Offset in `image` of the one 4 KiB-aligned block made entirely of `byte`.
fn find_block(image: &Path, byte: u8) -> u64 {
    let bytes = fs::read(image).unwrap();
    let hits: Vec<usize> = bytes
        .chunks_exact(APPEND)
        .enumerate()
        .filter(|(_, b)| b.iter().all(|&x| x == byte))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(hits.len(), 1, "blocks of {byte:#x}: {hits:?}");
    (hits[0] * APPEND) as u64
}

fn flip_bit(image: &Path, offset: u64) {
    let f = OpenOptions::new().read(true).write(true).open(image).unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, offset + 100).unwrap();
    b[0] ^= 0x04;
    f.write_all_at(&b, offset + 100).unwrap();
    f.sync_all().unwrap();
}

#[test]
fn damage_to_fsynced_appends_is_reported_refused_and_salvaged() {
    require_fuse!();
    let dir = common::scratch("durable_damage_cli", "appends");
    let (image, mnt, log) = common::mkfs_in(&dir, "64M");
    let (pid, guard) = common::mount_daemon_pid(&image, &mnt, &log);
    {
        let mut f = fs::File::create(mnt.join("f")).unwrap();
        for i in 0..5u8 {
            f.write_all(&[0xA0 + i; APPEND]).unwrap();
            f.sync_all().unwrap();
        }
    }
    common::sigkill(pid);
    common::umount_lazy(&mnt);
    drop(guard);
    common::wait_until("the daemon releases the image", Duration::from_secs(10), || {
        code(&tally(&["fsck"], &[&image])) != 3
    });

    // Undamaged, the image recovers all five appends (checked by fsck on a copy).
    let copy = dir.join("copy");
    fs::copy(&image, &copy).unwrap();
    let out = tally(&["fsck"], &[&copy]);
    assert_eq!(code(&out), 0, "{}", text(&out));

    flip_bit(&image, find_block(&image, 0xA1));
    let before = fs::read(&image).unwrap();
    let out = tally(&["fsck", "--json"], &[&image]);
    assert_eq!(code(&out), 4, "{}", text(&out));
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(json["status"], "corrupt");
    let error = json["error"].as_str().unwrap_or_default();
    assert!(error.contains("proves durable"), "{error}");
    assert_eq!(fs::read(&image).unwrap(), before, "fsck changed the image");

    let out = tally(&["mount", "--log"], &[&log, &image, &mnt]);
    assert_ne!(code(&out), 0, "mounted a log that lost durable transactions: {}", text(&out));
    assert!(text(&out).contains("--salvage --force"), "{}", text(&out));
    assert_eq!(fs::read(&image).unwrap(), before, "a refused mount changed the image");

    let out = tally(&["fsck", "--salvage"], &[&image]);
    assert_eq!(code(&out), 2, "--salvage without --force: {}", text(&out));
    assert_eq!(fs::read(&image).unwrap(), before);

    let out = tally(&["fsck", "--salvage", "--force", "--json"], &[&image]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let salvaged = json["salvaged"].as_array().unwrap();
    assert!(!salvaged.is_empty(), "{json}");
    let dropped: usize =
        salvaged.iter().map(|d| d["dropped_seqs"].as_array().map_or(0, Vec::len)).sum();
    assert!(dropped >= 4, "appends 2-5 (at least) reported dropped: {json}");

    // The salvaged image mounts; the file holds the first append only.
    let (_pid, _guard) = common::mount_daemon_pid(&image, &mnt, &log);
    let data = fs::read(mnt.join("f")).unwrap_or_default();
    assert!(data.len() <= APPEND && data.iter().all(|&b| b == 0xA0), "{} bytes", data.len());
    let out = tally(&["umount"], &[&mnt]);
    assert_eq!(code(&out), 0, "{}", text(&out));
}

//! `tally mkfs --block-size` end to end: the image records its block size, and fsck, inspect and
//! mount open it in that size (from the first superblock copy, or the second when the first is
//! damaged). The mount part needs root and /dev/fuse, and says so when it skips.

mod common;

use std::fs;
use std::os::unix::fs::FileExt as _;
use std::path::Path;

use common::{code, require_fuse, scratch, stderr, stdout, tally, text};

/// `tally inspect --json IMAGE`, which must succeed, as JSON.
fn inspect(image: &Path) -> serde_json::Value {
    let out = tally(&["inspect", "--json"], &[image]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    serde_json::from_str(&stdout(&out)).unwrap()
}

/// `tally fsck IMAGE` must exit 0 and say the image is clean.
fn assert_fsck_clean(image: &Path) {
    let out = tally(&["fsck"], &[image]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(stdout(&out).contains("clean"), "{}", text(&out));
}

#[test]
fn a_16k_image_is_checked_and_inspected_in_its_own_block_size() {
    let dir = scratch("block-size", "inspect");
    let image = dir.join("image");
    let out = tally(&["mkfs", "--size", "128M", "--block-size", "16K"], &[&image]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(stdout(&out).contains("blocks of 16384 bytes"), "{}", text(&out));

    assert_fsck_clean(&image);
    let v = inspect(&image);
    assert_eq!(v["superblock"]["block_size"], 16384, "{v}");
    // Segments stay 4 MiB: 256 blocks of 16 KiB.
    assert_eq!(v["superblock"]["segment_blocks"], 256, "{v}");
    assert!(v["error"].is_null(), "{v}");

    // The first copy wiped (a torn superblock write): the second, at 16 KiB, gives the size.
    let f = fs::OpenOptions::new().write(true).open(&image).unwrap();
    f.write_all_at(&[0u8; 16384], 0).unwrap();
    let out = tally(&["fsck"], &[&image]);
    assert_eq!(code(&out), 0, "one torn copy is normal, the other serves: {}", text(&out));
    let v = inspect(&image);
    assert_eq!(v["superblock"]["block_size"], 16384, "{v}");
    assert_eq!(v["superblock"]["copy_block"], 1, "{v}");

    // Both copies gone: not a Tally image, as for any other image.
    f.write_all_at(&[0u8; 16384], 16384).unwrap();
    let out = tally(&["fsck"], &[&image]);
    assert_eq!(code(&out), 8, "{}", text(&out));
    assert!(stderr(&out).contains("not a Tally image"), "{}", text(&out));
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn mkfs_refuses_block_sizes_outside_4k_to_64k_powers_of_two() {
    let dir = scratch("block-size", "refused");
    let image = dir.join("image");
    for bad in ["3000", "2K", "128K", "0", "16X"] {
        let out = tally(&["mkfs", "--size", "64M", "--block-size", bad], &[&image]);
        assert_eq!(code(&out), 2, "--block-size {bad}: {}", text(&out));
        assert!(stderr(&out).contains("block-size"), "{}", text(&out));
        assert!(!image.exists(), "--block-size {bad} left an image behind");
    }
    for good in ["4096", "8k", "32K", "64K"] {
        let out = tally(&["mkfs", "--size", "64M", "--force", "--block-size", good], &[&image]);
        assert_eq!(code(&out), 0, "--block-size {good}: {}", text(&out));
        assert_fsck_clean(&image);
    }
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn a_16k_image_mounts_serves_files_and_stays_clean() {
    require_fuse!();
    let dir = scratch("block-size", "mount");
    let (image, mnt, log) = (dir.join("image"), dir.join("mnt"), dir.join("log"));
    fs::create_dir_all(&mnt).unwrap();
    let out = tally(&["mkfs", "--size", "128M", "--block-size", "16K"], &[&image]);
    assert_eq!(code(&out), 0, "{}", text(&out));

    // A small file (less than one block) and one spanning many blocks, not block-aligned.
    let big: Vec<u8> = (0..(3 << 20) + 777).map(|i: u32| (i * 7 + i / 4096) as u8).collect();
    let (_, guard) = common::mount_daemon(&image, &mnt, &log);
    fs::write(mnt.join("small"), b"sixteen KiB blocks").unwrap();
    fs::write(mnt.join("big"), &big).unwrap();
    assert_eq!(fs::read(mnt.join("small")).unwrap(), b"sixteen KiB blocks");
    assert!(fs::read(mnt.join("big")).unwrap() == big, "big file read back differently");
    let out = tally(&["umount"], &[&mnt]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    drop(guard);
    assert_fsck_clean(&image);
    assert_eq!(inspect(&image)["superblock"]["block_size"], 16384);

    // Served again (from the snapshot): the files are there.
    let (_, guard) = common::mount_daemon(&image, &mnt, &log);
    assert_eq!(fs::read(mnt.join("small")).unwrap(), b"sixteen KiB blocks");
    assert!(fs::read(mnt.join("big")).unwrap() == big, "big file changed across remount");
    let out = tally(&["umount"], &[&mnt]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    drop(guard);
    assert_fsck_clean(&image);
    let _ = fs::remove_dir_all(&dir);
}

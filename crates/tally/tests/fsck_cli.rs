//! `tally fsck` and `tally inspect` as a user runs them: exit codes for a clean, a corrupt and
//! an unusable image, the image's bytes unchanged (also when it needs recovery), an image in
//! use refused, the JSON shapes.

mod common;

use std::fs::{self, File};
use std::os::unix::fs::FileExt as _;
use std::os::unix::io::AsRawFd as _;
use std::path::Path;
use std::process::Output;
use std::sync::Arc;

use tally_fs::{Fs, MkfsOptions, MountOptions, Owner, ROOT};
use tally_media::{Device, FileDevice, FileOptions};

use common::{code, tally, text};

const MARKER: &[u8] = b"FSCK-CLI-DATA:";

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(out)))
}

/// An image with files and directories; `clean`: unmounted (snapshot), else as after a crash
/// (synced, never unmounted: the next mount must recover, and recovery writes).
fn make_image(path: &Path, clean: bool) {
    File::create(path).unwrap().set_len(64 << 20).unwrap();
    let dev: Arc<dyn Device> = Arc::new(FileDevice::open(path, FileOptions::default()).unwrap());
    Fs::mkfs(dev.clone(), &MkfsOptions { streams: 2, ..MkfsOptions::default() }).unwrap();
    let fs = Fs::mount(dev, MountOptions::default()).unwrap();
    let me = Owner { uid: 0, gid: 0 };
    let d = fs.mkdir(None, ROOT, b"d", 0o755, me).unwrap();
    for i in 0..8u8 {
        let a = fs.create(None, d.ino, &[b'f', b'0' + i], 0o644, me).unwrap();
        let mut block = MARKER.to_vec();
        block.resize(4096, i);
        fs.write(None, a.ino, 0, &block).unwrap();
    }
    fs.sync().unwrap();
    if clean {
        fs.unmount().unwrap();
    }
}

#[test]
fn fsck_and_inspect_leave_every_byte_and_give_the_documented_exit_codes() {
    let dir = common::scratch("fsck-cli", "codes");
    for clean in [false, true] {
        let image = dir.join(format!("image-{clean}"));
        make_image(&image, clean);
        let before = fs::read(&image).unwrap();

        let out = tally(&["fsck"], &[&image]);
        assert_eq!(code(&out), 0, "{}", text(&out));
        assert!(text(&out).contains("clean"), "{}", text(&out));
        let out = tally(&["fsck", "--json"], &[&image]);
        assert_eq!(code(&out), 0, "{}", text(&out));
        let v = json(&out);
        assert_eq!(v["status"], "clean");
        assert_eq!(v["exit_code"], 0);
        assert_eq!(v["checked"]["data_blocks"], 8, "every data block read: {v}");
        assert_eq!(v["mount"]["from_snapshot"], clean);
        if !clean {
            assert!(v["mount"]["transactions_replayed"].as_u64().unwrap() > 0, "{v}");
        }

        let out = tally(&["inspect"], &[&image]);
        assert_eq!(code(&out), 0, "{}", text(&out));
        assert!(text(&out).contains("stream 1:"), "{}", text(&out));
        let out = tally(&["inspect", "--json"], &[&image]);
        assert_eq!(code(&out), 0, "{}", text(&out));
        let v = json(&out);
        assert_eq!(v["from_snapshot"], clean);
        assert_eq!(v["streams"].as_array().unwrap().len(), 2);
        assert_eq!(v["superblocks"].as_array().unwrap().len(), 2);
        let chain = v["streams"][0]["chain"].as_array().unwrap();
        assert!(!chain.is_empty(), "{v}");
        let segments: Vec<&serde_json::Value> =
            (0..2).flat_map(|s| v["streams"][s]["chain"].as_array().unwrap().iter()).collect();
        let bytes: u64 = segments.iter().map(|g| g["bytes"].as_u64().unwrap()).sum();
        let live: u64 = segments.iter().map(|g| g["live_bytes"].as_u64().unwrap()).sum();
        assert!(live > 8 * 4096 && live <= bytes, "8 files of a block each are live: {v}");
        if !clean {
            let replayed: u64 = (0..2)
                .map(|s| v["streams"][s]["recovered"]["transactions"].as_u64().unwrap())
                .sum();
            assert!(replayed > 8, "creates and writes survive the crash: {v}");
        }
        assert!(fs::read(&image).unwrap() == before, "fsck or inspect changed the image");
    }

    // A damaged data block: corruption, named; the image still unchanged by fsck.
    let image = dir.join("image-true");
    let bytes = fs::read(&image).unwrap();
    let at = bytes.windows(MARKER.len()).position(|w| w == MARKER).expect("a data block");
    let f = fs::OpenOptions::new().write(true).open(&image).unwrap();
    f.write_all_at(&[bytes[at + 100] ^ 0x10], (at + 100) as u64).unwrap();
    let damaged = fs::read(&image).unwrap();
    let out = tally(&["fsck", "--json"], &[&image]);
    assert_eq!(code(&out), 4, "{}", text(&out));
    let v = json(&out);
    assert_eq!(v["status"], "corrupt");
    assert!(v["checked"]["problems"][0].as_str().unwrap().contains("checksum"), "{v}");
    assert_eq!(code(&tally(&["fsck"], &[&image])), 4);
    assert!(fs::read(&image).unwrap() == damaged);

    // Not a Tally image, both copies' magic gone: unusable.
    let image = dir.join("image-false");
    let f = fs::OpenOptions::new().write(true).open(&image).unwrap();
    f.write_all_at(b"XXXX", 0).unwrap();
    let out = tally(&["fsck"], &[&image]);
    assert_eq!(code(&out), 0, "one torn copy is normal, the other serves: {}", text(&out));
    assert!(text(&out).contains("invalid"), "{}", text(&out));
    f.write_all_at(b"XXXX", 4096).unwrap();
    let out = tally(&["fsck", "--json"], &[&image]);
    assert_eq!(code(&out), 8, "{}", text(&out));
    assert_eq!(json(&out)["status"], "unusable");
    assert_eq!(code(&tally(&["inspect"], &[&image])), 8);
    // Mount refuses it before any FUSE work, with its own code for "not a Tally image".
    let mnt = dir.join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    let out = tally(&["mount", "--foreground"], &[&image, &mnt]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(text(&out).contains("is it a Tally image"), "{}", text(&out));

    // Truncated: shorter than its superblock says.
    let image = dir.join("truncated");
    make_image(&image, true);
    File::options().write(true).open(&image).unwrap().set_len(32 << 20).unwrap();
    let out = tally(&["fsck"], &[&image]);
    assert_eq!(code(&out), 8, "{}", text(&out));
    assert!(text(&out).contains("truncated"), "{}", text(&out));
    let out = tally(&["mount", "--foreground"], &[&image, &mnt]);
    assert_eq!(code(&out), 2, "mount of a truncated image: {}", text(&out));
    File::options().write(true).open(&image).unwrap().set_len(100).unwrap();
    assert_eq!(code(&tally(&["fsck"], &[&image])), 8);

    // Bad arguments.
    assert_eq!(code(&tally(&["fsck"], &[&dir.join("missing")])), 2);
    assert_eq!(code(&tally(&["fsck"], &[&dir])), 2);

    // In use: a mount's daemon holds an exclusive flock on its image.
    let image = dir.join("in-use");
    make_image(&image, true);
    let held = File::open(&image).unwrap();
    // SAFETY: flock on a descriptor owned by `held`.
    assert_eq!(unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }, 0);
    let out = tally(&["fsck", "--json"], &[&image]);
    assert_eq!(code(&out), 3, "{}", text(&out));
    assert_eq!(json(&out)["status"], "in_use");
    let out = tally(&["inspect"], &[&image]);
    assert_eq!(code(&out), 0, "inspect warns and shows: {}", text(&out));
    assert!(text(&out).contains("in use"), "{}", text(&out));
    drop(held);
    assert_eq!(code(&tally(&["fsck"], &[&image])), 0);
    let _ = fs::remove_dir_all(&dir);
}

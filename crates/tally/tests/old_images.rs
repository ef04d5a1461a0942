//! Images made by an older build still mount, whole: an upgrade must never cost a user the
//! data on an image they already have.
//!
//! `tests/images/` holds images made with the build of commit 86b5001 (24 Nov 2026, format
//! version 2, before large transactions, hot/cold cleaning and write-behind changed what the
//! current build writes) by `tests/images/make.py`, with the manifest of the tree on them as
//! that build served it. Two of each tree: one unmounted cleanly (this build starts from its
//! snapshot) and one whose daemon was killed after every file and directory was fsynced (this
//! build replays its log). For each: `tally fsck` finds it clean; through this build's mount the
//! tree is exactly the manifest (kind, mode, owner, size, link count, mtime, every byte,
//! extended attributes); a change made on it survives an unmount and a remount beside the old
//! tree; and the library's mount says it came the way the image was left.
//!
//! The comparison can fail: `a_changed_byte_is_seen` flips one byte of a file's data on the
//! image and requires a difference (a crc error or other bytes).

mod common;

use std::fs;
use std::io::Write as _;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use common::{code, require_fuse, scratch, tally, text};
use tally_fs::{Fs, MountOptions};
use tally_media::{Device, FileDevice, FileOptions};

const BUILD: &str = "86b5001";

fn images() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/images")
}

/// The image `kind` (`clean` or `killed`), decompressed into `dir`.
fn unpack(kind: &str, dir: &Path) -> PathBuf {
    let gz = images().join(format!("{BUILD}-{kind}.img.gz"));
    let out = Command::new("gzip").arg("-dc").arg(&gz).output().expect("gzip runs");
    assert!(
        out.status.success(),
        "gzip -dc {}: {}",
        gz.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let image = dir.join(format!("{kind}.img"));
    fs::write(&image, &out.stdout).unwrap();
    image
}

fn expected() -> String {
    fs::read_to_string(images().join(format!("{BUILD}.manifest"))).unwrap()
}

/// FNV-1a, 64 bits: `make.py` hashes file bytes the same way.
fn fnv64(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

fn cstr(p: &Path) -> std::ffi::CString {
    std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// `name=hex(value)` for every extended attribute of `p` (not followed), sorted, or "-".
fn xattrs(p: &Path) -> String {
    let path = cstr(p);
    let mut list = vec![0u8; 64 * 1024];
    // SAFETY: the buffer is as long as said; the path is NUL-terminated.
    let n = unsafe { libc::llistxattr(path.as_ptr(), list.as_mut_ptr().cast(), list.len()) };
    assert!(n >= 0, "llistxattr {}: {}", p.display(), std::io::Error::last_os_error());
    let mut names: Vec<&[u8]> =
        list[..n as usize].split(|&b| b == 0).filter(|n| !n.is_empty()).collect();
    names.sort_unstable();
    let mut out = Vec::new();
    for name in names {
        let cname = std::ffi::CString::new(name).unwrap();
        let mut value = vec![0u8; 64 * 1024];
        // SAFETY: as above.
        let len = unsafe {
            libc::lgetxattr(path.as_ptr(), cname.as_ptr(), value.as_mut_ptr().cast(), value.len())
        };
        assert!(len >= 0, "lgetxattr {}: {}", p.display(), std::io::Error::last_os_error());
        let hex: String = value[..len as usize].iter().map(|b| format!("{b:02x}")).collect();
        out.push(format!("{}={hex}", String::from_utf8_lossy(name)));
    }
    if out.is_empty() {
        "-".into()
    } else {
        out.join(",")
    }
}

/// The tree under `root` in `make.py`'s manifest format.
fn manifest(root: &Path) -> String {
    let mut lines = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let p = entry.unwrap().path();
            let st = fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let (kind, what, size) = if st.file_type().is_symlink() {
                ("l", fs::read_link(&p).unwrap().to_string_lossy().into_owned(), st.size())
            } else if st.is_dir() {
                dirs.push(p.clone());
                ("d", "-".to_string(), 0)
            } else {
                ("f", format!("{:016x}", fnv64(&fs::read(&p).unwrap())), st.size())
            };
            lines.push(format!(
                "{rel}\t{kind}\t{:o}\t{}\t{}\t{size}\t{}\t{}\t{what}\t{}\n",
                st.mode() & 0o7777,
                st.uid(),
                st.gid(),
                st.nlink(),
                st.mtime(),
                xattrs(&p)
            ));
        }
    }
    lines.sort_unstable();
    lines.concat()
}

/// Lines of `got` that `want` lacks and the reverse, for a readable failure.
fn diff(want: &str, got: &str) -> String {
    let w: std::collections::BTreeSet<&str> = want.lines().collect();
    let g: std::collections::BTreeSet<&str> = got.lines().collect();
    let missing: Vec<_> = w.difference(&g).collect();
    let extra: Vec<_> = g.difference(&w).collect();
    format!("expected but not found: {missing:#?}\nfound but not expected: {extra:#?}")
}

fn fsck_clean(image: &Path) {
    let out = tally(&["fsck"], &[image]);
    assert_eq!(code(&out), 0, "fsck of the {BUILD} image: {}", text(&out));
}

/// The old tree through this build's mount; then a change, an unmount and a remount.
fn mount_and_check(kind: &str) {
    let dir = scratch("old_images", kind);
    let image = unpack(kind, &dir);
    fsck_clean(&image);
    let (mnt, log) = (dir.join("mnt"), dir.join("log"));
    fs::create_dir_all(&mnt).unwrap();
    let _guard = common::mount_daemon(&image, &mnt, &log).1;
    let want = expected();
    let got = manifest(&mnt);
    assert!(got == want, "the {kind} image of {BUILD} through this build:\n{}", diff(&want, &got));

    // Go on using it: a new file, one grown, one removed.
    fs::write(mnt.join("a/b/new"), b"written by this build").unwrap();
    let mut grown = fs::read(mnt.join("a/b/c/appended")).unwrap();
    let mut file = fs::OpenOptions::new().append(true).open(mnt.join("a/b/c/appended")).unwrap();
    file.write_all(b"+more").unwrap();
    drop(file);
    grown.extend_from_slice(b"+more");
    fs::remove_file(mnt.join("many/entry-001")).unwrap();
    let out = tally(&["umount"], &[&mnt]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    fsck_clean(&image);
    let _guard = common::mount_daemon(&image, &mnt, &log).1;
    assert_eq!(fs::read(mnt.join("a/b/new")).unwrap(), b"written by this build");
    assert_eq!(fs::read(mnt.join("a/b/c/appended")).unwrap(), grown);
    assert!(!mnt.join("many/entry-001").exists());
    let untouched = |m: &str| -> String {
        m.lines()
            .filter(|l| {
                let path = l.split('\t').next().unwrap_or("");
                !["a/b", "a/b/new", "a/b/c/appended", "many", "many/entry-001"].contains(&path)
            })
            .map(|l| format!("{l}\n"))
            .collect()
    };
    let got = manifest(&mnt);
    assert!(
        untouched(&got) == untouched(&want),
        "after a remount:\n{}",
        diff(&untouched(&want), &untouched(&got))
    );
    let out = tally(&["umount"], &[&mnt]);
    assert_eq!(code(&out), 0, "{}", text(&out));
}

#[test]
fn a_cleanly_unmounted_image_of_an_older_build_mounts_whole() {
    require_fuse!();
    mount_and_check("clean");
}

#[test]
fn a_killed_image_of_an_older_build_replays_whole() {
    require_fuse!();
    mount_and_check("killed");
}

/// The library mounts each image the way it was left: from the snapshot after a clean unmount,
/// by replaying the log after the kill; fsck is clean either way.
#[test]
fn the_library_mounts_each_image_the_way_it_was_left() {
    for (kind, from_snapshot) in [("clean", true), ("killed", false)] {
        let dir = scratch("old_images", &format!("lib-{kind}"));
        let image = unpack(kind, &dir);
        let dev: Arc<dyn Device> =
            Arc::new(FileDevice::open(&image, FileOptions::default()).unwrap());
        let fs = Fs::mount(dev, MountOptions::default()).unwrap();
        assert_eq!(fs.mount_report().from_snapshot, from_snapshot, "{kind}");
        let report = fs.fsck();
        assert!(report.is_clean(), "{kind}: {:?}", report.problems);
        fs.unmount().unwrap();
    }
}

/// The check can fail: one byte of a file's data changed on the image is seen, as a read error
/// or as bytes that differ from the manifest.
#[test]
fn a_changed_byte_is_seen() {
    require_fuse!();
    let dir = scratch("old_images", "flip");
    let image = unpack("clean", &dir);
    let mut bytes = fs::read(&image).unwrap();
    // The 1 MiB file's bytes name it ("mib:00000000;..."): change one inside its data.
    let at = bytes.windows(13).position(|w| w == b"mib:00000100;").expect("the file's data");
    bytes[at + 4] ^= 1;
    fs::write(&image, &bytes).unwrap();
    let (mnt, log) = (dir.join("mnt"), dir.join("log"));
    fs::create_dir_all(&mnt).unwrap();
    let _guard = common::mount_daemon(&image, &mnt, &log).1;
    match fs::read(mnt.join("a/mib")) {
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}"),
        Ok(_) => assert!(manifest(&mnt) != expected(), "a changed byte went unseen"),
    }
    let _ = tally(&["umount"], &[&mnt]);
}

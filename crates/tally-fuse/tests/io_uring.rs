//! FUSE over io_uring (`-o io_uring=on`): the ring serves the kernel's requests, a mixed
//! workload leaves the same tree as through `/dev/fuse` (`-o io_uring=off`), and unmount ends
//! every ring thread and writes the snapshot.
//!
//! Needs root, a usable /dev/fuse and a kernel that offers the ring (Linux 6.14+ with
//! `CONFIG_FUSE_IO_URING` and `/sys/module/fuse/parameters/enable_uring` on; `.ci/run` switches
//! it on). Without them the test skips, saying why — under CI it fails instead.

mod common;

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;

use tally_fuse::{IoUring, MountConfig, Opcode, RequestCounts, Unmounted};

use common::{require_fuse, Scratch};

/// Names the listing test creates in one directory.
const NAME_COUNT: usize = 1000;
/// Bytes of the big write: more than one request (`max_pages`, 1 MiB by default).
const BIG_LEN: usize = 3 * (1 << 20) + 12_345;

/// Threads of this process whose name says they serve a ring.
fn ring_threads() -> usize {
    fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with("tally-ring"))
        .count()
}

/// Mount `s` with `io_uring`, run the workload, unmount; the tree it left and the requests.
/// `None` if the mount was refused (the ring not offered).
fn run(s: &Scratch, io_uring: IoUring) -> Option<(BTreeMap<String, String>, Arc<RequestCounts>)> {
    let cfg = MountConfig { threads: 4, io_uring, ..MountConfig::default() };
    let mounted = match tally_fuse::mount(s.open_fs(), &s.dir(), &cfg) {
        Ok(m) => m,
        Err(e) => {
            let msg = e.to_string();
            assert_eq!(io_uring, IoUring::On, "mount failed: {msg}");
            assert!(msg.contains("enable_uring"), "says how to enable the ring: {msg}");
            return None;
        }
    };
    let requests = mounted.requests();
    let served = std::thread::spawn(move || mounted.run().unwrap());
    workload(&s.dir());
    let tree = snapshot_tree(&s.dir());
    let mut tries = 0;
    while let Err(e) = tally_fuse::unmount_dir(&s.dir(), false) {
        tries += 1;
        assert!(tries < 100, "unmount: {e}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(served.join().unwrap(), Unmounted::Clean);
    Some((tree, requests))
}

/// Create, write, read, rename, list, xattrs, fsync, unlink, links, truncate, a big write
/// and a directory of [`NAME_COUNT`] names.
fn workload(dir: &Path) {
    let mut f = File::create(dir.join("a.txt")).unwrap();
    f.write_all(b"hello, ring").unwrap();
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(fs::read(dir.join("a.txt")).unwrap(), b"hello, ring");

    let big: Vec<u8> = (0..BIG_LEN).map(|i| (i * 7 % 251) as u8).collect();
    let mut f = OpenOptions::new().write(true).create_new(true).open(dir.join("big")).unwrap();
    f.write_all(&big).unwrap();
    f.sync_data().unwrap();
    drop(f);
    // O_DIRECT: the read reaches the daemon rather than the page cache the write filled.
    let mut back = Vec::new();
    File::open(dir.join("big")).unwrap().read_to_end(&mut back).unwrap();
    assert!(back == big, "big file read back differs");
    let mut direct =
        OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(dir.join("big"));
    if let Ok(f) = direct.as_mut() {
        let mut head = vec![0u8; 1 << 20];
        let n = f.read(&mut head).unwrap();
        assert!(n > 0 && head[..n] == big[..n]);
    }

    let a = dir.join("a.txt");
    xattr::set(&a, "user.colour", b"blue");
    xattr::set(&a, "user.gone", b"x");
    xattr::remove(&a, "user.gone");
    assert_eq!(xattr::get(&a, "user.colour"), b"blue");

    let many = dir.join("many");
    fs::create_dir(&many).unwrap();
    for i in 0..NAME_COUNT {
        File::create(many.join(format!("name-{i:04}"))).unwrap();
    }
    assert_eq!(fs::read_dir(&many).unwrap().count(), NAME_COUNT);
    for i in (0..NAME_COUNT).step_by(10) {
        fs::remove_file(many.join(format!("name-{i:04}"))).unwrap();
    }
    File::open(&many).unwrap().sync_all().unwrap();

    fs::rename(dir.join("a.txt"), many.join("renamed")).unwrap();
    std::os::unix::fs::symlink("many/renamed", dir.join("link")).unwrap();
    fs::hard_link(dir.join("big"), dir.join("big2")).unwrap();
    OpenOptions::new().write(true).open(dir.join("big2")).unwrap().set_len(100_000).unwrap();
    fs::create_dir(dir.join("empty")).unwrap();
    fs::remove_dir(dir.join("empty")).unwrap();
}

/// Every name under `dir` with what a program sees of it: kind, size, mode, links, content
/// digest, symlink target, user xattrs.
fn snapshot_tree(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(dir).unwrap().display().to_string();
            let what = if m.file_type().is_symlink() {
                format!("link -> {}", fs::read_link(&p).unwrap().display())
            } else if m.is_dir() {
                todo.push(p.clone());
                format!("dir {:o} nlink {}", m.mode() & 0o7777, m.nlink())
            } else {
                let data = fs::read(&p).unwrap();
                let digest =
                    data.iter().fold(0u64, |h, &b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
                let mut xattrs: Vec<_> = xattr::list(&p)
                    .into_iter()
                    .map(|n| {
                        let v = xattr::get(&p, &n);
                        format!("{n}={}", String::from_utf8_lossy(&v))
                    })
                    .collect();
                xattrs.sort();
                format!(
                    "file {:o} nlink {} size {} digest {digest:x} xattrs {xattrs:?}",
                    m.mode() & 0o7777,
                    m.nlink(),
                    m.size()
                )
            };
            out.insert(rel, what);
        }
    }
    out
}

#[test]
fn the_ring_serves_a_mixed_workload_as_dev_fuse_does_and_unmounts_cleanly() {
    require_fuse!();
    let s = Scratch::new("io-uring-test", "ring");
    let Some((ring_tree, ring)) = run(&s, IoUring::On) else {
        let switch = fs::read_to_string("/sys/module/fuse/parameters/enable_uring");
        common::skip(&format!(
            "the kernel does not offer FUSE over io_uring (enable_uring: {switch:?})"
        ));
        return;
    };
    // Every ring thread ended with the session.
    assert_eq!(ring_threads(), 0, "ring threads left after unmount");
    let r = ring.snapshot();
    // Everything but FORGET (and what came before the last queue had its entry) came over
    // the ring.
    let by_dev_fuse = r.total() - r.ring();
    assert!(r.ring() > 2 * NAME_COUNT as u64, "{r}");
    assert!(by_dev_fuse <= r.get(Opcode::Forget) + 8, "requests through /dev/fuse: {r}");
    assert!(r.get(Opcode::Create) >= NAME_COUNT as u64, "{r}");
    assert!(r.get(Opcode::Write) >= 4, "the big write is several requests: {r}");

    let d = Scratch::new("io-uring-test", "devfuse");
    let (dev_tree, dev) = run(&d, IoUring::Off).unwrap();
    assert_eq!(dev.snapshot().ring(), 0, "io_uring=off uses no ring");
    // big, big2, link, many, many/renamed and the names left in many.
    let top: Vec<_> = ring_tree.keys().filter(|k| !k.starts_with("many/name-")).collect();
    assert_eq!(top, ["big", "big2", "link", "many", "many/renamed"]);
    assert_eq!(ring_tree.len(), NAME_COUNT - NAME_COUNT / 10 + 5);
    assert_eq!(ring_tree, dev_tree, "the same workload leaves the same tree on both transports");

    // The image the ring wrote reads the same without FUSE (the snapshot was written).
    let fs = s.open_fs();
    let many = fs.lookup(tally_fs::ROOT, b"many").unwrap();
    let listed = fs.readdir(many.ino, 0).unwrap();
    assert_eq!(
        listed.iter().filter(|e| e.name.starts_with(b"name-")).count(),
        NAME_COUNT - NAME_COUNT / 10
    );
}

/// Extended attributes through libc (the calls programs make).
mod xattr {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    fn c(p: &Path) -> CString {
        CString::new(p.as_os_str().as_bytes()).unwrap()
    }

    pub fn set(p: &Path, name: &str, value: &[u8]) {
        let n = CString::new(name).unwrap();
        // SAFETY: valid NUL-terminated strings and a buffer of the given length.
        let rc = unsafe {
            libc::setxattr(c(p).as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), 0)
        };
        assert_eq!(rc, 0, "setxattr {name}: {}", std::io::Error::last_os_error());
    }

    pub fn remove(p: &Path, name: &str) {
        let n = CString::new(name).unwrap();
        // SAFETY: valid NUL-terminated strings.
        let rc = unsafe { libc::removexattr(c(p).as_ptr(), n.as_ptr()) };
        assert_eq!(rc, 0, "removexattr {name}: {}", std::io::Error::last_os_error());
    }

    pub fn get(p: &Path, name: &str) -> Vec<u8> {
        let n = CString::new(name).unwrap();
        // SAFETY: valid strings; a null buffer of size 0 asks for the size.
        let size = unsafe { libc::getxattr(c(p).as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0) };
        assert!(size >= 0, "getxattr {name}: {}", std::io::Error::last_os_error());
        let mut buf = vec![0u8; usize::try_from(size).unwrap()];
        // SAFETY: the buffer holds `buf.len()` bytes.
        let got = unsafe {
            libc::getxattr(c(p).as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
        };
        assert_eq!(got, size, "getxattr {name}");
        buf
    }

    pub fn list(p: &Path) -> Vec<String> {
        // SAFETY: as in `get`.
        let size = unsafe { libc::listxattr(c(p).as_ptr(), std::ptr::null_mut(), 0) };
        assert!(size >= 0, "listxattr: {}", std::io::Error::last_os_error());
        let mut buf = vec![0u8; usize::try_from(size).unwrap()];
        // SAFETY: as in `get`.
        let got = unsafe { libc::listxattr(c(p).as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        assert_eq!(got, size);
        buf.split(|&b| b == 0)
            .filter(|n| n.starts_with(b"user."))
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .collect()
    }
}

//! The adapter through the kernel: a temporary image mounted with FUSE, used with ordinary
//! file calls (std::fs and libc), unmounted, mounted again, and checked.
//!
//! Needs root and a usable /dev/fuse (CI has both); otherwise each test prints why it skips.

mod common;

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

use tally_fuse::Unmounted;

use common::{require_fuse, Scratch};

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn set_xattr(p: &Path, name: &str, value: &[u8], flags: i32) -> Result<(), i32> {
    let n = CString::new(name).unwrap();
    // SAFETY: valid C strings and a buffer of the given length.
    let rc = unsafe {
        libc::setxattr(cstr(p).as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), flags)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(errno())
    }
}

/// getxattr with a buffer of `size` bytes (0: ask for the size).
fn get_xattr(p: &Path, name: &str, size: usize) -> Result<Vec<u8>, i32> {
    let n = CString::new(name).unwrap();
    let mut buf = vec![0u8; size];
    // SAFETY: valid C strings and a buffer of `size` bytes (null when 0).
    let rc = unsafe {
        libc::getxattr(
            cstr(p).as_ptr(),
            n.as_ptr(),
            if size == 0 { std::ptr::null_mut() } else { buf.as_mut_ptr().cast() },
            size,
        )
    };
    if rc < 0 {
        return Err(errno());
    }
    if size == 0 {
        return Ok(vec![0; rc as usize]);
    }
    buf.truncate(rc as usize);
    Ok(buf)
}

fn list_xattr(p: &Path, size: usize) -> Result<Vec<u8>, i32> {
    let mut buf = vec![0u8; size];
    // SAFETY: a valid C string and a buffer of `size` bytes (null when 0).
    let rc = unsafe {
        libc::listxattr(
            cstr(p).as_ptr(),
            if size == 0 { std::ptr::null_mut() } else { buf.as_mut_ptr().cast() },
            size,
        )
    };
    if rc < 0 {
        return Err(errno());
    }
    buf.truncate(if size == 0 { 0 } else { rc as usize });
    if size == 0 {
        buf.resize(rc as usize, 0);
    }
    Ok(buf)
}

fn renameat2(from: &Path, to: &Path, flags: u32) -> Result<(), i32> {
    // SAFETY: valid C strings; AT_FDCWD with absolute paths.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            cstr(from).as_ptr(),
            libc::AT_FDCWD,
            cstr(to).as_ptr(),
            flags,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(errno())
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into())
        .collect();
    v.sort();
    v
}

#[test]
fn ordinary_file_operations_survive_unmount_and_remount() {
    require_fuse!();
    let scratch = Scratch::new("fuse-test", "ops");
    let m = scratch.mount();

    // Create, write, read back.
    fs::write(m.path("a.txt"), b"hello, tally\n").unwrap();
    assert_eq!(fs::read(m.path("a.txt")).unwrap(), b"hello, tally\n");
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    fs::write(m.path("big"), &big).unwrap();
    assert_eq!(fs::read(m.path("big")).unwrap(), big);
    assert_eq!(
        fs::metadata(m.path("big")).unwrap().blocks(),
        74 * 8,
        "st_blocks: 74 blocks of 4 KiB"
    );

    // Directories, rename, hard link, symlink.
    fs::create_dir(m.path("d")).unwrap();
    fs::rename(m.path("a.txt"), m.path("d/b.txt")).unwrap();
    fs::hard_link(m.path("d/b.txt"), m.path("link")).unwrap();
    std::os::unix::fs::symlink("d/b.txt", m.path("sym")).unwrap();
    assert_eq!(fs::read_link(m.path("sym")).unwrap(), Path::new("d/b.txt"));
    assert_eq!(fs::read(m.path("sym")).unwrap(), b"hello, tally\n");
    assert_eq!(fs::metadata(m.path("link")).unwrap().nlink(), 2);
    assert_eq!(names(&m.dir), ["big", "d", "link", "sym"]);
    assert_eq!(fs::metadata(&m.dir).unwrap().nlink(), 3);

    // Rename flags.
    fs::write(m.path("x"), b"x").unwrap();
    fs::write(m.path("y"), b"y").unwrap();
    assert_eq!(renameat2(&m.path("x"), &m.path("y"), libc::RENAME_NOREPLACE), Err(libc::EEXIST));
    renameat2(&m.path("x"), &m.path("y"), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(fs::read(m.path("x")).unwrap(), b"y");
    assert_eq!(fs::read(m.path("y")).unwrap(), b"x");

    // Extended attributes, with the size probe and ERANGE.
    let f = m.path("d/b.txt");
    set_xattr(&f, "user.colour", b"blue", 0).unwrap();
    assert_eq!(set_xattr(&f, "user.colour", b"red", libc::XATTR_CREATE), Err(libc::EEXIST));
    assert_eq!(set_xattr(&f, "user.none", b"1", libc::XATTR_REPLACE), Err(libc::ENODATA));
    set_xattr(&f, "user.shape", b"round", 0).unwrap();
    assert_eq!(get_xattr(&f, "user.colour", 0).unwrap().len(), 4);
    assert_eq!(get_xattr(&f, "user.colour", 2), Err(libc::ERANGE));
    assert_eq!(get_xattr(&f, "user.colour", 64).unwrap(), b"blue");
    assert_eq!(get_xattr(&f, "user.none", 64), Err(libc::ENODATA));
    let list_len = list_xattr(&f, 0).unwrap().len();
    assert_eq!(list_len, "user.colour\0user.shape\0".len());
    assert_eq!(list_xattr(&f, 3), Err(libc::ERANGE));
    assert_eq!(list_xattr(&f, list_len).unwrap(), b"user.colour\0user.shape\0");

    // Truncate (shrink and extend), permissions, fsync, a fifo.
    let mut file = OpenOptions::new().read(true).write(true).open(m.path("big")).unwrap();
    file.set_len(5000).unwrap();
    file.set_len(9000).unwrap();
    file.seek(SeekFrom::Start(4000)).unwrap();
    let mut tail = Vec::new();
    file.read_to_end(&mut tail).unwrap();
    assert_eq!(&tail[..1000], &big[4000..5000]);
    assert!(tail[1000..].iter().all(|&b| b == 0), "extension reads zeros");
    file.seek(SeekFrom::Start(4000)).unwrap();
    file.write_all(b"synced").unwrap();
    file.sync_all().unwrap();
    file.sync_data().unwrap();
    drop(file);
    fs::set_permissions(m.path("x"), fs::Permissions::from_mode(0o640)).unwrap();
    let fifo = cstr(&m.path("fifo"));
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    assert!(fs::symlink_metadata(m.path("fifo")).unwrap().file_type().is_fifo());
    File::open(&m.dir).unwrap().sync_all().unwrap();

    // A file unlinked while open stays readable until closed.
    fs::write(m.path("gone"), b"still here").unwrap();
    let mut held = File::open(m.path("gone")).unwrap();
    fs::remove_file(m.path("gone")).unwrap();
    let mut text = String::new();
    held.read_to_string(&mut text).unwrap();
    assert_eq!(text, "still here");
    drop(held);

    // statfs sees the file system's figures.
    let st = statvfs(&m.dir);
    assert_eq!(st.f_bsize, 4096);
    assert!(st.f_blocks > 0 && st.f_bfree > 0 && st.f_bfree <= st.f_blocks);
    assert_eq!(st.f_namemax, 255);

    fs::remove_file(m.path("y")).unwrap();
    assert_eq!(m.unmount(), Unmounted::Clean);

    // Mounted again (from the snapshot), everything is as left.
    let m = scratch.mount();
    assert_eq!(names(&m.dir), ["big", "d", "fifo", "link", "sym", "x"]);
    assert_eq!(fs::read(m.path("link")).unwrap(), b"hello, tally\n");
    assert_eq!(fs::read(m.path("x")).unwrap(), b"y");
    assert_eq!(fs::metadata(m.path("x")).unwrap().permissions().mode() & 0o7777, 0o640);
    let b = fs::read(m.path("big")).unwrap();
    assert_eq!(b.len(), 9000);
    assert_eq!(&b[4000..4006], b"synced");
    assert_eq!(get_xattr(&m.path("d/b.txt"), "user.shape", 64).unwrap(), b"round");
    assert_eq!(fs::read_link(m.path("sym")).unwrap(), Path::new("d/b.txt"));
    assert_eq!(m.unmount(), Unmounted::Clean);

    let fs = scratch.open_fs();
    assert!(fs.mount_report().from_snapshot, "a clean unmount leaves a snapshot");
    let report = fs.fsck();
    assert!(report.is_clean(), "{:?}", report.problems);
    fs.unmount().unwrap();
}

fn statvfs(p: &Path) -> libc::statvfs {
    // SAFETY: a valid C string; statvfs fills the zeroed struct.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        assert_eq!(libc::statvfs(cstr(p).as_ptr(), &mut st), 0);
        st
    }
}

#[test]
fn errors_arrive_as_the_errno_linux_gives() {
    require_fuse!();
    let scratch = Scratch::new("fuse-test", "errno");
    let m = scratch.mount();
    let code = |r: std::io::Result<()>| r.unwrap_err().raw_os_error().unwrap();
    fs::create_dir(m.path("d")).unwrap();
    fs::write(m.path("d/f"), b"1").unwrap();
    assert_eq!(code(fs::create_dir(m.path("d"))), libc::EEXIST);
    assert_eq!(code(fs::remove_dir(m.path("d"))), libc::ENOTEMPTY);
    assert_eq!(code(fs::remove_file(m.path("nothing"))), libc::ENOENT);
    assert_eq!(code(fs::rename(m.path("d"), m.path("d/inside"))), libc::EINVAL);
    assert_eq!(code(fs::hard_link(m.path("d"), m.path("dl"))), libc::EPERM);
    let long = "n".repeat(256);
    assert_eq!(code(fs::write(m.path(&long), b"").map(|_| ())), libc::ENAMETOOLONG);
    fs::write(m.path(&"n".repeat(255)), b"ok").unwrap();
    assert_eq!(code(File::open(m.path("d/f/x")).map(|_| ())), libc::ENOTDIR);
    assert_eq!(m.unmount(), Unmounted::Clean);
}

#[test]
fn parallel_writers_are_served() {
    require_fuse!();
    let scratch = Scratch::new("fuse-test", "parallel");
    let m = scratch.mount();
    let workers: Vec<_> = (0..4)
        .map(|t| {
            let dir = m.dir.clone();
            std::thread::spawn(move || {
                for i in 0..50 {
                    let p = dir.join(format!("t{t}-{i}"));
                    let mut f = File::create(&p).unwrap();
                    f.write_all(format!("{t}:{i}").as_bytes()).unwrap();
                    f.sync_all().unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!(fs::read_dir(&m.dir).unwrap().count(), 200);
    assert_eq!(fs::read(m.path("t3-49")).unwrap(), b"3:49");
    assert_eq!(m.unmount(), Unmounted::Clean);
}

/// Run `cmd` as nobody (uid and gid 65534, no supplementary groups); its exit status.
fn as_nobody(cmd: &str) -> Option<bool> {
    let status = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", cmd])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .ok()?;
    Some(status.success())
}

#[test]
fn the_kernel_checks_permissions_for_other_users() {
    require_fuse!();
    if as_nobody("true") != Some(true) && common::skip("setpriv cannot switch to nobody here") {
        return;
    }
    let scratch = Scratch::new("fuse-test", "perm");
    // The test's scratch directory must be reachable by nobody.
    fs::set_permissions(&scratch.root, fs::Permissions::from_mode(0o755)).unwrap();
    let m = scratch.mount();
    fs::write(m.path("secret"), b"root only").unwrap();
    fs::set_permissions(m.path("secret"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::write(m.path("public"), b"everyone").unwrap();
    fs::set_permissions(m.path("public"), fs::Permissions::from_mode(0o644)).unwrap();
    fs::create_dir(m.path("open")).unwrap();
    fs::set_permissions(m.path("open"), fs::Permissions::from_mode(0o1777)).unwrap();
    let p = |name: &str| m.path(name).display().to_string();

    assert_eq!(as_nobody(&format!("cat {}", p("public"))), Some(true));
    assert_eq!(as_nobody(&format!("cat {}", p("secret"))), Some(false), "0600 read by nobody");
    assert_eq!(as_nobody(&format!("echo x >> {}", p("public"))), Some(false), "0644 written");
    assert_eq!(as_nobody(&format!("touch {}", p("new"))), Some(false), "created in 0755 root");
    assert_eq!(as_nobody(&format!("chmod 777 {}", p("public"))), Some(false), "chmod by non-owner");
    assert_eq!(as_nobody(&format!("touch {}/mine", p("open"))), Some(true));
    assert_eq!(fs::metadata(m.path("open/mine")).unwrap().uid(), 65534, "owned by its creator");
    // Sticky directory: root's file in it cannot be removed by nobody.
    fs::write(m.path("open/roots"), b"").unwrap();
    assert_eq!(as_nobody(&format!("rm -f {}/roots", p("open"))), Some(false), "sticky bit");
    assert!(m.path("open/roots").exists());
    assert_eq!(fs::read(m.path("public")).unwrap(), b"everyone");
    assert_eq!(m.unmount(), Unmounted::Clean);
}

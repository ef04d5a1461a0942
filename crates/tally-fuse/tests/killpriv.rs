//! Privileges dropped on change, through the kernel. The adapter asks for
//! `FUSE_HANDLE_KILLPRIV_V2`, so the kernel leaves it to Tally to take a file's set-user-ID
//! and set-group-ID bits and its `security.capability` when it is written, truncated or given
//! to another owner, as POSIX and Linux do (`src/privs.rs`). Each case is checked as root and
//! as nobody, on a mount that honours set-user-ID (`-o suid`), so a bit the kernel wrongly kept
//! would run a program as its owner.
//!
//! Needs root, a usable /dev/fuse and `setpriv` (CI has them); otherwise each test prints why
//! it skips.

mod common;

use std::ffi::CString;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use tally_fuse::{FuseMutant, MountConfig, Unmounted};

use common::{require_fuse, Scratch, Served};

/// Run `cmd` with `sh -c` as nobody (uid and gid 65534, no supplementary groups, so no
/// capability); its standard output, or `None` if it failed.
fn as_nobody(cmd: &str) -> Option<String> {
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", cmd])
        .output()
        .ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// True, after printing why, when nobody cannot be switched to here.
fn skip_without_setpriv() -> bool {
    if as_nobody("true").is_some() {
        return false;
    }
    eprintln!("skipped: setpriv cannot switch to nobody here");
    true
}

/// A mount open to nobody that honours set-user-ID bits; `mutant` if given.
fn mount(s: &Scratch, mutant: Option<FuseMutant>) -> Served {
    // The scratch directory must be reachable by nobody.
    fs::set_permissions(&s.root, fs::Permissions::from_mode(0o755)).unwrap();
    let cfg = MountConfig {
        allow_other: true,
        threads: 4,
        mutant,
        options: vec!["suid".into()],
        ..MountConfig::default()
    };
    let m = s.serve(&cfg);
    fs::set_permissions(&m.dir, fs::Permissions::from_mode(0o777)).unwrap();
    m
}

/// Make `name` a file of root's with `perm` (chmod after the write: a write may drop bits).
fn make(m: &Served, name: &str, perm: u32) {
    fs::write(m.path(name), b"0123456789").unwrap();
    fs::set_permissions(m.path(name), fs::Permissions::from_mode(perm)).unwrap();
}

fn mode(m: &Served, name: &str) -> u32 {
    fs::metadata(m.path(name)).unwrap().mode() & 0o7777
}

fn sh(m: &Served, script: &str) -> String {
    script.replace("$D", &m.dir.display().to_string())
}

#[test]
fn writes_by_other_users_drop_set_user_and_group_id_root_keeps_them() {
    require_fuse!();
    if skip_without_setpriv() {
        return;
    }
    let s = Scratch::new("killpriv-test", "write");
    let m = mount(&s, None);
    make(&m, "both", 0o6777);
    make(&m, "locking", 0o2666); // set-group-ID without group execution: mandatory locking
    make(&m, "roots", 0o6777);
    assert!(as_nobody(&sh(&m, "printf x >> $D/both && printf x >> $D/locking")).is_some());
    assert_eq!(mode(&m, "both"), 0o0777);
    assert_eq!(mode(&m, "locking"), 0o2666, "set-group-ID without group execution stays");
    // Root has CAP_FSETID: its writes keep the bits, as on ext4.
    OpenOptions::new().append(true).open(m.path("roots")).unwrap().write_all(b"x").unwrap();
    assert_eq!(mode(&m, "roots"), 0o6777);
    // What was dropped is on media, not only in memory.
    assert_eq!(m.unmount(), Unmounted::Clean);
    let m = mount(&s, None);
    assert_eq!((mode(&m, "both"), mode(&m, "locking")), (0o0777, 0o2666));
    assert_eq!(m.unmount(), Unmounted::Clean);
}

/// A set-user-ID root copy of `id`, world-writable, run by nobody before and after nobody
/// appends a byte to it (ELF ignores trailing bytes): the effective uids it printed. The
/// append drops the bit; the kernel must stop running the file as root at once, without a
/// `stat` first to refresh the mode it cached.
fn suid_program_after_a_write(mutant: Option<FuseMutant>) -> (String, String) {
    let s = Scratch::new("killpriv-test", "exec");
    let m = mount(&s, mutant);
    fs::copy("/usr/bin/id", m.path("id")).unwrap();
    fs::set_permissions(m.path("id"), fs::Permissions::from_mode(0o4777)).unwrap();
    let before = as_nobody(&sh(&m, "$D/id -u")).unwrap();
    assert!(as_nobody(&sh(&m, "printf x >> $D/id")).is_some());
    let after = as_nobody(&sh(&m, "$D/id -u")).unwrap();
    assert_eq!(m.unmount(), Unmounted::Clean);
    (before, after)
}

#[test]
fn a_program_written_by_another_user_no_longer_runs_as_its_owner() {
    require_fuse!();
    if skip_without_setpriv() || !Path::new("/usr/bin/id").exists() {
        return;
    }
    assert_eq!(suid_program_after_a_write(None), ("0".into(), "65534".into()));
}

#[test]
#[cfg(feature = "mutants")]
fn the_exec_test_catches_a_kernel_left_with_the_old_mode() {
    require_fuse!();
    if skip_without_setpriv() || !Path::new("/usr/bin/id").exists() {
        return;
    }
    let (_, after) = suid_program_after_a_write(Some(FuseMutant::KeepCachedMode));
    assert_eq!(after, "0", "the mutant left the kernel running it as root");
    eprintln!("caught: after the write, nobody still ran it as uid {after}");
}

#[test]
fn chown_drops_them_whoever_asks_truncate_only_for_other_users() {
    require_fuse!();
    if skip_without_setpriv() {
        return;
    }
    let s = Scratch::new("killpriv-test", "chown");
    let m = mount(&s, None);
    make(&m, "given", 0o6755);
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid path; chown(2) reads nothing else.
    assert_eq!(unsafe { libc::chown(c(&m.path("given")).as_ptr(), 65534, 65534) }, 0);
    assert_eq!(mode(&m, "given"), 0o0755, "chown by root drops them too");
    make(&m, "kept", 0o6755);
    // Neither owner nor group given: nothing changes hands, nothing is dropped.
    // SAFETY: as above.
    assert_eq!(unsafe { libc::chown(c(&m.path("kept")).as_ptr(), u32::MAX, u32::MAX) }, 0);
    assert_eq!(mode(&m, "kept"), 0o6755);

    make(&m, "cut", 0o6777);
    make(&m, "roots", 0o6777);
    assert!(as_nobody(&sh(&m, "truncate -s 3 $D/cut")).is_some());
    assert_eq!((mode(&m, "cut"), fs::metadata(m.path("cut")).unwrap().len()), (0o0777, 3));
    fs::OpenOptions::new().write(true).open(m.path("roots")).unwrap().set_len(3).unwrap();
    assert_eq!(mode(&m, "roots"), 0o6777, "root's truncate keeps them (CAP_FSETID)");
    assert_eq!(m.unmount(), Unmounted::Clean);
}

/// A file capability (`cap_net_bind_service=p`) in the kernel's version-2 format.
fn capability() -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&0x0200_0000u32.to_le_bytes()); // VFS_CAP_REVISION_2
    v.extend_from_slice(&(1u32 << 10).to_le_bytes()); // permitted: CAP_NET_BIND_SERVICE
    v.extend_from_slice(&[0; 12]); // inheritable, and the high words
    v
}

fn has_capability(p: &Path) -> bool {
    let name = CString::new("security.capability").unwrap();
    let path = CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: valid strings; a null buffer of size 0 asks for the size only.
    unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) >= 0 }
}

fn set_capability(p: &Path) {
    let name = CString::new("security.capability").unwrap();
    let path = CString::new(p.as_os_str().as_bytes()).unwrap();
    let v = capability();
    // SAFETY: valid strings and a buffer of v.len() bytes.
    let rc = unsafe { libc::setxattr(path.as_ptr(), name.as_ptr(), v.as_ptr().cast(), v.len(), 0) };
    assert_eq!(rc, 0, "setxattr: {}", std::io::Error::last_os_error());
    assert!(has_capability(p));
}

#[test]
fn file_capabilities_go_with_a_write_a_truncate_and_a_chown() {
    require_fuse!();
    let s = Scratch::new("killpriv-test", "caps");
    let m = mount(&s, None);
    let f = m.path("f");
    make(&m, "f", 0o755);
    set_capability(&f);
    OpenOptions::new().append(true).open(&f).unwrap().write_all(b"x").unwrap();
    assert!(!has_capability(&f), "kept after a write");
    set_capability(&f);
    OpenOptions::new().write(true).open(&f).unwrap().set_len(1).unwrap();
    assert!(!has_capability(&f), "kept after a truncate");
    set_capability(&f);
    let path = CString::new(f.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid path.
    assert_eq!(unsafe { libc::chown(path.as_ptr(), 65534, u32::MAX) }, 0);
    assert!(!has_capability(&f), "kept after a chown");
    assert_eq!(m.unmount(), Unmounted::Clean);
}

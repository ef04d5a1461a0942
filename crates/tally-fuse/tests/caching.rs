//! What the kernel caches, and that it never shows what Tally undid behind its back. The
//! mount gives the kernel attributes, names and absent names for a day and keeps files' pages
//! from one open to the next (`src/adapter.rs`); the only change the kernel does not see is an
//! abort, which drops what it touched from the kernel's caches before the abort returns. Each
//! check here also runs against the adapter mutant that skips that (`no-invalidation`).
//!
//! Needs root and a usable /dev/fuse (CI has both); otherwise each test prints why it skips.

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use tally_fuse::{FuseMutant, Opcode, Unmounted};

use common::{require_fuse, Scratch, Served};

/// The contents of `f` read again from its start (through the kernel's page cache).
fn reread(f: &mut File) -> Vec<u8> {
    let mut out = Vec::new();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_to_end(&mut out).unwrap();
    out
}

/// A file read (so its pages are cached), rewritten in place with as many bytes in a
/// transaction (so its size tells nothing), and the transaction aborted: what a reader holding
/// the file open since before sees, and what a new open sees. Returns what went wrong.
fn pages_after_abort(mutant: Option<FuseMutant>) -> Result<(), String> {
    let s = Scratch::new("caching-test", "pages");
    let m = s.mount_with(mutant);
    fs::write(m.path("f"), "old contents").unwrap();
    let mut reader = File::open(m.path("f")).unwrap();
    assert_eq!(reread(&mut reader), b"old contents");
    let dir = File::open(&m.dir).unwrap();
    tally_client::begin(&dir).unwrap();
    OpenOptions::new().write(true).open(m.path("f")).unwrap().write_all(b"new contents").unwrap();
    assert_eq!(reread(&mut reader), b"new contents", "readers see a transaction's writes");
    assert_eq!(fs::read(m.path("f")).unwrap(), b"new contents");
    tally_client::abort(&dir).unwrap();
    let mut wrong = Vec::new();
    let held = reread(&mut reader);
    if held != b"old contents" {
        wrong
            .push(format!("the reader holding it open reads {:?}", String::from_utf8_lossy(&held)));
    }
    let opened = fs::read(m.path("f")).unwrap();
    if opened != b"old contents" {
        wrong.push(format!("a new open reads {:?}", String::from_utf8_lossy(&opened)));
    }
    drop((reader, dir));
    assert_eq!(m.unmount(), Unmounted::Clean);
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

#[test]
fn kept_pages_never_show_aborted_data() {
    require_fuse!();
    pages_after_abort(None).unwrap();
}

#[test]
#[cfg(feature = "mutants")]
fn the_page_test_catches_pages_left_after_an_abort() {
    require_fuse!();
    let e = pages_after_abort(Some(FuseMutant::NoInvalidation)).unwrap_err();
    eprintln!("caught: {e}");
    assert!(e.contains("new contents"), "{e}");
}

/// What a reader sees of each name: its mode, or `None` when it does not exist.
fn modes(m: &Served, names: &[&str]) -> Vec<Option<u32>> {
    names.iter().map(|n| fs::symlink_metadata(m.path(n)).ok().map(|a| a.mode() & 0o7777)).collect()
}

/// Names and attributes changed in a transaction, each looked at (so the kernel caches the
/// new state, absent names included, for a day), then the transaction aborted: the old state
/// must show at once. Returns what went wrong.
fn names_after_abort(mutant: Option<FuseMutant>) -> Result<(), String> {
    let s = Scratch::new("caching-test", "names");
    let m = s.mount_with(mutant);
    for n in ["chmodded", "unlinked", "renamed"] {
        fs::write(m.path(n), n).unwrap();
        fs::set_permissions(m.path(n), fs::Permissions::from_mode(0o644)).unwrap();
    }
    let names = ["chmodded", "unlinked", "renamed", "created", "made-dir", "renamed-to"];
    let old = modes(&m, &names);
    assert_eq!(old, [Some(0o644), Some(0o644), Some(0o644), None, None, None]);

    let dir = File::open(&m.dir).unwrap();
    tally_client::begin(&dir).unwrap();
    fs::set_permissions(m.path("chmodded"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::remove_file(m.path("unlinked")).unwrap();
    fs::rename(m.path("renamed"), m.path("renamed-to")).unwrap();
    fs::write(m.path("created"), "new").unwrap();
    fs::create_dir(m.path("made-dir")).unwrap();
    let new = modes(&m, &names);
    assert_eq!(new, [Some(0o600), None, None, Some(0o644), Some(0o755), Some(0o644)]);
    tally_client::abort(&dir).unwrap();
    let seen = modes(&m, &names);
    drop(dir);
    assert_eq!(m.unmount(), Unmounted::Clean);
    if seen == old {
        Ok(())
    } else {
        Err(format!("after the abort a reader sees {seen:?} of {names:?}, want {old:?}"))
    }
}

#[test]
fn long_timeouts_never_show_what_an_abort_undid() {
    require_fuse!();
    names_after_abort(None).unwrap();
}

#[test]
#[cfg(feature = "mutants")]
fn the_name_test_catches_entries_left_after_an_abort() {
    require_fuse!();
    let e = names_after_abort(Some(FuseMutant::NoInvalidation)).unwrap_err();
    eprintln!("caught: {e}");
}

/// Makes a name on a mount.
type Maker = dyn Fn(&Served, &str);

#[test]
fn an_absent_name_is_remembered_until_the_mount_makes_it() {
    require_fuse!();
    let s = Scratch::new("caching-test", "negative");
    let m = s.mount();
    fs::write(m.path("target"), "t").unwrap();
    let makers: [(&str, &Maker); 6] = [
        ("created", &|m, n| drop(File::create(m.path(n)).unwrap())),
        ("made-dir", &|m, n| fs::create_dir(m.path(n)).unwrap()),
        ("linked", &|m, n| fs::hard_link(m.path("target"), m.path(n)).unwrap()),
        ("symlinked", &|m, n| std::os::unix::fs::symlink("target", m.path(n)).unwrap()),
        ("renamed-onto", &|m, n| {
            fs::write(m.path("src"), "s").unwrap();
            fs::rename(m.path("src"), m.path(n)).unwrap();
        }),
        ("written", &|m, n| fs::write(m.path(n), "w").unwrap()),
    ];
    for (name, make) in makers {
        // Twice: the second answer is the kernel's own, from its negative entry.
        assert!(fs::symlink_metadata(m.path(name)).is_err());
        let before = m.requests();
        assert!(fs::symlink_metadata(m.path(name)).is_err());
        assert_eq!(m.requests().since(&before).get(Opcode::Lookup), 0, "{name}: asked again");
        make(&m, name);
        assert!(fs::symlink_metadata(m.path(name)).is_ok(), "{name} hidden by its absence");
    }
    assert_eq!(m.unmount(), Unmounted::Clean);
}

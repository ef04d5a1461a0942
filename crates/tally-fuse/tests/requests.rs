//! The kernel's requests to the mount, as the adapter counts them: what an operation costs in
//! round trips.
//!
//! Needs root and a usable /dev/fuse (CI has both); otherwise each test prints why it skips.

mod common;

use std::fs::{self, File, FileTimes, OpenOptions, Permissions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, SystemTime};

use tally_fuse::{FuseMutant, MountConfig, Opcode, RequestSnapshot, Unmounted};

use common::{require_fuse, wait_until, Scratch, Served};

/// Mount `s`, and wait until the daemon has set the mount's read-ahead (`-o read_ahead_kb`,
/// 1024 by default): its `stat` of the mount's root is a `GETATTR` that must not land among a
/// test's counts.
fn mount(s: &Scratch) -> Served {
    mount_as(s, None)
}

/// [`mount`], with the adapter mutant `mutant` if any.
fn mount_as(s: &Scratch, mutant: Option<FuseMutant>) -> Served {
    use std::os::unix::fs::MetadataExt;
    let m =
        s.serve(&MountConfig { allow_other: true, threads: 4, mutant, ..MountConfig::default() });
    let dev = fs::metadata(&m.dir).unwrap().dev();
    let path = format!("/sys/class/bdi/{}:{}/read_ahead_kb", libc::major(dev), libc::minor(dev));
    wait_until("read-ahead set", Duration::from_secs(10), || {
        fs::read_to_string(&path).is_ok_and(|v| v.trim() == "1024")
    });
    m
}

#[test]
fn each_request_is_counted_once_under_its_opcode() {
    require_fuse!();
    let s = Scratch::new("requests-test", "count");
    let m = mount(&s);
    let before = m.requests();
    let mut f = OpenOptions::new().write(true).create_new(true).open(m.path("f")).unwrap();
    for _ in 0..3 {
        f.write_all(&[7u8; 100]).unwrap();
    }
    drop(f);
    // The kernel's release comes a moment after close.
    wait_until("the release arrived", Duration::from_secs(5), || {
        m.requests().since(&before).get(Opcode::Release) == 1
    });
    let d = m.requests().since(&before);
    assert_eq!(d.get(Opcode::Create), 1, "{d}");
    assert_eq!(d.get(Opcode::Write), 3, "{d}");
    assert_eq!(fs::read(m.path("f")).unwrap(), [7u8; 300]);
    assert!(m.requests().since(&before).total() > d.total(), "the read was not counted");
    assert_eq!(m.unmount(), Unmounted::Clean);
}

#[test]
fn closing_a_reader_sends_no_flush_and_only_the_first_write_asks_for_capabilities() {
    require_fuse!();
    let s = Scratch::new("requests-test", "write");
    let m = mount(&s);
    let before = m.requests();
    let mut f = OpenOptions::new().write(true).create_new(true).open(m.path("f")).unwrap();
    for _ in 0..10 {
        f.write_all(b"0123456789").unwrap();
    }
    drop(f);
    wait_until("the release arrived", Duration::from_secs(5), || {
        m.requests().since(&before).get(Opcode::Release) == 1
    });
    // A reader's close sends none.
    drop(fs::File::open(m.path("f")).unwrap());
    wait_until("the reader's release arrived", Duration::from_secs(5), || {
        m.requests().since(&before).get(Opcode::Release) == 2
    });
    let d = m.requests().since(&before);
    // None: files open only for reading keep FOPEN_NOFLUSH, and so does a file created with
    // O_EXCL, through which no F2FS atomic write can start (tests/flush.rs).
    assert_eq!(d.get(Opcode::Flush), 0, "{d}");
    // FUSE_HANDLE_KILLPRIV_V2: the kernel marks the inode S_NOSEC after the first write.
    assert!(d.get(Opcode::Getxattr) <= 1, "{d}");
    assert_eq!(m.unmount(), Unmounted::Clean);
}

#[test]
fn unchanged_files_are_read_from_the_kernels_cache_and_attributes_asked_once() {
    require_fuse!();
    let s = Scratch::new("requests-test", "cache");
    let m = mount(&s);
    fs::write(m.path("f"), vec![5u8; 100_000]).unwrap();
    assert_eq!(fs::read(m.path("f")).unwrap(), vec![5u8; 100_000]);
    let _ = fs::metadata(m.path("f")).unwrap();
    let before = m.requests();
    for _ in 0..3 {
        assert_eq!(fs::read(m.path("f")).unwrap(), vec![5u8; 100_000]);
        assert_eq!(fs::metadata(m.path("f")).unwrap().len(), 100_000);
    }
    let d = m.requests().since(&before);
    for op in [Opcode::Read, Opcode::Getattr, Opcode::Lookup] {
        assert_eq!(d.get(op), 0, "{d}");
    }
    assert_eq!(m.unmount(), Unmounted::Clean);
}

#[test]
fn a_file_written_in_pieces_that_split_pages_is_read_whole() {
    require_fuse!();
    let s = Scratch::new("requests-test", "patchy");
    let m = mount(&s);
    // 10,000-byte pieces, as tar's 10 KiB records: most page boundaries fall inside a piece,
    // and the pages two pieces share stay out of date in the kernel's cache.
    let mut f = File::create(m.path("f")).unwrap();
    for i in 0..20u8 {
        f.write_all(&[i; 10_000]).unwrap();
    }
    drop(f);
    let before = m.requests();
    let data = fs::read(m.path("f")).unwrap();
    assert_eq!(data.len(), 200_000);
    assert!(data.chunks(10_000).enumerate().all(|(i, c)| c.iter().all(|&b| usize::from(b) == i)));
    let d = m.requests().since(&before);
    // Read whole in the kernel's largest reads, not a 4 KiB READ per shared page (19 here).
    assert!(d.get(Opcode::Read) <= 4, "{d}");
    assert_eq!(m.unmount(), Unmounted::Clean);
}

#[test]
fn a_listing_carries_the_attributes_of_its_names() {
    require_fuse!();
    let s = Scratch::new("requests-test", "listing");
    let m = mount(&s);
    fs::create_dir(m.path("d")).unwrap();
    for i in 0..50 {
        fs::write(m.path(&format!("d/f{i}")), format!("{i}")).unwrap();
    }
    assert_eq!(m.unmount(), Unmounted::Clean);
    // A new mount: the kernel knows no name in d yet.
    let m = mount(&s);
    let before = m.requests();
    let mut sizes = 0;
    for e in fs::read_dir(m.path("d")).unwrap() {
        sizes += fs::symlink_metadata(e.unwrap().path()).unwrap().len();
    }
    assert_eq!(sizes, (0..50).map(|i: u32| format!("{i}").len() as u64).sum());
    let d = m.requests().since(&before);
    assert!(d.get(Opcode::Readdirplus) >= 1, "{d}");
    // One lookup (d itself); every name listed came with its attributes.
    assert!(d.get(Opcode::Lookup) <= 1 && d.get(Opcode::Getattr) <= 1, "{d}");
    assert_eq!(m.unmount(), Unmounted::Clean);
}

/// Files extracted by [`extract`] and removed again in each test below.
const EXTRACTED_COUNT: u64 = 40;

/// What GNU tar does for each file it extracts, `EXTRACTED_COUNT` times in `dir`: create it
/// (`O_EXCL`), write three 10 KiB records, `fchown` it to its owner (the caller here), `fchmod`,
/// `futimens`, close.
fn extract(dir: &Path) {
    // SAFETY: geteuid and getegid have no preconditions.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    for i in 0..EXTRACTED_COUNT {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(dir.join(format!("f{i}")))
            .unwrap();
        for r in 0..3u8 {
            f.write_all(&[r; 10_240]).unwrap();
        }
        std::os::unix::fs::fchown(&f, Some(uid), Some(gid)).unwrap();
        f.set_permissions(Permissions::from_mode(0o644)).unwrap();
        f.set_times(FileTimes::new().set_accessed(at).set_modified(at)).unwrap();
    }
}

/// Requests but `FORGET` (a message without a reply): round trips.
fn round_trips(d: &RequestSnapshot) -> u64 {
    d.total() - d.get(Opcode::Forget)
}

/// The requests of extracting [`EXTRACTED_COUNT`] files into a new directory and of removing
/// them again, on a mount with `mutant` if any.
fn extract_and_remove(mutant: Option<FuseMutant>) -> (RequestSnapshot, RequestSnapshot) {
    let s = Scratch::new("requests-test", "extract");
    let m = mount_as(&s, mutant);
    fs::create_dir(m.path("d")).unwrap();
    let before = m.requests();
    extract(&m.path("d"));
    wait_until("every release arrived", Duration::from_secs(10), || {
        m.requests().since(&before).get(Opcode::Release) == EXTRACTED_COUNT
    });
    let extracted = m.requests().since(&before);
    // What tar left: every record, the mode and the times it set.
    let data = fs::read(m.path("d/f0")).unwrap();
    assert_eq!(data.len(), 30_720);
    assert!(data.chunks(10_240).enumerate().all(|(r, c)| c.iter().all(|&b| usize::from(b) == r)));
    let meta = fs::metadata(m.path(&format!("d/f{}", EXTRACTED_COUNT - 1))).unwrap();
    assert_eq!((meta.len(), meta.permissions().mode() & 0o7777), (30_720, 0o644));
    assert_eq!(
        meta.modified().unwrap(),
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)
    );
    let before = m.requests();
    for i in 0..EXTRACTED_COUNT {
        fs::remove_file(m.path(&format!("d/f{i}"))).unwrap();
    }
    let removed = m.requests().since(&before);
    assert_eq!(fs::read_dir(m.path("d")).unwrap().count(), 0);
    assert_eq!(m.unmount(), Unmounted::Clean);
    (extracted, removed)
}

/// What an extracted and a removed file cost, request by request, at what Linux (6.18)
/// forces on a file system that checks no permissions itself (`default_permissions`), keeps
/// extended attributes and makes each request a transaction before it answers
/// (docs/bench/posix.md, "FUSE requests per operation"). Per extracted file:
/// - `LOOKUP` of the new name, then `CREATE` (the kernel looks a name up before it creates it);
/// - one `WRITE` per record: an `O_EXCL` file open for writing only bypasses the page cache
///   (`FOPEN_DIRECT_IO`), through which a record starting inside a page costs two;
/// - one `GETXATTR("security.capability")`, at `fchown`: the kernel asks on every change of
///   owner whether there is a capability to drop (none before the first write, which the page
///   cache would ask, every attribute reply having cleared the inode's `S_NOSEC`);
/// - three `SETATTR`s (`fchown`, `fchmod`, `futimens`: the kernel merges none);
/// - one `GETATTR` of the directory (each create makes the kernel drop the directory's
///   attributes, and its permission check on the next path asks for them again);
/// - `RELEASE` and no `FLUSH` (an `O_EXCL` file cannot own an atomic write).
///
/// Per removed file: `UNLINK` and the directory's `GETATTR`, for the same reason.
#[test]
fn an_extracted_file_costs_what_the_kernel_forces_and_no_more() {
    require_fuse!();
    let (x, r) = extract_and_remove(None);
    let n = EXTRACTED_COUNT;
    assert_eq!(x.get(Opcode::Create), n, "{x}");
    assert_eq!(x.get(Opcode::Write), 3 * n, "{x}");
    assert_eq!(x.get(Opcode::Setattr), 3 * n, "{x}");
    assert_eq!(x.get(Opcode::Release), n, "{x}");
    assert_eq!(x.get(Opcode::Flush), 0, "{x}");
    assert!(x.get(Opcode::Lookup) <= n, "{x}");
    assert!(x.get(Opcode::Getxattr) <= n, "{x}");
    assert!(x.get(Opcode::Getattr) <= n + 1, "{x}");
    assert!(round_trips(&x) <= 11 * n + 1, "{x}");
    assert_eq!(r.get(Opcode::Unlink), n, "{r}");
    assert_eq!(r.get(Opcode::Lookup), 0, "{r}");
    assert!(r.get(Opcode::Getattr) <= n + 1, "{r}");
    assert!(round_trips(&r) <= 2 * n + 1, "{r}");
}

/// The budget above is tight enough to see a lost `FUSE_HANDLE_KILLPRIV_V2`: the kernel then
/// asks `getxattr("security.capability")` before every write, and the adapter, which no longer
/// drops privileges itself, keeps writes in the page cache (four `WRITE`s for three records).
#[cfg(feature = "mutants")]
#[test]
fn the_budget_catches_a_mount_without_killpriv() {
    require_fuse!();
    let (x, _) = extract_and_remove(Some(FuseMutant::NoKillPriv));
    assert!(x.get(Opcode::Getxattr) > EXTRACTED_COUNT, "{x}");
    assert!(x.get(Opcode::Write) > 3 * EXTRACTED_COUNT, "{x}");
    assert!(round_trips(&x) > 11 * EXTRACTED_COUNT + 1, "{x}");
}

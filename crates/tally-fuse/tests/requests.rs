//! The kernel's requests to the mount, as the adapter counts them: what an operation costs in
//! round trips.
//!
//! Needs root and a usable /dev/fuse (CI has both); otherwise each test prints why it skips.

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::time::Duration;

use tally_fuse::{Opcode, Unmounted};

use common::{require_fuse, wait_until, Scratch, Served};

/// Mount `s`, and wait until the daemon has set the mount's read-ahead (`-o read_ahead_kb`,
/// 1024 by default): its `stat` of the mount's root is a `GETATTR` that must not land among a
/// test's counts.
fn mount(s: &Scratch) -> Served {
    use std::os::unix::fs::MetadataExt;
    let m = s.mount();
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

//! Crashes around a clean unmount and a mount from its snapshot, on `CrashDevice`:
//! - at every device operation inside the unmount (sync, snapshot writes, flush, superblock),
//!   every legal image mounts to exactly the synced tree, fsck clean;
//! - after a mount from the snapshot, new operations and their fsyncs: at every device
//!   operation, every image mounts, holds every fsynced change, and is fsck clean;
//! - the log mutant `snapshot-trusted-after-crash` (the pointer kept and the generation not
//!   checked) is caught: a crash after a snapshot mount brings the stale snapshot back and an
//!   fsynced file is lost.

use std::sync::Arc;

use tally_fs::{Fs, MkfsOptions, MountOptions, Owner, ROOT};
use tally_media::{Device, Geometry, Image, MemDevice};
use tally_sim::{CrashConfig, CrashDevice, CrashOptions, CrashPoint, RecordingDevice};

const ME: Owner = Owner { uid: 0, gid: 0 };

/// Names and contents of the files in the root.
fn tree(fs: &Fs) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = fs
        .readdir(ROOT, 2)
        .unwrap()
        .into_iter()
        .map(|e| (String::from_utf8(e.name).unwrap(), fs.read(e.ino, 0, 1 << 20).unwrap()))
        .collect();
    out.sort();
    out
}

fn images(points: Vec<CrashPoint>) -> Vec<Image> {
    let options = CrashOptions { samples: 64, tearing: true, ..CrashOptions::default() };
    points
        .iter()
        .flat_map(|p| p.crash_images(options.clone()).take(96).collect::<Vec<_>>())
        .collect()
}

fn mount_image(image: Image, log_mutant: Option<tally_log::Mutant>) -> Fs {
    let dev: Arc<dyn Device> = Arc::new(MemDevice::from_image(image));
    Fs::mount(dev, MountOptions { log_mutant, ..MountOptions::default() })
        .expect("a legal image mounts")
}

/// Build a file system, unmount it cleanly, mount it from the snapshot and fsync a new file;
/// returns the images of every crash point after the snapshot mount, and what must survive.
struct Run {
    during_unmount: Vec<Image>,
    before_fsync: Vec<Image>,
    after_fsync: Vec<Image>,
    synced: Vec<(String, Vec<u8>)>,
    must: Vec<(String, Vec<u8>)>,
}

fn run(log_mutant: Option<tally_log::Mutant>) -> Run {
    let geometry = Geometry::new(1024, 1024, 512).unwrap();
    let dev = RecordingDevice::new(CrashDevice::new(geometry, CrashConfig::with_seed(5)));
    dev.set_recording(true);
    // The points since the last call, recording on again.
    let drain = || {
        let points = dev.take_points();
        dev.set_recording(true);
        points
    };
    let ddev: Arc<dyn Device> = dev.clone();
    Fs::mkfs(ddev.clone(), &MkfsOptions { streams: 2, segment_blocks: 16, uuid: Some([4; 16]) })
        .unwrap();
    let fs =
        Fs::mount(ddev.clone(), MountOptions { log_mutant, ..MountOptions::default() }).unwrap();
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        let f = fs.create(None, ROOT, name.as_bytes(), 0o644, ME).unwrap();
        fs.write(None, f.ino, 0, &vec![i as u8 + 1; 1500]).unwrap();
    }
    fs.sync().unwrap();
    let synced = tree(&fs);
    drain();
    fs.unmount().unwrap();
    let during_unmount = images(drain());

    let fs = Fs::mount(ddev, MountOptions { log_mutant, ..MountOptions::default() }).unwrap();
    assert!(fs.mount_report().from_snapshot);
    assert_eq!(tree(&fs), synced);
    let d = fs.create(None, ROOT, b"d", 0o644, ME).unwrap();
    fs.write(None, d.ino, 0, b"fsynced after a snapshot mount").unwrap();
    fs.fsync(d.ino).unwrap();
    // From the snapshot mount (its superblock update included) to the fsync's return.
    let before_fsync = images(drain());
    let mut must = synced.clone();
    must.push(("d".into(), b"fsynced after a snapshot mount".to_vec()));
    must.sort();
    // After the fsync returned, d must be in every image, whatever else happens.
    fs.unlink(None, ROOT, b"a").unwrap();
    let e = fs.create(None, ROOT, b"e", 0o644, ME).unwrap();
    fs.write(None, e.ino, 0, &[7u8; 3000]).unwrap();
    fs.rename(None, ROOT, b"b", ROOT, b"bb", tally_fs::RenameFlags::default()).unwrap();
    fs.sync().unwrap();
    let after_fsync = images(drain());
    drop(fs);
    Run { during_unmount, before_fsync, after_fsync, synced, must }
}

#[test]
fn crashes_around_a_clean_unmount_and_a_snapshot_mount() {
    let r = run(None);
    assert!(
        !r.during_unmount.is_empty() && !r.before_fsync.is_empty() && !r.after_fsync.is_empty()
    );
    for image in &r.during_unmount {
        let fs = mount_image(image.clone(), None);
        assert_eq!(tree(&fs), r.synced, "a crash during unmount changes nothing that was synced");
        assert!(fs.fsck().is_clean(), "{:?}", fs.fsck().problems);
    }
    // The create and the write are two operations: before both, after the create, after both.
    let mut created = r.synced.clone();
    created.push(("d".into(), Vec::new()));
    created.sort();
    for image in &r.before_fsync {
        let fs = mount_image(image.clone(), None);
        let t = tree(&fs);
        let names: Vec<(&str, usize)> = t.iter().map(|(n, d)| (n.as_str(), d.len())).collect();
        assert!(
            t == r.synced || t == created || t == r.must,
            "not a prefix of create, write: {names:?}"
        );
        assert!(fs.fsck().is_clean(), "{:?}", fs.fsck().problems);
    }
    for image in &r.after_fsync {
        let fs = mount_image(image.clone(), None);
        let t = tree(&fs);
        let d = r.must.iter().find(|(n, _)| n == "d");
        let names: Vec<&str> = t.iter().map(|(n, _)| n.as_str()).collect();
        assert!(t.iter().find(|(n, _)| n == "d") == d, "fsynced d lost: {names:?}");
        assert!(fs.fsck().is_clean(), "{:?}", fs.fsck().problems);
    }
    eprintln!(
        "snapshot crash test: {} images during unmount, {} from the snapshot mount to the fsync, {} after it; 0 violations",
        r.during_unmount.len(),
        r.before_fsync.len(),
        r.after_fsync.len()
    );
}

#[cfg(feature = "mutants")]
#[test]
fn snapshot_trusted_after_crash_is_caught() {
    let m = Some(tally_log::Mutant::SnapshotKept);
    let after_fsync = run(m).after_fsync;
    let lost = after_fsync
        .iter()
        .filter(|image| !tree(&mount_image((*image).clone(), m)).iter().any(|(n, _)| n == "d"))
        .count();
    assert!(lost > 0, "the stale snapshot never came back");
    eprintln!(
        "snapshot-trusted-after-crash: fsynced file lost in {lost} of {} images",
        after_fsync.len()
    );
}

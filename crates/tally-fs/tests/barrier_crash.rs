//! Repeated barriers on one stream, on `CrashDevice`. The file system keeps one barrier per
//! stream (its newest), since recovery keeps a prefix of each stream; this checks that the
//! newest one is what later operations depend on:
//! write a (v1), barrier(a), write a (v2), barrier(a), write b — a and b on different streams,
//! nothing flushed. In every crash image that keeps b's write, a holds v2.
//! The mutant `barrier-keeps-oldest` (the first barrier kept, the second ignored) is caught:
//! some image keeps b's write with a at v1.

use std::sync::Arc;

use tally_fs::{Fs, FsMutant, MkfsOptions, MountOptions, Owner, StreamPolicy, ROOT};
use tally_media::{Device, Geometry, Image, MemDevice};
use tally_sim::{CrashConfig, CrashDevice, CrashOptions, RecordingDevice};

const ME: Owner = Owner { uid: 0, gid: 0 };
const V1: [u8; 1024] = [1; 1024];
const V2: [u8; 1024] = [2; 1024];
const B: [u8; 1024] = [9; 1024];

fn options(mutant: Option<FsMutant>) -> MountOptions {
    MountOptions { streams: StreamPolicy::PerFile, mutant, ..MountOptions::default() }
}

/// Run the workload; the crash images of everything after the initial sync.
fn run(mutant: Option<FsMutant>) -> Vec<Image> {
    let geometry = Geometry::new(1024, 1024, 512).unwrap();
    let dev = RecordingDevice::new(CrashDevice::new(geometry, CrashConfig::with_seed(11)));
    let ddev: Arc<dyn Device> = dev.clone();
    Fs::mkfs(ddev.clone(), &MkfsOptions { streams: 2, segment_blocks: 16, uuid: Some([6; 16]) })
        .unwrap();
    let fs = Fs::mount(ddev, options(mutant)).unwrap();
    let a = fs.create(None, ROOT, b"a", 0o644, ME).unwrap().ino;
    let b = fs.create(None, ROOT, b"b", 0o644, ME).unwrap().ino;
    assert_ne!(a % 2, b % 2, "a and b must be on different streams (per-file policy, 2 streams)");
    fs.sync().unwrap();
    dev.take_points();
    dev.set_recording(true);
    fs.write(None, a, 0, &V1).unwrap();
    fs.barrier(a).unwrap();
    fs.write(None, a, 0, &V2).unwrap();
    fs.barrier(a).unwrap();
    fs.write(None, b, 0, &B).unwrap();
    // Make it all durable, so the last crash points hold every write.
    fs.sync().unwrap();
    let options = CrashOptions { samples: 256, tearing: false, ..CrashOptions::default() };
    let images: Vec<Image> =
        dev.take_points().iter().flat_map(|p| p.crash_images(options.clone())).collect();
    drop(fs);
    images
}

/// (a's content, b's content) after mounting `image`.
fn contents(image: &Image, mutant: Option<FsMutant>) -> (Vec<u8>, Vec<u8>) {
    let dev: Arc<dyn Device> = Arc::new(MemDevice::from_image(image.clone()));
    let fs = Fs::mount(dev, options(mutant)).expect("a legal image mounts");
    assert!(fs.fsck().is_clean(), "{:?}", fs.fsck().problems);
    let read = |name: &[u8]| {
        let ino = fs.lookup(ROOT, name).unwrap().ino;
        fs.read(ino, 0, 4096).unwrap()
    };
    (read(b"a"), read(b"b"))
}

/// Images that keep b's write while a is not at v2.
fn violations(images: &[Image], mutant: Option<FsMutant>) -> usize {
    images
        .iter()
        .filter(|image| {
            let (a, b) = contents(image, mutant);
            b == B && a != V2
        })
        .count()
}

#[test]
fn a_later_operation_depends_on_the_newest_barrier_of_a_stream() {
    let images = run(None);
    let with_b = images.iter().filter(|i| contents(i, None).1 == B).count();
    assert!(with_b > 0, "no image kept b's write: the test checks nothing");
    assert!(with_b < images.len(), "every image kept b's write: nothing was ever lost");
    assert_eq!(violations(&images, None), 0, "b's write survived without a's second write");
    eprintln!("barrier crash test: {} images, {with_b} keep b's write, 0 violations", images.len());
}

#[cfg(feature = "mutants")]
#[test]
fn barrier_keeps_oldest_is_caught() {
    let m = Some(FsMutant::BarrierKeepsOldest);
    let images = run(m);
    let bad = violations(&images, m);
    assert!(bad > 0, "no image kept b's write without a's second write");
    eprintln!("barrier-keeps-oldest: caught in {bad} of {} images", images.len());
}

//! `tally-fs` on a real `PmemDevice` (persistent memory emulated on a /dev/shm file, or an
//! msync-backed temp file): mkfs, mount, operations, fsync, unmount; remount from the snapshot,
//! contents and fsck clean; then operations without an unmount (the process "dies"), remount
//! scans the log, fsynced contents there, fsck clean.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tally_fs::{Fs, MkfsOptions, MountOptions, Owner, ROOT};
use tally_media::pmem::PmemStats;
use tally_media::{Device, PmemDevice, PmemMode, PmemOptions};

struct TempRegion(PathBuf);

impl TempRegion {
    /// Under /dev/shm (emulated persistent memory) when there is one, else the temp directory
    /// (msync mode): the same code either way.
    fn new(tag: &str) -> Self {
        let shm = Path::new("/dev/shm");
        let dir = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
        TempRegion(dir.join(format!("tally-fs-pmem-{}-{tag}", std::process::id())))
    }
}

impl Drop for TempRegion {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

const ME: Owner = Owner { uid: 1000, gid: 1000 };
const REGION_LEN: u64 = 16 << 20;

fn open(path: &Path) -> Arc<PmemDevice> {
    Arc::new(PmemDevice::open(path, PmemOptions::default()).unwrap())
}

fn content(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[test]
fn tally_fs_on_pmem_device_survives_unmount_and_crash() {
    let region = TempRegion::new("fs");
    let dev = Arc::new(PmemDevice::create(&region.0, REGION_LEN, PmemOptions::default()).unwrap());
    println!("pmem mode {} flush {}", dev.mode(), dev.flush_kind());
    let opts = MkfsOptions { streams: 2, segment_blocks: 64, uuid: None };
    Fs::mkfs(dev.clone() as Arc<dyn Device>, &opts).unwrap();
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    let before = dev.pmem_stats();
    let dir = fs.mkdir(None, ROOT, b"d", 0o755, ME).unwrap();
    let a = fs.create(None, dir.ino, b"a", 0o644, ME).unwrap();
    let b = fs.create(None, ROOT, b"b", 0o644, ME).unwrap();
    fs.write(None, a.ino, 0, &content(10_000, 1)).unwrap();
    fs.write(None, a.ino, 4095, &content(3, 9)).unwrap(); // across a block boundary
    let tx = fs.begin().unwrap();
    fs.write(Some(&tx), b.ino, 0, &content(777, 2)).unwrap();
    fs.rename(Some(&tx), ROOT, b"b", dir.ino, b"b2", tally_fs::RenameFlags::default()).unwrap();
    fs.commit_durable(tx).unwrap();
    fs.fsync(a.ino).unwrap();
    let used: PmemStats = dev.pmem_stats() - before;
    if dev.mode() != PmemMode::Msync {
        assert!(used.bytes_nt > 0, "blocks are copied non-temporally: {used:?}");
        assert!(used.fences > 0);
    }
    fs.unmount().unwrap();
    drop(dev);

    let mut want_a = content(10_000, 1);
    want_a[4095..4098].copy_from_slice(&content(3, 9));
    // Remount from the clean-unmount snapshot.
    let fs = Fs::mount(open(&region.0), MountOptions::default()).unwrap();
    let d = fs.lookup(ROOT, b"d").unwrap();
    let a = fs.lookup(d.ino, b"a").unwrap();
    assert_eq!(fs.read(a.ino, 0, 20_000).unwrap(), want_a);
    let b2 = fs.lookup(d.ino, b"b2").unwrap();
    assert_eq!(fs.read(b2.ino, 0, 1000).unwrap(), content(777, 2));
    assert!(fs.lookup(ROOT, b"b").is_err());
    let report = fs.fsck();
    assert!(report.is_clean(), "{:?}", report.problems);
    // More work, fsynced, and no unmount: the next mount recovers from the log.
    let c = fs.create(None, ROOT, b"c", 0o600, ME).unwrap();
    fs.write(None, c.ino, 0, &content(5000, 3)).unwrap();
    fs.fsync(c.ino).unwrap();
    fs.unlink(None, d.ino, b"b2").unwrap();
    fs.sync().unwrap();
    drop(fs);

    let fs = Fs::mount(open(&region.0), MountOptions::default()).unwrap();
    let c = fs.lookup(ROOT, b"c").unwrap();
    assert_eq!(fs.read(c.ino, 0, 9000).unwrap(), content(5000, 3));
    let d = fs.lookup(ROOT, b"d").unwrap();
    assert!(fs.lookup(d.ino, b"b2").is_err());
    assert_eq!(fs.read(fs.lookup(d.ino, b"a").unwrap().ino, 0, 20_000).unwrap(), want_a);
    let report = fs.fsck();
    assert!(report.is_clean(), "{:?}", report.problems);
    fs.unmount().unwrap();
}

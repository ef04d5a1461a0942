//! Atomic replace (write a new file, rename it over the old one) on a simulated disk
//! (`tally-sim`'s crash device), crashed at every device operation from the new file's creation
//! to the `sync` after the rename. Every image a crash leaves mounts, is fsck clean, and shows
//! the rename whole or not at all:
//! - `a` exists and holds exactly its old or its new content, never a mix, never empty;
//! - when `a` holds the new content, `a.tmp` is gone;
//! - when the new file was fsynced before the rename, an image without the rename still has
//!   `a.tmp` with the new content (nothing of it is lost);
//! - after `sync` returns, the worst crash (every uncertain write lost) shows `a` new, alone.
//!
//! The file system's own test on the simulated disk; `tally-crash`'s explorer checks generated
//! workloads. The checks are shown able to fail (`mutants` feature): a rename that removes the
//! old name in a transaction of its own (`rename-split`), and a rename that does not depend on
//! the unsynced write of the file it moves (`no-dependencies`).

use std::sync::Arc;

use tally_fs::{Fs, FsMutant, MkfsOptions, MountOptions, Owner, RenameFlags, StreamPolicy, ROOT};
use tally_media::{Device, Geometry, Image, MemDevice};
use tally_sim::{CrashConfig, CrashDevice, CrashOptions, CrashPoint, RecordingDevice};

const ME: Owner = Owner { uid: 0, gid: 0 };
/// `a`'s content before the rename and the new file's; 1500 bytes span two 1 KiB blocks.
const OLD: [u8; 1500] = [1; 1500];
const NEW: [u8; 1500] = [2; 1500];

fn options(mutant: Option<FsMutant>) -> MountOptions {
    // Per-file streams: the new file's data and the directory's change go to different
    // streams, so only the recorded dependencies order them.
    MountOptions { streams: StreamPolicy::PerFile, mutant, ..MountOptions::default() }
}

/// What one run leaves to check.
struct Run {
    /// Images of every crash point from the creation of `a.tmp` to its fsync's return (to the
    /// end of `sync` without the fsync).
    before_fsync: Vec<Image>,
    /// Images of every crash point from the fsync's return to the end of `sync`.
    after_fsync: Vec<Image>,
    /// The worst crash after `sync` returned.
    after_sync: Image,
}

/// `a` holds `OLD`, synced; then `a.tmp` is created and written (and fsynced when
/// `fsync_tmp`), renamed over `a`, and the file system synced.
fn images(points: &[CrashPoint]) -> Vec<Image> {
    let options = CrashOptions { samples: 64, tearing: true, ..CrashOptions::default() };
    points.iter().flat_map(|p| p.crash_images(options.clone()).take(96)).collect()
}

/// `a` holds `OLD`, synced; then `a.tmp` is created and written (and fsynced when
/// `fsync_tmp`), renamed over `a`, and the file system synced.
fn run(fsync_tmp: bool, mutant: Option<FsMutant>) -> Run {
    let geometry = Geometry::new(1024, 1024, 512).unwrap();
    let dev = RecordingDevice::new(CrashDevice::new(geometry, CrashConfig::with_seed(13)));
    let ddev: Arc<dyn Device> = dev.clone();
    Fs::mkfs(ddev.clone(), &MkfsOptions { streams: 2, segment_blocks: 16, uuid: Some([5; 16]) })
        .unwrap();
    let fs = Fs::mount(ddev, options(mutant)).unwrap();
    let a = fs.create(None, ROOT, b"a", 0o644, ME).unwrap().ino;
    fs.write(None, a, 0, &OLD).unwrap();
    // Inode numbers are given in order: this one makes a.tmp's stream differ from the root's.
    fs.create(None, ROOT, b"b", 0o644, ME).unwrap();
    fs.sync().unwrap();
    dev.set_recording(true);
    let tmp = fs.create(None, ROOT, b"a.tmp", 0o644, ME).unwrap().ino;
    assert_ne!(tmp % 2, ROOT % 2, "a.tmp must be on another stream than the root (per file)");
    fs.write(None, tmp, 0, &NEW).unwrap();
    let mut before_fsync = Vec::new();
    if fsync_tmp {
        fs.fsync(tmp).unwrap();
        before_fsync = dev.take_points();
        dev.set_recording(true);
    }
    let mut after_fsync = vec![dev.inner().crash_point()];
    fs.rename(None, ROOT, b"a.tmp", ROOT, b"a", RenameFlags::default()).unwrap();
    fs.sync().unwrap();
    after_fsync.extend(dev.take_points());
    if !fsync_tmp {
        before_fsync = std::mem::take(&mut after_fsync);
    }
    let after_sync = dev.inner().durable_image();
    drop(fs);
    Run { before_fsync: images(&before_fsync), after_fsync: images(&after_fsync), after_sync }
}

/// Names and contents, sorted by name.
type Tree = Vec<(Vec<u8>, Vec<u8>)>;

/// The root's files and their contents after mounting `image`, or why it does not mount clean.
fn tree(image: &Image, mutant: Option<FsMutant>) -> Result<Tree, String> {
    let dev: Arc<dyn Device> = Arc::new(MemDevice::from_image(image.clone()));
    let fs = Fs::mount(dev, options(mutant)).map_err(|e| format!("mount failed: {e}"))?;
    let report = fs.fsck();
    if !report.is_clean() {
        return Err(format!("fsck: {:?}", report.problems));
    }
    let mut files = Vec::new();
    for entry in fs.readdir(ROOT, 2).map_err(|e| format!("readdir: {e}"))? {
        let content = fs.read(entry.ino, 0, 1 << 16).map_err(|e| format!("read: {e}"))?;
        files.push((entry.name, content));
    }
    files.sort();
    Ok(files)
}

/// What is wrong with `image`, if anything; `fsynced`: a.tmp was fsynced before the crash.
fn check(image: &Image, fsynced: bool, mutant: Option<FsMutant>) -> Option<String> {
    let files = match tree(image, mutant) {
        Ok(files) => files,
        Err(e) => return Some(e),
    };
    let content = |name: &[u8]| files.iter().find(|(n, _)| n == name).map(|(_, c)| c.as_slice());
    let tmp = content(b"a.tmp");
    match content(b"a") {
        None => Some("a is missing".into()),
        Some(a) if a == NEW.as_slice() && tmp.is_some() => {
            Some("a renamed, a.tmp still there".into())
        }
        Some(a) if a == NEW.as_slice() => None,
        Some(a) if a != OLD.as_slice() => Some(format!("a holds {} other bytes", a.len())),
        // Not renamed: an fsynced new file must be there whole.
        Some(_) if fsynced && tmp != Some(NEW.as_slice()) => {
            Some(format!("not renamed and a.tmp lost ({:?} bytes)", tmp.map(<[u8]>::len)))
        }
        Some(_) => None,
    }
}

impl Run {
    /// The first image that breaks the rules, if any.
    fn first_failure(&self, mutant: Option<FsMutant>) -> Option<String> {
        let phases = [
            (&self.before_fsync, false, "before a.tmp's fsync"),
            (&self.after_fsync, true, "after it"),
        ];
        phases.into_iter().find_map(|(images, fsynced, phase)| {
            images.iter().enumerate().find_map(|(i, image)| {
                check(image, fsynced, mutant).map(|e| format!("image {i} {phase}: {e}"))
            })
        })
    }

    /// Every image of the run.
    fn images(&self) -> impl Iterator<Item = &Image> {
        self.before_fsync.iter().chain(&self.after_fsync)
    }
}

#[test]
fn a_crash_shows_the_rename_whole_or_not_at_all() {
    let new_a = (b"a".to_vec(), NEW.to_vec());
    for fsync_tmp in [true, false] {
        let run = run(fsync_tmp, None);
        let count = run.images().count();
        let renamed =
            run.images().filter(|i| tree(i, None).is_ok_and(|t| t.contains(&new_a))).count();
        // Both outcomes occur, or the test checks nothing.
        assert!(renamed > 0 && renamed < count, "fsync_tmp {fsync_tmp}: {renamed} of {count}");
        assert_eq!(run.first_failure(None), None, "fsync_tmp {fsync_tmp}");
        assert_eq!(
            tree(&run.after_sync, None),
            Ok(vec![new_a.clone(), (b"b".to_vec(), Vec::new())])
        );
        eprintln!("fsync_tmp {fsync_tmp}: {count} images, {renamed} renamed, 0 violations");
    }
}

#[cfg(feature = "mutants")]
#[test]
fn the_checks_catch_a_split_rename_and_a_missing_dependency() {
    for (fsync_tmp, mutant) in [(true, FsMutant::RenameSplit), (false, FsMutant::NoDependencies)] {
        let failure = run(fsync_tmp, Some(mutant)).first_failure(Some(mutant));
        let failure = failure.unwrap_or_else(|| panic!("{} not caught", mutant.name()));
        eprintln!("{}: caught, {failure}", mutant.name());
    }
}

//! Through the kernel, on both transports: the maintenance thread defers cleaning while
//! requests arrive, keeps making changes durable every interval meanwhile, cleans once the
//! mount is idle, and cleans anyway once cleaning has waited `clean_defer_max`
//! (`src/maintenance.rs`).
//!
//! Needs root and a usable /dev/fuse; without FUSE the test prints why it skips.

mod common;

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{require_fuse, wait_until, Scratch};
use tally_fs::{Fs, MountOptions};
use tally_fuse::{MaintenanceCounts, MountConfig, Unmounted};
use tally_media::{FileDevice, FileOptions};

const MS: Duration = Duration::from_millis(1);
/// The maintenance interval of these mounts: short, so many rounds fall in a busy stretch.
const INTERVAL: Duration = Duration::from_millis(100);

/// A mount served on a thread, with its maintenance counts.
struct Mount {
    counts: Arc<MaintenanceCounts>,
    thread: Option<std::thread::JoinHandle<Unmounted>>,
    dir: std::path::PathBuf,
}

impl Mount {
    fn new(s: &Scratch, clean_defer_max: Duration) -> Mount {
        let mut cfg = MountConfig {
            threads: 4,
            maintenance_interval: INTERVAL,
            clean_idle: 400 * MS,
            clean_defer_max,
            ..MountConfig::default()
        };
        // CI runs the tests once with the ring and once through /dev/fuse (`common`).
        if let Ok(how) = std::env::var("TALLY_FUSE_IO_URING") {
            tally_fuse::parse_options(&format!("io_uring={how}"), &mut cfg).unwrap();
        }
        let dev = Arc::new(FileDevice::open(s.image(), FileOptions::default()).unwrap());
        let fs = Fs::mount(dev, MountOptions::default()).unwrap();
        let mounted = tally_fuse::mount(fs, &s.dir(), &cfg).unwrap();
        let counts = mounted.maintenance();
        let thread = Some(std::thread::spawn(move || mounted.run().unwrap()));
        Mount { counts, thread, dir: s.dir() }
    }

    fn cleaned(&self) -> u64 {
        let c = &self.counts;
        c.cleaned_idle() + c.cleaned_space_low() + c.cleaned_overdue()
    }

    fn unmount(mut self) -> Unmounted {
        let mut tries = 0;
        while let Err(e) = tally_fuse::unmount_dir(&self.dir, false) {
            tries += 1;
            assert!(tries < 100, "unmount failed: {e}");
            std::thread::sleep(20 * MS);
        }
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.thread.is_some() {
            let _ = tally_fuse::unmount_dir(&self.dir, true);
        }
    }
}

/// Segments for cleaning to free: eight files written side by side in 256 KiB pieces (24 MiB,
/// several 4 MiB segments on each of the two fresh streams), six of them removed, so each
/// stream's oldest segments are about a quarter live.
fn make_garbage(dir: &Path) {
    let piece = vec![0x5a_u8; 256 << 10];
    let mut files: Vec<File> =
        (0..8).map(|i| File::create(dir.join(format!("f{i}"))).unwrap()).collect();
    for _ in 0..12 {
        for f in &mut files {
            f.write_all(&piece).unwrap();
        }
    }
    for f in &files {
        f.sync_all().unwrap();
    }
    drop(files);
    for i in 2..8 {
        std::fs::remove_file(dir.join(format!("f{i}"))).unwrap();
    }
}

/// Send a `WRITE` every 5 ms for `busy` (each a change to make durable), watching the counts:
/// returns the longest stretch without a round that made changes durable.
fn keep_busy(dir: &Path, busy: Duration, m: &Mount, mut each: impl FnMut(&Mount)) -> Duration {
    let f =
        OpenOptions::new().create(true).truncate(false).write(true).open(dir.join("busy")).unwrap();
    let start = Instant::now();
    let (mut synced, mut synced_at, mut longest) =
        (m.counts.synced_rounds(), start, Duration::ZERO);
    let mut i = 0u64;
    while start.elapsed() < busy {
        f.write_all_at(&i.to_le_bytes(), (i % 256) * 4096).unwrap();
        i += 1;
        let now = Instant::now();
        let s = m.counts.synced_rounds();
        if s != synced {
            (synced, synced_at) = (s, now);
        }
        longest = longest.max(now - synced_at);
        each(m);
        std::thread::sleep(5 * MS);
    }
    longest
}

#[test]
fn cleaning_waits_while_busy_durability_does_not_and_idle_cleans() {
    require_fuse!();
    let s = Scratch::new("maintenance_backoff", "idle");
    // No bound within the test: only idleness may start cleaning.
    let m = Mount::new(&s, Duration::from_secs(3600));
    make_garbage(&m.dir);
    // (A long fsync in `make_garbage` may look idle; nothing was dead before the removals.)
    let (rounds, cleaned, freed) =
        (m.counts.synced_rounds(), m.cleaned(), m.counts.segments_freed());
    let longest = keep_busy(&m.dir, Duration::from_secs(2), &m, |m| {
        assert_eq!(m.cleaned(), cleaned, "cleaning ran while requests arrived: {}", m.counts);
    });
    let c = &m.counts;
    // Twenty intervals: durability went on (a loaded machine may stretch a few).
    assert!(c.synced_rounds() - rounds >= 8, "durability deferred: {c}");
    assert!(longest < Duration::from_secs(1), "{longest:?} without a durable round: {c}");
    assert!(c.deferrals() >= 8, "{c}");
    assert_eq!(c.segments_freed(), freed, "{c}");
    // Idle now: the deferred cleaning runs, and frees what the removals left dead.
    let idle_from = Instant::now();
    wait_until("cleaning once idle", Duration::from_secs(10), || c.segments_freed() > freed);
    assert!(idle_from.elapsed() >= 300 * MS, "cleaned before the mount was idle: {c}");
    assert!(c.cleaned_idle() >= 1 && c.cleaned_overdue() == 0, "{c}");
    eprintln!("{c}");
    assert_eq!(m.unmount(), Unmounted::Clean);
}

#[test]
fn cleaning_runs_on_a_mount_never_idle_once_overdue() {
    require_fuse!();
    let s = Scratch::new("maintenance_backoff", "overdue");
    let m = Mount::new(&s, 800 * MS);
    make_garbage(&m.dir);
    let longest = keep_busy(&m.dir, Duration::from_secs(3), &m, |_| {});
    let c = &m.counts;
    assert!(c.cleaned_overdue() >= 1, "never cleaned under a steady load: {c}");
    assert!(c.segments_freed() > 0, "{c}");
    assert!(longest < Duration::from_secs(1), "{longest:?} without a durable round: {c}");
    eprintln!("{c}");
    assert_eq!(m.unmount(), Unmounted::Clean);
}

//! `tally_sqlite::atomic`'s failure path between SQLite's two commit phases: two `ATTACH`ed
//! databases (the split bank of `common::split`), a few transfers committed, then the device
//! fails at its Nth submit or flush from the start of one more transfer, for every N the
//! transfer's commit reaches (its write, its flush). The group commit runs in
//! SQLite's phase two (`SQLITE_FCNTL_COMMIT_PHASETWO`, after every database's phase one,
//! before any unlock), so the failure lands between the phases. Checked each time:
//! - what `atomic` returned, and what the same connection reads afterwards when the file system
//!   still answers: both databases at the old state or both at the new one, never a mix; the
//!   new one if `atomic` returned `Ok`, the old one if the group's write failed. After a failed *flush* the transfer's writes had completed and
//!   the file system keeps showing them: the outcome of a failed flush is unknown (the device
//!   may have stored them, as here), so `atomic`'s error means "not known durable", and the
//!   connection may read the transfer, in both databases alike;
//! - after a remount of the device's image: `PRAGMA integrity_check` `ok` in both, both holding
//!   the same transfers, the balances summing to the total and matching the model; an `Ok`
//!   transfer present; a transfer whose write failed absent (nothing of it reached the
//!   device). A transfer whose flush failed may be either (its writes completed; the outcome
//!   of a failed flush is unknown), but in both files alike.
//!
//! Mutant it must catch (feature `mutants`): `phase-two-failure-ignored` (the failed group
//! commit reported as committed: `atomic` returns `Ok` for a transfer in neither file).

mod common;

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use common::split;
use common::*;
use tally_fs::{Fs, MkfsOptions, MountOptions};
use tally_media::{
    Device, DeviceStats, Geometry, MediaError, MemDevice, Ticket, Write, WriteFlags,
};
use tally_sqlite::{TallyVfs, VfsMutant, VfsOptions};

const SEED: u64 = 41;
/// Transfers committed before the one that fails.
const BEFORE: i64 = 3;

/// A memory device whose submits and flushes fail from the `fail_at`th one on (counted from
/// when it is armed), as a dying disk's do.
struct FailingDevice {
    inner: MemDevice,
    /// Submits and flushes still allowed; `u64::MAX`: not armed.
    left: AtomicU64,
    /// Which operation failed first: 0 none, 1 submit, 2 flush.
    first: AtomicU64,
}

impl FailingDevice {
    fn arm(&self, n: u64) {
        self.left.store(n, Ordering::SeqCst);
    }

    /// Count one operation; an error if it must fail.
    fn step(&self, kind: u64, op: &'static str) -> tally_media::Result<()> {
        let ok = self
            .left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| match l {
                u64::MAX => Some(l),
                0 => None,
                _ => Some(l - 1),
            })
            .is_ok();
        if ok {
            return Ok(());
        }
        let _ = self.first.compare_exchange(0, kind, Ordering::SeqCst, Ordering::SeqCst);
        Err(MediaError::Io { op, source: io::Error::from_raw_os_error(5) })
    }
}

impl Device for FailingDevice {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn read(&self, block: u64, buf: &mut [u8]) -> tally_media::Result<()> {
        self.inner.read(block, buf)
    }
    fn submit(&self, writes: Vec<Write>, flags: WriteFlags) -> tally_media::Result<Ticket> {
        self.step(1, "pwritev")?;
        self.inner.submit(writes, flags)
    }
    fn wait(&self, ticket: Ticket) -> tally_media::Result<()> {
        self.inner.wait(ticket)
    }
    fn flush(&self) -> tally_media::Result<()> {
        self.step(2, "fdatasync")?;
        self.inner.flush()
    }
    fn stats(&self) -> DeviceStats {
        self.inner.stats()
    }
}

/// What one run saw.
#[derive(Debug)]
struct Outcome {
    /// `atomic` returned `Ok` for the failing transfer.
    acked: bool,
    /// Which device operation failed (1 submit, 2 flush; 0: the commit needed fewer than N).
    failed: u64,
    /// Transfers the same connection read afterwards, per database, if it could.
    live: Option<[Vec<i64>; 2]>,
    /// Transfers after a remount, per database; or why the image is wrong.
    remounted: Result<[Vec<i64>; 2], String>,
}

fn run(fail_at: u64, mutant: Option<VfsMutant>) -> Outcome {
    let dev = Arc::new(FailingDevice {
        inner: MemDevice::new(4096, 16384).unwrap(),
        left: AtomicU64::new(u64::MAX),
        first: AtomicU64::new(0),
    });
    let ddev: Arc<dyn Device> = dev.clone();
    let fs = mkfs_mount(ddev, &MkfsOptions::default());
    let options = VfsOptions { mutant, ..VfsOptions::default() };
    let vfs = TallyVfs::register(&vfs_name("attach-fail"), fs.clone(), options).unwrap();
    let db = split::open(&vfs);
    split::create(&db);
    for k in 1..=BEFORE {
        split::apply(&db, &split::transfer(SEED, k)).unwrap();
    }
    fs.sync().unwrap();

    dev.arm(fail_at);
    let acked = split::apply(&db, &split::transfer(SEED, BEFORE + 1)).is_ok();
    let live = split::look(&db, SEED).ok().map(|seen| seen.transfers);
    let failed = dev.first.load(Ordering::SeqCst);
    drop(db);
    drop(vfs);
    drop(fs);

    let image = dev.inner.image();
    let remounted = (|| {
        let dev: Arc<dyn Device> = Arc::new(MemDevice::from_image(image));
        let fs = Arc::new(Fs::mount(dev, MountOptions::default()).map_err(|e| e.to_string())?);
        let vfs = TallyVfs::register(&vfs_name("attach-fail-judge"), fs, VfsOptions::default())
            .map_err(|e| e.to_string())?;
        let db = split::try_open(&vfs).map_err(|e| e.to_string())?;
        let seen = split::look(&db, SEED).map_err(|e| e.to_string())?;
        if seen.integrity != ["ok", "ok"] {
            return Err(format!("integrity_check {:?}", seen.integrity));
        }
        if seen.transfers[0] != seen.transfers[1] {
            return Err(format!("the databases disagree: {:?}", seen.transfers));
        }
        let n = i64::try_from(seen.transfers[0].len()).map_err(|e| e.to_string())?;
        if seen.transfers[0] != (1..=n).collect::<Vec<_>>() {
            return Err(format!("transfers {:?}", seen.transfers[0]));
        }
        if seen.balances != split::model(SEED, n) {
            return Err(format!("balances {:?} after {n} transfers", seen.balances));
        }
        Ok(seen.transfers)
    })();
    Outcome { acked, failed, live, remounted }
}

/// What is wrong with `o` (empty: nothing).
fn judge(fail_at: u64, o: &Outcome) -> Vec<String> {
    let old: Vec<i64> = (1..=BEFORE).collect();
    let new: Vec<i64> = (1..=BEFORE + 1).collect();
    let mut wrong = Vec::new();
    if let Some(live) = &o.live {
        if live[0] != live[1] {
            wrong.push(format!("the connection reads a mix: {live:?}"));
        } else if live[0] != old && live[0] != new {
            wrong.push(format!("the connection reads transfers {:?}", live[0]));
        } else if live[0] == new && !o.acked && o.failed != 2 {
            wrong.push("the connection reads a transfer whose write failed".to_owned());
        } else if live[0] == old && o.acked {
            wrong.push("atomic() returned Ok, the connection reads the old state".to_owned());
        }
    }
    match &o.remounted {
        Err(e) => wrong.push(format!("after remount: {e}")),
        Ok(seen) => {
            if o.acked && seen[0] != new {
                wrong.push(format!("acknowledged transfer lost: {:?}", seen[0]));
            }
            if o.failed == 1 && seen[0] != old {
                wrong.push(format!("a transfer whose write failed is there: {:?}", seen[0]));
            }
        }
    }
    if o.failed == 0 && !o.acked {
        wrong.push("atomic() failed with no device error".to_owned());
    }
    wrong.into_iter().map(|w| format!("fail at {fail_at} ({o:?}): {w}")).collect()
}

/// Every failure point of the transfer's commit: (points that failed an operation, wrongs).
fn explore(mutant: Option<VfsMutant>) -> (u64, Vec<String>) {
    let mut wrongs = Vec::new();
    let mut failing = 0;
    for fail_at in 0.. {
        let o = run(fail_at, mutant);
        wrongs.extend(judge(fail_at, &o));
        if o.failed == 0 {
            // The commit needed fewer operations than that: every point was tried.
            assert!(o.acked, "{o:?}");
            break;
        }
        failing += 1;
        assert!(fail_at < 64, "the commit never stops reaching the device");
    }
    (failing, wrongs)
}

#[test]
fn a_failure_between_the_phases_leaves_both_databases_old_or_new() {
    let (failing, wrongs) = explore(None);
    println!("{failing} failure points, {} wrong", wrongs.len());
    // At least the group's write and its flush failed once each.
    assert!(failing >= 2, "{failing} failure points");
    assert!(wrongs.is_empty(), "{}", wrongs.join("\n"));
}

#[test]
fn a_write_failure_in_phase_two_is_reported_and_changes_nothing() {
    // The first device operation of the commit is the group's write: it fails.
    let o = run(0, None);
    assert_eq!(o.failed, 1, "{o:?}");
    assert!(!o.acked, "{o:?}");
    let old: Vec<i64> = (1..=BEFORE).collect();
    assert_eq!(o.remounted, Ok([old.clone(), old]), "{o:?}");
}

#[cfg(feature = "mutants")]
#[test]
fn mutant_phase_two_failure_ignored_is_caught() {
    let (failing, wrongs) = explore(Some(VfsMutant::PhaseTwoFailureIgnored));
    println!("{failing} failure points; caught:\n{}", wrongs.join("\n"));
    assert!(!wrongs.is_empty(), "the mutant went unnoticed");
}

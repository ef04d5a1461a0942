//! Small explicit transactions committed flat out, as SQLite commits through the F2FS
//! atomic-write ioctls on the mount (issue 15, seen by the SQLite work of issue 17): on a
//! 256 MiB image a writer committing a few pages per transaction must never get `ENOSPC` while
//! the live data is a few MiB, however long it runs. Before the fix, cleaning never ran: an
//! operation inside an explicit transaction never cleans (liveness is judged on what is on
//! media), and the maintenance round gives up whenever a transaction is open — which, for a
//! writer that is always inside one, is nearly always.

use std::sync::Arc;
use std::time::Duration;

use tally_fs::{Fs, FsError, Maintenance, MkfsOptions, MountOptions, Owner, ROOT};
use tally_media::{Device, MemDevice};

const ME: Owner = Owner { uid: 1000, gid: 1000 };
const BS: usize = 4096;
/// Pages of the database file.
const DB_PAGES: u64 = 1024;

#[test]
fn a_writer_always_inside_a_transaction_never_runs_out_of_space() {
    let dev: Arc<dyn Device> = Arc::new(MemDevice::new(BS as u32, 65_536).unwrap());
    Fs::mkfs(dev.clone(), &MkfsOptions::default()).unwrap();
    let opts = MountOptions {
        write_behind: Some(tally_log::WriteBehind::default()),
        ..MountOptions::default()
    };
    let fs = Arc::new(Fs::mount(dev.clone(), opts).unwrap());
    let _maintenance = Maintenance::spawn(&fs, Duration::from_millis(200));
    let db = fs.create(None, ROOT, b"bank.db", 0o644, ME).unwrap().ino;
    let page = vec![7u8; BS];
    for p in 0..DB_PAGES {
        fs.write(None, db, p * BS as u64, &page).unwrap();
    }
    fs.sync().unwrap();
    let mut rng = fastrand::Rng::with_seed(17);
    // Four times the image in pages committed.
    let commits = 4 * 65_536 / 4;
    let t0 = std::time::Instant::now();
    for n in 0..commits {
        let txn = fs.begin().unwrap();
        let mut result = Ok(());
        for _ in 0..4 {
            let p = rng.u64(..DB_PAGES);
            let mut data = page.clone();
            data[..8].copy_from_slice(&(n as u64).to_le_bytes());
            if let Err(e) = fs.write(Some(&txn), db, p * BS as u64, &data) {
                result = Err(e);
                break;
            }
        }
        match result {
            Ok(()) => fs.commit(txn).unwrap(),
            Err(e) => {
                fs.abort(txn).unwrap();
                let st = fs.statfs();
                panic!(
                    "commit {n} of {commits}: {e} ({} free segments, statfs free {} of {} \
                     blocks)",
                    fs.log().free_segments(),
                    st.blocks_free,
                    st.blocks
                );
            }
        }
        if n % 16 == 15 {
            fs.fsync(db).unwrap();
        }
    }
    eprintln!(
        "{commits} transactions of 4 pages in {:.1?}; {} free segments",
        t0.elapsed(),
        fs.log().free_segments()
    );
    let r = fs.fsck();
    assert!(r.is_clean(), "{:?}", r.problems);
    let _ = FsError::NoSpace;
}

//! SQLite opened by VFS name on a memory-device `Fs`: tables created, transactions committed
//! and rolled back, every commit after the first batch-atomic (no `-journal` file, ever, in the
//! directory after any commit), integrity and the balance invariant kept, and a remount shows
//! every committed transfer.

mod common;

use std::sync::Arc;

use common::*;
use tally_fs::{Fs, MkfsOptions, MountOptions};
use tally_media::{Device, MemDevice};
use tally_sqlite::{TallyVfs, VfsOptions};

const SEED: u64 = 17;

#[test]
fn commits_are_batch_atomic_and_survive_a_remount() {
    let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, 16384).unwrap());
    let fs = mkfs_mount(dev.clone(), &MkfsOptions::default());
    let vfs = TallyVfs::register(&vfs_name("commit"), fs.clone(), VfsOptions::default()).unwrap();
    let db = open(&vfs);
    create(&db);
    let setup = vfs.stats();
    assert_eq!(root_names(&fs), ["bank.db"], "the setup's journal is deleted");

    let mut committed = 0;
    for k in 1..=60 {
        if k % 7 == 0 {
            // A transaction the application rolls back: nothing reaches the file.
            let tx = db.unchecked_transaction().unwrap();
            tx.execute("UPDATE accounts SET balance = 0", []).unwrap();
            tx.execute("DELETE FROM transfers", []).unwrap();
            tx.rollback().unwrap();
        }
        apply(&db, &transfer(SEED, k));
        committed = k;
        assert_eq!(root_names(&fs), ["bank.db"], "a journal file after commit {k}");
    }
    let stats = vfs.stats();
    assert_eq!(stats.journal_opens, setup.journal_opens, "a commit opened a journal: {stats:?}");
    assert_eq!(stats.batch_commits - setup.batch_commits, 60, "{stats:?}");
    assert_eq!(stats.batch_rollbacks, 0);
    assert_eq!(stats.syncs, setup.syncs, "an xSync flushed after a batch commit: {stats:?}");
    assert!(stats.syncs_skipped >= 60, "{stats:?}");

    let seen = look(&db, SEED).unwrap();
    assert_eq!(seen.integrity, "ok");
    assert_eq!(seen.balances.iter().sum::<i64>(), TOTAL);
    assert_eq!(seen.balances, model(SEED, committed));
    assert_eq!(seen.transfers, (1..=committed).collect::<Vec<_>>());
    assert!(seen.rows_match);

    // Remount: every committed transfer is there.
    drop(db);
    drop(vfs);
    let fs = Arc::into_inner(fs).expect("the VFS let go of the file system");
    fs.unmount().unwrap();
    let fs = Arc::new(Fs::mount(dev, MountOptions::default()).unwrap());
    let vfs = TallyVfs::register(&vfs_name("remount"), fs, VfsOptions::default()).unwrap();
    let db = open(&vfs);
    let seen = look(&db, SEED).unwrap();
    assert_eq!(seen.integrity, "ok");
    assert_eq!(seen.balances, model(SEED, committed));
    assert_eq!(seen.transfers, (1..=committed).collect::<Vec<_>>());
    assert!(seen.rows_match);
}

#[test]
fn two_connections_exclude_each_other_like_two_processes() {
    let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, 16384).unwrap());
    let fs = mkfs_mount(dev, &MkfsOptions::default());
    let vfs = TallyVfs::register(&vfs_name("locks"), fs, VfsOptions::default()).unwrap();
    let a = open(&vfs);
    create(&a);
    let b = open(&vfs);
    a.execute_batch("BEGIN IMMEDIATE; UPDATE accounts SET balance = balance + 1 WHERE id = 0;")
        .unwrap();
    // b reads the committed state while a holds RESERVED, and cannot write.
    let total: i64 = b.query_row("SELECT sum(balance) FROM accounts", [], |r| r.get(0)).unwrap();
    assert_eq!(total, TOTAL);
    let busy = b.execute("UPDATE accounts SET balance = 0", []).unwrap_err();
    assert_eq!(busy.sqlite_error_code(), Some(rusqlite::ErrorCode::DatabaseBusy), "{busy}");
    a.execute_batch("UPDATE accounts SET balance = balance - 1 WHERE id = 1; COMMIT;").unwrap();
    apply(&b, &transfer(SEED, 1));
    let seen = look(&a, SEED).unwrap();
    assert_eq!(seen.integrity, "ok");
    assert_eq!(seen.balances.iter().sum::<i64>(), TOTAL);
    assert_eq!(seen.transfers, [1]);
}

#[test]
fn a_batch_too_large_for_one_transaction_commits_through_a_journal() {
    let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, 16384).unwrap());
    let fs = mkfs_mount(dev, &MkfsOptions::default());
    let options = VfsOptions { batch_bytes_max: Some(3 * 4096), ..VfsOptions::default() };
    let vfs = TallyVfs::register(&vfs_name("overflow"), fs.clone(), options).unwrap();
    let db = open(&vfs);
    create(&db);
    let before = vfs.stats();
    let mut k = 1;
    // Small transfers fit in three blocks; a long note does not.
    while vfs.stats().batch_overflows == before.batch_overflows {
        assert!(k < 100, "no transfer overflowed a 3-block batch");
        apply(&db, &transfer(SEED, k));
        k += 1;
    }
    let after = vfs.stats();
    assert!(after.batch_rollbacks > before.batch_rollbacks, "{after:?}");
    assert!(after.journal_opens > before.journal_opens, "the redo used no journal: {after:?}");
    assert!(after.batch_commits > before.batch_commits, "no small batch before it: {after:?}");
    assert_eq!(root_names(&fs), ["bank.db"], "the journal is deleted after the commit");
    let seen = look(&db, SEED).unwrap();
    assert_eq!(seen.integrity, "ok");
    assert_eq!(seen.balances, model(SEED, k - 1));
    assert_eq!(seen.transfers, (1..k).collect::<Vec<_>>());
    assert!(seen.rows_match);
}

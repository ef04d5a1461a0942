//! Two `ATTACH`ed databases committed by `tally_sqlite::atomic` as one Tally transaction: one
//! device flush per commit and no journal or super-journal file; a closure error, a
//! `ROLLBACK`-worthy failure and a transaction too large for one `Fs` transaction change
//! nothing in either file; journal modes come back; WAL is refused; a remount shows every
//! committed transfer in both databases.

mod common;

use std::sync::Arc;

use common::split;
use common::*;
use tally_fs::{Fs, MkfsOptions, MountOptions, ROOT};
use tally_media::{Device, MemDevice};
use tally_sqlite::{atomic, AtomicError, TallyVfs, VfsOptions};

const SEED: u64 = 23;

fn file_bytes(fs: &Fs, name: &[u8]) -> Vec<u8> {
    let ino = fs.lookup(ROOT, name).unwrap().ino;
    fs.read(ino, 0, 1 << 24).unwrap()
}

fn journal_modes(db: &rusqlite::Connection) -> (String, String) {
    let m = |s| db.pragma_query_value(Some(s), "journal_mode", |r| r.get(0)).unwrap();
    (m("main"), m("b"))
}

#[test]
fn two_databases_commit_with_one_flush_and_no_journal() {
    let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, 16384).unwrap());
    let fs = mkfs_mount(dev.clone(), &MkfsOptions::default());
    let vfs = TallyVfs::register(&vfs_name("attach"), fs.clone(), VfsOptions::default()).unwrap();
    let db = split::open(&vfs);
    split::create(&db);
    let mut names = root_names(&fs);
    names.sort();
    assert_eq!(names, ["a.db", "b.db"]);

    let before = (vfs.stats(), dev.stats().flushes);
    for k in 1..=40 {
        split::apply(&db, &split::transfer(SEED, k)).unwrap();
        let mut names = root_names(&fs);
        names.sort();
        assert_eq!(names, ["a.db", "b.db"], "a journal or super-journal after commit {k}");
        assert_eq!(journal_modes(&db), ("delete".into(), "delete".into()), "modes restored");
    }
    let (stats, flushes) = (vfs.stats(), dev.stats().flushes);
    assert_eq!(stats.group_commits - before.0.group_commits, 40, "{stats:?}");
    assert_eq!(stats.group_aborts, before.0.group_aborts, "{stats:?}");
    assert_eq!(stats.journal_opens, before.0.journal_opens, "a journal was opened: {stats:?}");
    assert_eq!(stats.syncs, before.0.syncs, "an xSync flushed inside a group: {stats:?}");
    assert_eq!(stats.batch_commits, before.0.batch_commits, "a file committed on its own");
    // One flush per commit (the maintenance thread may add one now and then).
    let per_commit = (flushes - before.1) as f64 / 40.0;
    assert!((1.0..1.2).contains(&per_commit), "{per_commit} flushes per commit");

    let seen = split::look(&db, SEED).unwrap();
    assert_eq!(seen.integrity, ["ok", "ok"]);
    assert_eq!(seen.balances, split::model(SEED, 40));
    assert_eq!(seen.transfers, [(1..=40).collect::<Vec<_>>(), (1..=40).collect()]);
    assert!(seen.rows_match);

    // Remount: both databases hold every transfer.
    drop(db);
    drop(vfs);
    let fs = Arc::into_inner(fs).expect("the VFS let go of the file system");
    fs.unmount().unwrap();
    let fs = Arc::new(Fs::mount(dev, MountOptions::default()).unwrap());
    let vfs = TallyVfs::register(&vfs_name("attach-remount"), fs, VfsOptions::default()).unwrap();
    let db = split::open(&vfs);
    let seen = split::look(&db, SEED).unwrap();
    assert_eq!(seen.integrity, ["ok", "ok"]);
    assert_eq!(seen.balances, split::model(SEED, 40));
    assert_eq!(seen.transfers[1], (1..=40).collect::<Vec<_>>());
}

#[test]
fn a_failed_closure_changes_neither_file_even_after_cache_spills() {
    let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, 16384).unwrap());
    let fs = mkfs_mount(dev, &MkfsOptions::default());
    let vfs =
        TallyVfs::register(&vfs_name("attach-fail"), fs.clone(), VfsOptions::default()).unwrap();
    let db = split::open(&vfs);
    split::create(&db);
    split::apply(&db, &split::transfer(SEED, 1)).unwrap();
    // A tiny page cache, so that SQLite spills dirty pages into the files mid-transaction.
    db.execute_batch("PRAGMA main.cache_size=2; PRAGMA b.cache_size=2;").unwrap();
    let files = |fs: &Fs| (file_bytes(fs, b"a.db"), file_bytes(fs, b"b.db"));
    let before = files(&fs);
    let stats = vfs.stats();

    let mut spilled = false;
    let err = atomic(&db, |tx| {
        tx.execute("UPDATE main.accounts SET balance = 0", [])?;
        tx.execute("UPDATE b.accounts SET balance = 0", [])?;
        for id in 100..140 {
            tx.execute("INSERT INTO main.transfers VALUES (?1, 0, 0, 0, zeroblob(3000))", [id])?;
            tx.execute("INSERT INTO b.ledger VALUES (?1, 0, 0, 0, zeroblob(3000))", [id])?;
        }
        spilled = files(&fs) != before;
        tx.execute("INSERT INTO b.ledger VALUES (1, 0, 0, 0, NULL)", []) // duplicate id
    })
    .unwrap_err();
    assert!(matches!(err, AtomicError::Sqlite(_)), "{err}");
    assert!(spilled, "SQLite wrote nothing to the files before the failure: untested");
    assert_eq!(files(&fs), before, "a failed closure changed a file");
    let after = vfs.stats();
    assert_eq!(after.group_commits, stats.group_commits);
    assert_eq!(after.group_aborts, stats.group_aborts + 1);
    assert_eq!(journal_modes(&db), ("delete".into(), "delete".into()));
    let seen = split::look(&db, SEED).unwrap();
    assert_eq!(seen.integrity, ["ok", "ok"]);
    assert_eq!(seen.balances, split::model(SEED, 1));
    assert_eq!(seen.transfers, [vec![1], vec![1]]);
    // The connection goes on: the next group commits.
    split::apply(&db, &split::transfer(SEED, 2)).unwrap();
    assert_eq!(split::look(&db, SEED).unwrap().balances, split::model(SEED, 2));
}

#[test]
fn a_group_too_large_for_one_transaction_changes_neither_file() {
    let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, 16384).unwrap());
    let fs = mkfs_mount(dev, &MkfsOptions::default());
    // A small transfer writes about 3 pages per database; one with a long note (half of it
    // in each database, with its overflow pages) at least 4 per database.
    let options = VfsOptions { batch_bytes_max: Some(7 * 4096), ..VfsOptions::default() };
    let vfs = TallyVfs::register(&vfs_name("attach-big"), fs.clone(), options).unwrap();
    let db = split::open(&vfs);
    split::create(&db);
    let files = |fs: &Fs| (file_bytes(fs, b"a.db"), file_bytes(fs, b"b.db"));
    let stats = vfs.stats();
    let mut committed = Vec::new();
    let mut failed = 0;
    for k in 1..=40 {
        let t = split::transfer(SEED, k);
        let before = files(&fs);
        match split::apply(&db, &t) {
            Ok(()) => committed.push(t.clone()),
            Err(e) => {
                assert!(matches!(e, AtomicError::Sqlite(_)), "{e}");
                assert_eq!(files(&fs), before, "transfer {k} failed but changed a file");
                failed += 1;
            }
        }
        if t.note.len() >= 9000 {
            assert!(committed.last().is_none_or(|c| c.id != k), "a {}-byte note fit", t.note.len());
        }
        assert_eq!(journal_modes(&db), ("delete".into(), "delete".into()));
    }
    assert!(failed > 0 && !committed.is_empty(), "{failed} failed, {} committed", committed.len());
    assert!(vfs.stats().batch_overflows > stats.batch_overflows);
    let seen = split::look(&db, SEED).unwrap();
    assert_eq!(seen.integrity, ["ok", "ok"]);
    let mut balances = vec![OPENING; ACCOUNTS as usize];
    for t in &committed {
        balances[t.src as usize] -= t.amount;
        balances[t.dst as usize] += t.amount;
    }
    assert_eq!(seen.balances, balances);
    let ids: Vec<i64> = committed.iter().map(|t| t.id).collect();
    assert_eq!(seen.transfers, [ids.clone(), ids]);
    assert!(seen.rows_match);
    assert_eq!(root_names(&fs).len(), 2, "a journal file was left");
}

#[test]
fn wal_databases_and_open_transactions_are_refused() {
    let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, 16384).unwrap());
    let fs = mkfs_mount(dev, &MkfsOptions::default());
    let vfs = TallyVfs::register(&vfs_name("attach-refuse"), fs, VfsOptions::default()).unwrap();
    let db = split::open(&vfs);
    split::create(&db);
    db.execute_batch("BEGIN").unwrap();
    assert!(matches!(atomic(&db, |_| Ok(())), Err(AtomicError::InTransaction)));
    db.execute_batch("COMMIT").unwrap();
    // WAL needs exclusive locking on this VFS (no shared memory).
    db.execute_batch("PRAGMA b.locking_mode=EXCLUSIVE; PRAGMA b.journal_mode=WAL;").unwrap();
    let err = atomic(&db, |_| Ok(())).unwrap_err();
    assert!(matches!(&err, AtomicError::Wal(name) if name == "b"), "{err}");
    assert_eq!(
        db.pragma_query_value(Some("main"), "journal_mode", |r| r.get::<_, String>(0)).unwrap(),
        "delete",
        "main's mode was left changed"
    );
}

//! A plain `rename a → b` where `b` is a second link to the same inode is a no-op (POSIX). When
//! an open transaction added `b`, that `Ok` would be a rename undone by the transaction's abort:
//! the rename must wait like any change to a held name (`docs/TRANSACTIONS.md`), then fail with
//! `EBUSY` after the bound, changing nothing — or, unbounded, happen once the name is gone.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use tally_fs::{Fs, FsError, MkfsOptions, MountOptions, Owner, RenameFlags, ROOT};
use tally_media::{Device, MemDevice};

const ME: Owner = Owner { uid: 1000, gid: 1000 };

/// A file system holding `a`, and an open transaction that added `b`, a link to `a`'s inode.
fn a_and_held_link() -> (Arc<Fs>, tally_fs::Txn, u64) {
    let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, 16384).unwrap());
    Fs::mkfs(dev.clone(), &MkfsOptions::default()).unwrap();
    let fs = Arc::new(Fs::mount(dev, MountOptions::default()).unwrap());
    let a = fs.create(None, ROOT, b"a", 0o644, ME).unwrap().ino;
    let tx = fs.begin().unwrap();
    fs.link(Some(&tx), a, ROOT, b"b").unwrap();
    (fs, tx, a)
}

fn names(fs: &Fs) -> Vec<Vec<u8>> {
    fs.readdir(ROOT, 2).unwrap().into_iter().map(|e| e.name).collect()
}

fn rename_a_to_b(fs: &Fs) -> tally_fs::Result<()> {
    fs.rename(None, ROOT, b"a", ROOT, b"b", RenameFlags::default())
}

#[test]
fn a_bounded_wait_ends_in_ebusy_and_changes_nothing() {
    let (fs, tx, a) = a_and_held_link();
    fs.set_txn_wait_max(Some(Duration::from_millis(100)));
    let other = fs.clone();
    let started = Instant::now();
    let r = thread::spawn(move || rename_a_to_b(&other)).join().unwrap();
    let waited = started.elapsed();
    assert!(matches!(r, Err(FsError::Busy)), "rename onto a held link: {r:?}");
    assert!(waited >= Duration::from_millis(100), "gave up after {waited:?}");
    fs.abort(tx).unwrap();
    assert_eq!(names(&fs), [b"a".to_vec()]);
    assert_eq!(fs.getattr(a).unwrap().nlink, 1);
}

#[test]
fn an_unbounded_wait_renames_once_the_transaction_aborted() {
    let (fs, tx, a) = a_and_held_link();
    let other = fs.clone();
    let waiter = thread::spawn(move || rename_a_to_b(&other));
    thread::sleep(Duration::from_millis(300));
    assert!(!waiter.is_finished(), "the rename returned while a transaction held `b`");
    fs.abort(tx).unwrap();
    waiter.join().unwrap().unwrap();
    assert_eq!(names(&fs), [b"b".to_vec()], "the rename happened after the abort");
    assert_eq!(fs.lookup(ROOT, b"b").unwrap().ino, a);
}

#[test]
fn after_a_commit_it_is_the_no_op_posix_asks_for() {
    let (fs, tx, a) = a_and_held_link();
    let other = fs.clone();
    let waiter = thread::spawn(move || rename_a_to_b(&other));
    thread::sleep(Duration::from_millis(100));
    fs.commit(tx).unwrap();
    waiter.join().unwrap().unwrap();
    assert_eq!(names(&fs), [b"a".to_vec(), b"b".to_vec()]);
    assert_eq!(fs.getattr(a).unwrap().nlink, 2);
}

#[test]
fn the_thread_holding_the_transaction_gets_ebusy_at_once() {
    let (fs, tx, _) = a_and_held_link();
    assert!(matches!(rename_a_to_b(&fs), Err(FsError::Busy)));
    // Inside the transaction that holds both names: the plain no-op.
    fs.rename(Some(&tx), ROOT, b"a", ROOT, b"b", RenameFlags::default()).unwrap();
    fs.abort(tx).unwrap();
    assert_eq!(names(&fs), [b"a".to_vec()]);
}

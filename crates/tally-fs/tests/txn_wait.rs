//! How long an operation outside transactions waits for an explicit transaction holding what it
//! changes: until the transaction ends by default; at most the bound set with
//! `Fs::set_txn_wait_max`, then `EBUSY` with nothing changed (what the FUSE adapter uses, so a
//! waiting request never holds a request thread forever).

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use tally_fs::{Fs, FsError, MkfsOptions, MountOptions, Owner, ROOT};
use tally_media::{Device, MemDevice};

const ME: Owner = Owner { uid: 1000, gid: 1000 };

fn fs() -> Arc<Fs> {
    let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, 16384).unwrap());
    Fs::mkfs(dev.clone(), &MkfsOptions::default()).unwrap();
    Arc::new(Fs::mount(dev, MountOptions::default()).unwrap())
}

#[test]
fn a_bounded_wait_ends_in_ebusy_and_changes_nothing() {
    let fs = fs();
    let a = fs.create(None, ROOT, b"a", 0o644, ME).unwrap().ino;
    fs.write(None, a, 0, b"old").unwrap();
    let tx = fs.begin().unwrap();
    fs.write(Some(&tx), a, 0, b"new").unwrap();
    fs.set_txn_wait_max(Some(Duration::from_millis(100)));
    let other = fs.clone();
    let started = Instant::now();
    let r = thread::spawn(move || other.write(None, a, 0, b"xyz")).join().unwrap();
    let waited = started.elapsed();
    assert!(matches!(r, Err(FsError::Busy)), "{r:?}");
    assert!(waited >= Duration::from_millis(100), "gave up after {waited:?}");
    assert!(waited < Duration::from_secs(5), "waited {waited:?}");
    fs.abort(tx).unwrap();
    assert_eq!(fs.read(a, 0, 16).unwrap(), b"old");
}

#[test]
fn an_unbounded_wait_lasts_until_the_transaction_ends() {
    let fs = fs();
    let a = fs.create(None, ROOT, b"a", 0o644, ME).unwrap().ino;
    let tx = fs.begin().unwrap();
    fs.write(Some(&tx), a, 0, b"new").unwrap();
    let other = fs.clone();
    let waiter = thread::spawn(move || other.write(None, a, 0, b"N"));
    thread::sleep(Duration::from_millis(300));
    assert!(
        !waiter.is_finished(),
        "a plain write went through while the transaction held the file"
    );
    fs.commit(tx).unwrap();
    assert_eq!(waiter.join().unwrap().unwrap(), 1);
    assert_eq!(fs.read(a, 0, 16).unwrap(), b"New");
}

#[test]
fn a_wait_that_ends_in_time_succeeds() {
    let fs = fs();
    let a = fs.create(None, ROOT, b"a", 0o644, ME).unwrap().ino;
    fs.set_txn_wait_max(Some(Duration::from_secs(10)));
    let tx = fs.begin().unwrap();
    fs.write(Some(&tx), a, 0, b"new").unwrap();
    let other = fs.clone();
    let waiter = thread::spawn(move || other.write(None, a, 0, b"N"));
    thread::sleep(Duration::from_millis(100));
    fs.commit(tx).unwrap();
    assert_eq!(waiter.join().unwrap().unwrap(), 1);
    assert_eq!(fs.read(a, 0, 16).unwrap(), b"New");
}

/// A transaction a server begins for a client binds no thread: an operation outside it on the
/// very thread that began it waits for it like on any other (the FUSE adapter serves many
/// callers' requests on one thread). `Fs::begin` binds its thread, which then gets `EBUSY`.
#[test]
fn a_detached_transaction_makes_its_beginning_thread_wait_too() {
    let fs = fs();
    let a = fs.create(None, ROOT, b"a", 0o644, ME).unwrap().ino;
    let bound = fs.begin().unwrap();
    fs.write(Some(&bound), a, 0, b"new").unwrap();
    assert!(matches!(fs.write(None, a, 0, b"N"), Err(FsError::Busy)));
    fs.commit(bound).unwrap();

    let tx = fs.begin_detached().unwrap();
    fs.write(Some(&tx), a, 0, b"tx!").unwrap();
    let committer = fs.clone();
    let started = Instant::now();
    let commit = thread::spawn(move || {
        thread::sleep(Duration::from_millis(200));
        committer.commit(tx).unwrap();
    });
    // This thread began the transaction: it waits until another thread commits it.
    assert_eq!(fs.write(None, a, 0, b"N").unwrap(), 1);
    assert!(started.elapsed() >= Duration::from_millis(200), "{:?}", started.elapsed());
    commit.join().unwrap();
    assert_eq!(fs.read(a, 0, 16).unwrap(), b"Nx!");
}

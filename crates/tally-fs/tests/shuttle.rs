//! Interleavings of operations and explicit transactions, explored by `shuttle` (randomised and
//! PCT schedules). Only built with `RUSTFLAGS="--cfg shuttle"`, which makes the file system's
//! locks shuttle's; `scripts/test` runs it that way. Each schedule must end without deadlock or
//! panic, with every explicit transaction all-or-nothing and `fsck` clean.
#![cfg(shuttle)]

use std::sync::Arc;

use shuttle::thread;
use tally_fs::{Fs, FsError, MkfsOptions, MountOptions, Owner, ROOT};
use tally_media::{Device, MemDevice};

const ME: Owner = Owner { uid: 0, gid: 0 };
const SCHEDULES: usize = 300;

fn fresh() -> Arc<Fs> {
    fresh_on().1
}

fn fresh_on() -> (Arc<dyn Device>, Arc<Fs>) {
    let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, 2048).unwrap());
    Fs::mkfs(dev.clone(), &MkfsOptions { streams: 2, segment_blocks: 64, uuid: None }).unwrap();
    (dev.clone(), Arc::new(Fs::mount(dev, MountOptions::default()).unwrap()))
}

/// Two transactions write the same two files in opposite orders; a conflict is `EBUSY` at
/// once (never a deadlock), the loser aborts. Afterwards both files hold the same writer's
/// bytes: each transaction was all or nothing.
fn opposite_orders() {
    let fs = fresh();
    let a = fs.create(None, ROOT, b"a", 0o644, ME).unwrap().ino;
    let b = fs.create(None, ROOT, b"b", 0o644, ME).unwrap().ino;
    let handles: Vec<_> = [(a, b, 1u8), (b, a, 2u8)]
        .into_iter()
        .map(|(x, y, tag)| {
            let fs = fs.clone();
            thread::spawn(move || {
                let t = fs.begin().unwrap();
                let r = fs
                    .write(Some(&t), x, 0, &[tag; 100])
                    .and_then(|_| fs.write(Some(&t), y, 0, &[tag; 100]));
                match r {
                    Ok(_) => fs.commit(t).unwrap(),
                    Err(FsError::Busy) => fs.abort(t).unwrap(),
                    Err(e) => panic!("{e}"),
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let (ra, rb) = (fs.read(a, 0, 100).unwrap(), fs.read(b, 0, 100).unwrap());
    assert_eq!(ra, rb, "a transaction was applied in part");
    assert!(fs.fsck().is_clean());
}

/// A plain write to a file a transaction holds waits for it; plain creates in the directory the
/// transaction adds to do not (shared attributes). After the transaction aborts, the directory's
/// link count and entries are exactly those of the plain operations.
fn waiter_and_shared_directory() {
    let fs = fresh();
    let x = fs.create(None, ROOT, b"x", 0o644, ME).unwrap().ino;
    let t = fs.begin().unwrap();
    fs.write(Some(&t), x, 0, b"txn").unwrap();
    fs.mkdir(Some(&t), ROOT, b"tdir", 0o755, ME).unwrap();
    let writer = {
        let fs = fs.clone();
        thread::spawn(move || {
            fs.write(None, x, 0, b"plain").unwrap();
        })
    };
    let creator = {
        let fs = fs.clone();
        thread::spawn(move || {
            fs.mkdir(None, ROOT, b"pdir", 0o755, ME).unwrap();
            fs.create(None, ROOT, b"pfile", 0o644, ME).unwrap();
        })
    };
    let ender = {
        let fs = fs.clone();
        thread::spawn(move || fs.abort(t).unwrap())
    };
    for h in [writer, creator, ender] {
        h.join().unwrap();
    }
    assert_eq!(fs.read(x, 0, 10).unwrap(), b"plain");
    assert_eq!(fs.getattr(ROOT).unwrap().nlink, 3, "root, its `.`, and pdir");
    assert!(fs.lookup(ROOT, b"tdir").is_err());
    assert!(fs.fsck().is_clean(), "{:?}", fs.fsck().problems);
}

/// Two transactions and a plain operation all create in one directory; one transaction commits,
/// the other aborts. The storage version of the directory must end up with exactly the
/// committed changes: a remount (a crash after sync) shows the same directory.
fn two_transactions_share_a_directory() {
    let (dev, fs) = fresh_on();
    let d = fs.mkdir(None, ROOT, b"d", 0o755, ME).unwrap().ino;
    let spawn = |commit: bool, name: &'static [u8]| {
        let fs = fs.clone();
        thread::spawn(move || {
            let t = fs.begin().unwrap();
            fs.mkdir(Some(&t), d, name, 0o755, ME).unwrap();
            if commit {
                fs.commit(t).unwrap();
            } else {
                fs.abort(t).unwrap();
            }
        })
    };
    let t1 = spawn(true, b"kept");
    let t2 = spawn(false, b"dropped");
    let plain = {
        let fs = fs.clone();
        thread::spawn(move || {
            fs.mkdir(None, d, b"plain", 0o755, ME).unwrap();
        })
    };
    for h in [t1, t2, plain] {
        h.join().unwrap();
    }
    let attr = fs.getattr(d).unwrap();
    assert_eq!(attr.nlink, 4, "d, its `.`, kept and plain");
    assert!(fs.fsck().is_clean(), "{:?}", fs.fsck().problems);
    fs.sync().unwrap();
    drop(fs);
    let fs = Fs::mount(dev, MountOptions::default()).unwrap();
    assert_eq!(fs.getattr(d).unwrap().nlink, 4, "what is on media is the committed changes only");
    assert!(fs.fsck().is_clean(), "{:?}", fs.fsck().problems);
}

/// A partial-block write reads its block's old bytes with the state lock dropped (issue 16
/// item 1) while another thread overwrites the whole block and makes it durable (so its bytes
/// leave memory and the retry must read again). Linearizable outcomes only: the overwrite
/// alone (it came last), or the overwrite with the partial write on top (it came first) —
/// never the partial write merged into the block's bytes from before the overwrite.
fn partial_write_against_overwrite() {
    let fs = fresh();
    let f = fs.create(None, ROOT, b"f", 0o644, ME).unwrap().ino;
    fs.write(None, f, 0, &[1u8; 4096]).unwrap();
    fs.fsync(f).unwrap(); // durable: the partial write must fetch the block from the device
    let partial = {
        let fs = fs.clone();
        thread::spawn(move || assert_eq!(fs.write(None, f, 10, b"late").unwrap(), 4))
    };
    let overwrite = {
        let fs = fs.clone();
        thread::spawn(move || {
            fs.write(None, f, 0, &[2u8; 4096]).unwrap();
            fs.sync().unwrap();
        })
    };
    partial.join().unwrap();
    overwrite.join().unwrap();
    let got = fs.read(f, 0, 4096).unwrap();
    let mut both = vec![2u8; 4096];
    both[10..14].copy_from_slice(b"late");
    assert!(got == vec![2u8; 4096] || got == both, "not linearizable: {:?}", &got[..16]);
    assert!(fs.fsck().is_clean(), "{:?}", fs.fsck().problems);
}

#[test]
fn partial_write_against_overwrite_random() {
    shuttle::check_random(partial_write_against_overwrite, SCHEDULES);
}

#[test]
fn partial_write_against_overwrite_pct() {
    shuttle::check_pct(partial_write_against_overwrite, SCHEDULES, 3);
}

#[test]
fn opposite_orders_random() {
    shuttle::check_random(opposite_orders, SCHEDULES);
}

#[test]
fn opposite_orders_pct() {
    shuttle::check_pct(opposite_orders, SCHEDULES, 3);
}

#[test]
fn waiter_and_shared_directory_random() {
    shuttle::check_random(waiter_and_shared_directory, SCHEDULES);
}

#[test]
fn waiter_and_shared_directory_pct() {
    shuttle::check_pct(waiter_and_shared_directory, SCHEDULES, 3);
}

#[test]
fn two_transactions_share_a_directory_random() {
    shuttle::check_random(two_transactions_share_a_directory, SCHEDULES);
}

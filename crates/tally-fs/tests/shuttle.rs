//! Interleavings of operations and explicit transactions, explored by `shuttle` (randomised and
//! PCT schedules). Only built with `RUSTFLAGS="--cfg shuttle"`, which makes the file system's
//! locks shuttle's; `scripts/test` runs it that way. Each schedule must end without deadlock or
//! panic, with every explicit transaction all-or-nothing and `fsck` clean.
#![cfg(shuttle)]

mod linearize;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use shuttle::thread;
use tally_fs::{Fs, FsError, Ino, MkfsOptions, MountOptions, Owner, RenameFlags, ROOT};
use tally_media::{Device, MemDevice};

const ME: Owner = Owner { uid: 0, gid: 0 };
const SCHEDULES: usize = 1000;

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

/// Every directory reachable from the root exactly once, each one's `..` its parent there, and
/// the number reached. A rename cycle (`a` inside `c` inside `a`) leaves directories that the
/// root no longer reaches, or reaches through a loop: the count comes out short, or the walk
/// meets a directory twice.
fn directories_reachable(fs: &Fs) -> usize {
    let mut seen = std::collections::BTreeSet::from([ROOT]);
    let mut todo = vec![ROOT];
    while let Some(dir) = todo.pop() {
        for e in fs.readdir(dir, 0).unwrap() {
            if e.name == b"." || e.name == b".." || e.kind != tally_fs::FileKind::Dir {
                continue;
            }
            assert!(seen.insert(e.ino), "directory {} reached twice: a cycle", e.ino);
            assert_eq!(fs.lookup(e.ino, b"..").unwrap().ino, dir, "`..` of {:?}", e.name);
            todo.push(e.ino);
        }
    }
    seen.len()
}

/// Run `f` on a shuttle thread per closure and join them all.
fn all<F: FnOnce() + Send + 'static>(fs: Vec<F>) {
    let handles: Vec<_> = fs.into_iter().map(thread::spawn).collect();
    for h in handles {
        h.join().unwrap();
    }
}

/// `/a/b → /c/b` and `/c/d → /a/d` at once: cross-directory renames in opposite directions,
/// which per-inode locking taken in argument order would deadlock on (one holds `a` and wants
/// `c`, the other the reverse). Both must succeed, each all or nothing: afterwards `a` holds
/// `d` and `c` holds `b`, nothing else, every directory reachable once, link counts right.
fn opposite_cross_directory_renames() {
    let fs = fresh();
    let a = fs.mkdir(None, ROOT, b"a", 0o755, ME).unwrap().ino;
    let c = fs.mkdir(None, ROOT, b"c", 0o755, ME).unwrap().ino;
    let b = fs.mkdir(None, a, b"b", 0o755, ME).unwrap().ino;
    let d = fs.mkdir(None, c, b"d", 0o755, ME).unwrap().ino;
    let (f1, f2) = (fs.clone(), fs.clone());
    all(vec![
        Box::new(move || f1.rename(None, a, b"b", c, b"b", RenameFlags::default()).unwrap())
            as Box<dyn FnOnce() + Send>,
        Box::new(move || f2.rename(None, c, b"d", a, b"d", RenameFlags::default()).unwrap()),
    ]);
    assert_eq!(fs.lookup(a, b"d").unwrap().ino, d);
    assert_eq!(fs.lookup(c, b"b").unwrap().ino, b);
    assert!(fs.lookup(a, b"b").is_err() && fs.lookup(c, b"d").is_err(), "a name left behind");
    assert_eq!(directories_reachable(&fs), 5);
    assert_eq!((fs.getattr(a).unwrap().nlink, fs.getattr(c).unwrap().nlink), (3, 3));
    assert!(fs.fsck().is_clean(), "{:?}", fs.fsck().problems);
}

/// A rename cycle: `/a → /c/d/a` and `/c → /a/b/c` at once. Each alone is legal; both would
/// put `a` inside `c` inside `a`, cut off from the root. The ancestry check of one must see the
/// other's result: exactly one succeeds, the other fails with `EINVAL`, and the tree has no
/// cycle (every directory reachable from the root, once) and `fsck` is clean. Never a deadlock.
fn rename_cycle() {
    let fs = fresh();
    let a = fs.mkdir(None, ROOT, b"a", 0o755, ME).unwrap().ino;
    let c = fs.mkdir(None, ROOT, b"c", 0o755, ME).unwrap().ino;
    let b = fs.mkdir(None, a, b"b", 0o755, ME).unwrap().ino;
    let d = fs.mkdir(None, c, b"d", 0o755, ME).unwrap().ino;
    let won = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let spawn = |from: &'static [u8], to: Ino| {
        let (fs, won) = (fs.clone(), won.clone());
        Box::new(move || match fs.rename(None, ROOT, from, to, from, RenameFlags::default()) {
            Ok(()) => {
                won.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            Err(FsError::Invalid(_)) => {}
            Err(e) => panic!("rename {from:?}: {e}"),
        }) as Box<dyn FnOnce() + Send>
    };
    all(vec![spawn(b"a", d), spawn(b"c", b)]);
    assert_eq!(won.load(std::sync::atomic::Ordering::SeqCst), 1, "both or neither renamed");
    assert_eq!(directories_reachable(&fs), 5, "a directory cut off from the root");
    assert_eq!(fs.getattr(ROOT).unwrap().nlink, 3, "root, `.` and the one left in it");
    assert!(fs.fsck().is_clean(), "{:?}", fs.fsck().problems);
}

/// Create, write, rename and unlink on one shared directory from three threads. Two threads
/// race to create `d/x` (exactly one may win: a create's name check and insertion are one
/// step); the winner writes its tag into it; a third renames `d/f0` to `d/f1`, unlinks that
/// and makes `d/sub`. The end state is then fully determined: `x` (the winner's bytes), `sub`,
/// and nothing else, the directory's link count right, `fsck` clean.
fn shared_directory_churn() {
    let fs = fresh();
    let d = fs.mkdir(None, ROOT, b"d", 0o755, ME).unwrap().ino;
    fs.create(None, d, b"f0", 0o644, ME).unwrap();
    let winners = Arc::new(std::sync::Mutex::new(Vec::new()));
    let racer = |tag: u8| {
        let (fs, winners) = (fs.clone(), winners.clone());
        Box::new(move || match fs.create(None, d, b"x", 0o644, ME) {
            Ok(attr) => {
                winners.lock().unwrap().push(tag);
                assert_eq!(fs.write(None, attr.ino, 0, &[tag; 3000]).unwrap(), 3000);
            }
            Err(FsError::Exists) => {}
            Err(e) => panic!("create: {e}"),
        }) as Box<dyn FnOnce() + Send>
    };
    let other = {
        let fs = fs.clone();
        Box::new(move || {
            fs.rename(None, d, b"f0", d, b"f1", RenameFlags::default()).unwrap();
            fs.unlink(None, d, b"f1").unwrap();
            fs.mkdir(None, d, b"sub", 0o755, ME).unwrap();
        }) as Box<dyn FnOnce() + Send>
    };
    all(vec![racer(1), racer(2), other]);
    let winners = winners.lock().unwrap().clone();
    assert_eq!(winners.len(), 1, "creates of one name both succeeded: {winners:?}");
    let names: Vec<Vec<u8>> = fs.readdir(d, 0).unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(names.len(), 4, "{names:?}");
    for want in [&b"x"[..], b"sub"] {
        assert!(names.iter().any(|n| n == want), "{want:?} missing: {names:?}");
    }
    let x = fs.lookup(d, b"x").unwrap();
    assert_eq!(fs.read(x.ino, 0, 4000).unwrap(), vec![winners[0]; 3000]);
    assert_eq!(fs.getattr(d).unwrap().nlink, 3);
    assert!(fs.fsck().is_clean(), "{:?}", fs.fsck().problems);
}

/// An explicit transaction that writes `a`, creates `d/t` and renames `b2` into `d` aborts
/// while other threads create in `d`, rename a file into `d` and unlink another there, and
/// write a third file. The abort puts back exactly what the transaction changed and nothing
/// the others did (its undo must not restore `d`'s link count or entries over theirs); a
/// remount after `sync` shows the same.
fn abort_beside_others() {
    let (dev, fs) = fresh_on();
    let d = fs.mkdir(None, ROOT, b"d", 0o755, ME).unwrap().ino;
    let a = fs.create(None, ROOT, b"a", 0o644, ME).unwrap().ino;
    fs.write(None, a, 0, b"old").unwrap();
    fs.create(None, ROOT, b"b", 0o644, ME).unwrap();
    fs.create(None, ROOT, b"b2", 0o644, ME).unwrap();
    fs.create(None, d, b"gone", 0o644, ME).unwrap();
    let c = fs.create(None, ROOT, b"c", 0o644, ME).unwrap().ino;
    let txn = {
        let fs = fs.clone();
        Box::new(move || {
            let t = fs.begin().unwrap();
            fs.write(Some(&t), a, 0, b"new bytes").unwrap();
            fs.create(Some(&t), d, b"t", 0o644, ME).unwrap();
            fs.rename(Some(&t), ROOT, b"b2", d, b"t2", RenameFlags::default()).unwrap();
            fs.abort(t).unwrap();
        }) as Box<dyn FnOnce() + Send>
    };
    let namer = {
        let fs = fs.clone();
        Box::new(move || {
            fs.mkdir(None, d, b"p", 0o755, ME).unwrap();
            fs.rename(None, ROOT, b"b", d, b"b", RenameFlags::default()).unwrap();
            fs.unlink(None, d, b"gone").unwrap();
        }) as Box<dyn FnOnce() + Send>
    };
    let writer = {
        let fs = fs.clone();
        Box::new(move || {
            fs.write(None, c, 0, &[7u8; 5000]).unwrap();
            fs.fsync(c).unwrap();
        }) as Box<dyn FnOnce() + Send>
    };
    all(vec![txn, namer, writer]);
    let check = |fs: &Fs| {
        assert_eq!(fs.read(a, 0, 100).unwrap(), b"old", "the aborted write stayed");
        let mut names: Vec<Vec<u8>> =
            fs.readdir(d, 0).unwrap().into_iter().map(|e| e.name).collect();
        names.sort();
        assert_eq!(names, [&b"."[..], b"..", b"b", b"p"], "d's entries");
        assert!(fs.lookup(ROOT, b"b2").is_ok(), "the aborted rename stayed");
        assert_eq!(fs.getattr(d).unwrap().nlink, 3, "d, `.`, p");
        assert_eq!(fs.read(c, 0, 6000).unwrap(), vec![7u8; 5000]);
        assert!(fs.fsck().is_clean(), "{:?}", fs.fsck().problems);
    };
    check(&fs);
    fs.sync().unwrap();
    drop(fs);
    check(&Fs::mount(dev, MountOptions::default()).unwrap());
}

/// Schedules run so far by `linearizable_history` (each draws its own operations).
static LINEARIZABLE_RUNS: AtomicU64 = AtomicU64::new(0);

std::thread_local! {
    /// Pairs of operations of different threads that overlapped in time, in the schedules this
    /// test thread ran (shuttle runs a test's tasks on the test's thread).
    static OVERLAPS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The multithreaded model-based test (`tests/linearizable.rs`) with shuttle choosing the
/// interleaving instead of the OS: three threads run four seeded random operations each
/// (namespace operations on two shared directories, writes, reads, explicit transactions),
/// every call and return stamped; the history with the final state observed after it must be
/// linearizable against the reference model. Where the OS mostly runs short operations one
/// after another, shuttle switches threads at every lock, wait and notify inside them.
fn linearizable_history() {
    const THREADS: usize = 3;
    let run = LINEARIZABLE_RUNS.fetch_add(1, Ordering::SeqCst);
    let (fs, fx) = linearize::fresh();
    let clock = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (fs, clock) = (fs.clone(), clock.clone());
            thread::spawn(move || {
                let mut rng = fastrand::Rng::with_seed(run * 31 + t as u64);
                let mut events = Vec::new();
                for k in 0..4 {
                    let op = linearize::random_op(&mut rng, (1 + t * 4 + k) as u8);
                    if matches!(op, linearize::Op::Txn { .. }) {
                        events.extend(linearize::run_txn(&fs, fx, t, &op, &clock));
                        continue;
                    }
                    let call = clock.fetch_add(1, Ordering::SeqCst);
                    let ret = linearize::run_op(&fs, fx, &op);
                    let done = clock.fetch_add(1, Ordering::SeqCst);
                    events.push(linearize::Event { thread: t, op, ret, call, done });
                }
                events
            })
        })
        .collect();
    let mut h: Vec<linearize::Event> =
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
    linearize::observe_final(&fs, fx, &mut h, THREADS);
    assert!(
        linearize::linearization(fx, &h, linearize::Variant::Right).is_some(),
        "schedule {run}: not linearizable:\n{}",
        linearize::describe(&h)
    );
    assert!(fs.fsck().is_clean(), "{:?}", fs.fsck().problems);
    OVERLAPS.with(|o| o.set(o.get() + linearize::overlapping_pairs(&h)));
}

/// Without overlapping operations the histories would be sequential and prove little.
fn assert_overlaps() {
    let n = OVERLAPS.with(std::cell::Cell::get);
    assert!(n > SCHEDULES, "only {n} overlapping pairs in {SCHEDULES} schedules");
}

#[test]
fn linearizable_history_random() {
    shuttle::check_random(linearizable_history, SCHEDULES);
    assert_overlaps();
}

#[test]
fn linearizable_history_pct() {
    shuttle::check_pct(linearizable_history, SCHEDULES, 3);
    assert_overlaps();
}

#[test]
fn opposite_cross_directory_renames_random() {
    shuttle::check_random(opposite_cross_directory_renames, SCHEDULES);
}

#[test]
fn opposite_cross_directory_renames_pct() {
    shuttle::check_pct(opposite_cross_directory_renames, SCHEDULES, 3);
}

#[test]
fn rename_cycle_random() {
    shuttle::check_random(rename_cycle, SCHEDULES);
}

#[test]
fn rename_cycle_pct() {
    shuttle::check_pct(rename_cycle, SCHEDULES, 3);
}

#[test]
fn shared_directory_churn_random() {
    shuttle::check_random(shared_directory_churn, SCHEDULES);
}

#[test]
fn shared_directory_churn_pct() {
    shuttle::check_pct(shared_directory_churn, SCHEDULES, 3);
}

#[test]
fn abort_beside_others_random() {
    shuttle::check_random(abort_beside_others, SCHEDULES);
}

#[test]
fn abort_beside_others_pct() {
    shuttle::check_pct(abort_beside_others, SCHEDULES, 3);
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

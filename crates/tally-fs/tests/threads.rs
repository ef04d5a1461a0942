//! Threads sharing one file system: workers on their own files and on a shared directory,
//! explicit transactions that conflict (one gets `EBUSY`, never a deadlock) and commit or
//! abort, and plain operations that wait for a transaction holding their object. Afterwards
//! every thread's own expectations hold, the files written only in transactions are equal (no
//! transaction landed in part), fsck is clean, and a clean remount and a crash remount show
//! exactly the same file system.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

use tally_fs::{
    Attr, DirEntry, FileKind, Fs, FsError, Ino, MkfsOptions, MountOptions, Owner, RenameFlags, ROOT,
};
use tally_media::{Device, MemDevice};

const ME: Owner = Owner { uid: 1000, gid: 1000 };
const BS: usize = 4096;
const WORKERS: u64 = 3;
const ROUNDS: u64 = 150;

/// A block of one repeated byte: a torn or mixed write shows.
fn block(tag: u8) -> Vec<u8> {
    vec![tag; BS]
}

fn uniform(bytes: &[u8]) -> Option<u8> {
    let first = *bytes.first()?;
    bytes.iter().all(|&b| b == first).then_some(first)
}

/// Everything the file system shows: attributes, entries with offsets, contents.
type Dump = BTreeMap<Ino, (Attr, Vec<DirEntry>, Vec<u8>)>;

fn dump(fs: &Fs) -> Dump {
    let mut out = Dump::new();
    let mut todo = vec![ROOT];
    while let Some(ino) = todo.pop() {
        if out.contains_key(&ino) {
            continue;
        }
        let attr = fs.getattr(ino).unwrap();
        let (entries, data) = match attr.kind {
            FileKind::Dir => (fs.readdir(ino, 0).unwrap(), Vec::new()),
            FileKind::File => (Vec::new(), fs.read(ino, 0, attr.size as usize).unwrap()),
            _ => (Vec::new(), Vec::new()),
        };
        todo.extend(entries.iter().skip(2).map(|e| e.ino));
        out.insert(ino, (attr, entries, data));
    }
    out
}

/// A worker: its own file rewritten in place, a write-then-rename into the shared directory,
/// and creates and unlinks there. Returns the names it expects to leave in the shared
/// directory, with their contents.
fn worker(fs: &Fs, me: u64, shared: Ino) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let own = fs.create(None, ROOT, format!("own{me}").as_bytes(), 0o644, ME).unwrap();
    let mut left = BTreeMap::new();
    for round in 0..ROUNDS {
        let tag = (me * 50 + round % 50) as u8;
        fs.write(None, own.ino, (round % 4) * BS as u64, &block(tag)).unwrap();
        let tmp = format!("w{me}.tmp").into_bytes();
        let fin = format!("w{me}.final").into_bytes();
        let t = fs.create(None, shared, &tmp, 0o644, ME).unwrap();
        fs.write(None, t.ino, 0, &block(tag)).unwrap();
        fs.rename(None, shared, &tmp, shared, &fin, RenameFlags::default()).unwrap();
        left.insert(fin, block(tag));
        let n = format!("w{me}.{}", round % 5).into_bytes();
        if round % 10 < 5 {
            fs.create(None, shared, &n, 0o644, ME).unwrap();
            left.insert(n, Vec::new());
        } else {
            fs.unlink(None, shared, &n).unwrap();
            left.remove(&n);
        }
        if round % 37 == 0 {
            fs.fsync(own.ino).unwrap();
        }
    }
    let last = (0..ROUNDS).filter(|r| r % 4 == 3).max().unwrap_or(0);
    assert_eq!(fs.read(own.ino, 3 * BS as u64, BS).unwrap(), block((me * 50 + last % 50) as u8));
    left
}

/// A transaction thread: `a` and `b` are only ever written together, in one transaction.
/// A conflict with the other transaction thread is `EBUSY` (then abort); some transactions
/// abort on purpose. Each also writes `c`, which a plain writer rewrites at the same time
/// (the plain writer waits while a transaction holds it), and creates a name in the shared
/// directory that it removes again in the same transaction or the next.
fn transactions(fs: &Fs, me: u64, files: [Ino; 3], shared: Ino, busy: &AtomicU64) {
    let [a, b, c] = files;
    for round in 0..ROUNDS {
        let tag = (100 + me * 60 + round % 60) as u8;
        let t = fs.begin().unwrap();
        let name = format!("t{me}").into_bytes();
        let mut ok = true;
        for ino in [a, b] {
            match fs.write(Some(&t), ino, 0, &block(tag)) {
                // Hold the object a little: the other threads run into it.
                Ok(_) => thread::yield_now(),
                Err(FsError::Busy) => {
                    busy.fetch_add(1, Ordering::Relaxed);
                    ok = false;
                    break;
                }
                Err(e) => panic!("write in a transaction: {e}"),
            }
        }
        if ok {
            match fs.write(Some(&t), c, 0, &block(tag)) {
                Ok(_) => {}
                Err(FsError::Busy) => ok = false,
                Err(e) => panic!("write in a transaction: {e}"),
            }
        }
        if ok {
            fs.create(Some(&t), shared, &name, 0o644, ME).unwrap();
            fs.unlink(Some(&t), shared, &name).unwrap();
        }
        if round % 16 == 0 {
            thread::sleep(std::time::Duration::from_micros(300));
        }
        if ok && round % 4 != 3 {
            if round % 8 == 0 {
                fs.commit_durable(t).unwrap();
            } else {
                fs.commit(t).unwrap();
            }
        } else {
            fs.abort(t).unwrap();
        }
    }
}

fn check(fs: &Fs, files: [Ino; 3], shared: Ino, expected: &BTreeMap<Vec<u8>, Vec<u8>>) {
    let [a, b, c] = files;
    let (da, db) = (fs.read(a, 0, 2 * BS).unwrap(), fs.read(b, 0, 2 * BS).unwrap());
    assert_eq!(da, db, "a and b are only written together");
    assert!(uniform(&da).is_some());
    let dc = fs.read(c, 0, 2 * BS).unwrap();
    assert!(uniform(&dc).is_some(), "c holds one whole write");
    let mut names = BTreeMap::new();
    for e in fs.readdir(shared, 0).unwrap().into_iter().skip(2) {
        names.insert(e.name.clone(), fs.read(e.ino, 0, 2 * BS).unwrap());
    }
    assert_eq!(&names, expected, "the shared directory");
    let r = fs.fsck();
    assert!(r.is_clean(), "fsck: {:?}", r.problems);
}

#[test]
fn threads_transactions_and_waiters() {
    let dev: Arc<dyn Device> = Arc::new(MemDevice::new(BS as u32, 8192).unwrap());
    Fs::mkfs(dev.clone(), &MkfsOptions { streams: 3, segment_blocks: 32, uuid: None }).unwrap();
    let fs = Arc::new(Fs::mount(dev.clone(), MountOptions::default()).unwrap());
    let shared = fs.mkdir(None, ROOT, b"shared", 0o755, ME).unwrap().ino;
    let files = [b"a", b"b", b"c"].map(|n| {
        let f = fs.create(None, ROOT, n, 0o644, ME).unwrap();
        fs.write(None, f.ino, 0, &block(1)).unwrap();
        f.ino
    });
    let busy = Arc::new(AtomicU64::new(0));
    let waited = Arc::new(AtomicU64::new(0));

    let mut handles = Vec::new();
    for me in 0..WORKERS {
        let fs = fs.clone();
        handles.push(thread::spawn(move || worker(&fs, me, shared)));
    }
    let mut tx = Vec::new();
    for me in 0..2 {
        let (fs, busy) = (fs.clone(), busy.clone());
        tx.push(thread::spawn(move || transactions(&fs, me, files, shared, &busy)));
    }
    // The plain writer of c: waits whenever a transaction holds c.
    let plain = {
        let (fs, waited) = (fs.clone(), waited.clone());
        thread::spawn(move || {
            for round in 0..ROUNDS {
                let start = std::time::Instant::now();
                fs.write(None, files[2], 0, &block(250 - (round % 3) as u8)).unwrap();
                if start.elapsed() > std::time::Duration::from_micros(200) {
                    waited.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    let mut expected = BTreeMap::new();
    for h in handles {
        expected.extend(h.join().unwrap());
    }
    for h in tx {
        h.join().unwrap();
    }
    plain.join().unwrap();
    eprintln!(
        "EBUSY between transactions: {}, slow plain writes (waits): {}",
        busy.load(Ordering::Relaxed),
        waited.load(Ordering::Relaxed)
    );

    check(&fs, files, shared, &expected);
    let before = dump(&fs);
    let fs = Arc::into_inner(fs).expect("every thread is done");
    fs.unmount().unwrap();
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    assert_eq!(dump(&fs), before, "clean remount");
    check(&fs, files, shared, &expected);
    fs.sync().unwrap();
    drop(fs);
    let fs = Fs::mount(dev, MountOptions::default()).unwrap();
    assert_eq!(dump(&fs), before, "crash remount");
    check(&fs, files, shared, &expected);
}

/// Two transactions on overlapping objects, made to overlap deterministically: the second
/// gets `EBUSY` at once (no deadlock), a plain operation on the held object waits until the
/// holder ends, and the holder's abort leaves the plain operation's result.
#[test]
fn conflicting_transactions_and_a_waiter() {
    let dev: Arc<dyn Device> = Arc::new(MemDevice::new(BS as u32, 2048).unwrap());
    Fs::mkfs(dev.clone(), &MkfsOptions { streams: 2, segment_blocks: 32, uuid: None }).unwrap();
    let fs = Arc::new(Fs::mount(dev.clone(), MountOptions::default()).unwrap());
    let x = fs.create(None, ROOT, b"x", 0o644, ME).unwrap().ino;
    let y = fs.create(None, ROOT, b"y", 0o644, ME).unwrap().ino;
    let t1 = fs.begin().unwrap();
    fs.write(Some(&t1), x, 0, b"t1").unwrap();
    let t2 = fs.begin().unwrap();
    fs.write(Some(&t2), y, 0, b"t2").unwrap();
    // Crossed: each touches what the other holds.
    assert!(matches!(fs.write(Some(&t1), y, 0, b"t1"), Err(FsError::Busy)));
    assert!(matches!(fs.unlink(Some(&t2), ROOT, b"x"), Err(FsError::Busy)));
    assert!(matches!(
        fs.rename(Some(&t2), ROOT, b"y", ROOT, b"x", RenameFlags::default()),
        Err(FsError::Busy)
    ));
    // A plain write of x waits for t1.
    let waiter = {
        let fs = fs.clone();
        thread::spawn(move || fs.write(None, x, 0, b"plain").unwrap())
    };
    thread::sleep(std::time::Duration::from_millis(50));
    assert!(!waiter.is_finished(), "a plain write must wait for the transaction holding x");
    assert_eq!(fs.read(x, 0, 10).unwrap(), b"t1");
    fs.abort(t1).unwrap();
    waiter.join().unwrap();
    fs.commit(t2).unwrap();
    assert_eq!(fs.read(x, 0, 10).unwrap(), b"plain");
    assert_eq!(fs.read(y, 0, 10).unwrap(), b"t2");
    let fs = Arc::into_inner(fs).expect("every thread is done");
    fs.unmount().unwrap();
    let fs = Fs::mount(dev, MountOptions::default()).unwrap();
    assert_eq!(fs.read(x, 0, 10).unwrap(), b"plain");
    assert_eq!(fs.read(y, 0, 10).unwrap(), b"t2");
    assert!(fs.fsck().is_clean());
}

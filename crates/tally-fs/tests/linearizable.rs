//! Multithreaded model-based test (issue 16): several threads run seeded random operations on
//! one shared tree at once; every call and return is stamped from one global counter, and the
//! history must be **linearizable** against a reference model: some total order of the
//! operations, consistent with real time (an operation that returned before another was
//! called comes first), in which the model, run sequentially, gives every operation exactly
//! the result the file system returned.
//!
//! The checker is Wing & Gong's search with memoisation (as in Lowe's and Porcupine's
//! checkers): from the set of operations linearized so far and the model's state, try each
//! operation that may come next — one no unlinearized operation returned before the call of —
//! apply it to the model, and recurse if the model's result is the one observed; a (set,
//! state) pair that failed once is not searched again. It is sound (a history it accepts has
//! the order it found; `linearization` returns it) and complete for the histories it is given
//! (it tries every order real time allows). Histories are kept small (3 threads × 6
//! operations per round, many rounds), so the search is short.
//!
//! The tree: two fixed directories `d0` and `d1` (never moved or removed), where the threads
//! create, mkdir, unlink, rmdir, rename (within and across the two, onto files and empty
//! directories) and link, over three names so operations collide; two fixed files `f0` and
//! `f1` in the root that the threads write, read, link into the directories (so unlinks change
//! their link counts) and write inside explicit transactions together with a create (the
//! transaction commits, or aborts when a step fails). Readers see a transaction's changes as
//! they happen (no isolation of readers, `docs/TRANSACTIONS.md`), so a transaction is recorded
//! as its calls — begin and write, create, commit or abort — each linearizable on its own, an
//! abort undoing exactly the transaction's changes in one step, and another transaction's
//! `EBUSY` allowed only while one holds what it touches; lookups,
//! readdirs and getattrs (sizes, link counts, directories' counts included) observe it all.
//! Inode numbers of created objects are the file system's: the model takes them from the
//! create's result and checks them wherever they are observed.
//!
//! It can fail: `the_checker_rejects_a_wrong_model` runs recorded histories against a model
//! whose rename keeps the old name and must reject some; `the_checker_rejects_a_torn_rename`
//! hands it a history in which a rename was seen half done (the name in neither directory)
//! and must reject it, while accepting the same history with the name seen arriving.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use tally_fs::{FileKind, Fs, FsError, Ino, MkfsOptions, MountOptions, Owner, RenameFlags, ROOT};
use tally_media::MemDevice;

const ME: Owner = Owner { uid: 0, gid: 0 };
const THREADS: usize = 3;
const OPS_PER_THREAD: usize = 6;
/// Rounds at most, and the time they may take (whichever comes first; at least `ROUNDS_MIN`).
const ROUNDS_MAX: usize = 3000;
const ROUNDS_MIN: usize = 50;
const TIME_MAX: Duration = Duration::from_secs(15);
/// Names the threads create, remove and rename in `d0` and `d1`.
const NAMES: [&[u8]; 3] = [b"a", b"b", b"c"];
/// Offsets of writes to `f0`/`f1` (the second block's start, an unaligned middle, across the
/// first block's end).
const OFFSETS: [u64; 3] = [0, 1000, 4000];

/// The fixed objects, by index: `d0`, `d1` (directories), `f0`, `f1` (files).
#[derive(Clone, Copy, Debug)]
struct Fixed {
    dirs: [Ino; 2],
    files: [Ino; 2],
}

/// An operation, as a thread issues it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Op {
    Create {
        dir: usize,
        name: usize,
    },
    Mkdir {
        dir: usize,
        name: usize,
    },
    Unlink {
        dir: usize,
        name: usize,
    },
    Rmdir {
        dir: usize,
        name: usize,
    },
    Rename {
        from: (usize, usize),
        to: (usize, usize),
    },
    Link {
        file: usize,
        dir: usize,
        name: usize,
    },
    Write {
        file: usize,
        off: u64,
        len: usize,
        tag: u8,
    },
    Read {
        file: usize,
    },
    Lookup {
        dir: usize,
        name: usize,
    },
    Readdir {
        dir: usize,
    },
    GetattrFile {
        file: usize,
    },
    GetattrDir {
        dir: usize,
    },
    /// `begin; write file; create dir/name; commit` (abort when a step fails). A thread runs
    /// it as the calls below, each its own event: readers see a transaction's changes as they
    /// happen (`docs/TRANSACTIONS.md`: no isolation of readers), so a transaction is not one
    /// atomic step to them; each call is, and an abort undoes exactly its changes at once.
    Txn {
        file: usize,
        tag: u8,
        dir: usize,
        name: usize,
    },
    /// `begin` and the transaction's write of 300 bytes of `tag` at offset 0.
    TxnWrite {
        file: usize,
        tag: u8,
    },
    /// The transaction's create.
    TxnCreate {
        dir: usize,
        name: usize,
    },
    /// `commit`.
    TxnCommit,
    /// `abort`.
    TxnAbort,
}

/// What an abort puts back.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Undo {
    /// A file's bytes before the transaction wrote it.
    Data(Ino, Vec<u8>),
    /// An entry the transaction created.
    Entry(Ino, Vec<u8>, Ino),
}

/// What an operation returned. Errors by kind; `Busy` only from transactions.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Ret {
    Ok,
    Ino(Ino),
    Len(usize),
    Bytes(Vec<u8>),
    /// Sorted (name, inode, is a directory).
    Entries(Vec<(Vec<u8>, Ino, bool)>),
    /// (size, link count).
    Attr(u64, u32),
    Err(&'static str),
}

fn err(e: &FsError) -> Ret {
    Ret::Err(match e {
        FsError::NotFound => "ENOENT",
        FsError::Exists => "EEXIST",
        FsError::NotDir => "ENOTDIR",
        FsError::IsDir => "EISDIR",
        FsError::NotEmpty => "ENOTEMPTY",
        FsError::Invalid(_) => "EINVAL",
        FsError::NotPermitted => "EPERM",
        FsError::Busy => "EBUSY",
        _ => "other",
    })
}

/// One completed operation: who, what, what it returned, and its call and return stamps.
#[derive(Clone, Debug)]
struct Event {
    thread: usize,
    op: Op,
    ret: Ret,
    call: u64,
    done: u64,
}

// ----- the reference model ------------------------------------------------------------------

/// A node: a directory's entries, or a file's bytes and link count.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Node {
    Dir(BTreeMap<Vec<u8>, Ino>),
    File { data: Vec<u8>, nlink: u32 },
}

/// The model: every live inode, and each thread's open transaction's undo list.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Model {
    nodes: BTreeMap<Ino, Node>,
    txns: BTreeMap<usize, Vec<Undo>>,
}

/// A deliberately wrong model, to show the checker rejects what it should.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Variant {
    Right,
    /// Rename adds the new name but keeps the old one.
    RenameKeepsSource,
}

impl Model {
    fn new(fx: Fixed) -> Model {
        let mut root = BTreeMap::new();
        root.insert(b"d0".to_vec(), fx.dirs[0]);
        root.insert(b"d1".to_vec(), fx.dirs[1]);
        root.insert(b"f0".to_vec(), fx.files[0]);
        root.insert(b"f1".to_vec(), fx.files[1]);
        let mut nodes = BTreeMap::from([(ROOT, Node::Dir(root))]);
        for d in fx.dirs {
            nodes.insert(d, Node::Dir(BTreeMap::new()));
        }
        for f in fx.files {
            nodes.insert(f, Node::File { data: Vec::new(), nlink: 1 });
        }
        Model { nodes, txns: BTreeMap::new() }
    }

    /// Whether a transaction other than `thread`'s holds the file or the entry.
    fn held_by_other(&self, thread: usize, what: &Undo) -> bool {
        self.txns.iter().filter(|(&t, _)| t != thread).flat_map(|(_, u)| u).any(|u| {
            match (u, what) {
                (Undo::Data(a, _), Undo::Data(b, _)) => a == b,
                (Undo::Entry(d, n, _), Undo::Entry(e, m, _)) => d == e && n == m,
                _ => false,
            }
        })
    }

    fn entries(&self, dir: Ino) -> &BTreeMap<Vec<u8>, Ino> {
        match self.nodes.get(&dir) {
            Some(Node::Dir(e)) => e,
            _ => panic!("model: {dir} is not a directory"),
        }
    }

    fn entries_mut(&mut self, dir: Ino) -> &mut BTreeMap<Vec<u8>, Ino> {
        match self.nodes.get_mut(&dir) {
            Some(Node::Dir(e)) => e,
            _ => panic!("model: {dir} is not a directory"),
        }
    }

    fn is_dir(&self, ino: Ino) -> bool {
        matches!(self.nodes.get(&ino), Some(Node::Dir(_)))
    }

    /// Remove one name's link to `ino`; a file without names goes, a directory goes.
    fn drop_link(&mut self, ino: Ino) {
        match self.nodes.get_mut(&ino) {
            Some(Node::File { nlink, .. }) if *nlink > 1 => *nlink -= 1,
            _ => {
                self.nodes.remove(&ino);
            }
        }
    }

    fn write(&mut self, file: Ino, off: u64, data: &[u8]) {
        if let Some(Node::File { data: bytes, .. }) = self.nodes.get_mut(&file) {
            let (off, end) = (off as usize, off as usize + data.len());
            if bytes.len() < end {
                bytes.resize(end, 0);
            }
            bytes[off..end].copy_from_slice(data);
        }
    }

    /// Make `name` in `dir`: `Ok(())` or the error; `new` is the inode the file system gave.
    fn make(&mut self, dir: Ino, name: &[u8], new: Option<Ino>, is_dir: bool) -> Ret {
        if self.entries(dir).contains_key(name) {
            return Ret::Err("EEXIST");
        }
        // The name is free: the create must have succeeded, with an inode not in use.
        let Some(ino) = new.filter(|i| !self.nodes.contains_key(i)) else {
            return Ret::Err("must succeed with a new inode");
        };
        self.entries_mut(dir).insert(name.to_vec(), ino);
        let node =
            if is_dir { Node::Dir(BTreeMap::new()) } else { Node::File { data: vec![], nlink: 1 } };
        self.nodes.insert(ino, node);
        Ret::Ino(ino)
    }

    /// Apply `op` (whose observed result is `seen`, for the inode a create chose) and return
    /// what the model says it returns.
    fn step(&mut self, fx: Fixed, thread: usize, op: &Op, seen: &Ret, v: Variant) -> Ret {
        let new = match seen {
            Ret::Ino(i) => Some(*i),
            _ => None,
        };
        match *op {
            Op::Create { dir, name } | Op::Mkdir { dir, name } => {
                self.make(fx.dirs[dir], NAMES[name], new, matches!(op, Op::Mkdir { .. }))
            }
            Op::Unlink { dir, name } | Op::Rmdir { dir, name } => {
                let d = fx.dirs[dir];
                let Some(&ino) = self.entries(d).get(NAMES[name]) else {
                    return Ret::Err("ENOENT");
                };
                match (matches!(op, Op::Rmdir { .. }), self.is_dir(ino)) {
                    (false, true) => return Ret::Err("EISDIR"),
                    (true, false) => return Ret::Err("ENOTDIR"),
                    // Directories made here are never parents: always empty.
                    _ => {}
                }
                self.entries_mut(d).remove(NAMES[name]);
                self.drop_link(ino);
                Ret::Ok
            }
            Op::Rename { from, to } => {
                let (sd, sn) = (fx.dirs[from.0], NAMES[from.1]);
                let (dd, dn) = (fx.dirs[to.0], NAMES[to.1]);
                let Some(&src) = self.entries(sd).get(sn) else { return Ret::Err("ENOENT") };
                if let Some(&dst) = self.entries(dd).get(dn) {
                    if dst == src {
                        return Ret::Ok; // two names of one inode (or the same name)
                    }
                    match (self.is_dir(src), self.is_dir(dst)) {
                        (true, false) => return Ret::Err("ENOTDIR"),
                        (false, true) => return Ret::Err("EISDIR"),
                        _ => {}
                    }
                    self.drop_link(dst);
                }
                if v != Variant::RenameKeepsSource {
                    self.entries_mut(sd).remove(sn);
                }
                self.entries_mut(dd).insert(dn.to_vec(), src);
                Ret::Ok
            }
            Op::Link { file, dir, name } => {
                let (f, d) = (fx.files[file], fx.dirs[dir]);
                if self.entries(d).contains_key(NAMES[name]) {
                    return Ret::Err("EEXIST");
                }
                self.entries_mut(d).insert(NAMES[name].to_vec(), f);
                if let Some(Node::File { nlink, .. }) = self.nodes.get_mut(&f) {
                    *nlink += 1;
                }
                Ret::Ino(f)
            }
            Op::Write { file, off, len, tag } => {
                self.write(fx.files[file], off, &vec![tag; len]);
                Ret::Len(len)
            }
            Op::Read { file } => match self.nodes.get(&fx.files[file]) {
                Some(Node::File { data, .. }) => Ret::Bytes(data.clone()),
                _ => Ret::Err("ENOENT"),
            },
            Op::Lookup { dir, name } => match self.entries(fx.dirs[dir]).get(NAMES[name]) {
                Some(&ino) => Ret::Ino(ino),
                None => Ret::Err("ENOENT"),
            },
            Op::Readdir { dir } => Ret::Entries(
                self.entries(fx.dirs[dir])
                    .iter()
                    .map(|(n, &i)| (n.clone(), i, self.is_dir(i)))
                    .collect(),
            ),
            Op::GetattrFile { file } => match self.nodes.get(&fx.files[file]) {
                Some(Node::File { data, nlink }) => Ret::Attr(data.len() as u64, *nlink),
                _ => Ret::Err("ENOENT"),
            },
            Op::GetattrDir { dir } => {
                let e = self.entries(fx.dirs[dir]);
                let subdirs = e.values().filter(|&&i| self.is_dir(i)).count() as u32;
                Ret::Attr(0, 2 + subdirs)
            }
            Op::Txn { .. } => panic!("a transaction is recorded as its calls"),
            Op::TxnWrite { file, tag } => {
                let f = fx.files[file];
                let Some(Node::File { data, .. }) = self.nodes.get(&f) else {
                    return Ret::Err("ENOENT");
                };
                let pre = Undo::Data(f, data.clone());
                if self.held_by_other(thread, &pre) {
                    return Ret::Err("EBUSY");
                }
                self.txns.entry(thread).or_default().push(pre);
                self.write(f, 0, &[tag; 300]);
                Ret::Len(300)
            }
            Op::TxnCreate { dir, name } => {
                let d = fx.dirs[dir];
                let held = self.held_by_other(thread, &Undo::Entry(d, NAMES[name].to_vec(), 0));
                if held && *seen == Ret::Err("EBUSY") {
                    return Ret::Err("EBUSY");
                }
                let r = self.make(d, NAMES[name], new, false);
                if let Ret::Ino(i) = r {
                    let undo = Undo::Entry(d, NAMES[name].to_vec(), i);
                    self.txns.entry(thread).or_default().push(undo);
                }
                r
            }
            Op::TxnCommit => {
                self.txns.remove(&thread);
                Ret::Ok
            }
            Op::TxnAbort => {
                for u in self.txns.remove(&thread).unwrap_or_default().into_iter().rev() {
                    match u {
                        Undo::Data(f, bytes) => {
                            if let Some(Node::File { data, .. }) = self.nodes.get_mut(&f) {
                                *data = bytes;
                            }
                        }
                        Undo::Entry(d, n, i) => {
                            self.entries_mut(d).remove(&n);
                            self.nodes.remove(&i);
                        }
                    }
                }
                Ret::Ok
            }
        }
    }
}

// ----- the checker --------------------------------------------------------------------------

/// A linearization of `history` against the model (indices in order), or `None`.
fn linearization(fx: Fixed, history: &[Event], v: Variant) -> Option<Vec<usize>> {
    assert!(history.len() <= 64, "histories are bit sets");
    let mut failed: HashSet<(u64, Model)> = HashSet::new();
    let mut order = Vec::new();
    let full = if history.len() == 64 { u64::MAX } else { (1u64 << history.len()) - 1 };
    search(fx, history, v, 0, full, &Model::new(fx), &mut failed, &mut order).then_some(order)
}

#[allow(clippy::too_many_arguments)]
fn search(
    fx: Fixed,
    h: &[Event],
    v: Variant,
    done: u64,
    full: u64,
    model: &Model,
    failed: &mut HashSet<(u64, Model)>,
    order: &mut Vec<usize>,
) -> bool {
    if done == full {
        return true;
    }
    if failed.contains(&(done, model.clone())) {
        return false;
    }
    let pending = || (0..h.len()).filter(move |i| done & 1 << i == 0);
    // Only an operation called before every pending operation's return may come next.
    let first_return = pending().map(|i| h[i].done).min().unwrap_or(u64::MAX);
    for i in pending().filter(|&i| h[i].call < first_return) {
        let mut next = model.clone();
        if next.step(fx, h[i].thread, &h[i].op, &h[i].ret, v) != h[i].ret {
            continue;
        }
        order.push(i);
        if search(fx, h, v, done | 1 << i, full, &next, failed, order) {
            return true;
        }
        order.pop();
    }
    failed.insert((done, model.clone()));
    false
}

// ----- running it ---------------------------------------------------------------------------

fn fresh() -> (Arc<Fs>, Fixed) {
    let dev = Arc::new(MemDevice::new(4096, 4096).unwrap());
    Fs::mkfs(dev.clone(), &MkfsOptions { streams: 2, segment_blocks: 64, uuid: None }).unwrap();
    let fs = Arc::new(Fs::mount(dev, MountOptions::default()).unwrap());
    let dir = |n: &[u8]| fs.mkdir(None, ROOT, n, 0o755, ME).unwrap().ino;
    let dirs = [dir(b"d0"), dir(b"d1")];
    let file = |n: &[u8]| fs.create(None, ROOT, n, 0o644, ME).unwrap().ino;
    let files = [file(b"f0"), file(b"f1")];
    (fs, Fixed { dirs, files })
}

fn random_op(rng: &mut fastrand::Rng, tag: u8) -> Op {
    let (d, n, f) = (rng.usize(..2), rng.usize(..NAMES.len()), rng.usize(..2));
    match rng.u32(..100) {
        0..=11 => Op::Create { dir: d, name: n },
        12..=19 => Op::Mkdir { dir: d, name: n },
        20..=29 => Op::Unlink { dir: d, name: n },
        30..=35 => Op::Rmdir { dir: d, name: n },
        36..=51 => Op::Rename { from: (d, n), to: (rng.usize(..2), rng.usize(..NAMES.len())) },
        52..=56 => Op::Link { file: f, dir: d, name: n },
        57..=64 => {
            let off = OFFSETS[rng.usize(..OFFSETS.len())];
            Op::Write { file: f, off, len: rng.usize(1..=200), tag }
        }
        65..=69 => Op::Read { file: f },
        70..=75 => Op::Lookup { dir: d, name: n },
        76..=85 => Op::Readdir { dir: d },
        86..=89 => Op::GetattrFile { file: f },
        90..=93 => Op::GetattrDir { dir: d },
        _ => Op::Txn { file: f, tag, dir: d, name: n },
    }
}

fn run_op(fs: &Fs, fx: Fixed, op: &Op) -> Ret {
    let r = |res: Result<Ret, FsError>| res.unwrap_or_else(|e| err(&e));
    match *op {
        Op::Create { dir, name } => {
            r(fs.create(None, fx.dirs[dir], NAMES[name], 0o644, ME).map(|a| Ret::Ino(a.ino)))
        }
        Op::Mkdir { dir, name } => {
            r(fs.mkdir(None, fx.dirs[dir], NAMES[name], 0o755, ME).map(|a| Ret::Ino(a.ino)))
        }
        Op::Unlink { dir, name } => r(fs.unlink(None, fx.dirs[dir], NAMES[name]).map(|()| Ret::Ok)),
        Op::Rmdir { dir, name } => r(fs.rmdir(None, fx.dirs[dir], NAMES[name]).map(|()| Ret::Ok)),
        Op::Rename { from, to } => r(fs
            .rename(
                None,
                fx.dirs[from.0],
                NAMES[from.1],
                fx.dirs[to.0],
                NAMES[to.1],
                RenameFlags::default(),
            )
            .map(|()| Ret::Ok)),
        Op::Link { file, dir, name } => {
            r(fs.link(None, fx.files[file], fx.dirs[dir], NAMES[name]).map(|a| Ret::Ino(a.ino)))
        }
        Op::Write { file, off, len, tag } => {
            r(fs.write(None, fx.files[file], off, &vec![tag; len]).map(Ret::Len))
        }
        Op::Read { file } => r(fs.read(fx.files[file], 0, 1 << 16).map(Ret::Bytes)),
        Op::Lookup { dir, name } => {
            r(fs.lookup(fx.dirs[dir], NAMES[name]).map(|a| Ret::Ino(a.ino)))
        }
        Op::Readdir { dir } => r(fs.readdir(fx.dirs[dir], 0).map(|es| {
            let mut out: Vec<_> = es
                .into_iter()
                .filter(|e| e.name != b"." && e.name != b"..")
                .map(|e| (e.name, e.ino, e.kind == FileKind::Dir))
                .collect();
            out.sort();
            Ret::Entries(out)
        })),
        Op::GetattrFile { file } => {
            r(fs.getattr(fx.files[file]).map(|a| Ret::Attr(a.size, a.nlink)))
        }
        Op::GetattrDir { dir } => r(fs.getattr(fx.dirs[dir]).map(|a| Ret::Attr(0, a.nlink))),
        Op::Txn { .. }
        | Op::TxnWrite { .. }
        | Op::TxnCreate { .. }
        | Op::TxnCommit
        | Op::TxnAbort => panic!("transactions run through run_txn"),
    }
}

/// Run `Op::Txn` as its calls, each an event stamped by `clock`.
fn run_txn(fs: &Fs, fx: Fixed, thread: usize, op: &Op, clock: &AtomicU64) -> Vec<Event> {
    let Op::Txn { file, tag, dir, name } = *op else { panic!("not a transaction: {op:?}") };
    let mut out = Vec::new();
    let mut event = |op: Op, run: &mut dyn FnMut() -> Ret| {
        let call = clock.fetch_add(1, Ordering::SeqCst);
        let ret = run();
        let done = clock.fetch_add(1, Ordering::SeqCst);
        let ok = !matches!(ret, Ret::Err(_));
        out.push(Event { thread, op, ret, call, done });
        ok
    };
    let mut txn = None;
    let wrote = event(Op::TxnWrite { file, tag }, &mut || {
        let t = fs.begin().unwrap();
        let r = fs.write(Some(&t), fx.files[file], 0, &[tag; 300]);
        txn = Some(t);
        r.map_or_else(|e| err(&e), Ret::Len)
    });
    let created = wrote
        && event(Op::TxnCreate { dir, name }, &mut || {
            let t = txn.as_ref().unwrap();
            fs.create(Some(t), fx.dirs[dir], NAMES[name], 0o644, ME)
                .map_or_else(|e| err(&e), |a| Ret::Ino(a.ino))
        });
    let end = if created { Op::TxnCommit } else { Op::TxnAbort };
    event(end, &mut || {
        let t = txn.take().unwrap();
        let r = if created { fs.commit(t) } else { fs.abort(t) };
        r.map_or_else(|e| err(&e), |()| Ret::Ok)
    });
    out
}

/// One round: a fresh file system, `THREADS` threads each running its seeded operations,
/// started together; the history, in no particular order.
fn round(seed: u64) -> (Fixed, Vec<Event>, Arc<Fs>) {
    let (fs, fx) = fresh();
    let clock = Arc::new(AtomicU64::new(0));
    let start = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (fs, clock, start) = (fs.clone(), clock.clone(), start.clone());
            std::thread::spawn(move || {
                let mut rng = fastrand::Rng::with_seed(seed ^ ((t as u64 + 1) * 0x9E37_79B9));
                let ops: Vec<Op> = (0..OPS_PER_THREAD)
                    .map(|k| random_op(&mut rng, (1 + t * OPS_PER_THREAD + k) as u8))
                    .collect();
                start.wait();
                let mut events = Vec::new();
                for op in ops {
                    if matches!(op, Op::Txn { .. }) {
                        events.extend(run_txn(&fs, fx, t, &op, &clock));
                        continue;
                    }
                    let call = clock.fetch_add(1, Ordering::SeqCst);
                    let ret = run_op(&fs, fx, &op);
                    let done = clock.fetch_add(1, Ordering::SeqCst);
                    events.push(Event { thread: t, op, ret, call, done });
                }
                events
            })
        })
        .collect();
    let history = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
    (fx, history, fs)
}

/// Pairs of operations of different threads whose call-return intervals overlap.
fn overlapping_pairs(h: &[Event]) -> usize {
    let mut n = 0;
    for (i, a) in h.iter().enumerate() {
        for b in &h[i + 1..] {
            if a.thread != b.thread && a.call < b.done && b.call < a.done {
                n += 1;
            }
        }
    }
    n
}

fn describe(h: &[Event]) -> String {
    let mut h = h.to_vec();
    h.sort_by_key(|e| e.call);
    h.iter()
        .map(|e| format!("  t{} [{}, {}] {:?} -> {:?}\n", e.thread, e.call, e.done, e.op, e.ret))
        .collect()
}

fn base_seed() -> u64 {
    std::env::var("TALLY_LIN_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x11AE_A216_u64)
}

/// Every round's history, with the final state observed after it, is linearizable, and `fsck`
/// is clean.
#[test]
fn concurrent_histories_are_linearizable() {
    let seed = base_seed();
    let started = Instant::now();
    let (mut rounds, mut overlaps, mut busy) = (0usize, 0usize, 0usize);
    while rounds < ROUNDS_MAX && (rounds < ROUNDS_MIN || started.elapsed() < TIME_MAX) {
        let s = seed.wrapping_add(rounds as u64);
        let (fx, h, fs) = round(s);
        // The final state, observed once every thread is done, is part of the history: it
        // must be what some linearization of the operations leaves.
        let mut h = h;
        let mut stamp = h.iter().map(|e| e.done).max().unwrap_or(0) + 1;
        for op in [
            Op::Readdir { dir: 0 },
            Op::Readdir { dir: 1 },
            Op::Read { file: 0 },
            Op::Read { file: 1 },
            Op::GetattrFile { file: 0 },
            Op::GetattrFile { file: 1 },
            Op::GetattrDir { dir: 0 },
            Op::GetattrDir { dir: 1 },
        ] {
            let ret = run_op(&fs, fx, &op);
            h.push(Event { thread: THREADS, op, ret, call: stamp, done: stamp + 1 });
            stamp += 2;
        }
        if linearization(fx, &h, Variant::Right).is_none() {
            panic!(
                "round seed {s} (TALLY_LIN_SEED={seed}, round {rounds}): not linearizable:\n{}",
                describe(&h)
            );
        }
        assert!(fs.fsck().is_clean(), "seed {s}: {:?}", fs.fsck().problems);
        overlaps += overlapping_pairs(&h);
        busy += h.iter().filter(|e| e.ret == Ret::Err("EBUSY")).count();
        rounds += 1;
    }
    println!(
        "{rounds} rounds of {THREADS}x{OPS_PER_THREAD} operations linearizable in {:.1} s; \
         {overlaps} overlapping pairs of operations, {busy} EBUSY",
        started.elapsed().as_secs_f64()
    );
    // Without overlap the test would check sequential histories only.
    assert!(overlaps > rounds, "too little concurrency: {overlaps} overlaps in {rounds} rounds");
}

/// A model whose rename keeps the old name is wrong; on recorded histories with successful
/// renames the checker must say so (else it accepts anything).
#[test]
fn the_checker_rejects_a_wrong_model() {
    let seed = base_seed();
    let (mut rejected, mut with_renames) = (0, 0);
    for k in 0..60u64 {
        let (fx, h, _fs) = round(seed.wrapping_add(10_000 + k));
        assert!(linearization(fx, &h, Variant::Right).is_some(), "round {k}");
        if h.iter().any(|e| matches!(e.op, Op::Rename { .. }) && e.ret == Ret::Ok) {
            with_renames += 1;
        }
        if linearization(fx, &h, Variant::RenameKeepsSource).is_none() {
            rejected += 1;
        }
    }
    println!("wrong model rejected on {rejected} of 60 histories ({with_renames} with a rename)");
    assert!(rejected > 0, "the checker accepted every history against a wrong model");
}

/// A history where a rename from `d0` to `d1` is seen half done — while it runs, one thread
/// sees the name gone from `d0` and then not yet in `d1` — is not linearizable; the same
/// history with the name seen in `d1` is.
#[test]
fn the_checker_rejects_a_torn_rename() {
    let fx = Fixed { dirs: [10, 11], files: [12, 13] };
    let a = 20;
    let ev = |thread, op, ret, call, done| Event { thread, op, ret, call, done };
    let history = |seen_in_d1: Vec<(Vec<u8>, Ino, bool)>| {
        vec![
            ev(0, Op::Create { dir: 0, name: 0 }, Ret::Ino(a), 0, 1),
            ev(0, Op::Rename { from: (0, 0), to: (1, 0) }, Ret::Ok, 2, 9),
            ev(1, Op::Readdir { dir: 0 }, Ret::Entries(vec![]), 3, 4),
            ev(1, Op::Readdir { dir: 1 }, Ret::Entries(seen_in_d1), 5, 6),
        ]
    };
    let torn = history(vec![]);
    assert!(linearization(fx, &torn, Variant::Right).is_none(), "a torn rename was accepted");
    let whole = history(vec![(b"a".to_vec(), a, false)]);
    assert!(linearization(fx, &whole, Variant::Right).is_some(), "an atomic rename was rejected");
    // And real time is respected: the rename seen done before it was called is rejected.
    let early = vec![
        ev(0, Op::Create { dir: 0, name: 0 }, Ret::Ino(a), 0, 1),
        ev(1, Op::Readdir { dir: 1 }, Ret::Entries(vec![(b"a".to_vec(), a, false)]), 2, 3),
        ev(0, Op::Rename { from: (0, 0), to: (1, 0) }, Ret::Ok, 4, 5),
    ];
    assert!(linearization(fx, &early, Variant::Right).is_none(), "real-time order ignored");
}

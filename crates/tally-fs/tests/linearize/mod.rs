//! The reference model, the linearizability checker and the operations of the multithreaded
//! model-based test, shared by `tests/linearizable.rs` (OS threads) and `tests/shuttle.rs`
//! (shuttle's schedules). `tests/linearizable.rs` describes them.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tally_fs::{
    FileKind, Fs, FsError, Ino, MkfsOptions, MountOptions, Owner, RenameFlags, SetAttr, ROOT,
};
use tally_media::MemDevice;

pub(crate) const ME: Owner = Owner { uid: 0, gid: 0 };
/// Names the threads create, remove and rename in `d0` and `d1`.
pub(crate) const NAMES: [&[u8]; 3] = [b"a", b"b", b"c"];
/// Offsets of writes to `f0`/`f1` (the second block's start, an unaligned middle, across the
/// first block's end).
pub(crate) const OFFSETS: [u64; 3] = [0, 1000, 4000];
/// Sizes a truncate sets (into the first block, into the second, past every write's end).
pub(crate) const TRUNCATE_SIZES: [u64; 3] = [700, 4100, 6000];

/// The fixed objects, by index: `d0`, `d1` (directories), `f0`, `f1` (files).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fixed {
    pub(crate) dirs: [Ino; 2],
    pub(crate) files: [Ino; 2],
}

/// An operation, as a thread issues it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Op {
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
    /// `setattr` of the size (down into a block, or up past the written bytes).
    Truncate {
        file: usize,
        size: u64,
    },
    /// `fsync` (nothing the model sees; its durable wait is where another thread runs).
    Fsync {
        file: usize,
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
pub(crate) enum Undo {
    /// A file's bytes before the transaction wrote it.
    Data(Ino, Vec<u8>),
    /// An entry the transaction created.
    Entry(Ino, Vec<u8>, Ino),
}

/// What an operation returned. Errors by kind; `Busy` only from transactions.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Ret {
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

pub(crate) fn err(e: &FsError) -> Ret {
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
pub(crate) struct Event {
    pub(crate) thread: usize,
    pub(crate) op: Op,
    pub(crate) ret: Ret,
    pub(crate) call: u64,
    pub(crate) done: u64,
}

// ----- the reference model ------------------------------------------------------------------

/// A node: a directory's entries, or a file's bytes and link count.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Node {
    Dir(BTreeMap<Vec<u8>, Ino>),
    File { data: Vec<u8>, nlink: u32 },
}

/// The model: every live inode, and each thread's open transaction's undo list.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Model {
    nodes: BTreeMap<Ino, Node>,
    txns: BTreeMap<usize, Vec<Undo>>,
}

/// A deliberately wrong model, to show the checker rejects what it should.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Variant {
    Right,
    /// Rename adds the new name but keeps the old one.
    RenameKeepsSource,
    /// An abort undoes the transaction's entries but not its writes.
    AbortKeepsWrites,
}

impl Model {
    pub(crate) fn new(fx: Fixed) -> Model {
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
    pub(crate) fn step(
        &mut self,
        fx: Fixed,
        thread: usize,
        op: &Op,
        seen: &Ret,
        v: Variant,
    ) -> Ret {
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
            Op::Truncate { file, size } => {
                if let Some(Node::File { data, .. }) = self.nodes.get_mut(&fx.files[file]) {
                    data.resize(size as usize, 0);
                }
                Ret::Ok
            }
            Op::Fsync { .. } => Ret::Ok,
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
                        Undo::Data(..) if v == Variant::AbortKeepsWrites => {}
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
pub(crate) fn linearization(fx: Fixed, history: &[Event], v: Variant) -> Option<Vec<usize>> {
    assert!(history.len() <= 64, "histories are bit sets");
    let mut failed: HashSet<(u64, Model)> = HashSet::new();
    let mut order = Vec::new();
    let full = if history.len() == 64 { u64::MAX } else { (1u64 << history.len()) - 1 };
    search(fx, history, v, 0, full, &Model::new(fx), &mut failed, &mut order).then_some(order)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn search(
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

pub(crate) fn fresh() -> (Arc<Fs>, Fixed) {
    let dev = Arc::new(MemDevice::new(4096, 4096).unwrap());
    Fs::mkfs(dev.clone(), &MkfsOptions { streams: 2, segment_blocks: 64, uuid: None }).unwrap();
    let fs = Arc::new(Fs::mount(dev, MountOptions::default()).unwrap());
    let dir = |n: &[u8]| fs.mkdir(None, ROOT, n, 0o755, ME).unwrap().ino;
    let dirs = [dir(b"d0"), dir(b"d1")];
    let file = |n: &[u8]| fs.create(None, ROOT, n, 0o644, ME).unwrap().ino;
    let files = [file(b"f0"), file(b"f1")];
    (fs, Fixed { dirs, files })
}

pub(crate) fn random_op(rng: &mut fastrand::Rng, tag: u8) -> Op {
    let (d, n, f) = (rng.usize(..2), rng.usize(..NAMES.len()), rng.usize(..2));
    match rng.u32(..110) {
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
        94..=99 => Op::Txn { file: f, tag, dir: d, name: n },
        100..=104 => {
            Op::Truncate { file: f, size: TRUNCATE_SIZES[rng.usize(..TRUNCATE_SIZES.len())] }
        }
        _ => Op::Fsync { file: f },
    }
}

pub(crate) fn run_op(fs: &Fs, fx: Fixed, op: &Op) -> Ret {
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
        Op::Truncate { file, size } => r(fs
            .setattr(None, fx.files[file], &SetAttr { size: Some(size), ..SetAttr::default() })
            .map(|_| Ret::Ok)),
        Op::Fsync { file } => r(fs.fsync(fx.files[file]).map(|()| Ret::Ok)),
        Op::Txn { .. }
        | Op::TxnWrite { .. }
        | Op::TxnCreate { .. }
        | Op::TxnCommit
        | Op::TxnAbort => panic!("transactions run through run_txn"),
    }
}

/// Run `Op::Txn` as its calls, each an event stamped by `clock`.
pub(crate) fn run_txn(fs: &Fs, fx: Fixed, thread: usize, op: &Op, clock: &AtomicU64) -> Vec<Event> {
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
/// Pairs of operations of different threads whose call-return intervals overlap.
pub(crate) fn overlapping_pairs(h: &[Event]) -> usize {
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

pub(crate) fn describe(h: &[Event]) -> String {
    let mut h = h.to_vec();
    h.sort_by_key(|e| e.call);
    h.iter()
        .map(|e| format!("  t{} [{}, {}] {:?} -> {:?}\n", e.thread, e.call, e.done, e.op, e.ret))
        .collect()
}

/// Observe the final state once every thread is done (readdirs, reads, getattrs) and add the
/// observations to the history as a last thread's: it must be what some linearization leaves.
pub(crate) fn observe_final(fs: &Fs, fx: Fixed, h: &mut Vec<Event>, thread: usize) {
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
        let ret = run_op(fs, fx, &op);
        h.push(Event { thread, op, ret, call: stamp, done: stamp + 1 });
        stamp += 2;
    }
}

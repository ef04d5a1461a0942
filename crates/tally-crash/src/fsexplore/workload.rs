//! Workloads for the file-system explorer, in the style of B3/ACE: from a small durable tree,
//! sequences of one or two operations, each followed by a persistence operation (or none).
//!
//! Operations name paths; they are resolved against the model when they run (`resolve`), so
//! one description replays the same bytes, sizes and names every time.

use std::fmt;

use super::model::{join, MIno, MOp, MState, MROOT};

/// How a write lands in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteKind {
    /// At the end, 700 bytes (crossing a block boundary when the size is not aligned).
    Append,
    /// One whole block at offset 0.
    Overwrite,
    /// A block and a half from offset 300: two partial blocks.
    Unaligned,
    /// 200 bytes two blocks past the end: a hole before them.
    Sparse,
    /// Five blocks at the end: one transaction of six blocks, so a stream moves on to its next
    /// segment after a few of them.
    Big,
    /// [`HUGE_BLOCKS`] blocks from offset 0 (over the file's first blocks, then past its end):
    /// inside an explicit transaction, a large transaction whose parts span three or more of
    /// the explorer's 16-block segments (`large`); not in the catalogue.
    Huge,
}

/// Blocks a [`WriteKind::Huge`] write covers: more than two 16-block segments can hold.
pub const HUGE_BLOCKS: u64 = 40;

/// Which way a truncate goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TruncKind {
    /// To just under half the size (a partial last block).
    Down,
    /// A block and 300 bytes past the size (zeros).
    Up,
}

/// How an explicit transaction ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnEnd {
    /// `commit`: ordered, atomic, not durable.
    Commit,
    /// `commit_durable`: durable when it returns.
    CommitDurable,
    /// `abort`: nothing of it may ever appear.
    Abort,
}

/// One operation of a workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FsOp {
    /// `create(path)`.
    Create(String),
    /// `mkdir(path)`.
    Mkdir(String),
    /// `write(path)`.
    Write(String, WriteKind),
    /// `truncate(path)`.
    Truncate(String, TruncKind),
    /// `link(existing, new)`.
    Link(String, String),
    /// `unlink(path)`.
    Unlink(String),
    /// `rename(from, to)` (replacing `to` if it exists).
    Rename(String, String),
    /// `rmdir(path)`.
    Rmdir(String),
    /// `chmod(path)` (0600 ↔ 0640).
    Chmod(String),
    /// `setxattr(path, "user.t")`.
    SetXattr(String),
    /// `removexattr(path, first attribute)`.
    RemoveXattr(String),
    /// `begin; ops; end`.
    Txn(Vec<FsOp>, TxnEnd),
    /// `Fs::clean(stream, all but the current segment)`: relocation of live records and data.
    Clean(u16),
}

/// What follows an operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Persist {
    /// `fsync(path)`.
    Fsync(String),
    /// `fdatasync(path)`.
    Fdatasync(String),
    /// `fsync` of the directory `path` (the operation's parent).
    FsyncDir(String),
    /// `barrier(path)`.
    Barrier(String),
    /// `sync()`.
    Sync,
    /// Nothing.
    Nothing,
}

/// An operation and what follows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// The operation.
    pub op: FsOp,
    /// The persistence operation after it.
    pub persist: Persist,
}

/// A workload: steps run in order from the start tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsWorkload(pub Vec<Step>);

/// The extended attribute the start tree gives `/A/foo`.
pub const START_XATTR: &[u8] = b"user.a";
/// The attribute `SetXattr` sets.
pub const SET_XATTR: &[u8] = b"user.t";
/// Permission bits of created files and directories.
pub const FILE_PERM: u16 = 0o644;
/// …of directories.
pub const DIR_PERM: u16 = 0o755;

/// Non-zero bytes that identify `tag` (so they differ from holes and from other writes).
#[must_use]
pub fn pattern(tag: u64, len: usize) -> Vec<u8> {
    (0..len as u64).map(|i| ((i.wrapping_mul(31) ^ tag.wrapping_mul(0x9E37)) as u8) | 1).collect()
}

fn parent_and_name(path: &str) -> Result<(&str, &str), String> {
    let (dir, name) = path.rsplit_once('/').ok_or_else(|| format!("bad path {path}"))?;
    Ok((if dir.is_empty() { "/" } else { dir }, name))
}

/// Resolve `op` against `st` (which it does not change): the model operation it is, with the
/// bytes it writes derived from `tag`. `Clean` and aborted transactions resolve to `None`:
/// they change nothing the model sees.
///
/// # Errors
/// A path that does not resolve, or a precondition that fails.
pub fn resolve(st: &MState, op: &FsOp, tag: u64, bs: u64) -> Result<Option<MOp>, String> {
    let lookup = |p: &str| st.lookup(p).ok_or_else(|| format!("{p} does not exist"));
    let entry = |p: &str| -> Result<(MIno, Vec<u8>), String> {
        let (dir, name) = parent_and_name(p)?;
        Ok((lookup(dir)?, name.as_bytes().to_vec()))
    };
    let size = |ino: MIno| st.node(ino).map_or(0, |n| n.data.len() as u64);
    let mop = match op {
        FsOp::Create(p) | FsOp::Mkdir(p) => {
            let (dir, name) = entry(p)?;
            let is_dir = matches!(op, FsOp::Mkdir(_));
            let perm = if is_dir { DIR_PERM } else { FILE_PERM };
            MOp::Create { dir, name, new: st.next, is_dir, perm }
        }
        FsOp::Write(p, kind) => {
            let ino = lookup(p)?;
            let s = size(ino);
            let (off, len) = match kind {
                WriteKind::Append => (s, 700),
                WriteKind::Overwrite => (0, bs),
                WriteKind::Unaligned => (300, bs + bs / 2),
                WriteKind::Sparse => ((s / bs + 2) * bs + 100, 200),
                WriteKind::Big => (s, 5 * bs),
                WriteKind::Huge => (0, HUGE_BLOCKS * bs),
            };
            MOp::Write { ino, off, data: pattern(tag, len as usize) }
        }
        FsOp::Truncate(p, kind) => {
            let ino = lookup(p)?;
            let s = size(ino);
            let size = match kind {
                TruncKind::Down => (s / 2).saturating_sub(1),
                TruncKind::Up => s + bs + 300,
            };
            MOp::SetSize { ino, size }
        }
        FsOp::Link(from, to) => {
            let (dir, name) = entry(to)?;
            MOp::Link { ino: lookup(from)?, dir, name }
        }
        FsOp::Unlink(p) => {
            let (dir, name) = entry(p)?;
            MOp::Unlink { dir, name }
        }
        FsOp::Rmdir(p) => {
            let (dir, name) = entry(p)?;
            MOp::Rmdir { dir, name }
        }
        FsOp::Rename(from, to) => {
            let (sdir, sname) = entry(from)?;
            let (ddir, dname) = entry(to)?;
            MOp::Rename { sdir, sname, ddir, dname }
        }
        FsOp::Chmod(p) => {
            let ino = lookup(p)?;
            let perm = if st.node(ino).is_some_and(|n| n.perm == 0o600) { 0o640 } else { 0o600 };
            MOp::Chmod { ino, perm }
        }
        FsOp::SetXattr(p) => {
            MOp::SetXattr { ino: lookup(p)?, name: SET_XATTR.to_vec(), value: pattern(tag, 24) }
        }
        FsOp::RemoveXattr(p) => {
            let ino = lookup(p)?;
            let name = st
                .node(ino)
                .and_then(|n| n.xattrs.keys().next().cloned())
                .ok_or_else(|| format!("{p} has no attribute"))?;
            MOp::RemoveXattr { ino, name }
        }
        FsOp::Txn(ops, end) => {
            let mut scratch = st.clone();
            let mut out = Vec::new();
            for (i, op) in ops.iter().enumerate() {
                let Some(m) = resolve(&scratch, op, tag * 16 + i as u64 + 1, bs)? else {
                    return Err("nested transaction or clean".into());
                };
                scratch.apply(&m)?;
                out.push(m);
            }
            if *end == TxnEnd::Abort {
                return Ok(None);
            }
            MOp::Group(out)
        }
        FsOp::Clean(_) => return Ok(None),
    };
    st.clone().apply(&mop)?;
    Ok(Some(mop))
}

/// A name not yet in directory `dir`.
fn fresh(st: &MState, dir: MIno, stem: &str) -> String {
    let taken = |n: &str| st.node(dir).is_some_and(|d| d.entries.contains_key(n.as_bytes()));
    (1..).map(|i| format!("{stem}{i}")).find(|n| !taken(n)).unwrap_or_default()
}

/// Every operation of the catalogue that applies to `st` (B3's op set over the tree's files and
/// directories, transactions over its first two files, a clean of each stream).
#[must_use]
pub fn catalogue(st: &MState, streams: u16, bs: u64) -> Vec<FsOp> {
    let paths = st.paths();
    let is_dir = |ino: MIno| st.node(ino).is_some_and(|n| n.dir);
    let dirs: Vec<(String, MIno)> = paths.iter().filter(|(_, i)| is_dir(*i)).cloned().collect();
    let mut files: Vec<(String, MIno)> = Vec::new();
    for (p, i) in paths.iter().filter(|(_, i)| !is_dir(*i)) {
        if !files.iter().any(|(_, j)| j == i) {
            files.push((p.clone(), *i));
        }
    }
    let mut ops = Vec::new();
    for (p, ino) in &files {
        let Ok((parent, _)) = parent_and_name(p) else { continue };
        let parent_ino = st.lookup(parent).unwrap_or(MROOT);
        for k in [
            WriteKind::Append,
            WriteKind::Overwrite,
            WriteKind::Unaligned,
            WriteKind::Sparse,
            WriteKind::Big,
        ] {
            ops.push(FsOp::Write(p.clone(), k));
        }
        if st.node(*ino).is_some_and(|n| n.data.len() > 2) {
            ops.push(FsOp::Truncate(p.clone(), TruncKind::Down));
        }
        ops.push(FsOp::Truncate(p.clone(), TruncKind::Up));
        ops.push(FsOp::Chmod(p.clone()));
        ops.push(FsOp::SetXattr(p.clone()));
        if st.node(*ino).is_some_and(|n| !n.xattrs.is_empty()) {
            ops.push(FsOp::RemoveXattr(p.clone()));
        }
        let other = dirs.iter().find(|(_, d)| *d != parent_ino);
        if let Some((od, oino)) = other {
            ops.push(FsOp::Link(p.clone(), join(od, &fresh(st, *oino, "l"))));
            ops.push(FsOp::Rename(p.clone(), join(od, &fresh(st, *oino, "r"))));
        }
        ops.push(FsOp::Unlink(p.clone()));
        ops.push(FsOp::Rename(p.clone(), join(parent, &fresh(st, parent_ino, "r"))));
        if let Some((q, _)) = files.iter().find(|(_, j)| j != ino) {
            ops.push(FsOp::Rename(p.clone(), q.clone()));
        }
    }
    for (p, ino) in &dirs {
        ops.push(FsOp::Create(join(p, &fresh(st, *ino, "c"))));
        ops.push(FsOp::Mkdir(join(p, &fresh(st, *ino, "d"))));
        if *ino == MROOT {
            continue;
        }
        if st.node(*ino).is_some_and(|n| n.entries.is_empty()) {
            ops.push(FsOp::Rmdir(p.clone()));
        }
        // Move the directory into another one that is not inside it.
        let target = dirs.iter().find(|(q, d)| {
            *d != *ino
                && !q.starts_with(&format!("{p}/"))
                && parent_and_name(p).is_ok_and(|(pp, _)| pp != q)
        });
        if let Some((q, d)) = target {
            ops.push(FsOp::Rename(p.clone(), join(q, &fresh(st, *d, "r"))));
        }
    }
    if let [(f1, _), (f2, _), ..] = files.as_slice() {
        let other_dir =
            dirs.iter().find(|(q, _)| parent_and_name(f2).is_ok_and(|(pp, _)| pp != q.as_str()));
        let mut bodies = vec![vec![
            FsOp::Write(f1.clone(), WriteKind::Overwrite),
            FsOp::Write(f2.clone(), WriteKind::Append),
        ]];
        if let Some((q, d)) = other_dir {
            bodies.push(vec![
                FsOp::Rename(f2.clone(), join(q, &fresh(st, *d, "t"))),
                FsOp::Write(f1.clone(), WriteKind::Unaligned),
            ]);
        }
        for body in bodies {
            for end in [TxnEnd::Commit, TxnEnd::CommitDurable, TxnEnd::Abort] {
                ops.push(FsOp::Txn(body.clone(), end));
            }
        }
    }
    for s in 0..streams {
        ops.push(FsOp::Clean(s));
    }
    ops.retain(|op| resolve(st, op, 1, bs).is_ok());
    ops
}

/// The path an operation is about, after it ran, and its parent directory.
fn subject(op: &FsOp) -> Option<(String, String)> {
    let of = |p: &str| parent_and_name(p).ok().map(|(d, _)| (p.to_string(), d.to_string()));
    match op {
        FsOp::Create(p) | FsOp::Mkdir(p) | FsOp::Write(p, _) | FsOp::Truncate(p, _) => of(p),
        FsOp::Chmod(p) | FsOp::SetXattr(p) | FsOp::RemoveXattr(p) => of(p),
        FsOp::Link(_, p) | FsOp::Rename(_, p) => of(p),
        FsOp::Unlink(p) | FsOp::Rmdir(p) => of(p).map(|(_, d)| (d.clone(), d)),
        FsOp::Txn(ops, _) => ops.first().and_then(subject),
        FsOp::Clean(_) => None,
    }
}

/// The persistence operations that may follow `op` (B3's fsync, fdatasync, sync, plus the
/// parent directory's fsync, a barrier, or nothing). `after` is the state after `op`.
#[must_use]
pub fn persists(op: &FsOp, after: &MState) -> Vec<Persist> {
    let mut out = vec![Persist::Nothing, Persist::Sync];
    if let Some((p, dir)) = subject(op) {
        if after.lookup(&p).is_some() {
            out.push(Persist::Fsync(p.clone()));
            out.push(Persist::Fdatasync(p.clone()));
            out.push(Persist::Barrier(p.clone()));
        }
        if dir != p && after.lookup(&dir).is_some() {
            out.push(Persist::FsyncDir(dir));
        }
    }
    out
}

/// The state after `step` (unchanged if it does not resolve).
#[must_use]
pub fn after(st: &MState, op: &FsOp, tag: u64, bs: u64) -> MState {
    let mut next = st.clone();
    if let Ok(Some(m)) = resolve(st, op, tag, bs) {
        let _ = next.apply(&m);
    }
    next
}

/// Tag of step `i` (the seed of its bytes).
#[must_use]
pub fn step_tag(i: usize) -> u64 {
    i as u64 + 1
}

/// Every seq-1 workload from `base`: each catalogue operation with each persistence.
#[must_use]
pub fn seq1(base: &MState, streams: u16, bs: u64) -> Vec<FsWorkload> {
    let mut out = Vec::new();
    for op in catalogue(base, streams, bs) {
        let next = after(base, &op, step_tag(0), bs);
        for persist in persists(&op, &next) {
            out.push(FsWorkload(vec![Step { op: op.clone(), persist }]));
        }
    }
    out
}

/// Every seq-2 workload from `base`: each seq-1 step, then each step that applies after it.
#[must_use]
pub fn seq2(base: &MState, streams: u16, bs: u64) -> Vec<FsWorkload> {
    let mut out = Vec::new();
    for first in seq1(base, streams, bs) {
        let st = after(base, &first.0[0].op, step_tag(0), bs);
        for op in catalogue(&st, streams, bs) {
            for persist in persists(&op, &after(&st, &op, step_tag(1), bs)) {
                out.push(FsWorkload(vec![first.0[0].clone(), Step { op: op.clone(), persist }]));
            }
        }
    }
    out
}

/// `count` seq-2 workloads drawn by `seed` (first step uniform over seq-1, second uniform over
/// what applies after it), without repeats.
#[must_use]
pub fn seq2_sample(
    base: &MState,
    streams: u16,
    bs: u64,
    count: usize,
    seed: u64,
) -> Vec<FsWorkload> {
    let firsts = seq1(base, streams, bs);
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut out: Vec<FsWorkload> = Vec::new();
    let mut tries = 0;
    while out.len() < count && tries < count * 20 && !firsts.is_empty() {
        tries += 1;
        let first = &firsts[rng.usize(..firsts.len())];
        let st = after(base, &first.0[0].op, step_tag(0), bs);
        let ops = catalogue(&st, streams, bs);
        if ops.is_empty() {
            continue;
        }
        let op = ops[rng.usize(..ops.len())].clone();
        let ps = persists(&op, &after(&st, &op, step_tag(1), bs));
        let persist = ps[rng.usize(..ps.len())].clone();
        let w = FsWorkload(vec![first.0[0].clone(), Step { op, persist }]);
        if !out.contains(&w) {
            out.push(w);
        }
    }
    out
}

impl fmt::Display for FsOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FsOp::Create(p) => write!(f, "create {p}"),
            FsOp::Mkdir(p) => write!(f, "mkdir {p}"),
            FsOp::Write(p, k) => write!(f, "write {p} {}", format!("{k:?}").to_lowercase()),
            FsOp::Truncate(p, k) => write!(f, "truncate {p} {}", format!("{k:?}").to_lowercase()),
            FsOp::Link(a, b) => write!(f, "link {a} {b}"),
            FsOp::Unlink(p) => write!(f, "unlink {p}"),
            FsOp::Rename(a, b) => write!(f, "rename {a} {b}"),
            FsOp::Rmdir(p) => write!(f, "rmdir {p}"),
            FsOp::Chmod(p) => write!(f, "chmod {p}"),
            FsOp::SetXattr(p) => write!(f, "setxattr {p}"),
            FsOp::RemoveXattr(p) => write!(f, "removexattr {p}"),
            FsOp::Txn(ops, end) => {
                write!(f, "begin")?;
                for op in ops {
                    write!(f, ", {op}")?;
                }
                write!(f, ", {}", format!("{end:?}").to_lowercase())
            }
            FsOp::Clean(s) => write!(f, "clean stream {s}"),
        }
    }
}

impl fmt::Display for Persist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Persist::Fsync(p) => write!(f, "fsync {p}"),
            Persist::Fdatasync(p) => write!(f, "fdatasync {p}"),
            Persist::FsyncDir(p) => write!(f, "fsync-dir {p}"),
            Persist::Barrier(p) => write!(f, "barrier {p}"),
            Persist::Sync => write!(f, "sync"),
            Persist::Nothing => write!(f, "-"),
        }
    }
}

impl fmt::Display for FsWorkload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, s) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, " | ")?;
            }
            write!(f, "{}; {}", s.op, s.persist)?;
        }
        Ok(())
    }
}

/// Longer workloads for what one or two operations cannot reach: a tombstone in a segment that
/// cleaning relocates while an older record of its object lives on another stream (an unlink,
/// two big writes on the unlink's stream so it moves to a new segment, then a clean of that
/// stream), with and without a sync first.
#[must_use]
pub fn longer() -> Vec<FsWorkload> {
    let step = |op: FsOp, persist: Persist| Step { op, persist };
    let big = || FsOp::Write("/bar".into(), WriteKind::Big);
    let mut out = Vec::new();
    for (gone, stream) in
        [(FsOp::Unlink("/A/foo".into()), 0), (FsOp::Rename("/A/foo".into(), "/B/r1".into()), 0)]
    {
        for persist in [Persist::Nothing, Persist::Sync] {
            out.push(FsWorkload(vec![
                step(gone.clone(), persist.clone()),
                step(big(), Persist::Nothing),
                step(big(), Persist::Nothing),
                step(FsOp::Clean(stream), Persist::Nothing),
            ]));
        }
    }
    out
}

/// Large transactions (issue 15 part 1): an explicit transaction whose data goes to the
/// device in parts while it runs and whose parts span three or more segments (a
/// [`WriteKind::Huge`] overwrite of `/A/foo`, alone or with a rename), committed, committed
/// durable or aborted, each followed by nothing, `sync` or an `fsync`; then a committed one
/// followed by a clean of each stream (its parts relocated), and by an `fsync`ed append on the
/// other file (a later transaction after the run). A part kept without its close shows as
/// `/A/foo`'s first blocks changed without the rest (I1).
#[must_use]
pub fn large() -> Vec<FsWorkload> {
    let step = |op: FsOp, persist: Persist| Step { op, persist };
    let huge = || FsOp::Write("/A/foo".into(), WriteKind::Huge);
    let bodies = [vec![huge()], vec![huge(), FsOp::Rename("/bar".into(), "/B/t1".into())]];
    let mut out = Vec::new();
    for body in &bodies {
        for end in [TxnEnd::Commit, TxnEnd::CommitDurable, TxnEnd::Abort] {
            for persist in [Persist::Nothing, Persist::Sync, Persist::Fsync("/A/foo".into())] {
                out.push(FsWorkload(vec![step(FsOp::Txn(body.clone(), end), persist)]));
            }
        }
    }
    let committed = || step(FsOp::Txn(vec![huge()], TxnEnd::Commit), Persist::Nothing);
    for stream in 0..2 {
        out.push(FsWorkload(vec![committed(), step(FsOp::Clean(stream), Persist::Sync)]));
    }
    out.push(FsWorkload(vec![
        committed(),
        step(FsOp::Write("/bar".into(), WriteKind::Append), Persist::Fsync("/bar".into())),
    ]));
    out
}

/// Durability of names (`docs/FS.md`): namespace changes on one stream followed by durable
/// waits on another stream's file. The first is SQLite's DELETE-mode pattern: the journal `/j`
/// created, written and fsynced, the database `/bar` written and fsynced, the journal unlinked
/// (the commit point, never fsynced; the entry is on the root's stream, `/bar` on the other),
/// then the next transaction writes and fsyncs `/bar` only: after that fsync, `/j` must be gone
/// in every crash image, or SQLite finds a hot journal and rolls back acknowledged commits.
/// Then the same with the fsync right after the unlink (no change of `/bar` after it), a
/// rename over `/A/foo` and a `mkdir` in `/B` followed by another file's fsync, and a rename
/// inside an explicit transaction followed by an fsync of a file it did not touch.
#[must_use]
pub fn names() -> Vec<FsWorkload> {
    let step = |op: FsOp, persist: Persist| Step { op, persist };
    let db_write = || FsOp::Write("/bar".into(), WriteKind::Append);
    let db_sync = || Persist::Fsync("/bar".into());
    let journal = || {
        vec![
            step(FsOp::Create("/j".into()), Persist::Nothing),
            step(FsOp::Write("/j".into(), WriteKind::Append), Persist::Fsync("/j".into())),
            step(db_write(), db_sync()),
        ]
    };
    let mut sqlite = journal();
    sqlite.push(step(FsOp::Unlink("/j".into()), Persist::Nothing));
    sqlite.push(step(db_write(), db_sync()));
    let mut no_write = journal();
    no_write.push(step(FsOp::Unlink("/j".into()), db_sync()));
    vec![
        FsWorkload(sqlite),
        FsWorkload(no_write),
        FsWorkload(vec![
            step(FsOp::Create("/t".into()), Persist::Nothing),
            step(FsOp::Write("/t".into(), WriteKind::Append), Persist::Nothing),
            step(FsOp::Rename("/t".into(), "/A/foo".into()), Persist::Nothing),
            step(db_write(), db_sync()),
        ]),
        FsWorkload(vec![
            step(FsOp::Mkdir("/B/d".into()), Persist::Nothing),
            step(FsOp::Chmod("/bar".into()), Persist::Fdatasync("/bar".into())),
        ]),
        FsWorkload(vec![
            step(
                FsOp::Txn(vec![FsOp::Rename("/A/foo".into(), "/B/r".into())], TxnEnd::Commit),
                Persist::Nothing,
            ),
            step(db_write(), db_sync()),
        ]),
    ]
}

/// The workloads of a named set: `seq-1`, `seq-2` (every one), `seq-2:N` (`N` drawn by `seed`),
/// `longer`, `large`, `names`. A reported violation names its set and index, so the set
/// replays it.
///
/// # Errors
/// An unknown set name.
pub fn workload_set(
    name: &str,
    base: &MState,
    streams: u16,
    bs: u64,
    seed: u64,
) -> Result<Vec<FsWorkload>, String> {
    match name {
        "seq-1" => Ok(seq1(base, streams, bs)),
        "seq-2" => Ok(seq2(base, streams, bs)),
        "longer" => Ok(longer()),
        "large" => Ok(large()),
        "names" => Ok(names()),
        _ => match name.strip_prefix("seq-2:").map(str::parse::<usize>) {
            Some(Ok(n)) => Ok(seq2_sample(base, streams, bs, n, seed)),
            _ => Err(format!(
                "unknown workload set {name:?}: seq-1, seq-2, seq-2:N, longer, large or names"
            )),
        },
    }
}

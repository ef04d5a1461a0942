//! Model-based test: seeded random operation sequences run against the file system and against
//! an in-memory POSIX reference model, compared after every step.
//!
//! The model is a tree of directories, files, symlinks and device nodes with contents (a sparse
//! map of blocks, so far offsets cost nothing), permission bits, owners, link counts and
//! extended attributes. For every operation the model decides the result or the errno; the file
//! system must agree exactly. Two answers are accepted from the file system that the model
//! cannot predict, and both are checked for what they promise:
//! - `ENOSPC`: the operation failed and the state is unchanged; a plain write larger than one
//!   transaction is split into atomic transactions and may be short, ending at one of their
//!   boundaries;
//! - cleaning's `ENOSPC`: nothing visible changed.
//!
//! Explicit transactions: `Begin` snapshots the model and a full dump of the file system
//! (attributes with every timestamp, entries with their readdir offsets, xattrs, block counts);
//! the operations until `Commit`/`Abort` run inside it; after `Abort` (or a remount or crash
//! while it is open, or a commit that does not fit) both must equal the snapshots exactly.
//! `Remount` and `CrashRemount` (drop after `sync()`, no unmount) must reproduce the dump
//! exactly; `Clean` must not change it. `fsck` must be clean at the end of every case.
//!
//! The default case count keeps `cargo test --release` short; `PROPTEST_CASES` raises it.
//! Inputs are plain vectors of operations whose operands are selectors (indices into whatever
//! exists at that point), so shrinking removes operations freely and failures shrink to short
//! sequences.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tally_fs::{
    Attr, DirEntry, FallocFlags, FileKind, Fs, FsError, Ino, MkfsOptions, MountOptions, Owner,
    RenameFlags, SetAttr, Txn, XattrSet, FILE_SIZE_MAX, ROOT,
};
use tally_media::{Device, MemDevice};

const BS: u64 = 4096;
const NAME_MAX: usize = 255;
const XATTR_VALUE_MAX: usize = 3072;

type R<T = ()> = Result<T, String>;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

// ----- the reference model ------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq, Eq)]
struct MEntry {
    ino: Ino,
    /// The readdir offset, once observed; it must not change while the entry exists.
    offset: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct MDir {
    parent: Ino,
    entries: BTreeMap<Vec<u8>, MEntry>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct MNode {
    kind: FileKind,
    perm: u16,
    uid: u32,
    gid: u32,
    /// Links of a non-directory (a directory's count is derived from its entries).
    nlink: u32,
    size: u64,
    rdev: u64,
    target: Vec<u8>,
    /// Allocated blocks, `BS` bytes each; bytes past `size` are zero.
    blocks: BTreeMap<u64, Vec<u8>>,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    dir: Option<MDir>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Model {
    nodes: BTreeMap<Ino, MNode>,
}

/// A resolved operation: concrete inodes, names, offsets and bytes.
#[derive(Clone, Debug)]
enum ROp {
    Make {
        parent: Ino,
        name: Vec<u8>,
        kind: FileKind,
        perm: u16,
        rdev: u64,
        target: Vec<u8>,
        /// Through `mknod` rather than `create` (for regular files).
        mknod: bool,
    },
    Link {
        ino: Ino,
        parent: Ino,
        name: Vec<u8>,
    },
    Unlink {
        parent: Ino,
        name: Vec<u8>,
    },
    Rmdir {
        parent: Ino,
        name: Vec<u8>,
    },
    Rename {
        parent: Ino,
        name: Vec<u8>,
        to: Ino,
        to_name: Vec<u8>,
        flags: RenameFlags,
    },
    Write {
        ino: Ino,
        off: u64,
        data: Vec<u8>,
    },
    SetAttr {
        ino: Ino,
        set: SetAttr,
    },
    Fallocate {
        ino: Ino,
        off: u64,
        len: u64,
        flags: FallocFlags,
    },
    SetXattr {
        ino: Ino,
        name: Vec<u8>,
        value: Vec<u8>,
        how: XattrSet,
    },
    RemoveXattr {
        ino: Ino,
        name: Vec<u8>,
    },
    Lookup {
        parent: Ino,
        name: Vec<u8>,
    },
    Readdir {
        dir: Ino,
        from: u8,
    },
    Fsync {
        ino: Ino,
    },
    Barrier {
        ino: Ino,
    },
}

impl ROp {
    /// Inodes whose contents the operation may change (checked in full after it).
    fn inos(&self) -> Vec<Ino> {
        match self {
            ROp::Write { ino, .. } | ROp::SetAttr { ino, .. } | ROp::Fallocate { ino, .. } => {
                vec![*ino]
            }
            _ => Vec::new(),
        }
    }

    /// Whether the file system may answer `ENOSPC`.
    fn may_run_out_of_space(&self) -> bool {
        !matches!(
            self,
            ROp::Lookup { .. } | ROp::Readdir { .. } | ROp::Fsync { .. } | ROp::Barrier { .. }
        )
    }
}

/// What the model says a successful operation returns.
#[derive(Debug)]
enum Out {
    Unit,
    /// The attributes of this inode.
    Attr(Ino),
    Len(usize),
}

/// The errno the model predicts for a failure the file system reports as `e` (the FUSE
/// adapter's mapping, for the failures the model knows); `None` for failures it never predicts.
fn predicted(e: &FsError) -> Option<i32> {
    Some(match e {
        FsError::NotFound => libc::ENOENT,
        FsError::Exists => libc::EEXIST,
        FsError::NotDir => libc::ENOTDIR,
        FsError::IsDir => libc::EISDIR,
        FsError::NotEmpty => libc::ENOTEMPTY,
        FsError::Invalid(_) | FsError::NoTxn => libc::EINVAL,
        FsError::NoSpace => libc::ENOSPC,
        FsError::Busy => libc::EBUSY,
        FsError::ReadOnly { .. } => libc::EROFS,
        FsError::NameTooLong => libc::ENAMETOOLONG,
        FsError::FileTooBig => libc::EFBIG,
        FsError::TooManyLinks => libc::EMLINK,
        FsError::NotPermitted => libc::EPERM,
        FsError::NotSupported(_) => libc::EOPNOTSUPP,
        FsError::NoAttr => libc::ENODATA,
        FsError::Range => libc::ERANGE,
        _ => return None,
    })
}

fn check_name(name: &[u8]) -> Result<(), i32> {
    if name.len() > NAME_MAX {
        return Err(libc::ENAMETOOLONG);
    }
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) || name == b"." || name == b".."
    {
        return Err(libc::EINVAL);
    }
    Ok(())
}

impl Model {
    fn new() -> Model {
        let root = MNode {
            kind: FileKind::Dir,
            perm: 0o755,
            uid: 0,
            gid: 0,
            nlink: 0,
            size: 0,
            rdev: 0,
            target: Vec::new(),
            blocks: BTreeMap::new(),
            xattrs: BTreeMap::new(),
            dir: Some(MDir { parent: ROOT, entries: BTreeMap::new() }),
        };
        Model { nodes: BTreeMap::from([(ROOT, root)]) }
    }

    fn node(&self, ino: Ino) -> Result<&MNode, i32> {
        self.nodes.get(&ino).ok_or(libc::ENOENT)
    }

    fn node_mut(&mut self, ino: Ino) -> &mut MNode {
        self.nodes.get_mut(&ino).expect("model inode")
    }

    fn dir(&self, ino: Ino) -> Result<&MDir, i32> {
        self.node(ino)?.dir.as_ref().ok_or(libc::ENOTDIR)
    }

    fn dir_mut(&mut self, ino: Ino) -> &mut MDir {
        self.node_mut(ino).dir.as_mut().expect("model directory")
    }

    fn nlink(&self, ino: Ino) -> u32 {
        let n = &self.nodes[&ino];
        match &n.dir {
            Some(d) => {
                2 + d.entries.values().filter(|e| self.nodes[&e.ino].kind == FileKind::Dir).count()
                    as u32
            }
            None => n.nlink,
        }
    }

    fn kind_of(&self, ino: Ino) -> FileKind {
        self.nodes[&ino].kind
    }

    /// Is `ino` equal to `ancestor` or inside it?
    fn within(&self, mut ino: Ino, ancestor: Ino) -> bool {
        loop {
            if ino == ancestor {
                return true;
            }
            if ino == ROOT {
                return false;
            }
            match self.nodes.get(&ino).and_then(|n| n.dir.as_ref()) {
                Some(d) => ino = d.parent,
                None => return false,
            }
        }
    }

    fn file(&self, ino: Ino) -> Result<&MNode, i32> {
        let n = self.node(ino)?;
        match n.kind {
            FileKind::File => Ok(n),
            FileKind::Dir => Err(libc::EISDIR),
            _ => Err(libc::EINVAL),
        }
    }

    /// Bytes `[off, off + len)` of a file, short at its end.
    fn read(&self, ino: Ino, off: u64, len: u64) -> Vec<u8> {
        let n = &self.nodes[&ino];
        let end = n.size.min(off.saturating_add(len));
        if off >= end {
            return Vec::new();
        }
        let mut out = vec![0u8; (end - off) as usize];
        for (&b, bytes) in n.blocks.range(off / BS..=(end - 1) / BS) {
            let (from, to) = (off.max(b * BS), end.min((b + 1) * BS));
            out[(from - off) as usize..(to - off) as usize]
                .copy_from_slice(&bytes[(from - b * BS) as usize..(to - b * BS) as usize]);
        }
        out
    }

    /// Drop one link to `ino` (already removed from its directory); free it at zero.
    fn drop_link(&mut self, ino: Ino) {
        let n = self.node_mut(ino);
        n.nlink = n.nlink.saturating_sub(1);
        if n.nlink == 0 || n.dir.is_some() {
            self.nodes.remove(&ino);
        }
    }

    fn write(&mut self, ino: Ino, off: u64, data: &[u8]) {
        let end = off + data.len() as u64;
        let n = self.node_mut(ino);
        for b in off / BS..=(end - 1) / BS {
            let (from, to) = (off.max(b * BS), end.min((b + 1) * BS));
            let block = n.blocks.entry(b).or_insert_with(|| vec![0; BS as usize]);
            if from == b * BS && to == (b + 1) * BS {
                block.fill(0);
            }
            block[(from - b * BS) as usize..(to - b * BS) as usize]
                .copy_from_slice(&data[(from - off) as usize..(to - off) as usize]);
        }
        n.size = n.size.max(end);
    }

    fn truncate(&mut self, ino: Ino, size: u64) {
        let n = self.node_mut(ino);
        if size < n.size {
            n.blocks.retain(|&b, _| b < size.div_ceil(BS));
            if !size.is_multiple_of(BS) {
                if let Some(block) = n.blocks.get_mut(&(size / BS)) {
                    block[(size % BS) as usize..].fill(0);
                }
            }
        }
        n.size = size;
    }

    /// Apply `op`; `new_ino` is the inode number the file system gave a new object.
    fn apply(&mut self, op: &ROp, new_ino: Ino) -> Result<Out, i32> {
        match op {
            ROp::Make { parent, name, kind, perm, rdev, target, .. } => {
                if *kind == FileKind::Symlink && target.is_empty() {
                    return Err(libc::ENOENT);
                }
                check_name(name)?;
                let pdir = self.dir(*parent)?;
                if pdir.entries.contains_key(name) {
                    return Err(libc::EEXIST);
                }
                let p = &self.nodes[parent];
                let (psgid, pgid) = (p.perm & 0o2000 != 0, p.gid);
                let mut node = MNode {
                    kind: *kind,
                    perm: perm & 0o7777,
                    uid: OWNER.uid,
                    gid: if psgid { pgid } else { OWNER.gid },
                    nlink: 1,
                    size: target.len() as u64,
                    rdev: *rdev,
                    target: target.clone(),
                    blocks: BTreeMap::new(),
                    xattrs: BTreeMap::new(),
                    dir: (*kind == FileKind::Dir)
                        .then(|| MDir { parent: *parent, entries: BTreeMap::new() }),
                };
                if psgid && *kind == FileKind::Dir {
                    node.perm |= 0o2000;
                }
                self.nodes.insert(new_ino, node);
                self.dir_mut(*parent)
                    .entries
                    .insert(name.clone(), MEntry { ino: new_ino, offset: None });
                Ok(Out::Attr(new_ino))
            }
            ROp::Link { ino, parent, name } => {
                check_name(name)?;
                if self.node(*ino)?.kind == FileKind::Dir {
                    return Err(libc::EPERM);
                }
                if self.dir(*parent)?.entries.contains_key(name) {
                    return Err(libc::EEXIST);
                }
                self.dir_mut(*parent)
                    .entries
                    .insert(name.clone(), MEntry { ino: *ino, offset: None });
                self.node_mut(*ino).nlink += 1;
                Ok(Out::Attr(*ino))
            }
            ROp::Unlink { parent, name } => {
                check_name(name)?;
                let e = self.dir(*parent)?.entries.get(name).ok_or(libc::ENOENT)?.ino;
                if self.kind_of(e) == FileKind::Dir {
                    return Err(libc::EISDIR);
                }
                self.dir_mut(*parent).entries.remove(name);
                self.drop_link(e);
                Ok(Out::Unit)
            }
            ROp::Rmdir { parent, name } => {
                check_name(name)?;
                let e = self.dir(*parent)?.entries.get(name).ok_or(libc::ENOENT)?.ino;
                if self.kind_of(e) != FileKind::Dir {
                    return Err(libc::ENOTDIR);
                }
                if !self.dir(e)?.entries.is_empty() {
                    return Err(libc::ENOTEMPTY);
                }
                self.dir_mut(*parent).entries.remove(name);
                self.drop_link(e);
                Ok(Out::Unit)
            }
            ROp::Rename { parent, name, to, to_name, flags } => {
                self.rename(*parent, name, *to, to_name, *flags).map(|()| Out::Unit)
            }
            ROp::Write { ino, off, data } => {
                let end = off.checked_add(data.len() as u64).ok_or(libc::EFBIG)?;
                if end > FILE_SIZE_MAX {
                    return Err(libc::EFBIG);
                }
                if data.is_empty() {
                    self.node(*ino)?;
                    return Ok(Out::Len(0));
                }
                self.file(*ino)?;
                self.write(*ino, *off, data);
                Ok(Out::Len(data.len()))
            }
            ROp::SetAttr { ino, set } => {
                if set.size.is_some_and(|s| s > FILE_SIZE_MAX) {
                    return Err(libc::EFBIG);
                }
                let kind = self.node(*ino)?.kind;
                if let Some(size) = set.size {
                    self.file(*ino)?;
                    self.truncate(*ino, size);
                }
                let n = self.node_mut(*ino);
                if let Some(p) = set.perm {
                    n.perm = p & 0o7777;
                }
                let owner_changed =
                    set.uid.is_some_and(|u| u != n.uid) || set.gid.is_some_and(|g| g != n.gid);
                n.uid = set.uid.unwrap_or(n.uid);
                n.gid = set.gid.unwrap_or(n.gid);
                if owner_changed && set.perm.is_none() && kind != FileKind::Dir {
                    n.perm &= !0o4000;
                    if n.perm & 0o010 != 0 {
                        n.perm &= !0o2000;
                    }
                }
                Ok(Out::Attr(*ino))
            }
            ROp::Fallocate { ino, off, len, flags } => {
                let end = off.checked_add(*len).ok_or(libc::EFBIG)?;
                if *len == 0 {
                    return Err(libc::EINVAL);
                }
                if end > FILE_SIZE_MAX {
                    return Err(libc::EFBIG);
                }
                if flags.punch_hole && !flags.keep_size {
                    return Err(libc::EINVAL);
                }
                let size = self.file(*ino)?.size;
                let n = self.node_mut(*ino);
                if flags.punch_hole {
                    let end = end.min(size);
                    if *off < end {
                        for b in off / BS..=(end - 1) / BS {
                            let (from, to) = ((*off).max(b * BS), end.min((b + 1) * BS));
                            if from == b * BS && to == (b + 1) * BS {
                                n.blocks.remove(&b);
                            } else if let Some(block) = n.blocks.get_mut(&b) {
                                block[(from - b * BS) as usize..(to - b * BS) as usize].fill(0);
                            }
                        }
                    }
                } else if !flags.keep_size {
                    n.size = n.size.max(end);
                }
                Ok(Out::Unit)
            }
            ROp::SetXattr { ino, name, value, how } => {
                if name.is_empty() {
                    return Err(libc::EINVAL);
                }
                if name.len() > NAME_MAX || value.len() > XATTR_VALUE_MAX {
                    return Err(libc::ERANGE);
                }
                let exists = self.node(*ino)?.xattrs.contains_key(name);
                match how {
                    XattrSet::Create if exists => return Err(libc::EEXIST),
                    XattrSet::Replace if !exists => return Err(libc::ENODATA),
                    _ => {}
                }
                self.node_mut(*ino).xattrs.insert(name.clone(), value.clone());
                Ok(Out::Unit)
            }
            ROp::RemoveXattr { ino, name } => {
                if !self.node(*ino)?.xattrs.contains_key(name) {
                    return Err(libc::ENODATA);
                }
                self.node_mut(*ino).xattrs.remove(name);
                Ok(Out::Unit)
            }
            ROp::Lookup { parent, name } => {
                if name.len() > NAME_MAX {
                    return Err(libc::ENAMETOOLONG);
                }
                let d = self.dir(*parent)?;
                Ok(Out::Attr(match name.as_slice() {
                    b"." => *parent,
                    b".." => d.parent,
                    _ => d.entries.get(name).ok_or(libc::ENOENT)?.ino,
                }))
            }
            ROp::Readdir { dir, .. } => self.dir(*dir).map(|_| Out::Unit),
            ROp::Fsync { ino } | ROp::Barrier { ino } => self.node(*ino).map(|_| Out::Unit),
        }
    }

    fn rename(
        &mut self,
        parent: Ino,
        name: &[u8],
        to: Ino,
        to_name: &[u8],
        flags: RenameFlags,
    ) -> Result<(), i32> {
        check_name(name)?;
        check_name(to_name)?;
        if flags.noreplace && flags.exchange {
            return Err(libc::EINVAL);
        }
        let src = self.dir(parent)?.entries.get(name).ok_or(libc::ENOENT)?.ino;
        let dst = self.dir(to)?.entries.get(to_name).map(|e| e.ino);
        let src_dir = self.kind_of(src) == FileKind::Dir;
        if src_dir && self.within(to, src) {
            return Err(libc::EINVAL);
        }
        match dst {
            Some(dst) => {
                let dst_dir = self.kind_of(dst) == FileKind::Dir;
                if flags.noreplace {
                    return Err(libc::EEXIST);
                }
                if flags.exchange && dst_dir && self.within(parent, dst) {
                    return Err(libc::EINVAL);
                }
                if dst == src && !flags.exchange {
                    return Ok(());
                }
                if !flags.exchange {
                    match (src_dir, dst_dir) {
                        (true, false) => return Err(libc::ENOTDIR),
                        (false, true) => return Err(libc::EISDIR),
                        (true, true) if !self.dir(dst)?.entries.is_empty() => {
                            return Err(libc::ENOTEMPTY)
                        }
                        _ => {}
                    }
                }
            }
            None if flags.exchange => return Err(libc::ENOENT),
            None => {}
        }
        match dst {
            Some(dst) if flags.exchange => {
                self.dir_mut(to)
                    .entries
                    .insert(to_name.to_vec(), MEntry { ino: src, offset: None });
                self.dir_mut(parent)
                    .entries
                    .insert(name.to_vec(), MEntry { ino: dst, offset: None });
                if src_dir {
                    self.dir_mut(src).parent = to;
                }
                if self.kind_of(dst) == FileKind::Dir {
                    self.dir_mut(dst).parent = parent;
                }
            }
            dst => {
                if let Some(dst) = dst {
                    self.dir_mut(to).entries.remove(to_name);
                    self.drop_link(dst);
                }
                self.dir_mut(parent).entries.remove(name);
                self.dir_mut(to)
                    .entries
                    .insert(to_name.to_vec(), MEntry { ino: src, offset: None });
                if src_dir {
                    self.dir_mut(src).parent = to;
                }
            }
        }
        Ok(())
    }
}

// ----- generated operations ----------------------------------------------------------------

/// Owner of everything the test creates (the root belongs to 0:0).
const OWNER: Owner = Owner { uid: 1000, gid: 1000 };

/// A name: mostly from a small pool (so names collide), sometimes long or illegal.
#[derive(Clone, Debug)]
enum Name {
    Pool(u8),
    /// An entry that exists in the directory (a pool name if it is empty).
    Existing(u8),
    /// 255 bytes: the longest legal name.
    Long(u8),
    /// 256 bytes.
    TooLong,
    Dot,
    DotDot,
    Empty,
    Slash,
}

impl Name {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Name::Pool(k) | Name::Existing(k) => vec![b'a' + k % 5],
            Name::Long(k) => {
                let mut v = vec![b'a' + k % 3; NAME_MAX];
                v[NAME_MAX - 1] = b'0' + k % 3;
                v
            }
            Name::TooLong => vec![b'z'; NAME_MAX + 1],
            Name::Dot => b".".to_vec(),
            Name::DotDot => b"..".to_vec(),
            Name::Empty => Vec::new(),
            Name::Slash => b"a/b".to_vec(),
        }
    }
}

/// A file offset.
#[derive(Clone, Debug)]
enum At {
    Abs(u64),
    /// Relative to the current size (clamped at 0).
    End(i64),
    /// Far past anything written: a sparse file.
    Far(u64),
    /// Just below the largest file size.
    Huge,
}

/// Selects an object among what exists (an index, taken modulo the candidates).
type Sel = u8;

#[derive(Clone, Debug)]
enum Op {
    Create { dir: Sel, name: Name, perm: u16 },
    Mkdir { dir: Sel, name: Name, perm: u16 },
    Mknod { dir: Sel, name: Name, kind: u8, rdev: u64 },
    Symlink { dir: Sel, name: Name, target_len: u16 },
    Link { ino: Sel, dir: Sel, name: Name },
    Unlink { dir: Sel, name: Name },
    Rmdir { dir: Sel, name: Name },
    Rename { dir: Sel, name: Name, to: Sel, to_name: Name, flags: u8 },
    Write { file: Sel, at: At, len: u32, seed: u8 },
    Truncate { file: Sel, size: At },
    Chmod { ino: Sel, perm: u16 },
    Chown { ino: Sel, uid: Option<u8>, gid: Option<u8> },
    Fallocate { file: Sel, at: At, len: u32, mode: u8 },
    SetXattr { ino: Sel, name: u8, len: u16, how: u8 },
    RemoveXattr { ino: Sel, name: u8 },
    Lookup { dir: Sel, name: Name },
    Readdir { dir: Sel, from: u8 },
    Fsync { ino: Sel },
    Barrier { ino: Sel },
    Sync,
    Begin,
    Commit { durable: bool },
    Abort,
    Remount,
    CrashRemount,
    Clean { stream: u8, segments: u8, remount: bool },
}

fn name() -> impl Strategy<Value = Name> {
    prop_oneof![
        30 => (0u8..5).prop_map(Name::Pool),
        2 => (0u8..3).prop_map(Name::Long),
        1 => Just(Name::TooLong),
        1 => prop_oneof![Just(Name::Dot), Just(Name::DotDot), Just(Name::Empty), Just(Name::Slash)],
    ]
}

/// The name of something to remove, rename or link from: mostly one that exists.
fn source() -> impl Strategy<Value = Name> {
    prop_oneof![3 => any::<u8>().prop_map(Name::Existing), 1 => name()]
}

fn at() -> impl Strategy<Value = At> {
    prop_oneof![
        4 => (0..3 * BS).prop_map(At::Abs),
        4 => (-(BS as i64)..=BS as i64).prop_map(At::End),
        1 => (0..4 * BS).prop_map(At::Far),
        1 => Just(At::Huge),
    ]
}

fn len() -> impl Strategy<Value = u32> {
    let bs = BS as u32;
    prop_oneof![8 => 0..=2 * bs, 2 => 2 * bs..12 * bs]
}

fn namespace_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (any::<Sel>(), name(), any::<u16>()).prop_map(|(dir, name, perm)| Op::Create { dir, name, perm }),
        4 => (any::<Sel>(), name(), any::<u16>()).prop_map(|(dir, name, perm)| Op::Mkdir { dir, name, perm }),
        1 => (any::<Sel>(), name(), 0u8..5, any::<u64>()).prop_map(|(dir, name, kind, rdev)| Op::Mknod { dir, name, kind, rdev }),
        1 => (any::<Sel>(), name(), 0u16..40).prop_map(|(dir, name, target_len)| Op::Symlink { dir, name, target_len }),
        2 => (any::<Sel>(), any::<Sel>(), name()).prop_map(|(ino, dir, name)| Op::Link { ino, dir, name }),
        3 => (any::<Sel>(), source()).prop_map(|(dir, name)| Op::Unlink { dir, name }),
        2 => (any::<Sel>(), source()).prop_map(|(dir, name)| Op::Rmdir { dir, name }),
        5 => (any::<Sel>(), source(), any::<Sel>(), prop_oneof![name(), source()], 0u8..8).prop_map(|(dir, name, to, to_name, flags)| Op::Rename { dir, name, to, to_name, flags }),
        1 => (any::<Sel>(), name()).prop_map(|(dir, name)| Op::Lookup { dir, name }),
        1 => (any::<Sel>(), any::<u8>()).prop_map(|(dir, from)| Op::Readdir { dir, from }),
    ]
}

fn data_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (any::<Sel>(), at(), len(), any::<u8>()).prop_map(|(file, at, len, seed)| Op::Write { file, at, len, seed }),
        2 => (any::<Sel>(), at()).prop_map(|(file, size)| Op::Truncate { file, size }),
        1 => (any::<Sel>(), any::<u16>()).prop_map(|(ino, perm)| Op::Chmod { ino, perm }),
        1 => (any::<Sel>(), proptest::option::of(0u8..3), proptest::option::of(0u8..3)).prop_map(|(ino, uid, gid)| Op::Chown { ino, uid, gid }),
        2 => (any::<Sel>(), at(), len(), 0u8..4).prop_map(|(file, at, len, mode)| Op::Fallocate { file, at, len, mode }),
        2 => (any::<Sel>(), 0u8..6, 0u16..64, 0u8..3).prop_map(|(ino, name, len, how)| Op::SetXattr { ino, name, len, how }),
        1 => (any::<Sel>(), 0u8..6).prop_map(|(ino, name)| Op::RemoveXattr { ino, name }),
    ]
}

fn control_op(cleaning: bool) -> BoxedStrategy<Op> {
    let ops = prop_oneof![
        1 => any::<Sel>().prop_map(|ino| Op::Fsync { ino }),
        1 => any::<Sel>().prop_map(|ino| Op::Barrier { ino }),
        1 => Just(Op::Sync),
        3 => Just(Op::Begin),
        2 => any::<bool>().prop_map(|durable| Op::Commit { durable }),
        2 => Just(Op::Abort),
        1 => Just(Op::Remount),
        1 => Just(Op::CrashRemount),
    ];
    if !cleaning {
        return ops.boxed();
    }
    let clean = (any::<u8>(), 1u8..4, any::<bool>())
        .prop_map(|(stream, segments, remount)| Op::Clean { stream, segments, remount });
    prop_oneof![9 => ops, 2 => clean].boxed()
}

/// An operation; `cleaning`: explicit cleaning among them.
fn op(cleaning: bool) -> impl Strategy<Value = Op> {
    prop_oneof![10 => namespace_op(), 8 => data_op(), 3 => control_op(cleaning)]
}

/// Shape of the file system under test.
#[derive(Clone, Debug)]
struct Cfg {
    streams: u16,
    segment_blocks: u32,
    blocks: u64,
}

fn cfg() -> impl Strategy<Value = Cfg> {
    (
        1u16..=3,
        prop_oneof![Just(16u32), Just(32)],
        prop_oneof![Just(512u64), Just(1024), Just(4096)],
    )
        .prop_map(|(streams, segment_blocks, blocks)| Cfg { streams, segment_blocks, blocks })
}

/// Bytes of a write: position-dependent, so misplaced blocks show.
fn pattern(seed: u8, len: u32) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31) ^ (i >> 12) ^ u32::from(seed).wrapping_mul(97)) as u8 | 1)
        .collect()
}

// ----- the harness ---------------------------------------------------------------------------

/// Everything the file system shows, as seen by walking it from the root.
#[derive(Debug, PartialEq)]
struct DumpNode {
    attr: Attr,
    entries: Vec<DirEntry>,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    allocated: u64,
}

type Dump = BTreeMap<Ino, DumpNode>;

struct OpenTxn {
    txn: Txn,
    model: Model,
    dump: Dump,
}

struct Harness {
    dev: Arc<dyn Device>,
    fs: Option<Fs>,
    cfg: Cfg,
    model: Model,
    /// Inodes that existed once and are gone.
    dead: BTreeSet<Ino>,
    txn: Option<OpenTxn>,
    /// How many operations failed with `ENOSPC` (state checked unchanged).
    enospc: u32,
}

fn errno<T>(r: &Result<T, FsError>) -> Option<i32> {
    r.as_ref().err().and_then(predicted)
}

fn pick<T: Copy>(v: &[T], sel: Sel) -> Option<T> {
    (!v.is_empty()).then(|| v[usize::from(sel) % v.len()])
}

impl Harness {
    fn new(cfg: Cfg) -> R<Harness> {
        let dev: Arc<dyn Device> =
            Arc::new(MemDevice::new(BS as u32, cfg.blocks).map_err(|e| e.to_string())?);
        let opts =
            MkfsOptions { streams: cfg.streams, segment_blocks: cfg.segment_blocks, uuid: None };
        Fs::mkfs(dev.clone(), &opts).map_err(|e| format!("mkfs: {e}"))?;
        let fs =
            Fs::mount(dev.clone(), MountOptions::default()).map_err(|e| format!("mount: {e}"))?;
        let mut model = Model::new();
        // The root's attributes come from mkfs.
        let root = fs.getattr(ROOT).map_err(|e| e.to_string())?;
        let r = model.node_mut(ROOT);
        (r.perm, r.uid, r.gid) = (root.perm, root.uid, root.gid);
        Ok(Harness { dev, fs: Some(fs), cfg, model, dead: BTreeSet::new(), txn: None, enospc: 0 })
    }

    fn fs(&self) -> &Fs {
        self.fs.as_ref().expect("mounted")
    }

    fn of_kind(&self, kind: Option<FileKind>) -> Vec<Ino> {
        self.model
            .nodes
            .iter()
            .filter(|(_, n)| kind.is_none_or(|k| n.kind == k))
            .map(|(&i, _)| i)
            .collect()
    }

    /// Mostly an object of `kind`; one time in eight anything, dead inodes included.
    fn select(&self, sel: Sel, kind: Option<FileKind>) -> Ino {
        if sel % 8 != 7 {
            if let Some(i) = pick(&self.of_kind(kind), sel / 8) {
                return i;
            }
        }
        let mut all = self.of_kind(None);
        all.extend(self.dead.iter().copied());
        pick(&all, sel / 8).unwrap_or(ROOT)
    }

    fn offset(&self, ino: Ino, at: &At) -> u64 {
        let size = self.model.nodes.get(&ino).map_or(0, |n| n.size);
        match *at {
            At::Abs(x) => x,
            At::End(d) => size.saturating_add_signed(d),
            At::Far(x) => (1 << 30) + x,
            At::Huge => FILE_SIZE_MAX - 10,
        }
    }

    /// A name in `dir`: for [`Name::Existing`], one of its entries.
    fn name_in(&self, dir: Ino, name: &Name) -> Vec<u8> {
        if let Name::Existing(k) = name {
            if let Some(d) = self.model.nodes.get(&dir).and_then(|n| n.dir.as_ref()) {
                let names: Vec<&Vec<u8>> = d.entries.keys().collect();
                if let Some(n) = pick(&names, *k) {
                    return n.clone();
                }
            }
        }
        name.bytes()
    }

    /// A directory to remove or rename from: mostly one with entries.
    fn parent(&self, sel: Sel) -> Ino {
        let full: Vec<Ino> = self
            .model
            .nodes
            .iter()
            .filter(|(_, n)| n.dir.as_ref().is_some_and(|d| !d.entries.is_empty()))
            .map(|(&i, _)| i)
            .collect();
        match pick(&full, sel / 8) {
            Some(i) if sel % 8 < 6 => i,
            _ => self.select(sel, Some(FileKind::Dir)),
        }
    }

    fn resolve(&self, op: &Op) -> Option<ROp> {
        let dir = |s| self.select(s, Some(FileKind::Dir));
        let file = |s| self.select(s, Some(FileKind::File));
        let any = |s| self.select(s, None);
        let make = |d: Sel, name: &Name, kind, perm, rdev, target| ROp::Make {
            parent: dir(d),
            name: name.bytes(),
            kind,
            perm,
            rdev,
            target,
            mknod: false,
        };
        Some(match op {
            Op::Create { dir: d, name, perm } => make(*d, name, FileKind::File, *perm, 0, vec![]),
            Op::Mkdir { dir: d, name, perm } => make(*d, name, FileKind::Dir, *perm, 0, vec![]),
            Op::Mknod { dir: d, name, kind, rdev } => {
                let kinds = [
                    FileKind::Fifo,
                    FileKind::Socket,
                    FileKind::CharDev,
                    FileKind::BlockDev,
                    FileKind::File,
                ];
                let kind = kinds[usize::from(*kind) % kinds.len()];
                let rdev =
                    if matches!(kind, FileKind::CharDev | FileKind::BlockDev) { *rdev } else { 0 };
                let mut op = make(*d, name, kind, 0o640, rdev, vec![]);
                if let ROp::Make { mknod, .. } = &mut op {
                    *mknod = true;
                }
                op
            }
            Op::Symlink { dir: d, name, target_len } => {
                let target = (0..*target_len).map(|i| b'a' + (i % 26) as u8).collect();
                make(*d, name, FileKind::Symlink, 0o777, 0, target)
            }
            Op::Link { ino, dir: d, name } => {
                ROp::Link { ino: any(*ino), parent: dir(*d), name: name.bytes() }
            }
            Op::Unlink { dir: d, name } => {
                let parent = self.parent(*d);
                ROp::Unlink { parent, name: self.name_in(parent, name) }
            }
            Op::Rmdir { dir: d, name } => {
                let parent = self.parent(*d);
                ROp::Rmdir { parent, name: self.name_in(parent, name) }
            }
            Op::Rename { dir: d, name, to, to_name, flags } => ROp::Rename {
                parent: self.parent(*d),
                name: self.name_in(self.parent(*d), name),
                to: dir(*to),
                to_name: self.name_in(dir(*to), to_name),
                flags: RenameFlags {
                    noreplace: flags & 3 == 1,
                    exchange: flags & 3 == 2 || flags & 7 == 7,
                },
            },
            Op::Write { file: f, at, len, seed } => {
                let ino = file(*f);
                ROp::Write { ino, off: self.offset(ino, at), data: pattern(*seed, *len) }
            }
            Op::Truncate { file: f, size } => {
                let ino = file(*f);
                let size = match size {
                    At::Huge => FILE_SIZE_MAX + 1,
                    at => self.offset(ino, at),
                };
                ROp::SetAttr { ino, set: SetAttr { size: Some(size), ..SetAttr::default() } }
            }
            Op::Chmod { ino, perm } => ROp::SetAttr {
                ino: any(*ino),
                set: SetAttr { perm: Some(*perm), ..SetAttr::default() },
            },
            Op::Chown { ino, uid, gid } => {
                let id = |x: Option<u8>| x.map(|x| [0, 1000, 1001][usize::from(x)]);
                let set = SetAttr { uid: id(*uid), gid: id(*gid), ..SetAttr::default() };
                ROp::SetAttr { ino: any(*ino), set }
            }
            Op::Fallocate { file: f, at, len, mode } => {
                let ino = file(*f);
                let flags = match mode % 4 {
                    0 => FallocFlags::default(),
                    1 => FallocFlags { keep_size: true, ..FallocFlags::default() },
                    2 => {
                        FallocFlags { keep_size: true, punch_hole: true, ..FallocFlags::default() }
                    }
                    _ => FallocFlags { punch_hole: true, ..FallocFlags::default() },
                };
                ROp::Fallocate { ino, off: self.offset(ino, at), len: u64::from(*len), flags }
            }
            Op::SetXattr { ino, name, len, how } => {
                let value_len = if *len == 63 { XATTR_VALUE_MAX + 1 } else { usize::from(*len) };
                ROp::SetXattr {
                    ino: any(*ino),
                    name: xattr_name(*name),
                    value: pattern(*name, value_len as u32),
                    how: [XattrSet::Any, XattrSet::Create, XattrSet::Replace]
                        [usize::from(*how) % 3],
                }
            }
            Op::RemoveXattr { ino, name } => {
                // Mostly an inode with attributes, one of its names.
                let with: Vec<(Ino, usize)> = self
                    .model
                    .nodes
                    .iter()
                    .filter(|(_, n)| !n.xattrs.is_empty())
                    .map(|(&i, n)| (i, n.xattrs.len()))
                    .collect();
                match pick(&with, *ino / 8) {
                    Some((i, count)) if *ino % 8 < 6 => {
                        let names: Vec<&Vec<u8>> = self.model.nodes[&i].xattrs.keys().collect();
                        let name = names[usize::from(*name) % count].clone();
                        ROp::RemoveXattr { ino: i, name }
                    }
                    _ => ROp::RemoveXattr { ino: any(*ino), name: xattr_name(*name) },
                }
            }
            Op::Lookup { dir: d, name } => ROp::Lookup { parent: dir(*d), name: name.bytes() },
            Op::Readdir { dir: d, from } => ROp::Readdir { dir: dir(*d), from: *from },
            Op::Fsync { ino } => ROp::Fsync { ino: any(*ino) },
            Op::Barrier { ino } => ROp::Barrier { ino: any(*ino) },
            _ => return None,
        })
    }
}

fn xattr_name(k: u8) -> Vec<u8> {
    match k {
        0..=2 => format!("user.{}", (b'a' + k) as char).into_bytes(),
        3 => b"trusted.x".to_vec(),
        4 => Vec::new(),
        _ => vec![b'n'; NAME_MAX + 1],
    }
}

/// What the file system returned.
#[derive(Debug)]
enum Got {
    Unit,
    Attr(Attr),
    Len(usize),
    Entries,
}

fn call(fs: &Fs, txn: Option<&Txn>, op: &ROp) -> Result<Got, FsError> {
    let unit = |r: Result<(), FsError>| r.map(|()| Got::Unit);
    match op {
        ROp::Make { parent, name, kind, perm, rdev, target, mknod } => match kind {
            FileKind::File if !mknod => fs.create(txn, *parent, name, *perm, OWNER),
            FileKind::Dir => fs.mkdir(txn, *parent, name, *perm, OWNER),
            FileKind::Symlink => fs.symlink(txn, *parent, name, target, OWNER),
            k => fs.mknod(txn, *parent, name, *k, *perm, *rdev, OWNER),
        }
        .map(Got::Attr),
        ROp::Link { ino, parent, name } => fs.link(txn, *ino, *parent, name).map(Got::Attr),
        ROp::Unlink { parent, name } => unit(fs.unlink(txn, *parent, name)),
        ROp::Rmdir { parent, name } => unit(fs.rmdir(txn, *parent, name)),
        ROp::Rename { parent, name, to, to_name, flags } => {
            unit(fs.rename(txn, *parent, name, *to, to_name, *flags))
        }
        ROp::Write { ino, off, data } => fs.write(txn, *ino, *off, data).map(Got::Len),
        ROp::SetAttr { ino, set } => fs.setattr(txn, *ino, set).map(Got::Attr),
        ROp::Fallocate { ino, off, len, flags } => {
            unit(fs.fallocate(txn, *ino, *off, *len, *flags))
        }
        ROp::SetXattr { ino, name, value, how } => unit(fs.setxattr(txn, *ino, name, value, *how)),
        ROp::RemoveXattr { ino, name } => unit(fs.removexattr(txn, *ino, name)),
        ROp::Lookup { parent, name } => fs.lookup(*parent, name).map(Got::Attr),
        ROp::Readdir { dir, .. } => fs.readdir(*dir, 0).map(|_| Got::Entries),
        ROp::Fsync { ino } => unit(fs.fsync(*ino)),
        ROp::Barrier { ino } => unit(fs.barrier(*ino)),
    }
}

/// Walk the file system from the root and record everything it shows.
fn dump(fs: &Fs) -> R<Dump> {
    let mut out = Dump::new();
    let mut todo = vec![ROOT];
    while let Some(ino) = todo.pop() {
        if out.contains_key(&ino) {
            continue;
        }
        let attr = fs.getattr(ino).map_err(|e| format!("dump: getattr {ino}: {e}"))?;
        let entries = if attr.kind == FileKind::Dir {
            fs.readdir(ino, 0).map_err(|e| format!("dump: readdir {ino}: {e}"))?
        } else {
            Vec::new()
        };
        todo.extend(entries.iter().skip(2).map(|e| e.ino));
        let mut xattrs = Vec::new();
        for name in fs.listxattr(ino).map_err(|e| format!("dump: listxattr {ino}: {e}"))? {
            let v = fs.getxattr(ino, &name).map_err(|e| format!("dump: getxattr {ino}: {e}"))?;
            xattrs.push((name, v));
        }
        let allocated = fs.allocated_blocks(ino).map_err(|e| e.to_string())?;
        out.insert(ino, DumpNode { attr, entries, xattrs, allocated });
    }
    Ok(out)
}

/// The first difference between two dumps, in words.
fn dump_diff(want: &Dump, got: &Dump) -> Option<String> {
    for ino in want.keys().chain(got.keys()) {
        match (want.get(ino), got.get(ino)) {
            (Some(a), Some(b)) if a == b => {}
            (a, b) => return Some(format!("inode {ino}:\n  expected {a:?}\n  found    {b:?}")),
        }
    }
    None
}

impl Harness {
    fn step(&mut self, op: &Op) -> R {
        if matches!(
            op,
            Op::Begin
                | Op::Commit { .. }
                | Op::Abort
                | Op::Remount
                | Op::CrashRemount
                | Op::Clean { .. }
                | Op::Sync
        ) {
            let name = format!("{op:?}");
            let name = name.split([' ', '{']).next().unwrap_or("?");
            let open = if self.txn.is_some() { "(in a transaction)" } else { "" };
            *STATS.lock().unwrap().entry(format!("{name} {open}")).or_default() += 1;
        }
        match op {
            Op::Sync => {
                self.fs().sync().map_err(|e| format!("sync: {e}"))?;
                self.check(&[], false)
            }
            Op::Begin => {
                if self.txn.is_none() {
                    let dump = dump(self.fs())?;
                    let txn = self.fs().begin().map_err(|e| format!("begin: {e}"))?;
                    self.txn = Some(OpenTxn { txn, model: self.model.clone(), dump });
                }
                Ok(())
            }
            Op::Commit { durable } => {
                let Some(t) = self.txn.take() else { return Ok(()) };
                let r = if *durable {
                    self.fs().commit_durable(t.txn)
                } else {
                    self.fs().commit(t.txn)
                };
                match r {
                    Ok(()) => self.check(&[], true),
                    Err(FsError::NoSpace) => {
                        // Did not fit: aborted.
                        self.enospc += 1;
                        self.back_to(t.model, &t.dump)
                    }
                    Err(e) => Err(format!("commit: {e}")),
                }
            }
            Op::Abort => {
                let Some(t) = self.txn.take() else { return Ok(()) };
                self.fs().abort(t.txn).map_err(|e| format!("abort: {e}"))?;
                self.back_to(t.model, &t.dump)
            }
            Op::Remount => self.remount(false),
            Op::CrashRemount => self.remount(true),
            Op::Clean { stream, segments, remount } => {
                let before = dump(self.fs())?;
                let stream = u16::from(*stream) % self.cfg.streams;
                let r = self.fs().clean(stream, usize::from(*segments));
                match (&r, self.txn.is_some()) {
                    (Err(FsError::Busy), true) | (Ok(_), false) => {}
                    (Err(FsError::NoSpace), false) => self.enospc += 1,
                    _ => {
                        return Err(format!(
                            "clean({stream}): {r:?} (transaction open: {})",
                            self.txn.is_some()
                        ))
                    }
                }
                let after = dump(self.fs())?;
                if let Some(d) = dump_diff(&before, &after) {
                    return Err(format!("cleaning changed what the file system shows: {d}"));
                }
                self.check(&[], true)?;
                if *remount {
                    self.remount(false)?;
                }
                Ok(())
            }
            op => {
                let rop = self.resolve(op).expect("an operation on objects");
                self.run(&rop)
            }
        }
    }

    /// The transaction did not happen: the model goes back to `model`, the file system must
    /// show exactly `want`.
    fn back_to(&mut self, model: Model, want: &Dump) -> R {
        for ino in self.model.nodes.keys() {
            if !model.nodes.contains_key(ino) {
                self.dead.insert(*ino);
            }
        }
        self.model = model;
        for ino in self.model.nodes.keys() {
            self.dead.remove(ino);
        }
        let got = dump(self.fs())?;
        if let Some(d) = dump_diff(want, &got) {
            return Err(format!("state after the transaction ended differs from before it: {d}"));
        }
        self.check(&[], true)
    }

    fn fsck(&self, when: &str) -> R {
        let r = self.fs().fsck();
        ensure!(r.is_clean(), "fsck {when}: {:?}", r.problems);
        Ok(())
    }

    /// Unmount (or, for `crash`, `sync` and drop without unmounting) and mount again: an
    /// open explicit transaction is gone; everything else must be exactly as before.
    fn remount(&mut self, crash: bool) -> R {
        let open = self.txn.take();
        let fs = self.fs.take().expect("mounted");
        let before = match &open {
            Some(_) => None,
            None => Some(dump(&fs)?),
        };
        if crash {
            fs.sync().map_err(|e| format!("sync: {e}"))?;
            drop(fs);
        } else {
            let r = fs.unmount();
            match (&r, open.is_some()) {
                (Ok(tally_fs::SnapshotOutcome::Written), false)
                | (Err(FsError::Invalid(_)), true) => {}
                _ => return Err(format!("unmount: {r:?} (transaction open: {})", open.is_some())),
            }
        }
        let fs = Fs::mount(self.dev.clone(), MountOptions::default())
            .map_err(|e| format!("mount after {}: {e}", if crash { "crash" } else { "unmount" }))?;
        self.fs = Some(fs);
        self.fsck("after mount")?;
        match (open, before) {
            (Some(t), _) => self.back_to(t.model, &t.dump),
            (None, Some(before)) => {
                let after = dump(self.fs())?;
                if let Some(d) = dump_diff(&before, &after) {
                    return Err(format!("remount (crash: {crash}) changed the file system: {d}"));
                }
                self.check(&[], true)
            }
            (None, None) => unreachable!(),
        }
    }

    fn run(&mut self, rop: &ROp) -> R {
        let got = call(self.fs(), self.txn.as_ref().map(|t| &t.txn), rop);
        let new_ino = match (&got, rop) {
            (Ok(Got::Attr(a)), ROp::Make { .. }) => a.ino,
            _ => u64::MAX,
        };
        let short;
        let rop = match (&got, rop) {
            (Ok(Got::Len(n)), ROp::Write { ino, off, data }) if *n < data.len() => {
                // A plain write split into transactions ran out of space after some of them:
                // a short write, ending at a transaction boundary.
                ensure!(self.txn.is_none(), "{rop:?}: short write ({n}) in a transaction");
                ensure!(
                    self.chunk_ends(*off, data.len()).contains(n),
                    "{rop:?}: short write of {n}, not at a transaction boundary"
                );
                self.enospc += 1;
                short = ROp::Write { ino: *ino, off: *off, data: data[..*n].to_vec() };
                &short
            }
            _ => rop,
        };
        let mut next = self.model.clone();
        let want = next.apply(rop, new_ino);
        match (got, want) {
            (Ok(got), Ok(out)) => {
                if let ROp::Make { .. } = rop {
                    ensure!(
                        !self.model.nodes.contains_key(&new_ino),
                        "{rop:?} reused live inode {new_ino}"
                    );
                    self.dead.remove(&new_ino);
                }
                for ino in self.model.nodes.keys() {
                    if !next.nodes.contains_key(ino) {
                        self.dead.insert(*ino);
                    }
                }
                self.model = next;
                tally(rop, "ok");
                match (&got, out) {
                    (Got::Unit, Out::Unit) => {}
                    (Got::Len(n), Out::Len(m)) => {
                        ensure!(*n == m, "{rop:?}: returned {n}, expected {m}")
                    }
                    (Got::Attr(a), Out::Attr(ino)) => {
                        self.cmp_attr(a, ino).map_err(|e| format!("{rop:?} returned: {e}"))?;
                    }
                    (Got::Entries, Out::Unit) => {
                        if let ROp::Readdir { dir, from } = rop {
                            self.check_dir(*dir, Some(*from))?;
                        }
                    }
                    (g, o) => return Err(format!("{rop:?}: returned {g:?}, expected {o:?}")),
                }
            }
            (Err(e), Err(n)) if predicted(&e) == Some(n) => tally(rop, &format!("errno {n}")),
            (Err(FsError::NoSpace), _) if rop.may_run_out_of_space() => {
                self.enospc += 1;
                tally(rop, "ENOSPC");
            }
            (got, want) => {
                return Err(format!(
                    "{rop:?}: file system {got:?}, model {want:?} (errno {:?})",
                    want.as_ref().err()
                ));
            }
        }
        self.check(&rop.inos(), false)
    }

    /// Where the transactions of a plain write of `len` bytes at `off` end (relative to `off`).
    fn chunk_ends(&self, off: u64, len: usize) -> Vec<usize> {
        let chunk = u64::from(self.cfg.segment_blocks / 2).saturating_sub(2).max(1) * BS;
        let (end, mut at, mut out) = (off + len as u64, off, Vec::new());
        while at < end {
            at = end.min(at / BS * BS + chunk);
            out.push((at - off) as usize);
        }
        out
    }

    fn cmp_attr(&self, a: &Attr, ino: Ino) -> R {
        let n = self.model.node(ino).map_err(|_| format!("inode {ino} is not in the model"))?;
        let want = (ino, n.kind, n.perm, n.uid, n.gid, self.model.nlink(ino), n.size, n.rdev);
        let got = (a.ino, a.kind, a.perm, a.uid, a.gid, a.nlink, a.size, a.rdev);
        ensure!(
            got == want,
            "attributes (ino, kind, perm, uid, gid, nlink, size, rdev) {got:?}, expected {want:?}"
        );
        Ok(())
    }

    /// Compare a directory's entries, `.` and `..`, kinds, and offsets (stable while the entry
    /// exists; learnt on first sight). With `from`, also resume from an entry's offset.
    fn check_dir(&mut self, dir: Ino, from: Option<u8>) -> R {
        let fs = self.fs.as_ref().expect("mounted");
        let got = fs.readdir(dir, 0).map_err(|e| format!("readdir {dir}: {e}"))?;
        let d = self.model.dir(dir).map_err(|e| format!("directory {dir}: errno {e}"))?;
        ensure!(
            got.len() == d.entries.len() + 2,
            "readdir {dir}: {} entries, model has {}: {got:?} vs {:?}",
            got.len() - 2,
            d.entries.len(),
            d.entries.keys().collect::<Vec<_>>()
        );
        ensure!(
            got[0].name == b"." && got[0].ino == dir && got[0].offset == 1,
            "readdir {dir}: first entry {:?}",
            got[0]
        );
        ensure!(
            got[1].name == b".." && got[1].ino == d.parent && got[1].offset == 2,
            "readdir {dir}: second entry {:?}, parent is {}",
            got[1],
            d.parent
        );
        let mut learnt = Vec::new();
        let mut last = 2;
        for e in &got[2..] {
            ensure!(e.offset > last, "readdir {dir}: offsets not increasing at {e:?}");
            last = e.offset;
            let m = d
                .entries
                .get(&e.name)
                .ok_or_else(|| format!("readdir {dir}: unexpected entry {e:?}"))?;
            ensure!(m.ino == e.ino, "readdir {dir}: {e:?} should name inode {}", m.ino);
            ensure!(self.model.kind_of(m.ino) == e.kind, "readdir {dir}: {e:?} kind");
            match m.offset {
                Some(o) => ensure!(
                    o == e.offset,
                    "readdir {dir}: offset of {:?} moved from {o} to {}",
                    String::from_utf8_lossy(&e.name),
                    e.offset
                ),
                None => learnt.push((e.name.clone(), e.offset)),
            }
            let l = fs.lookup(dir, &e.name).map_err(|err| format!("lookup {e:?}: {err}"))?;
            ensure!(l.ino == e.ino, "lookup {e:?} found {}", l.ino);
        }
        if let Some(from) = from {
            let i = usize::from(from) % (got.len() + 1);
            let offset = if i == 0 { 0 } else { got[i - 1].offset };
            let rest =
                fs.readdir(dir, offset).map_err(|e| format!("readdir {dir} from {offset}: {e}"))?;
            ensure!(
                rest == got[i..],
                "readdir {dir} from offset {offset}: {rest:?}, expected {:?}",
                &got[i..]
            );
        }
        let d = self.model.dir_mut(dir);
        for (name, offset) in learnt {
            if let Some(e) = d.entries.get_mut(&name) {
                e.offset = Some(offset);
            }
        }
        Ok(())
    }

    /// Compare everything the model tracks; file contents of `inos` (or of every file when
    /// `full`).
    fn check(&mut self, inos: &[Ino], full: bool) -> R {
        let fs = self.fs.as_ref().expect("mounted");
        let mut dirs = Vec::new();
        for (&ino, n) in &self.model.nodes {
            let a = fs.getattr(ino).map_err(|e| format!("getattr {ino}: {e}"))?;
            self.cmp_attr(&a, ino)?;
            match n.kind {
                FileKind::File if full || inos.contains(&ino) => {
                    file_matches(fs, &self.model, ino)?
                }
                FileKind::Symlink => {
                    let t = fs.readlink(ino).map_err(|e| format!("readlink {ino}: {e}"))?;
                    ensure!(t == n.target, "readlink {ino}: {t:?}");
                }
                FileKind::Dir => dirs.push(ino),
                _ => {}
            }
            let names = fs.listxattr(ino).map_err(|e| format!("listxattr {ino}: {e}"))?;
            ensure!(
                names.iter().eq(n.xattrs.keys()),
                "listxattr {ino}: {names:?}, expected {:?}",
                n.xattrs.keys().collect::<Vec<_>>()
            );
            for (name, value) in &n.xattrs {
                let v = fs.getxattr(ino, name).map_err(|e| format!("getxattr {ino}: {e}"))?;
                ensure!(
                    &v == value,
                    "getxattr {ino} {name:?}: {} bytes, expected {}",
                    v.len(),
                    value.len()
                );
            }
        }
        for &ino in &self.dead {
            let r = fs.getattr(ino);
            ensure!(errno(&r) == Some(libc::ENOENT), "getattr of removed inode {ino}: {r:?}");
        }
        let files = fs.statfs().files;
        ensure!(
            files == self.model.nodes.len() as u64,
            "statfs: {files} files, model has {}",
            self.model.nodes.len()
        );
        for dir in dirs {
            self.check_dir(dir, None)?;
        }
        Ok(())
    }
}

/// A file's size, block count and contents (every allocated block, the block after each, the
/// first and the last, aligned and unaligned) against the model.
fn file_matches(fs: &Fs, model: &Model, ino: Ino) -> R {
    let n = &model.nodes[&ino];
    let a = fs.getattr(ino).map_err(|e| format!("getattr {ino}: {e}"))?;
    ensure!(a.size == n.size, "file {ino}: size {}, expected {}", a.size, n.size);
    let allocated = fs.allocated_blocks(ino).map_err(|e| e.to_string())?;
    ensure!(
        allocated == n.blocks.len() as u64,
        "file {ino}: {allocated} blocks allocated, expected {} ({:?})",
        n.blocks.len(),
        n.blocks.keys().collect::<Vec<_>>()
    );
    let mut probe: BTreeSet<u64> = n.blocks.keys().flat_map(|&b| [b, b + 1]).collect();
    probe.insert(0);
    probe.insert(n.size.saturating_sub(1) / BS);
    for b in probe {
        for off in [b * BS, b * BS + BS / 2 + 3] {
            let got =
                fs.read(ino, off, BS as usize).map_err(|e| format!("read {ino} at {off}: {e}"))?;
            let want = model.read(ino, off, BS);
            if got != want {
                let at = got.iter().zip(&want).position(|(x, y)| x != y);
                return Err(format!(
                    "file {ino}: {} bytes read at {off}, expected {}; first difference at {at:?}",
                    got.len(),
                    want.len()
                ));
            }
        }
    }
    Ok(())
}

fn run(cfg: Cfg, ops: &[Op]) -> R {
    let mut h = Harness::new(cfg)?;
    for (i, op) in ops.iter().enumerate() {
        h.step(op).map_err(|e| format!("step {i} ({op:?}): {e}"))?;
    }
    if h.txn.is_some() {
        h.step(&Op::Commit { durable: true }).map_err(|e| format!("final commit: {e}"))?;
    }
    h.fsck("at the end")?;
    h.remount(false).map_err(|e| format!("final remount: {e}"))?;
    h.fsck("after the final remount")?;
    if std::env::var_os("MODEL_STATS").is_some() {
        let mut stats = STATS.lock().unwrap();
        *stats.entry("cases".into()).or_default() += 1;
        *stats.entry("steps".into()).or_default() += ops.len() as u64;
        *stats.entry("ENOSPC (any)".into()).or_default() += u64::from(h.enospc);
        eprintln!("{stats:#?}");
    }
    Ok(())
}

/// Outcomes per operation over the whole run, printed when `MODEL_STATS` is set (to see what
/// the generator reaches).
static STATS: std::sync::Mutex<BTreeMap<String, u64>> = std::sync::Mutex::new(BTreeMap::new());

fn tally(rop: &ROp, outcome: &str) {
    let op = format!("{rop:?}");
    let name = op.split([' ', '{']).next().unwrap_or("?");
    *STATS.lock().unwrap().entry(format!("{name} {outcome}")).or_default() += 1;
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(512)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        max_shrink_iters: 4096,
        ..ProptestConfig::default()
    })]

    /// Random operation sequences agree with the reference model at every step.
    #[test]
    fn fs_agrees_with_the_model(cfg in cfg(), ops in proptest::collection::vec(op(false), 1..150)) {
        run(cfg, &ops).map_err(TestCaseError::fail)?;
    }

    /// The same with explicit cleaning (then a comparison of everything, and sometimes a
    /// remount) among the operations.
    #[test]
    fn fs_agrees_with_the_model_while_cleaning(
        cfg in cfg(),
        ops in proptest::collection::vec(op(true), 1..150),
    ) {
        run(cfg, &ops).map_err(TestCaseError::fail)?;
    }
}

/// Replays of sequences the random test found, kept as named regressions.
mod found {
    use super::*;

    fn cfg1() -> Cfg {
        Cfg { streams: 1, segment_blocks: 16, blocks: 1024 }
    }

    fn create(dir: Sel, name: u8) -> Op {
        Op::Create { dir, name: Name::Pool(name), perm: 0 }
    }

    fn write(file: Sel, at: u64, len: u32) -> Op {
        Op::Write { file, at: At::Abs(at), len, seed: 0 }
    }

    /// Bug M1: a directory made and filled inside one transaction kept, in memory, the times
    /// of its creation after the commit while the media had the later ones.
    #[test]
    fn commit_keeps_a_new_directory_attributes() {
        let ops = [
            Op::Begin,
            Op::Mkdir { dir: 0, name: Name::Pool(0), perm: 0 },
            create(8, 0),
            Op::Commit { durable: false },
            Op::CrashRemount,
            Op::Begin,
            Op::Mknod { dir: 0, name: Name::Pool(2), kind: 0, rdev: 0 },
            Op::Chmod { ino: 0, perm: 0 },
            Op::Commit { durable: true },
            Op::Remount,
        ];
        run(cfg1(), &ops).unwrap();
    }

    /// Bug M2: cleaning dropped the root's first attribute record and relocated an older entry
    /// of it; mount then applied the entry before any record of the root existed.
    #[test]
    fn cleaning_keeps_the_root() {
        let ops = [
            create(0, 1),
            write(24, 45, 4052),
            write(0, 5276, 7013),
            create(0, 2),
            write(0, 0, 4097),
            write(8, 0, 1),
            Op::Link { ino: 0, dir: 0, name: Name::Pool(0) },
            Op::Link { ino: 8, dir: 0, name: Name::Pool(0) },
            write(32, 0, 1),
            Op::Clean { stream: 0, segments: 1, remount: false },
            Op::CrashRemount,
        ];
        run(cfg1(), &ops).unwrap();
    }
}

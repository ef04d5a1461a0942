//! Operation contexts, undo, and explicit multi-file transactions (CFS).
//!
//! Every operation runs in a [`Cx`] that records, before changing anything, the pre-image of
//! what it changes. An operation that fails (or has to wait) is rolled back from it, so the
//! DRAM state is exactly what it was; an operation whose log commit fails (out of space, I/O
//! error) is rolled back the same way.
//!
//! Explicit transactions keep the first pre-image of everything they change, so `abort`
//! restores the DRAM state exactly. Isolation of writers:
//! - the objects a transaction changes are *locked* by it until it ends: an inode it writes,
//!   truncates, chmods or frees, and each directory entry it adds or removes. Another
//!   transaction touching them gets `EBUSY` at once (no deadlock is possible); an operation
//!   outside any transaction waits until the transaction ends, unless its own thread began
//!   that transaction with [`crate::Fs::begin`] (it would wait for itself) and gets `EBUSY`
//!   (a server's [`crate::Fs::begin_detached`] binds no thread);
//! - a directory's own attributes (times, link count) are *shared metadata*, as in CFS: adding
//!   an entry to a directory inside a transaction does not lock the directory. The directory
//!   keeps a *storage version* of its attributes (what is on media, changed only by committed
//!   operations) beside the memory version (what readers see, including open transactions'
//!   changes); each transaction keeps its changes to it as a delta, applied to the storage
//!   version at commit and dropped from the memory version at abort.
//!
//! Readers see every change as it happens (as in a page cache); isolation of readers is the
//! application's business, as in CFS.
//!
//! Pre-images are proportional to what an operation changes, never to a file's or directory's
//! size: an inode's scalar part ([`InodeHead`]) is copied, and each block-map key, xattr and
//! directory entry is recorded with its old value by the hook the operation calls just before
//! changing it ([`Cx::block`], [`Cx::xattr`], [`Cx::dentry`]); a freed inode is moved onto the
//! list whole ([`Cx::free`]), not copied. Why this rather than a persistent map with structural
//! sharing (cheap whole-inode clones): every change already goes through one of these hooks, so
//! recording the old value there costs O(keys touched) with no new dependency, while a
//! persistent map would slow every block lookup of every read and still path-copy a node of
//! dozens of entries per level on every append. Rolling back restores key by key, in reverse,
//! which is exact: each key gets back its value from before the first change.

use std::collections::{BTreeSet, HashMap, HashSet};

use tally_log::TxId;

use crate::state::{Block, Dentry, Inode, InodeHead, Key, State, Xattr};
use crate::types::{Attr, Ino, Timespec};
use crate::FsError;

pub(crate) type TxnId = u64;

/// Why an operation stopped.
pub(crate) enum Stop {
    Err(FsError),
    /// An object is locked by an open transaction: roll back, wait for it to end, retry.
    Wait,
    /// These committed blocks' bytes are needed and only on the device: roll back, read them
    /// with the state lock dropped (no device I/O under it), retry. The retry uses them only
    /// if each block is still the one read (same place, version and crc): otherwise it asks
    /// again.
    Fetch(Vec<(Ino, u64, Block)>),
}

/// A block's bytes read from the device for an operation, and which block they were.
#[derive(Debug)]
pub(crate) struct Fetched {
    pub addr: u64,
    pub ver: u64,
    pub crc: u32,
    /// The bytes (crc checked), or why they could not be had (a read error or a checksum
    /// mismatch of the block as it still is: `EIO`).
    pub bytes: std::result::Result<std::sync::Arc<Vec<u8>>, crate::IoCause>,
}

impl Fetched {
    /// Are these the bytes of `block` as it is now?
    pub fn is_of(&self, block: &Block) -> bool {
        block.tx.is_some() && (block.addr, block.ver, block.crc) == (self.addr, self.ver, self.crc)
    }
}

impl From<FsError> for Stop {
    fn from(e: FsError) -> Self {
        Stop::Err(e)
    }
}

pub(crate) type OpResult<T> = std::result::Result<T, Stop>;

/// A pre-image.
#[derive(Debug)]
pub(crate) enum Undo {
    /// An inode's scalar part; `None`: the inode did not exist (created by the operation).
    Inode(Ino, Option<Box<InodeHead>>),
    /// One block-map entry; `None`: a hole.
    Block(Ino, u64, Option<Block>),
    /// One extended attribute; `None`: absent.
    Xattr(Ino, Vec<u8>, Option<Xattr>),
    /// An inode removed from the table (freed), moved here whole as it was at the free.
    Freed(Ino, Box<Inode>),
    Dentry(Ino, Vec<u8>, Option<Dentry>),
    Parent(Ino, Ino),
    DirAttr(Ino, Attr, Option<Attr>),
}

/// What a pre-image is of: kind, inode, block, name.
type UndoKey<'a> = (u8, Ino, u64, &'a [u8]);

impl Undo {
    fn key(&self) -> UndoKey<'_> {
        match self {
            Undo::Inode(i, _) => (0, *i, 0, &[]),
            Undo::Dentry(d, n, _) => (1, *d, 0, n),
            Undo::Parent(d, _) => (2, *d, 0, &[]),
            Undo::DirAttr(d, ..) => (3, *d, 0, &[]),
            Undo::Block(i, b, _) => (4, *i, *b, &[]),
            Undo::Xattr(i, n, _) => (5, *i, 0, n),
            Undo::Freed(i, _) => (6, *i, 0, &[]),
        }
    }

    /// Committed data blocks that the committed change this is the pre-image of made dead:
    /// an overwritten or removed block, and every block a freed inode still held (a hint for
    /// cleaning). Blocks the same change overwrote before the free are counted by their own
    /// `Block` pre-images: in the freed inode they are new (not committed) or gone.
    pub fn dying_blocks(&self, st: &State) -> u64 {
        match self {
            Undo::Block(_, _, Some(old)) => u64::from(old.tx.is_some()),
            Undo::Freed(ino, old) if !st.inodes.contains_key(ino) => {
                old.blocks.values().filter(|b| b.tx.is_some()).count() as u64
            }
            _ => 0,
        }
    }

    /// The last log transaction of the inode before the change (a dependency of the commit).
    pub fn last_tx(&self) -> Option<TxId> {
        match self {
            Undo::Inode(_, Some(h)) => h.last_tx,
            _ => None,
        }
    }

    pub fn apply(self, st: &mut State) {
        match self {
            Undo::Inode(ino, Some(head)) => {
                // Present: pre-images are applied in reverse, so a free of this inode later in
                // the same operation or transaction has already been put back.
                if let Some(i) = st.inodes.get_mut(&ino) {
                    i.set_head(*head);
                }
            }
            Undo::Inode(ino, None) => {
                if let Some(i) = st.inodes.remove(&ino) {
                    st.usage.remove_inode(&i);
                }
            }
            Undo::Freed(ino, inode) => {
                st.usage.add_inode(&inode);
                if let Some(i) = st.inodes.insert(ino, inode) {
                    st.usage.remove_inode(&i);
                }
            }
            Undo::Block(ino, b, old) => {
                // Absent (freed later in the same operation, put back above first): nothing.
                let _ = match old {
                    Some(old) => st.insert_block(ino, b, old),
                    None => st.remove_block(ino, b),
                };
            }
            Undo::Xattr(ino, name, old) => {
                if let Some(i) = st.inodes.get_mut(&ino) {
                    match old {
                        Some(old) => i.xattrs.insert(name, old),
                        None => i.xattrs.remove(&name),
                    };
                }
            }
            Undo::Dentry(dir, name, old) => {
                if let Some(d) = st.inodes.get_mut(&dir).and_then(|i| i.dir.as_mut()) {
                    match old {
                        Some(old) => d.insert(name, old),
                        None => {
                            d.remove(&name);
                        }
                    }
                }
            }
            Undo::Parent(dir, parent) => {
                if let Some(d) = st.inodes.get_mut(&dir).and_then(|i| i.dir.as_mut()) {
                    d.parent = parent;
                }
            }
            Undo::DirAttr(dir, attr, stored) => {
                if let Some(i) = st.inodes.get_mut(&dir) {
                    i.attr = attr;
                    i.stored = stored;
                }
            }
        }
    }
}

/// A transaction's change to a directory's shared attributes.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct AttrDiff {
    pub nlink: i64,
    pub mtime: Option<Timespec>,
    pub ctime: Option<Timespec>,
}

impl AttrDiff {
    pub fn between(before: &Attr, after: &Attr) -> AttrDiff {
        AttrDiff {
            nlink: i64::from(after.nlink) - i64::from(before.nlink),
            mtime: (after.mtime != before.mtime).then_some(after.mtime),
            ctime: (after.ctime != before.ctime).then_some(after.ctime),
        }
    }

    pub fn then(self, later: AttrDiff) -> AttrDiff {
        AttrDiff {
            nlink: self.nlink + later.nlink,
            mtime: later.mtime.or(self.mtime),
            ctime: later.ctime.or(self.ctime),
        }
    }

    pub fn apply(self, attr: &mut Attr) {
        attr.nlink = (i64::from(attr.nlink) + self.nlink).clamp(0, i64::from(u32::MAX)) as u32;
        if let Some(t) = self.mtime {
            attr.mtime = t;
        }
        if let Some(t) = self.ctime {
            attr.ctime = t;
        }
    }
}

/// An open explicit transaction.
#[derive(Debug, Default)]
pub(crate) struct TxnState {
    /// First pre-images, in the order taken.
    pub undo: Vec<Undo>,
    pub undone: HashSet<(u8, Ino, u64, Vec<u8>)>,
    /// Everything to write at commit.
    pub touched: BTreeSet<Key>,
    /// Changes to directories' shared attributes.
    pub dir_diffs: HashMap<Ino, AttrDiff>,
    /// Stream of its first operation.
    pub stream: Option<u16>,
    /// The thread that began it (`None`: begun for a client, [`crate::Fs::begin_detached`]).
    pub thread: Option<crate::sync::ThreadId>,
    /// The log's large transaction (run) its data went out in ahead of the commit, if any
    /// (`fs/large.rs`).
    pub run: Option<u64>,
    /// Keys written by those parts, each with the tombstone version it had before (the
    /// bookkeeping an abort puts back).
    pub streamed: Vec<(Key, Option<u64>)>,
    /// Data blocks written by its operations since its last part (a trigger, not exact).
    pub unstreamed: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Txns {
    pub open: HashMap<TxnId, TxnState>,
    pub next: TxnId,
    pub locks: HashMap<Key, TxnId>,
}

impl Txns {
    /// The memory version of a directory's attributes is its storage version plus the deltas
    /// of every open transaction.
    pub fn recompute_dir(&self, st_inode: &mut Inode, dir: Ino) {
        let Some(stored) = st_inode.stored else { return };
        let mut attr = stored;
        for t in self.open.values() {
            if let Some(d) = t.dir_diffs.get(&dir) {
                d.apply(&mut attr);
            }
        }
        st_inode.attr = attr;
        if !self.open.values().any(|t| t.dir_diffs.contains_key(&dir)) {
            st_inode.stored = None;
        }
    }
}

/// One operation's context.
#[derive(Debug, Default)]
pub(crate) struct Cx {
    pub txn: Option<TxnId>,
    pub undo: Vec<Undo>,
    pub touched: BTreeSet<Key>,
    full: HashSet<Ino>,
    dentries: HashSet<(Ino, Vec<u8>)>,
    parents: HashSet<Ino>,
    /// Directories whose shared attributes this operation changed, with their attributes before.
    pub dir_before: HashMap<Ino, Attr>,
    new_locks: Vec<Key>,
    /// Mutants only: keys committed in a transaction of their own, before the rest.
    pub split: BTreeSet<Key>,
    /// Blocks read from the device for this operation by earlier tries ([`Stop::Fetch`]).
    pub fetched: HashMap<(Ino, u64), Fetched>,
}

impl Cx {
    pub fn new(txn: Option<TxnId>) -> Cx {
        Cx { txn, ..Cx::default() }
    }

    /// An object is held by open transaction(s) `owners`: another transaction gets `EBUSY`; an
    /// operation outside transactions waits, unless its own thread holds one of them (it would
    /// wait for itself) and gets `EBUSY` too.
    fn conflict(&self, st: &State, owners: &[TxnId]) -> Stop {
        let me = crate::sync::current_thread();
        let mine = owners.iter().any(|o| st.txns.open.get(o).is_some_and(|t| t.thread == Some(me)));
        if self.txn.is_some() || mine {
            Stop::Err(FsError::Busy)
        } else {
            Stop::Wait
        }
    }

    fn lock(&mut self, st: &mut State, key: Key) -> OpResult<()> {
        match st.txns.locks.get(&key) {
            Some(&owner) if Some(owner) == self.txn => Ok(()),
            Some(&owner) => Err(self.conflict(st, &[owner])),
            None => {
                if let Some(t) = self.txn {
                    st.txns.locks.insert(key.clone(), t);
                    self.new_locks.push(key);
                }
                Ok(())
            }
        }
    }

    /// Stop (wait, or `EBUSY`; see `conflict`) if another open transaction holds `key`, without
    /// taking it: for an operation that finds nothing to change in what a transaction may yet
    /// undo, so that its `Ok` cannot be undone by an abort.
    pub fn unheld(&self, st: &State, key: &Key) -> OpResult<()> {
        match st.txns.locks.get(key) {
            Some(&owner) if Some(owner) != self.txn => Err(self.conflict(st, &[owner])),
            _ => Ok(()),
        }
    }

    /// About to change anything of inode `ino` (attributes, data, xattrs, or free it).
    pub fn inode(&mut self, st: &mut State, ino: Ino) -> OpResult<()> {
        // A change to a whole directory (chmod, free) while other transactions hold deltas to
        // its shared attributes: wait until they end (or EBUSY, see `conflict`).
        let sharers: Vec<TxnId> = st
            .txns
            .open
            .iter()
            .filter(|(&id, t)| Some(id) != self.txn && t.dir_diffs.contains_key(&ino))
            .map(|(&id, _)| id)
            .collect();
        if !sharers.is_empty() && st.inodes.get(&ino).is_some_and(|i| i.dir.is_some()) {
            return Err(self.conflict(st, &sharers));
        }
        self.lock(st, Key::Inode(ino))?;
        if self.full.insert(ino) {
            self.undo.push(Undo::Inode(ino, st.inodes.get(&ino).map(|i| Box::new(i.head()))));
        }
        self.touched.insert(Key::Inode(ino));
        Ok(())
    }

    /// About to change a directory's shared attributes (times, link count) because of an
    /// entry added or removed.
    pub fn dir_attr(&mut self, st: &mut State, dir: Ino) -> OpResult<()> {
        match st.txns.locks.get(&Key::Inode(dir)) {
            Some(&owner) if Some(owner) != self.txn => return Err(self.conflict(st, &[owner])),
            _ => {}
        }
        self.touched.insert(Key::Inode(dir));
        if self.full.contains(&dir) || self.dir_before.contains_key(&dir) {
            return Ok(());
        }
        let inode = st.inode(dir)?;
        self.dir_before.insert(dir, inode.attr);
        self.undo.push(Undo::DirAttr(dir, inode.attr, inode.stored));
        Ok(())
    }

    /// About to add, change or remove entry `name` of `dir`.
    pub fn dentry(&mut self, st: &mut State, dir: Ino, name: &[u8]) -> OpResult<()> {
        self.lock(st, Key::Dentry(dir, name.to_vec()))?;
        if self.dentries.insert((dir, name.to_vec())) {
            let old = st.dir(dir)?.entries().get(name).cloned();
            self.undo.push(Undo::Dentry(dir, name.to_vec(), old));
        }
        self.touched.insert(Key::Dentry(dir, name.to_vec()));
        Ok(())
    }

    /// About to change a directory's parent (rename of a directory).
    pub fn parent(&mut self, st: &State, dir: Ino) -> OpResult<()> {
        if self.parents.insert(dir) {
            self.undo.push(Undo::Parent(dir, st.dir(dir)?.parent));
        }
        Ok(())
    }

    /// About to change block `block` of `ino` (after [`Cx::inode`]): keeps its old entry,
    /// the first time this operation touches it.
    pub fn block(&mut self, st: &State, ino: Ino, block: u64) {
        debug_assert!(self.full.contains(&ino));
        if self.touched.insert(Key::Block(ino, block)) {
            let old = st.inodes.get(&ino).and_then(|i| i.blocks.get(&block)).cloned();
            self.undo.push(Undo::Block(ino, block, old));
        }
    }

    /// About to change xattr `name` of `ino` (after [`Cx::inode`]): keeps its old value.
    pub fn xattr(&mut self, st: &State, ino: Ino, name: &[u8]) {
        debug_assert!(self.full.contains(&ino));
        if self.touched.insert(Key::Xattr(ino, name.to_vec())) {
            let old = st.inodes.get(&ino).and_then(|i| i.xattrs.get(name)).cloned();
            self.undo.push(Undo::Xattr(ino, name.to_vec(), old));
        }
    }

    /// Free inode `ino`: remove it from the table, keeping it whole on the undo list (moved,
    /// not copied).
    pub fn free(&mut self, st: &mut State, ino: Ino) -> OpResult<()> {
        self.inode(st, ino)?;
        if let Some(i) = st.inodes.remove(&ino) {
            st.usage.remove_inode(&i);
            self.undo.push(Undo::Freed(ino, i));
        }
        Ok(())
    }

    /// The committed bytes of block `b` of `ino` (`block`, its entry now): from memory, or
    /// as an earlier try read them from the device; else [`Stop::Fetch`] (no device I/O
    /// under the state lock).
    pub fn block_bytes(
        &self,
        ino: Ino,
        b: u64,
        block: &Block,
    ) -> OpResult<std::sync::Arc<Vec<u8>>> {
        if let Some(d) = &block.data {
            return Ok(d.clone());
        }
        if block.tx.is_none() {
            // Never made (an uncommitted block always holds its bytes): fetching could only
            // retry forever.
            return Err(Stop::Err(FsError::io(crate::IoCause::NoBytes { ino, block: b })));
        }
        match self.fetched.get(&(ino, b)) {
            Some(f) if f.is_of(block) => match &f.bytes {
                Ok(bytes) => Ok(bytes.clone()),
                Err(why) => Err(Stop::Err(FsError::io(why.clone()))),
            },
            _ => Err(Stop::Fetch(vec![(ino, b, block.clone())])),
        }
    }

    /// [`Stop::Fetch`] for every block of `blocks` whose bytes are neither in memory nor
    /// fetched already (one retry for all of them, not one per block).
    pub fn need(&self, ino: Ino, blocks: &[(u64, Block)]) -> OpResult<()> {
        let missing: Vec<(Ino, u64, Block)> = blocks
            .iter()
            .filter(|(b, block)| {
                // (An uncommitted block without bytes is `block_bytes`'s error, not a fetch.)
                block.data.is_none()
                    && block.tx.is_some()
                    && !self.fetched.get(&(ino, *b)).is_some_and(|f| f.is_of(block))
            })
            .map(|(b, block)| (ino, *b, block.clone()))
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(Stop::Fetch(missing))
        }
    }

    /// Undo everything the operation did and release the locks it took.
    pub fn rollback(mut self, st: &mut State) {
        while let Some(u) = self.undo.pop() {
            u.apply(st);
        }
        for k in self.new_locks.drain(..) {
            st.txns.locks.remove(&k);
        }
    }

    /// The operation succeeded inside transaction `id`: hand its pre-images and keys over.
    pub fn into_txn(self, st: &mut State, id: TxnId, stream: u16) {
        let mut diffs = Vec::new();
        for (&dir, before) in &self.dir_before {
            if let Some(inode) = st.inodes.get_mut(&dir) {
                let diff = AttrDiff::between(before, &inode.attr);
                if inode.stored.is_none() {
                    inode.stored = Some(*before);
                }
                diffs.push((dir, diff));
            }
        }
        let Some(t) = st.txns.open.get_mut(&id) else { return };
        t.stream.get_or_insert(stream);
        for (dir, diff) in diffs {
            let e = t.dir_diffs.entry(dir).or_default();
            *e = e.then(diff);
        }
        for u in self.undo {
            if matches!(u, Undo::DirAttr(..)) {
                continue; // shared attributes are restored from the storage version
            }
            let (kind, ino, block, name) = u.key();
            if t.undone.insert((kind, ino, block, name.to_vec())) {
                t.undo.push(u);
            }
        }
        t.touched.extend(self.touched);
    }

    /// The operation succeeded outside any transaction: changes to shared directory attributes
    /// also go to their storage version. Returns the attributes to write for those directories.
    pub fn storage_attrs(&self, st: &mut State) -> HashMap<Ino, Attr> {
        let mut out = HashMap::new();
        for (&dir, before) in &self.dir_before {
            if let Some(inode) = st.inodes.get_mut(&dir) {
                if let Some(stored) = inode.stored.as_mut() {
                    AttrDiff::between(before, &inode.attr).apply(stored);
                    out.insert(dir, *stored);
                }
            }
        }
        out
    }
}

//! The DRAM state: inode table, per-file block maps, per-directory name maps, and the
//! bookkeeping that says which records in the log are still needed. All of it is rebuilt from
//! the log's records at mount ([`State::replay`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use tally_log::{RecoveredTx, TxId};

use crate::record::{Record, DATA_HOLE};
use crate::types::{Attr, FileKind, Ino, Timespec, ROOT};
use crate::{FsError, Result};

/// What one record describes. Two records with the same key describe the same thing; the one
/// with the higher version wins. Every key belongs to one inode, its owner: two operations that
/// touch a common key touch a common inode, which is what dependencies are tracked on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Key {
    /// The file-system record.
    Fs,
    /// An inode's attributes (and its `Free`).
    Inode(Ino),
    /// A directory entry.
    Dentry(Ino, Vec<u8>),
    /// A block of a file.
    Block(Ino, u64),
    /// An extended attribute.
    Xattr(Ino, Vec<u8>),
}

impl Key {
    /// The inode the key belongs to (0 for the file-system record).
    pub fn owner(&self) -> Ino {
        match self {
            Key::Fs => 0,
            Key::Inode(i) | Key::Dentry(i, _) | Key::Block(i, _) | Key::Xattr(i, _) => *i,
        }
    }

    pub fn of(rec: &Record) -> Key {
        match rec {
            Record::Fs { .. } => Key::Fs,
            Record::Inode { attr, .. } => Key::Inode(attr.ino),
            Record::Free { ino, .. } => Key::Inode(*ino),
            Record::Dentry { dir, name, .. } => Key::Dentry(*dir, name.clone()),
            Record::Extent { ino, block, .. } => Key::Block(*ino, *block),
            Record::Xattr { ino, name, .. } => Key::Xattr(*ino, name.clone()),
        }
    }
}

/// A block of file data: where it is, its crc, and (until it is durable, or while it belongs to
/// an open explicit transaction) its bytes.
#[derive(Debug, Clone)]
pub(crate) struct Block {
    /// Version of the record that placed it (0 while pending in an explicit transaction).
    pub ver: u64,
    pub crc: u32,
    /// Device block; meaningless while `tx` is `None`.
    pub addr: u64,
    /// The log transaction that wrote it; `None` while not yet committed.
    pub tx: Option<TxId>,
    /// The bytes, kept in memory until the write is durable (a read must never see the device
    /// before the write reached it).
    pub data: Option<Arc<Vec<u8>>>,
}

#[derive(Debug, Clone)]
pub(crate) struct Dentry {
    pub ino: Ino,
    pub kind: FileKind,
    pub cookie: u64,
    /// Version of its record (0 while never written).
    pub ver: u64,
}

/// The first cookie handed to an entry: 1 and 2 are `.` and `..`.
pub(crate) const FIRST_COOKIE: u64 = 3;

#[derive(Debug, Clone)]
pub(crate) struct Dir {
    /// Entries by name. Changed only by [`Dir::insert`], [`Dir::remove`] and
    /// [`Dir::set_ver`], which keep `order`, `name_bytes` and the snapshot's notes.
    entries: HashMap<Vec<u8>, Dentry>,
    /// Entries by cookie: readdir order, stable across inserts and removals, and the order
    /// the snapshot encodes them in (a big directory kept in pieces of cookies, as a big
    /// file's block map: [`BlockMap`]).
    order: BTreeMap<u64, Vec<u8>>,
    pub next_cookie: u64,
    pub parent: Ino,
    /// Bytes of all the entries' names (the space accounting's, `live.rs`).
    pub name_bytes: u64,
    /// Pieces of cookies ([`crate::snapshot::piece_of`]) with an entry inserted, removed or
    /// changed since the snapshot's pieces last took them. (A directory made new or cloned
    /// comes with its inode's block map, whose `unseen` makes the whole inode encoded.)
    changed: BTreeSet<u64>,
}

impl Dir {
    pub fn new(parent: Ino) -> Dir {
        Dir {
            entries: HashMap::new(),
            order: BTreeMap::new(),
            next_cookie: FIRST_COOKIE,
            parent,
            name_bytes: 0,
            changed: BTreeSet::new(),
        }
    }

    /// Entries by name.
    pub fn entries(&self) -> &HashMap<Vec<u8>, Dentry> {
        &self.entries
    }

    /// Entries' names by cookie.
    pub fn order(&self) -> &BTreeMap<u64, Vec<u8>> {
        &self.order
    }

    /// Whether `cookie` is another name's than `name` (two names never share a cookie: the
    /// directory hands out each once; replay and the snapshot's decoding refuse it).
    pub fn cookie_taken(&self, cookie: u64, name: &[u8]) -> bool {
        self.order.get(&cookie).is_some_and(|n| n.as_slice() != name)
    }

    pub fn insert(&mut self, name: Vec<u8>, d: Dentry) {
        if let Some(old) = self.entries.get(&name) {
            self.order.remove(&old.cookie);
            self.changed.insert(crate::snapshot::piece_of(old.cookie));
        } else {
            self.name_bytes = self.name_bytes.saturating_add(name.len() as u64);
        }
        // Saturating: a cookie read from the device may be the largest (replay refuses it; a
        // forged snapshot must not panic here).
        self.next_cookie = self.next_cookie.max(d.cookie.saturating_add(1));
        self.changed.insert(crate::snapshot::piece_of(d.cookie));
        self.order.insert(d.cookie, name.clone());
        self.entries.insert(name, d);
    }

    pub fn remove(&mut self, name: &[u8]) -> Option<Dentry> {
        let d = self.entries.remove(name)?;
        self.order.remove(&d.cookie);
        self.changed.insert(crate::snapshot::piece_of(d.cookie));
        self.name_bytes = self.name_bytes.saturating_sub(name.len() as u64);
        Some(d)
    }

    /// Set the version of `name`'s record (its commit placed it).
    pub fn set_ver(&mut self, name: &[u8], ver: u64) {
        if let Some(d) = self.entries.get_mut(name) {
            d.ver = ver;
            self.changed.insert(crate::snapshot::piece_of(d.cookie));
        }
    }

    /// The pieces noted changed since the last call, cleared (for the snapshot's pieces).
    pub fn take_changed(&mut self) -> BTreeSet<u64> {
        std::mem::take(&mut self.changed)
    }

    /// Note `pieces` changed again (what a checkpoint's slice took and left for the next).
    pub fn put_back_changed(&mut self, pieces: BTreeSet<u64>) {
        self.changed.extend(pieces);
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Xattr {
    pub value: Vec<u8>,
    pub ver: u64,
}

#[derive(Debug, Clone)]
pub(crate) struct Inode {
    pub attr: Attr,
    /// Version of its current record (0: never written).
    pub ver: u64,
    pub target: Vec<u8>,
    pub blocks: BlockMap,
    pub dir: Option<Dir>,
    pub xattrs: BTreeMap<Vec<u8>, Xattr>,
    /// The last log transaction that changed it, for dependencies and fsync.
    pub last_tx: Option<TxId>,
    /// CFS's storage version of a directory's attributes while open explicit transactions
    /// hold changes to them that others must not see on media (see `txn.rs`).
    pub stored: Option<Attr>,
}

/// An inode's scalar part: everything but its block map, directory and xattrs, whose changes
/// the undo list records key by key (see `txn.rs`), so a pre-image costs the same for a file of
/// any size.
#[derive(Debug, Clone)]
pub(crate) struct InodeHead {
    pub attr: Attr,
    pub ver: u64,
    pub target: Vec<u8>,
    pub last_tx: Option<TxId>,
    pub stored: Option<Attr>,
}

impl Inode {
    /// A copy of the scalar part.
    pub fn head(&self) -> InodeHead {
        InodeHead {
            attr: self.attr,
            ver: self.ver,
            target: self.target.clone(),
            last_tx: self.last_tx,
            stored: self.stored,
        }
    }

    /// Put back a scalar part taken by [`Inode::head`].
    pub fn set_head(&mut self, h: InodeHead) {
        let InodeHead { attr, ver, target, last_tx, stored } = h;
        (self.attr, self.ver, self.target, self.last_tx, self.stored) =
            (attr, ver, target, last_tx, stored);
    }

    pub fn new(attr: Attr, target: Vec<u8>, parent: Ino) -> Inode {
        let dir = (attr.kind == FileKind::Dir).then(|| Dir::new(parent));
        Inode {
            attr,
            ver: 0,
            target,
            blocks: BlockMap::default(),
            dir,
            xattrs: BTreeMap::new(),
            last_tx: None,
            stored: None,
        }
    }
}

/// A file's block map (block index → block), read as a `BTreeMap` and changed only through
/// its own methods, which note the snapshot piece of each block they change: a big file's
/// snapshot encoding is kept in pieces of blocks (`snapshot.rs`, `Chunks`), and a checkpoint
/// encodes again only the pieces noted, not the whole map of a file of which 4 KiB changed.
#[derive(Debug)]
pub(crate) struct BlockMap {
    map: BTreeMap<u64, Block>,
    /// Pieces ([`crate::snapshot::piece_of`]) with a block inserted, removed or changed since
    /// the snapshot's pieces last took them.
    changed: BTreeSet<u64>,
    /// No kept piece describes this map's inode yet (made new, or a clone: a block map is
    /// made and cloned with its inode): the whole inode is encoded, directory included.
    unseen: bool,
}

impl Default for BlockMap {
    fn default() -> Self {
        BlockMap { map: BTreeMap::new(), changed: BTreeSet::new(), unseen: true }
    }
}

/// A clone is a map the kept pieces do not describe (an explicit transaction's pre-image put
/// back may hold blocks the pieces no longer have).
impl Clone for BlockMap {
    fn clone(&self) -> Self {
        BlockMap { map: self.map.clone(), changed: BTreeSet::new(), unseen: true }
    }
}

impl std::ops::Deref for BlockMap {
    type Target = BTreeMap<u64, Block>;

    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl<'a> IntoIterator for &'a BlockMap {
    type Item = (&'a u64, &'a Block);
    type IntoIter = std::collections::btree_map::Iter<'a, u64, Block>;

    fn into_iter(self) -> Self::IntoIter {
        self.map.iter()
    }
}

impl BlockMap {
    pub fn insert(&mut self, b: u64, block: Block) -> Option<Block> {
        self.changed.insert(crate::snapshot::piece_of(b));
        self.map.insert(b, block)
    }

    pub fn remove(&mut self, b: &u64) -> Option<Block> {
        let old = self.map.remove(b)?;
        self.changed.insert(crate::snapshot::piece_of(*b));
        Some(old)
    }

    /// A block to change in place (its version, address, transaction: what the snapshot
    /// encodes); its piece is noted.
    pub fn get_mut(&mut self, b: &u64) -> Option<&mut Block> {
        let block = self.map.get_mut(b)?;
        self.changed.insert(crate::snapshot::piece_of(*b));
        Some(block)
    }

    /// Let go of block `b`'s bytes if it is still version `ver` of transaction `tx` (the bytes
    /// are not encoded: no piece is noted).
    pub fn take_bytes(&mut self, b: u64, ver: u64, tx: TxId) -> Option<Arc<Vec<u8>>> {
        let block = self.map.get_mut(&b)?;
        if block.ver == ver && block.tx == Some(tx) {
            block.data.take()
        } else {
            None
        }
    }

    /// The pieces noted changed since the last call, and whether the map was unseen; both
    /// cleared (for the snapshot's pieces).
    pub fn take_changed(&mut self) -> (BTreeSet<u64>, bool) {
        (std::mem::take(&mut self.changed), std::mem::replace(&mut self.unseen, false))
    }

    /// Note `pieces` changed again (what a checkpoint's slice took and left for the next).
    pub fn put_back_changed(&mut self, pieces: BTreeSet<u64>) {
        if self.changed.is_empty() {
            self.changed = pieces;
        } else {
            self.changed.extend(pieces);
        }
    }
}

/// A data block whose bytes are cached until its transaction is durable.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cached {
    pub tx: TxId,
    pub ino: Ino,
    pub block: u64,
    pub ver: u64,
}

/// The data blocks held in memory until durable, per stream in commit order, so in seq order:
/// pruning pops each stream's durable front, never scanning what stays (an fsync prunes).
#[derive(Debug, Default)]
pub(crate) struct CachedBlocks(pub Vec<VecDeque<Cached>>);

impl CachedBlocks {
    /// Hold `c` (committed after every block held on its stream).
    pub fn push(&mut self, c: Cached) {
        let s = usize::from(c.tx.stream);
        if self.0.len() <= s {
            self.0.resize_with(s + 1, VecDeque::new);
        }
        if let Some(q) = self.0.get_mut(s) {
            debug_assert!(q.back().is_none_or(|b| b.tx.seq <= c.tx.seq));
            q.push_back(c);
        }
    }
}

/// The clean-unmount snapshot's room, as measured (`fs/space.rs`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SnapshotNeed {
    /// Free segments set aside for it, a spare included.
    pub segments: u32,
    /// Bytes it may grow by before it outgrows them.
    pub slack: u64,
    /// An upper bound of what it grew by since measured ([`crate::snapshot::growth_bound`]
    /// of every key operations changed).
    pub grown: u64,
}

/// The hash of the maps keyed by inode number that every operation looks up several times
/// (the inode table, open handles): a folded multiply with a per-process random seed, not SipHash
/// (about a tenth of a small operation's CPU was hashing). Inode numbers are handed out by
/// the file system, one after another, not chosen by callers; the seed keeps a crafted image's
/// numbers from being made to collide.
#[derive(Debug, Clone, Copy)]
pub(crate) struct InoHash {
    seed: u64,
}

impl Default for InoHash {
    fn default() -> Self {
        static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        let seed = *SEED.get_or_init(|| {
            use std::hash::BuildHasher;
            std::collections::hash_map::RandomState::new().hash_one(0x7a11_u64)
        });
        InoHash { seed }
    }
}

impl std::hash::BuildHasher for InoHash {
    type Hasher = InoHasher;
    fn build_hasher(&self) -> InoHasher {
        InoHasher(self.seed)
    }
}

/// See [`InoHash`].
#[derive(Debug)]
pub(crate) struct InoHasher(u64);

impl InoHasher {
    fn mix(&mut self, n: u64) {
        // A folded multiply: every bit of the input reaches every bit of the result (a plain
        // multiply leaves the low bits to the input's low bits alone).
        let wide = u128::from(self.0 ^ n) * 0x9e37_79b9_7f4a_7c15_u128;
        self.0 = (wide as u64) ^ ((wide >> 64) as u64);
    }
}

impl std::hash::Hasher for InoHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.mix(u64::from(*b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.mix(n);
    }

    fn finish(&self) -> u64 {
        // Once more, so that inputs differing in a few bits only (high bits) differ in all.
        let wide = u128::from(self.0) * 0xff51_afd7_ed55_8ccd_u128;
        (wide as u64) ^ ((wide >> 64) as u64)
    }
}

/// A map keyed by inode number, hashed with [`InoHash`].
pub(crate) type InoMap<V> = HashMap<Ino, V, InoHash>;

/// The hash of the maps keyed by [`Key`] that every committed record updates (record counts,
/// tombstones): foldhash's folded multiply over whole words, seeded per process and per map,
/// not SipHash (the record counts were a tenth of a small write's CPU, mostly hashing). A
/// key's name comes from a caller, so the hash stays seeded: a caller who cannot see the seed
/// cannot choose names that collide.
pub(crate) type KeyHash = foldhash::fast::RandomState;

/// A map keyed by [`Key`], hashed with [`KeyHash`].
pub(crate) type KeyMap<V> = HashMap<Key, V, KeyHash>;

/// The inode table. Every access that can change an inode (`get_mut`, `insert`, `remove`,
/// `entry`) marks its number changed, and nothing else hands out a mutable inode: a
/// checkpoint re-encodes the changed inodes only and reuses every other one's encoding from
/// the one before (`snapshot.rs`, [`crate::snapshot::Chunks`]). A mark is conservative (a
/// `get_mut` that changed nothing costs a re-encoding, never a stale one).
#[derive(Debug, Default)]
pub(crate) struct Inodes {
    map: InoMap<Box<Inode>>,
    changed: HashSet<Ino, InoHash>,
    /// The same marks, for the space accounting's kept totals (`live.rs`, `LiveTotals`).
    changed_live: HashSet<Ino, InoHash>,
}

impl Inodes {
    pub fn get(&self, ino: &Ino) -> Option<&Inode> {
        self.map.get(ino).map(|i| &**i)
    }

    pub fn get_mut(&mut self, ino: &Ino) -> Option<&mut Box<Inode>> {
        let inode = self.map.get_mut(ino)?;
        self.changed.insert(*ino);
        self.changed_live.insert(*ino);
        Some(inode)
    }

    /// An inode to change only what the snapshot does not encode (its block map's notes of
    /// changed pieces): not marked changed. For the snapshot's pieces (`snapshot.rs`).
    pub fn get_mut_unmarked(&mut self, ino: &Ino) -> Option<&mut Inode> {
        self.map.get_mut(ino).map(|i| &mut **i)
    }

    pub fn insert(&mut self, ino: Ino, inode: Box<Inode>) -> Option<Box<Inode>> {
        self.mark(ino);
        self.map.insert(ino, inode)
    }

    pub fn remove(&mut self, ino: &Ino) -> Option<Box<Inode>> {
        self.mark(*ino);
        self.map.remove(ino)
    }

    pub fn entry(&mut self, ino: Ino) -> std::collections::hash_map::Entry<'_, Ino, Box<Inode>> {
        self.mark(ino);
        self.map.entry(ino)
    }

    pub fn contains_key(&self, ino: &Ino) -> bool {
        self.map.contains_key(ino)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn keys(&self) -> std::collections::hash_map::Keys<'_, Ino, Box<Inode>> {
        self.map.keys()
    }

    pub fn values(&self) -> std::collections::hash_map::Values<'_, Ino, Box<Inode>> {
        self.map.values()
    }

    pub fn iter(&self) -> std::collections::hash_map::Iter<'_, Ino, Box<Inode>> {
        self.map.iter()
    }

    fn mark(&mut self, ino: Ino) {
        self.changed.insert(ino);
        self.changed_live.insert(ino);
    }

    /// The inodes marked changed since the last call, unmarked (for the snapshot's chunks).
    pub fn take_changed(&mut self) -> HashSet<Ino, InoHash> {
        std::mem::take(&mut self.changed)
    }

    /// The same for the space accounting's totals.
    pub fn take_changed_live(&mut self) -> HashSet<Ino, InoHash> {
        std::mem::take(&mut self.changed_live)
    }

    /// Up to `n` of the inodes marked changed for the space accounting's totals, unmarked.
    /// (The space totals' marks stay in the table until done: `statfs` and the low-space
    /// check bring the totals up to date from them at any time.)
    pub fn take_changed_live_some(&mut self, n: usize) -> Vec<Ino> {
        let some: Vec<Ino> = self.changed_live.iter().take(n).copied().collect();
        for ino in &some {
            self.changed_live.remove(ino);
        }
        some
    }

    /// Let go of the bytes of `ino`'s block `block` held in memory, if it is still the copy
    /// version `ver` of transaction `tx` placed (they are durable now). The inode stays
    /// unmarked: neither the snapshot's encoding nor the space totals hold a block's bytes,
    /// so a checkpoint need not encode the inode again for it (marked, every file written
    /// was encoded twice: once for the write, once for its bytes made durable).
    ///
    /// Returns the bytes let go of, for the caller to free once it has given up the state
    /// lock (`Fs::prune_cache_in_slices`).
    pub fn let_go_of_bytes(
        &mut self,
        ino: Ino,
        block: u64,
        ver: u64,
        tx: TxId,
    ) -> Option<Arc<Vec<u8>>> {
        // The same version and the same copy: cleaning moves a block (same version, another
        // transaction) and holds it again until the move is durable (`clean.rs`); the entry of
        // the write it moved must not drop it.
        self.map.get_mut(&ino)?.blocks.take_bytes(block, ver, tx)
    }

    /// How many inodes are marked changed.
    #[cfg(test)]
    pub fn changed_count(&self) -> usize {
        self.changed.len()
    }

    /// How many inodes are marked changed for the space accounting's totals.
    pub fn changed_live_len(&self) -> usize {
        self.changed_live.len()
    }
}

impl<'a> IntoIterator for &'a Inodes {
    type Item = (&'a Ino, &'a Box<Inode>);
    type IntoIter = std::collections::hash_map::Iter<'a, Ino, Box<Inode>>;
    fn into_iter(self) -> Self::IntoIter {
        self.map.iter()
    }
}

impl std::ops::Index<&Ino> for Inodes {
    type Output = Box<Inode>;
    fn index(&self, ino: &Ino) -> &Box<Inode> {
        &self.map[ino]
    }
}

#[derive(Debug, Default)]
pub(crate) struct State {
    /// Boxed: an inode is about 400 bytes, and a hash table moves its entries when it grows.
    /// Unboxed, the table's growth at 57,000 inodes stalled the operation that caused it
    /// (under the state lock) for 38 ms on the 2-core VM, mostly faulting in the new table's
    /// fresh pages; boxed, it moves 16-byte entries.
    pub inodes: Inodes,
    pub next_ino: Ino,
    /// The version clock: the next record version.
    pub next_ver: u64,
    pub block_size: u32,
    /// Version of the file-system record.
    pub fs_ver: u64,
    /// Records of each key in the log, live or not (for dropping tombstones safely).
    pub key_count: KeyMap<u32>,
    /// Records of each inode in the log. A persistent map: a checkpoint takes it whole in O(1)
    /// under the state lock and encodes it after giving the lock up (`snapshot.rs`, `Taken`);
    /// sorting and encoding it under the lock took 7-17 ms for 200,000 files (`examples/
    /// checkpoint_hold.rs`).
    pub ino_count: imbl::OrdMap<Ino, u32>,
    /// Keys whose current record is a tombstone, with its version. Persistent, as `ino_count`
    /// (after deleting many files there are as many tombstones until cleaning drops them).
    pub tombs: imbl::OrdMap<Key, u64>,
    /// Freed inodes whose `Free` record is in the log, with its version. Persistent, as
    /// `ino_count`.
    pub freed: imbl::OrdMap<Ino, u64>,
    /// Data blocks whose bytes are held until durable.
    pub cached: CachedBlocks,
    pub cached_bytes: usize,
    /// Transactions later operations must depend on while they are not durable (barriers):
    /// at most one per stream, its newest.
    pub barriers: Vec<TxId>,
    pub txns: crate::txn::Txns,
    /// Set after a failed write or flush: every change fails until remount.
    pub failed: Option<std::sync::Arc<FsError>>,
    /// Per stream: the oldest segment last found at least half live, and `dead_blocks` then
    /// (cleaning does not measure it again until it changes or enough data has died).
    pub liveness_checked: HashMap<u16, (u32, u64)>,
    /// Open handles per inode ([`crate::Fs::open`]); DRAM only.
    pub pins: InoMap<u32>,
    /// Committed data blocks made dead since mount (a hint of when to measure liveness again).
    pub dead_blocks: u64,
    /// Blocks `fallocate` reserved and no write has used yet; DRAM only (`reserve.rs`).
    pub reserved: crate::reserve::Reservations,
    /// What the clean-unmount snapshot of this state needs, as last measured (`fs/space.rs`).
    pub snapshot_need: Option<SnapshotNeed>,
    /// `next_ver` when the checkpoint snapshot in force was taken (`None` without one): every
    /// record from this version on is in the log after it, and tombstones among them are kept
    /// while it is in force (`clean.rs`).
    pub checkpoint_ver: Option<u64>,
    /// The last checkpoint snapshot's bookkeeping part (record counts, tombstones, freed
    /// inodes: about 70 bytes per file), kept for the next one to encode into (its memory
    /// stays mapped); the inodes' part is kept per inode (`chunks`). Not part of the state.
    pub snapshot_buf: Vec<u8>,
    /// Live data blocks per segment, kept as the block maps change (`live.rs`); derived from
    /// them, not part of the state. Every change of a committed block (placed, moved, dropped,
    /// put back by an undo, its inode freed or restored) goes through it.
    pub usage: crate::live::SegmentUsage,
    /// Each inode's snapshot encoding as the last checkpoint made it (`snapshot.rs`); not part
    /// of the state.
    pub chunks: crate::snapshot::Chunks,
    /// The record counts' snapshot encoding in groups, as the last checkpoint made it
    /// (`snapshot.rs`); not part of the state.
    pub counts: crate::snapshot::CountGroups,
    /// The live state's data blocks and record bytes, kept per inode (`live.rs`); derived,
    /// not part of the state.
    pub live_totals: crate::live::LiveTotals,
}

impl State {
    pub fn next_ver(&mut self) -> u64 {
        let v = self.next_ver;
        self.next_ver += 1;
        v
    }

    pub fn inode(&self, ino: Ino) -> Result<&Inode> {
        self.inodes.get(&ino).ok_or(FsError::NotFound)
    }

    pub fn inode_mut(&mut self, ino: Ino) -> Result<&mut Inode> {
        self.inodes.get_mut(&ino).map(|i| &mut **i).ok_or(FsError::NotFound)
    }

    pub fn dir(&self, ino: Ino) -> Result<&Dir> {
        self.inode(ino)?.dir.as_ref().ok_or(FsError::NotDir)
    }

    pub fn dir_mut(&mut self, ino: Ino) -> Result<&mut Dir> {
        self.inode_mut(ino)?.dir.as_mut().ok_or(FsError::NotDir)
    }

    /// Count a record now in the log.
    pub fn count(&mut self, key: &Key) {
        // A key already in the log (most are: an inode's attributes, a rewritten block) is
        // counted without cloning it (a name would be a fresh allocation).
        match self.key_count.get_mut(key) {
            Some(c) => *c += 1,
            None => {
                self.key_count.insert(key.clone(), 1);
            }
        }
        self.counts.mark(key);
        let owner = key.owner();
        match self.ino_count.get_mut(&owner) {
            Some(c) => *c += 1,
            None => {
                self.ino_count.insert(owner, 1);
            }
        }
    }

    /// Forget a record that left the log (cleaned).
    pub fn uncount(&mut self, key: &Key) {
        if let Some(c) = self.key_count.get_mut(key) {
            *c = c.saturating_sub(1);
            if *c == 0 {
                self.key_count.remove(key);
            }
            self.counts.mark(key);
        }
        if let Some(c) = self.ino_count.get_mut(&key.owner()) {
            *c = c.saturating_sub(1);
            if *c == 0 {
                self.ino_count.remove(&key.owner());
            }
        }
    }

    pub fn in_log(&self, key: &Key) -> bool {
        self.key_count.get(key).is_some_and(|&c| c > 0)
    }

    /// Rebuild the state from the transactions recovery kept. Records are applied in version
    /// order, whatever stream or position they were found at.
    pub fn replay(streams: &[Vec<RecoveredTx>], ignore_versions: bool) -> Result<State> {
        let st = State { next_ino: ROOT + 1, next_ver: 1, ..State::default() };
        Self::replay_onto(st, streams, ignore_versions)
    }

    /// Apply the transactions recovery kept on top of `st` (empty, or a checkpoint snapshot's
    /// state, which the transactions all followed), in version order.
    pub fn replay_onto(
        mut st: State,
        streams: &[Vec<RecoveredTx>],
        ignore_versions: bool,
    ) -> Result<State> {
        let mut recs: Vec<(Record, TxId, u64, u32)> = Vec::new();
        for txs in streams {
            for tx in txs {
                for bytes in &tx.records {
                    let rec = Record::decode(bytes)?;
                    recs.push((rec, tx.id, tx.data_start, tx.data_count));
                }
            }
        }
        if !ignore_versions {
            // Within one version (one operation), `Free` after the rest.
            recs.sort_by_key(|(r, ..)| (r.ver(), replay_rank(r)));
        }
        // An inode freed later makes every earlier record of it irrelevant, even if cleaning
        // already dropped the records that created it.
        let mut freed_at: HashMap<Ino, u64> = HashMap::new();
        for (r, ..) in &recs {
            if let Record::Free { ver, ino } = r {
                let e = freed_at.entry(*ino).or_default();
                *e = (*e).max(*ver);
            }
        }
        // Inodes first, then what belongs to them: cleaning relocates a live entry or extent
        // with its old version, while its inode's only surviving attribute record may be newer
        // (the older ones were dead and dropped), so version order alone could meet a child
        // before its inode exists.
        let (inodes, children): (Vec<_>, Vec<_>) = recs.into_iter().partition(|(r, ..)| {
            matches!(r, Record::Fs { .. } | Record::Inode { .. } | Record::Free { .. })
        });
        for (rec, tx, data_start, data_count) in inodes.into_iter().chain(children) {
            let key = Key::of(&rec);
            st.count(&key);
            // Bytes from the device: a version or inode number at its maximum has no successor.
            let after = |v: u64, what: &str| {
                v.checked_add(1).ok_or_else(|| {
                    FsError::corrupted("record", format!("{what} {v} at its maximum"))
                })
            };
            st.next_ver = st.next_ver.max(after(rec.ver(), "version")?);
            st.next_ino = st.next_ino.max(after(key.owner(), "inode number")?);
            let superseded =
                freed_at.get(&key.owner()).is_some_and(|&f| f > rec.ver() && key != Key::Fs);
            if superseded {
                continue;
            }
            st.apply(rec, tx, data_start, data_count)?;
        }
        if st.fs_ver == 0 {
            return Err(FsError::corrupted("log replay", "no file-system record in the log"));
        }
        if st.inodes.get(&ROOT).is_none_or(|i| i.dir.is_none()) {
            return Err(FsError::corrupted("log replay", "no root directory"));
        }
        // Parents of directories, from the entries naming them.
        let mut parents = Vec::new();
        for (&ino, inode) in &st.inodes {
            if let Some(dir) = &inode.dir {
                parents.extend(
                    dir.entries()
                        .values()
                        .filter(|d| d.kind == FileKind::Dir)
                        .map(|d| (d.ino, ino)),
                );
            }
        }
        for (child, parent) in parents {
            if let Some(Some(d)) = st.inodes.get_mut(&child).map(|i| i.dir.as_mut()) {
                d.parent = parent;
            }
        }
        Ok(st)
    }

    fn apply(&mut self, rec: Record, tx: TxId, data_start: u64, data_count: u32) -> Result<()> {
        let ver = rec.ver();
        match rec {
            Record::Fs { block_size, .. } => {
                self.block_size = block_size;
                self.fs_ver = ver;
            }
            Record::Inode { attr, target, .. } => {
                let ino = attr.ino;
                self.freed.remove(&ino);
                self.tombs.remove(&Key::Inode(ino));
                let inode = self
                    .inodes
                    .entry(ino)
                    .or_insert_with(|| Box::new(Inode::new(attr, Vec::new(), ino)));
                if inode.attr.kind != attr.kind {
                    return Err(FsError::corrupted("record", format!("inode {ino} changed kind")));
                }
                inode.attr = attr;
                inode.target = target;
                inode.ver = ver;
                inode.last_tx = None;
            }
            Record::Free { ino, .. } => {
                self.inodes.remove(&ino);
                self.freed.insert(ino, ver);
            }
            Record::Dentry { dir, name, ino, kind, cookie, .. } => {
                let key = Key::Dentry(dir, name.clone());
                let d =
                    self.inodes.get_mut(&dir).and_then(|i| i.dir.as_mut()).ok_or_else(|| {
                        FsError::corrupted(
                            "record",
                            format!("entry {name:?} in missing directory {dir}"),
                        )
                    })?;
                if ino == 0 {
                    d.remove(&name);
                    self.tombs.insert(key, ver);
                } else {
                    // `.` and `..` take cookies 1 and 2; a cookie needs a successor for the next.
                    if cookie < FIRST_COOKIE || cookie == u64::MAX {
                        return Err(FsError::corrupted(
                            "record",
                            format!("entry {name:?} with cookie {cookie}"),
                        ));
                    }
                    // Each cookie is handed out once in a directory: a record giving
                    // another name's is not one this file system wrote.
                    if d.cookie_taken(cookie, &name) {
                        return Err(FsError::corrupted(
                            "record",
                            format!("entry {name:?} with the cookie {cookie} of another"),
                        ));
                    }
                    d.insert(name, Dentry { ino, kind, cookie, ver });
                    self.tombs.remove(&key);
                }
            }
            Record::Extent { ino, block, data, crc, .. } => {
                let key = Key::Block(ino, block);
                let inode = self.inodes.get_mut(&ino).ok_or_else(|| {
                    FsError::corrupted("record", format!("data of missing inode {ino}"))
                })?;
                if data == DATA_HOLE {
                    inode.blocks.remove(&block);
                    self.tombs.insert(key, ver);
                } else {
                    if data >= data_count {
                        return Err(FsError::corrupted("record", format!(
                            "extent of inode {ino} names data block {data} of a transaction with {data_count}"
                        )));
                    }
                    let b = Block {
                        ver,
                        crc,
                        addr: data_start + u64::from(data),
                        tx: Some(tx),
                        data: None,
                    };
                    inode.blocks.insert(block, b);
                    self.tombs.remove(&key);
                }
            }
            Record::Xattr { ino, name, value, .. } => {
                let key = Key::Xattr(ino, name.clone());
                let inode = self.inodes.get_mut(&ino).ok_or_else(|| {
                    FsError::corrupted("record", format!("xattr of missing inode {ino}"))
                })?;
                match value {
                    Some(value) => {
                        inode.xattrs.insert(name, Xattr { value, ver });
                        self.tombs.remove(&key);
                    }
                    None => {
                        inode.xattrs.remove(&name);
                        self.tombs.insert(key, ver);
                    }
                }
            }
        }
        Ok(())
    }

    /// Inodes in use.
    pub fn files(&self) -> u64 {
        self.inodes.len() as u64
    }

    /// Keys of an inode's blocks in `range`.
    pub fn block_keys(&self, ino: Ino, from: u64) -> Vec<u64> {
        self.inodes
            .get(&ino)
            .map_or_else(Vec::new, |i| i.blocks.range(from..).map(|(&b, _)| b).collect())
    }

    /// Inodes reachable by following entries from the root (for fsck).
    pub fn reachable(&self) -> HashSet<Ino> {
        let mut seen = HashSet::from([ROOT]);
        let mut todo = vec![ROOT];
        while let Some(i) = todo.pop() {
            if let Some(dir) = self.inodes.get(&i).and_then(|n| n.dir.as_ref()) {
                for d in dir.entries().values() {
                    if seen.insert(d.ino) && d.kind == FileKind::Dir {
                        todo.push(d.ino);
                    }
                }
            }
        }
        seen
    }
}

fn replay_rank(r: &Record) -> u8 {
    match r {
        Record::Fs { .. } => 0,
        Record::Inode { .. } => 1,
        Record::Dentry { .. } => 2,
        Record::Extent { .. } => 3,
        Record::Xattr { .. } => 4,
        Record::Free { .. } => 5,
    }
}

/// The attributes of a fresh inode.
pub(crate) fn fresh_attr(
    ino: Ino,
    kind: FileKind,
    perm: u16,
    uid: u32,
    gid: u32,
    now: Timespec,
) -> Attr {
    Attr {
        ino,
        kind,
        perm: perm & 0o7777,
        uid,
        gid,
        nlink: if kind == FileKind::Dir { 2 } else { 1 },
        size: 0,
        rdev: 0,
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
    }
}

#[cfg(test)]
mod tests {
    use std::hash::BuildHasher;

    use super::*;

    /// Consecutive inode numbers (how the file system hands them out) and numbers that
    /// differ only in their high bits (a crafted image's) spread over a table's buckets as
    /// well as random keys would: the bucket is the hash's low bits.
    #[test]
    fn inode_numbers_spread_over_the_buckets() {
        let h = InoHash::default();
        let buckets = 1u64 << 12;
        for (what, inos) in [
            ("consecutive", (1..=buckets).collect::<Vec<u64>>()),
            ("high bits only", (1..=buckets).map(|i| i << 40).collect()),
            ("strided", (1..=buckets).map(|i| i * 4096).collect()),
        ] {
            let used: std::collections::HashSet<u64> =
                inos.iter().map(|&i| h.hash_one(i) & (buckets - 1)).collect();
            // Random keys fill 1 - 1/e (63 %) of as many buckets as keys.
            assert!(used.len() as u64 > buckets / 2, "{what}: {} of {buckets} buckets", used.len());
        }
        let mut m: InoMap<u32> = InoMap::default();
        m.insert(7, 1);
        assert_eq!(m.get(&7), Some(&1));
    }
}

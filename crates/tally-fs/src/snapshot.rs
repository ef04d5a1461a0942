//! The clean-unmount snapshot of the DRAM state: everything [`State::replay`] would rebuild from
//! the log, so the next mount reads it instead of scanning (`docs/FORMAT.md`, "File-system
//! snapshot"). It is handed to [`tally_log::Log::close_clean`], which stores it with its own
//! checksum; decoding still checks every length and never panics, and a snapshot that does not
//! decode makes mount fall back to scanning the log.

use std::collections::{BTreeMap, HashMap, HashSet};

use tally_log::format::codec::{Appender, Cursor};
use tally_log::TxId;

use crate::record::Record;
use crate::state::{Block, Dentry, Dir, Inode, Key, State, Xattr};
use crate::types::{FileKind, Ino};
use crate::{FsError, Result};

/// Magic at the start of the snapshot.
pub const SNAPSHOT_MAGIC: [u8; 8] = *b"TALLYFSS";
/// Its format version.
pub const SNAPSHOT_VERSION: u32 = 1;

fn put_key(o: &mut Appender, k: &Key) {
    match k {
        Key::Fs => o.u8(0),
        Key::Inode(i) => {
            o.u8(1);
            o.u64(*i);
        }
        Key::Dentry(d, n) => {
            o.u8(2);
            o.u64(*d);
            o.bytes_len8(n);
        }
        Key::Block(i, b) => {
            o.u8(3);
            o.u64(*i);
            o.u64(*b);
        }
        Key::Xattr(i, n) => {
            o.u8(4);
            o.u64(*i);
            o.bytes_len8(n);
        }
    }
}

/// Encode the state. Called with no explicit transaction open and everything durable.
pub(crate) fn encode(st: &State) -> Vec<u8> {
    encode_into(st, Vec::new())
}

/// [`encode`] into `buf`'s allocation (grown to the encoding's exact length if short): a
/// checkpoint reuses the last one's buffer, whose pages are mapped already (fresh pages cost
/// more than the encoding's copies on a VM).
pub(crate) fn encode_into(st: &State, buf: Vec<u8>) -> Vec<u8> {
    let len = usize::try_from(encoded_len(st)).unwrap_or(0);
    let mut o = Appender::reusing(buf, len);
    put_header(&mut o, st);
    // Sorted, so the same state always gives the same bytes.
    let mut inos: Vec<&Ino> = st.inodes.keys().collect();
    inos.sort_unstable();
    for inode in inos.into_iter().filter_map(|i| st.inodes.get(i)) {
        put_inode(&mut o, inode);
    }
    put_bookkeeping(&mut o, st);
    o.into_vec()
}

/// A kept piece of the encoding: shared, so a checkpoint can hold the pieces it writes while
/// the state lock is given up and the state's own are replaced (boxed inside the `Arc`, so
/// that sharing a freshly encoded piece does not copy it).
pub(crate) type Piece = std::sync::Arc<Box<[u8]>>;

/// Each inode's encoding (what [`encode`] writes for it) as the last checkpoint made it, kept
/// in memory in place of one buffer holding the whole encoding: a checkpoint encodes again
/// only what changed since ([`crate::state::Inodes`] marks the inodes, and a file's
/// [`crate::state::BlockMap`] its pieces of blocks), and hands the log every other piece's
/// bytes as they are ([`encode_parts`]). Not part of the state.
///
/// An inode of at most [`PIECE_SIZE`] blocks and directory entries is one piece, its whole
/// encoding, under `(ino, HEAD, 0)`. A bigger one (a big file, a big directory) is split, one
/// piece per section of its encoding: its record and block count (`HEAD`); the blocks of
/// each piece `p` of its block map (`(BLOCKS, p)`, [`piece_of`] the block index); its
/// directory's header, or the byte saying it has none (`DIR`); the entries of each piece `p`
/// of its cookies (`(ENTRIES, p)`, [`piece_of`] the cookie: the encoding lists entries in
/// cookie order); its extended attributes (`TAIL`). In key order the pieces are the
/// encoding's bytes. Kept whole, a 4 KiB overwrite of a 1 GiB file made the next checkpoint
/// encode its 262,144 blocks again under the state lock, every other operation waiting
/// 14–29 ms (`examples/big_file_hold.rs`); and a name made in a directory of 100,000, its
/// 100,000 names sorted and encoded.
///
/// A persistent ordered map: a checkpoint takes every piece in order with an O(1) clone
/// under the state lock; collecting, sorting and cloning 200,000 of them one by one held it
/// 17-50 ms (`examples/checkpoint_hold.rs`).
#[derive(Debug, Default)]
pub(crate) struct Chunks {
    by_key: imbl::OrdMap<PieceKey, Piece>,
    /// Inodes with pieces (a split one counted once).
    inodes: usize,
}

/// A kept piece's place: inode, section, piece within the section.
type PieceKey = (Ino, u8, u64);

/// Sections of a split inode's encoding, in order (and of an unsplit one's only piece).
const HEAD: u8 = 0;
const BLOCKS: u8 = 1;
const DIR: u8 = 2;
const ENTRIES: u8 = 3;
const TAIL: u8 = 4;

/// Blocks or cookies of one piece of a split inode, as a shift: 4,096 (a file's 16 MiB of
/// 4 KiB blocks, about 150 KiB encoded); 4 in the unit tests, so that small files and
/// directories split.
#[cfg(not(test))]
const PIECE_SHIFT: u32 = 12;
#[cfg(test)]
const PIECE_SHIFT: u32 = 2;
/// An inode with more blocks or more entries than this is split into pieces.
const PIECE_SIZE: usize = 1 << PIECE_SHIFT;

/// The piece holding block (or entry cookie) `n`.
pub(crate) const fn piece_of(n: u64) -> u64 {
    n >> PIECE_SHIFT
}

/// The first and last block (or cookie) of piece `p`.
const fn piece_range(p: u64) -> std::ops::RangeInclusive<u64> {
    let first = p << PIECE_SHIFT;
    first..=first | ((1 << PIECE_SHIFT) - 1)
}

impl Chunks {
    /// Drop every piece of `ino`.
    fn remove_inode(&mut self, ino: Ino) {
        let keys: Vec<PieceKey> =
            self.by_key.range((ino, HEAD, 0)..=(ino, TAIL, u64::MAX)).map(|(k, _)| *k).collect();
        if !keys.is_empty() {
            self.inodes = self.inodes.saturating_sub(1);
        }
        for k in keys {
            self.by_key.remove(&k);
        }
    }

    fn has(&self, ino: Ino) -> bool {
        self.by_key.contains_key(&(ino, HEAD, 0))
    }

    /// Put `o`'s bytes at `key`; an empty piece is dropped.
    fn put(&mut self, key: PieceKey, o: Appender) {
        let bytes = o.into_vec();
        if bytes.is_empty() {
            self.by_key.remove(&key);
            return;
        }
        if self.by_key.insert(key, Piece::new(bytes.into_boxed_slice())).is_none() && key.1 == HEAD
        {
            self.inodes = self.inodes.saturating_add(1);
        }
    }
}

/// Bring `st.chunks` up to date: encode what changed in every inode marked changed since the
/// last call (and any without a piece yet), drop the pieces of inodes gone.
pub(crate) fn refresh_chunks(st: &mut State) {
    let changed = st.inodes.take_changed();
    for ino in changed {
        rechunk_whole(st, ino);
    }
    if st.chunks.inodes != st.inodes.len() {
        // Not reached when every change is marked (a mount marks every inode it loads); a
        // missing piece is encoded rather than trusted to be there.
        let missing: Vec<Ino> =
            st.inodes.keys().filter(|ino| !st.chunks.has(**ino)).copied().collect();
        for ino in missing {
            rechunk_whole(st, ino);
        }
        let State { chunks, inodes, .. } = st;
        let mut gone: Vec<Ino> =
            chunks.by_key.keys().map(|k| k.0).filter(|ino| !inodes.contains_key(ino)).collect();
        gone.dedup();
        for ino in gone {
            chunks.remove_inode(ino);
        }
    }
}

/// The marks of the kept pieces (inodes whose chunk, record keys whose count changed), taken
/// from the state in one hold of its lock by a checkpoint that brings the pieces up to date in
/// slices before its own hold (`Fs::refresh_kept_in_slices`), then worked through a slice per
/// hold ([`Marks::refresh_slice`]). The sets are moved out, not copied; they are sorted with
/// the lock given up ([`Marks::sort`]). What changes meanwhile is marked anew in the state and
/// brought up to date later. Only checkpoints read these marks (one at a time), so none sees
/// the pieces while marks are out; a file system that fails meanwhile (a poisoned lock)
/// checkpoints no more.
#[derive(Debug, Default)]
pub(crate) struct Marks {
    inodes: Vec<Ino>,
    /// Record keys with their group, sorted by group once [`Marks::sort`] ran: a group is
    /// merged once, whole, in one slice.
    keys: Vec<(u128, Key)>,
    taken_inodes: HashSet<Ino, crate::state::InoHash>,
    taken_keys: HashSet<Key, crate::state::KeyHash>,
    inodes_at: usize,
    keys_at: usize,
}

/// Blocks (and directory entries) a slice of [`Marks::refresh_slice`] encodes per marked
/// inode it may take: 128 marks, 8,192 blocks (about 300 KiB encoded).
const SLICE_BLOCKS_PER_MARK: usize = 64;

/// Bytes of kept record-count groups a slice of [`Marks::refresh_slice`] merges again per
/// marked inode it may take: 128 marks, 32 KiB (about 2,000 counts, or 150 groups of 16
/// inodes' counts: about half a millisecond).
const SLICE_COUNT_BYTES: usize = 256;

impl Marks {
    /// Move the marks out of `st` (O(1)). The record keys' marks only once the groups are
    /// built: the first refresh after a mount builds them whole.
    pub(crate) fn take(st: &mut State) -> Marks {
        let taken_keys = if st.counts.built {
            std::mem::take(&mut st.counts.changed)
        } else {
            HashSet::default()
        };
        Marks { taken_inodes: st.inodes.take_changed(), taken_keys, ..Marks::default() }
    }

    /// How many marks were taken.
    pub(crate) fn len(&self) -> usize {
        self.taken_inodes.len() + self.inodes.len() + self.taken_keys.len() + self.keys.len()
    }

    /// Order the marks (call it with the lock given up).
    pub(crate) fn sort(&mut self) {
        self.inodes.extend(self.taken_inodes.drain());
        self.keys.extend(self.taken_keys.drain().map(|k| (group_of(&k), k)));
        self.keys.sort_unstable_by_key(|a| a.0);
    }

    /// Bring up to date the pieces of the next `n` inodes (at most about `n` times
    /// [`SLICE_BLOCKS_PER_MARK`] blocks and entries encoded: a big file's pieces may take
    /// several slices) and the groups of the next `4 n` keys or so (whole groups); true once
    /// every mark is done.
    pub(crate) fn refresh_slice(&mut self, st: &mut State, n: usize) -> bool {
        let mut budget = n.saturating_mul(SLICE_BLOCKS_PER_MARK).max(1);
        let to = self.inodes.len().min(self.inodes_at.saturating_add(n));
        while self.inodes_at < to && budget > 0 {
            if !rechunk(st, self.inodes[self.inodes_at], &mut budget) {
                break;
            }
            self.inodes_at += 1;
        }
        // Whole groups, up to `4 n` keys and `n` times [`SLICE_COUNT_BYTES`] bytes of
        // kept groups merged again (at least one group).
        let State { key_count, counts, .. } = st;
        let (max_keys, max_bytes) = (n.saturating_mul(4), n.saturating_mul(SLICE_COUNT_BYTES));
        let (mut to, mut bytes) = (self.keys_at, 0usize);
        while to < self.keys.len() {
            let g = self.keys[to].0;
            let run = self.keys[to..].iter().take_while(|e| e.0 == g).count();
            let kept = counts.groups.get(&g).map_or(0, |b| b.len());
            if to > self.keys_at
                && (to - self.keys_at + run > max_keys || bytes.saturating_add(kept) > max_bytes)
            {
                break;
            }
            to += run;
            bytes = bytes.saturating_add(kept);
        }
        if counts.built {
            let slice = self.keys[self.keys_at..to].iter().map(|(_, k)| k);
            if merge_groups(&mut counts.groups, slice, key_count).is_none() {
                // A kept group did not decode (a bug): the next refresh encodes them all.
                counts.built = false;
                counts.changed.clear();
            }
        }
        self.keys_at = to;
        self.inodes_at == self.inodes.len() && self.keys_at == self.keys.len()
    }
}

/// Bring `ino`'s pieces up to date (drop them if it is gone), encoding about `budget` blocks
/// and entries at most (at least one piece), less what it did taken from `budget`. True once
/// its pieces are all up to date; false when the budget ran out first, the pieces still to
/// encode kept noted in its block map and directory for the next call.
fn rechunk(st: &mut State, ino: Ino, budget: &mut usize) -> bool {
    let State { inodes, chunks, .. } = st;
    let Some(inode) = inodes.get_mut_unmarked(&ino) else {
        chunks.remove_inode(ino);
        return true;
    };
    let (mut blocks, unseen) = inode.blocks.take_changed();
    let mut entries = inode.dir.as_mut().map(crate::state::Dir::take_changed).unwrap_or_default();
    let was_split = chunks.by_key.contains_key(&(ino, TAIL, 0));
    let n_entries = inode.dir.as_ref().map_or(0, |d| d.entries().len());
    if inode.blocks.len() <= PIECE_SIZE && n_entries <= PIECE_SIZE {
        if was_split {
            chunks.remove_inode(ino);
        }
        let mut o = Appender::with_capacity(256);
        put_inode(&mut o, inode);
        chunks.put((ino, HEAD, 0), o);
        *budget = budget.saturating_sub(cost(inode, inode.blocks.len().saturating_add(n_entries)));
        return true;
    }
    if unseen || !was_split {
        // Made new, replaced, or grown past one piece: every piece encoded anew.
        chunks.remove_inode(ino);
        blocks = pieces_of(&inode.blocks);
        entries = inode.dir.as_ref().map(|d| pieces_of(d.order())).unwrap_or_default();
    }
    let mut o = Appender::with_capacity(128);
    put_inode_head(&mut o, inode);
    chunks.put((ino, HEAD, 0), o);
    let mut o = Appender::with_capacity(32);
    put_dir_head(&mut o, inode);
    chunks.put((ino, DIR, 0), o);
    let mut o = Appender::with_capacity(16);
    put_xattrs(&mut o, inode);
    chunks.put((ino, TAIL, 0), o);
    *budget = budget.saturating_sub(cost(inode, 0));
    loop {
        let n = if let Some(p) = blocks.pop_first() {
            let mut o = Appender::with_capacity(PIECE_SIZE.saturating_mul(BLOCK_BYTES));
            let mut n = 0usize;
            for (&b, block) in inode.blocks.range(piece_range(p)) {
                put_block(&mut o, b, block);
                n += 1;
            }
            chunks.put((ino, BLOCKS, p), o);
            n
        } else if let Some(p) = entries.pop_first() {
            let Some(dir) = inode.dir.as_ref() else { break };
            let mut o = Appender::with_capacity(PIECE_SIZE.saturating_mul(64));
            let mut n = 0usize;
            for (_, name) in dir.order().range(piece_range(p)) {
                if let Some(d) = dir.entries().get(name) {
                    put_entry(&mut o, name, d);
                    n += 1;
                }
            }
            chunks.put((ino, ENTRIES, p), o);
            n
        } else {
            break;
        };
        *budget = budget.saturating_sub(n.max(1));
        if *budget == 0 && !(blocks.is_empty() && entries.is_empty()) {
            inode.blocks.put_back_changed(blocks);
            if let Some(dir) = inode.dir.as_mut() {
                dir.put_back_changed(entries);
            }
            return false;
        }
    }
    true
}

/// Every piece of `m` that holds something.
fn pieces_of<V>(m: &BTreeMap<u64, V>) -> std::collections::BTreeSet<u64> {
    let mut pieces = std::collections::BTreeSet::new();
    let mut from = 0u64;
    while let Some((&n, _)) = m.range(from..).next() {
        let p = piece_of(n);
        pieces.insert(p);
        match p.checked_add(1).and_then(|n| n.checked_mul(1 << PIECE_SHIFT)) {
            Some(next) => from = next,
            None => break,
        }
    }
    pieces
}

/// [`rechunk`] with no budget.
fn rechunk_whole(st: &mut State, ino: Ino) {
    let mut unbounded = usize::MAX;
    while !rechunk(st, ino, &mut unbounded) {
        unbounded = usize::MAX;
    }
}

/// What encoding `inode` with `blocks_and_entries` of its blocks and directory entries costs
/// against a slice's budget (its extended attributes counted too).
fn cost(inode: &Inode, blocks_and_entries: usize) -> usize {
    blocks_and_entries.saturating_add(inode.xattrs.len()).saturating_add(1)
}

/// Keys of one [`Key::Block`] group: 4,096 blocks (16 MiB of 4 KiB blocks), so appending to
/// a large file encodes again only its last group's counts.
const GROUP_BLOCKS_SHIFT: u32 = 12;
/// Inodes of one [`Key::Inode`] group: 16. With 1,024, a checkpoint after 1,000 files of
/// 200,000 were written merged every group again (200,000 counts) in one slice, other
/// operations waiting 5–9 ms (`examples/checkpoint_hold.rs`, docs/bench/fs.md).
const GROUP_INODES_SHIFT: u32 = 4;

/// The record counts' part of the snapshot (every key with records in the log, in key order,
/// with its count: `put_key`, then a u32), kept encoded in groups of keys that sort
/// together ([`group_of`]): a checkpoint encodes again only the groups holding a key whose
/// count changed since the last one ([`State::count`] and [`State::uncount`] mark it), and
/// hands the log the others' bytes as they are. Encoding and sorting every count anew made a
/// checkpoint's cost grow with everything stored: writing 256 MiB with 1 MiB `O_DIRECT`
/// writes went from 374 to 210 MiB/s as a file beside them grew from 256 MiB to 1 GiB (the
/// file system holding 0.5 to 1.8 GiB), the maintenance thread spending most of its time in
/// that sort and encoding. Not part of the state.
#[derive(Debug, Default)]
pub(crate) struct CountGroups {
    /// Persistent, as [`Chunks`]: a checkpoint takes them all with an O(1) clone (a file with
    /// blocks has a group of its own, so there are about as many groups as files).
    groups: imbl::OrdMap<u128, Piece>,
    /// Keys whose count changed since the groups were brought up to date.
    changed: HashSet<Key, crate::state::KeyHash>,
    /// Whether `groups` hold every count but those of `changed`: not before the first
    /// refresh after a mount (the counting of a replay or a decoded snapshot is not marked).
    built: bool,
}

/// Most keys [`CountGroups`] keeps marked: past it, the marks are dropped and the next refresh
/// encodes every group (without checkpoints, `replay_budget_mib=0`, nothing else bounds them).
const CHANGED_MAX: usize = 1 << 20;

impl CountGroups {
    /// `key`'s count changed (called with every change of [`State::key_count`]).
    pub(crate) fn mark(&mut self, key: &Key) {
        if self.built && !self.changed.contains(key) {
            if self.changed.len() >= CHANGED_MAX {
                self.built = false;
                self.changed = HashSet::default();
                return;
            }
            self.changed.insert(key.clone());
        }
    }
}

/// The group a key's count is kept in: its tag in the top 3 bits, its owner (for an inode
/// record, its inode number over 16) in the next 61, a block's number over 4,096 or an
/// entry's [`name_bucket`] in the low 64. The counts are encoded in group order, and in key
/// order within a group ([`sorted_keys`]): key order but for a directory's entries, ordered by
/// bucket first. Owners from 2^61 - 1 up (which no file system hands out, but a crafted
/// snapshot or log could hold) share their tag's last group.
fn group_of(k: &Key) -> u128 {
    let (tag, owner, sub) = match k {
        Key::Fs => (0u128, 0, 0),
        Key::Inode(i) => (1, *i >> GROUP_INODES_SHIFT, 0),
        Key::Dentry(d, name) => (2, *d, name_bucket(name)),
        Key::Block(i, b) => (3, *i, *b >> GROUP_BLOCKS_SHIFT),
        Key::Xattr(i, _) => (4, *i, 0),
    };
    let (owner, sub) = if owner >= LAST_OWNER { (LAST_OWNER, 0) } else { (owner, sub) };
    tag << 125 | u128::from(owner) << 64 | u128::from(sub)
}

/// The owner whose group (a tag's last) every larger owner shares.
const LAST_OWNER: u64 = (1 << 61) - 1;

/// Buckets of a directory's entries' record counts, as a number of bits: 64 groups per
/// directory. One group per directory made a checkpoint after one name made in a directory of
/// 100,000 merge the group's 100,000 counts again under the state lock (6–10 ms); by bucket,
/// about 1,600 (`examples/big_dir_hold.rs`, docs/bench/fs.md).
const NAME_BUCKET_BITS: u32 = 6;

/// An entry's bucket among its directory's: the top bits of its name's crc32c (the names'
/// order would keep a directory's count groups in key order, but names such as `file-000123`
/// share long prefixes: no prefix splits them).
fn name_bucket(name: &[u8]) -> u64 {
    u64::from(crc32c::crc32c(name) >> (32 - NAME_BUCKET_BITS))
}

/// Bring `st.counts` up to date with `st.key_count`: every group holding a changed key is
/// merged anew (its unchanged entries copied as they are, the changed ones encoded from their
/// count now, or left out when it is gone); the first call after a mount encodes them all.
/// Returns how many groups were encoded.
pub(crate) fn refresh_counts(st: &mut State) -> usize {
    let State { key_count, counts, .. } = st;
    if counts.built {
        let changed = std::mem::take(&mut counts.changed);
        let merged = merge_groups(&mut counts.groups, changed.iter(), key_count);
        counts.changed = changed;
        counts.changed.clear();
        if let Some(merged) = merged {
            return merged;
        }
    }
    // Every group from the counts: the first time, or if a kept group did not decode (its
    // bytes are this module's own, so that is a bug, answered by starting over).
    counts.groups.clear();
    counts.changed.clear();
    let mut group: Option<(u128, Appender)> = None;
    for (k, c) in sorted_keys(key_count) {
        let g = group_of(k);
        if let Some((at, o)) = group.take_if(|(at, _)| *at != g) {
            counts.groups.insert(at, Piece::new(o.into_vec().into_boxed_slice()));
        }
        let (_, o) = group.get_or_insert_with(|| (g, Appender::with_capacity(64)));
        put_key(o, k);
        o.u32(c);
    }
    if let Some((at, o)) = group {
        counts.groups.insert(at, Piece::new(o.into_vec().into_boxed_slice()));
    }
    counts.built = true;
    counts.groups.len()
}

/// Merge each group holding one of `changed` anew ([`merge_group`]); the number of groups
/// merged, or `None` if a kept group did not decode.
fn merge_groups<'k>(
    groups: &mut imbl::OrdMap<u128, Piece>,
    changed: impl Iterator<Item = &'k Key>,
    key_count: &crate::state::KeyMap<u32>,
) -> Option<usize> {
    let mut keys: Vec<(u128, &Key)> = changed.map(|k| (group_of(k), k)).collect();
    keys.sort_unstable();
    let mut merged = 0;
    for run in keys.chunk_by(|a, b| a.0 == b.0) {
        merged += 1;
        let old = groups.remove(&run[0].0);
        let bytes =
            merge_group(old.as_deref().map(|b| &b[..]), run.iter().map(|e| e.1), key_count)?;
        if !bytes.is_empty() {
            groups.insert(run[0].0, Piece::new(bytes));
        }
    }
    Some(merged)
}

/// A group's bytes with the counts of `changed` (sorted, all of the group) as `key_count` has
/// them now: `old`'s entries for other keys are copied as they are. `None` if `old` does not
/// decode.
fn merge_group<'k>(
    old: Option<&[u8]>,
    changed: impl Iterator<Item = &'k Key>,
    key_count: &crate::state::KeyMap<u32>,
) -> Option<Box<[u8]>> {
    let old = old.unwrap_or(&[]);
    let mut o = Appender::with_capacity(old.len() + 64);
    let mut r = Cursor::new(old);
    // The next old entry (`None` past the last): its key and where its bytes are.
    fn next(r: &mut Cursor<'_>) -> Option<Option<(Key, std::ops::Range<usize>)>> {
        if r.at_end() {
            return Some(None);
        }
        let from = r.position();
        let k = key(r).ok()?;
        r.u32().ok()?;
        Some(Some((k, from..r.position())))
    }
    let mut entry = next(&mut r)?;
    for k in changed {
        loop {
            match &entry {
                Some((ok, at)) if ok < k => {
                    o.put(&old[at.clone()]);
                    entry = next(&mut r)?;
                }
                Some((ok, _)) if ok == k => {
                    entry = next(&mut r)?;
                    break;
                }
                _ => break,
            }
        }
        if let Some(&c) = key_count.get(k) {
            put_key(&mut o, k);
            o.u32(c);
        }
    }
    while let Some((_, at)) = entry {
        o.put(&old[at]);
        entry = next(&mut r)?;
    }
    Some(o.into_vec().into_boxed_slice())
}

/// [`encode`]'s bytes as pieces ([`encode_parts`]), taken under the state lock: the kept
/// pieces and the per-inode record counts shared (persistent maps, taken in O(1)), the rest
/// owned. [`Taken::seal`] encodes the per-inode counts, with the lock given up.
#[derive(Debug, Default)]
pub(crate) struct Taken {
    head: Vec<u8>,
    chunks: imbl::OrdMap<PieceKey, Piece>,
    mid: Vec<u8>,
    groups: Option<imbl::OrdMap<u128, Piece>>,
    ino_count: imbl::OrdMap<Ino, u32>,
    tombs: imbl::OrdMap<Key, u64>,
    freed: imbl::OrdMap<Ino, u64>,
    /// The buffer the bookkeeping is encoded into (the last checkpoint's).
    tail: Vec<u8>,
}

impl Taken {
    /// Encode what was taken shared and not encoded yet; call it with the state lock given up.
    pub(crate) fn seal(self) -> Parts {
        let Taken { head, chunks, mid, groups, ino_count, tombs, freed, tail } = self;
        let mut o = Appender::reusing(tail, 0);
        put_bookkeeping_after_counts(&mut o, &ino_count, &tombs, &freed);
        Parts { head, chunks, mid, groups: groups.unwrap_or_default(), tail: o.into_vec() }
    }
}

/// [`encode`]'s bytes as pieces ([`Taken::seal`]), held apart from the state.
#[derive(Debug, Default)]
pub(crate) struct Parts {
    /// The header.
    head: Vec<u8>,
    /// Each inode's chunk, in inode order.
    chunks: imbl::OrdMap<PieceKey, Piece>,
    /// The number of record counts, and the counts themselves when the groups were not
    /// brought up to date.
    mid: Vec<u8>,
    /// The record counts' groups in order (empty when in `mid`).
    groups: imbl::OrdMap<u128, Piece>,
    /// Per-inode counts, tombstones, freed inodes.
    tail: Vec<u8>,
}

impl Parts {
    /// The pieces in order: their concatenation is the encoding.
    pub(crate) fn slices(&self) -> Vec<&[u8]> {
        let mut v: Vec<&[u8]> = Vec::with_capacity(
            self.chunks.len().saturating_add(self.groups.len()).saturating_add(3),
        );
        v.push(&self.head);
        v.extend(self.chunks.values().map(|c| &c[..]));
        v.push(&self.mid);
        v.extend(self.groups.values().map(|g| &g[..]));
        v.push(&self.tail);
        v
    }

    /// The bookkeeping's buffer, for the next checkpoint to encode into (its pages mapped).
    pub(crate) fn into_tail(self) -> Vec<u8> {
        self.tail
    }
}

/// [`encode`]'s bytes as pieces, from chunks and count groups brought up to date by
/// [`refresh_chunks`] and [`refresh_counts`] (which must be called first, with nothing
/// changed since): the header, each inode's chunk in inode order, the number of record
/// counts, the counts' groups in order, and the per-inode counts, tombstones and freed inodes
/// (into `tail`'s allocation, kept from the last checkpoint: mapped already). Their
/// concatenation is exactly `encode(st)` (tests check it). Under the state lock this costs
/// the header, not what is stored: the kept pieces and the bookkeeping are taken whole in
/// O(1) (persistent maps) and the bookkeeping is encoded by [`Taken::seal`].
pub(crate) fn encode_parts(st: &State, tail: Vec<u8>) -> Taken {
    let mut o = Appender::with_capacity(64);
    put_header(&mut o, st);
    let head = o.into_vec();
    let groups_ready = st.counts.built && st.counts.changed.is_empty();
    let mut o = Appender::with_capacity(8);
    o.len_u64(st.key_count.len());
    if !groups_ready {
        // Not brought up to date: the counts sorted and encoded whole, after their number.
        put_counts(&mut o, st);
    }
    let mid = o.into_vec();
    debug_assert_eq!(st.chunks.inodes, st.inodes.len(), "chunks not brought up to date");
    Taken {
        head,
        chunks: st.chunks.by_key.clone(),
        mid,
        groups: groups_ready.then(|| st.counts.groups.clone()),
        ino_count: st.ino_count.clone(),
        tombs: st.tombs.clone(),
        freed: st.freed.clone(),
        tail,
    }
}

/// The snapshot's start: magic, version, the file system's numbers, the inode count.
fn put_header(o: &mut Appender, st: &State) {
    o.put(&SNAPSHOT_MAGIC);
    o.u32(SNAPSHOT_VERSION);
    o.u32(st.block_size);
    o.u64(st.fs_ver);
    o.u64(st.next_ino);
    o.u64(st.next_ver);
    o.len_u64(st.inodes.len());
}

/// One inode: its record, its blocks, its directory, its extended attributes.
fn put_inode(o: &mut Appender, inode: &Inode) {
    put_inode_head(o, inode);
    for (&b, block) in &inode.blocks {
        put_block(o, b, block);
    }
    put_dir_head(o, inode);
    if let Some(dir) = &inode.dir {
        // In cookie order (readdir's): a big directory is kept in pieces of cookies.
        for name in dir.order().values() {
            if let Some(d) = dir.entries().get(name) {
                put_entry(o, name, d);
            }
        }
    }
    put_xattrs(o, inode);
}

/// Bytes of one block of a block map in the snapshot.
const BLOCK_BYTES: usize = 8 + 8 + 4 + 8 + 2 + 8;

/// An inode's record and its number of blocks.
fn put_inode_head(o: &mut Appender, inode: &Inode) {
    let rec = Record::Inode { ver: inode.ver, attr: inode.attr, target: inode.target.clone() };
    o.bytes_len32(&rec.encode());
    o.len_u64(inode.blocks.len());
}

/// Block `b` of a block map.
fn put_block(o: &mut Appender, b: u64, block: &Block) {
    let tx = block.tx.unwrap_or(TxId { stream: 0, seq: 0 });
    o.u64(b);
    o.u64(block.ver);
    o.u32(block.crc);
    o.u64(block.addr);
    o.u16(tx.stream);
    o.u64(tx.seq);
}

/// An inode's directory header (parent, next cookie, entry count), or the byte saying it has
/// no directory.
fn put_dir_head(o: &mut Appender, inode: &Inode) {
    match &inode.dir {
        None => o.u8(0),
        Some(dir) => {
            o.u8(1);
            o.u64(dir.parent);
            o.u64(dir.next_cookie);
            o.len_u64(dir.entries().len());
        }
    }
}

/// One directory entry.
fn put_entry(o: &mut Appender, name: &[u8], d: &Dentry) {
    o.bytes_len8(name);
    o.u64(d.ino);
    o.u8(d.kind.code());
    o.u64(d.cookie);
    o.u64(d.ver);
}

/// An inode's extended attributes.
fn put_xattrs(o: &mut Appender, inode: &Inode) {
    // At most one per name of at most 255 bytes: far below 2^32.
    o.u32(u32::try_from(inode.xattrs.len()).unwrap_or(u32::MAX));
    for (name, x) in &inode.xattrs {
        o.bytes_len8(name);
        o.bytes_len32(&x.value);
        o.u64(x.ver);
    }
}

/// The snapshot's end: record counts, tombstones, freed inodes, each in key order.
fn put_bookkeeping(o: &mut Appender, st: &State) {
    o.len_u64(st.key_count.len());
    put_counts(o, st);
    put_bookkeeping_after_counts(o, &st.ino_count, &st.tombs, &st.freed);
}

/// The record counts, sorted (without their number).
fn put_counts(o: &mut Appender, st: &State) {
    for (k, c) in sorted_keys(&st.key_count) {
        put_key(o, k);
        o.u32(c);
    }
}

/// The bookkeeping after the record counts: per-inode counts, tombstones, freed inodes.
fn put_bookkeeping_after_counts(
    o: &mut Appender,
    ino_count: &imbl::OrdMap<Ino, u32>,
    tombs: &imbl::OrdMap<Key, u64>,
    freed: &imbl::OrdMap<Ino, u64>,
) {
    o.len_u64(ino_count.len());
    for (&i, &c) in ino_count {
        o.u64(i);
        o.u32(c);
    }
    o.len_u64(tombs.len());
    for (k, &v) in tombs {
        put_key(o, k);
        o.u64(v);
    }
    o.len_u64(freed.len());
    for (&i, &v) in freed {
        o.u64(i);
        o.u64(v);
    }
}

/// Bytes of an inode's record in the snapshot without its target: the [`Record::Inode`]
/// encoding (tag, version, ino, kind, perm, uid, gid, nlink, size, rdev, four times, target
/// length). Checked against [`Record::encode`] by the tests.
const INODE_RECORD_FIXED: u64 = 1 + 8 + 8 + 1 + 2 + 4 + 4 + 4 + 8 + 8 + 4 * 12 + 2;

/// Bytes of `put_key(k)`.
fn key_len(k: &Key) -> u64 {
    match k {
        Key::Fs => 1,
        Key::Inode(_) => 9,
        Key::Dentry(_, n) | Key::Xattr(_, n) => 10 + n.len() as u64,
        Key::Block(..) => 17,
    }
}

/// Bytes one inode takes in the snapshot, leaving out its blocks, entries and attributes.
fn inode_len(inode: &Inode) -> u64 {
    let dir = if inode.dir.is_some() { 1 + 24 } else { 1 };
    4 + INODE_RECORD_FIXED + inode.target.len() as u64 + 8 + dir + 4
}

/// Bytes a block takes in its inode's list.
const BLOCK_LEN: u64 = 8 + 8 + 4 + 8 + 2 + 8;

/// Bytes of a directory entry named `name`.
fn dentry_len(name: &[u8]) -> u64 {
    1 + name.len() as u64 + 8 + 1 + 8 + 8
}

/// Bytes of an extended attribute.
fn xattr_len(name: &[u8], value: &[u8]) -> u64 {
    1 + name.len() as u64 + 4 + value.len() as u64 + 8
}

/// The exact length of [`encode`]`(st)`, without sorting or encoding anything: what the space
/// accounting measures (`fs/space.rs`), in time linear in the state and no allocation.
pub(crate) fn encoded_len(st: &State) -> u64 {
    let mut n: u64 = 8 + 4 + 4 + 8 + 8 + 8 + 8;
    for inode in st.inodes.values() {
        n += inode_len(inode) + BLOCK_LEN * inode.blocks.len() as u64;
        if let Some(dir) = &inode.dir {
            n += dir.entries().keys().map(|name| dentry_len(name)).sum::<u64>();
        }
        n += inode.xattrs.iter().map(|(name, x)| xattr_len(name, &x.value)).sum::<u64>();
    }
    n += 8 + st.key_count.keys().map(|k| key_len(k) + 4).sum::<u64>();
    n += 8 + 12 * st.ino_count.len() as u64;
    n += 8 + st.tombs.keys().map(|k| key_len(k) + 8).sum::<u64>();
    n + 8 + 16 * st.freed.len() as u64
}

/// An upper bound of what committing `key` as it is now in `st` can have added to the
/// snapshot since it was last measured: the key's own entry as it is now (a block, an
/// entry, an attribute, an inode without its members), a tombstone and a record count for
/// it, and for an inode its count and its freed version. Summed over the keys of every
/// operation, it tells when the measurement may be out of date (`fs/space.rs`).
pub(crate) fn growth_bound(st: &State, key: &Key) -> u64 {
    let own = match key {
        Key::Fs => 0,
        Key::Inode(ino) => st.inodes.get(ino).map_or(0, inode_len) + 12 + 16,
        Key::Block(..) => BLOCK_LEN,
        Key::Dentry(_, name) => dentry_len(name),
        Key::Xattr(ino, name) => {
            let value = st.inodes.get(ino).and_then(|i| i.xattrs.get(name));
            xattr_len(name, value.map_or(&[][..], |x| &x.value))
        }
    };
    own + key_len(key) * 2 + 8 + 4
}

/// Where a key sorts in the record counts' order ([`group_of`]: key order, a directory's
/// entries by [`name_bucket`] first), as one number: the tag in the top 3 bits, the owner in
/// the next 61, the block (an entry's bucket, 0 for another name) in the low 64. `None` for an
/// owner from [`LAST_OWNER`] up, which no file system hands out (but a crafted snapshot or log
/// could hold). Keys that tie here are names of one owner (and bucket), ordered by the name.
fn packed_rank(k: &Key) -> Option<u128> {
    let (tag, owner, block) = match k {
        Key::Fs => (0u128, 0, 0),
        Key::Inode(i) => (1, *i, 0),
        Key::Dentry(d, name) => (2, *d, name_bucket(name)),
        Key::Block(i, b) => (3, *i, *b),
        Key::Xattr(i, _) => (4, *i, 0),
    };
    (owner < LAST_OWNER).then(|| tag << 125 | u128::from(owner) << 64 | u128::from(block))
}

/// A map keyed by [`Key`], in the record counts' order: by [`group_of`], then by key. Sorted
/// on each key's packed rank and its name's [`name_prefix`] held beside it, then each run of
/// ties (names of one owner that share their first 16 bytes) by the key: comparing the keys
/// themselves (an enum, through a reference) made the sort of a large state's record counts
/// cost twice as much, and the encoding holds the state lock. Falls back to comparing the
/// groups and keys when an owner does not fit the packed rank.
fn sorted_keys<V: Copy, S>(m: &HashMap<Key, V, S>) -> Vec<(&Key, V)> {
    let mut v: Vec<(u128, u128, &Key, V)> = Vec::with_capacity(m.len());
    for (k, &x) in m {
        let Some(rank) = packed_rank(k) else {
            let mut v: Vec<(u128, &Key, V)> = m.iter().map(|(k, &x)| (group_of(k), k, x)).collect();
            v.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(b.1)));
            return v.into_iter().map(|(_, k, x)| (k, x)).collect();
        };
        let name = match k {
            Key::Dentry(_, n) | Key::Xattr(_, n) => name_prefix(n),
            _ => 0,
        };
        v.push((rank, name, k, x));
    }
    v.sort_unstable_by_key(|e| (e.0, e.1));
    let mut rest = v.as_mut_slice();
    while let Some((rank, name)) = rest.first().map(|e| (e.0, e.1)) {
        let tie = rest.iter().position(|e| (e.0, e.1) != (rank, name)).unwrap_or(rest.len());
        let (run, after) = rest.split_at_mut(tie);
        if run.len() > 1 {
            run.sort_unstable_by(|a, b| a.2.cmp(b.2));
        }
        rest = after;
    }
    v.into_iter().map(|(_, _, k, x)| (k, x)).collect()
}

/// A name's first 16 bytes as a big-endian number (zeros past its end): names whose numbers
/// differ sort as these do, so a sort by name compares numbers and reads the bytes only on a
/// tie. The names of a large directory (`file-1234`, ...) sorted by comparing the bytes took
/// most of a checkpoint's encoding (100,000 names in one directory: a third of 117 ms, for
/// its entries, then listed by name, and again for their record counts), with the state lock
/// held; with 8 bytes,
/// names such as `file-000123` still tied in runs of a thousand, sorted by comparing keys
/// (most of the 43 ms the record counts' sort took for 100,000 such files).
fn name_prefix(name: &[u8]) -> u128 {
    let mut b = [0u8; 16];
    let n = name.len().min(16);
    b[..n].copy_from_slice(&name[..n]);
    u128::from_be_bytes(b)
}

fn bad(what: &str) -> FsError {
    FsError::corrupted("snapshot", what)
}

fn key(r: &mut Cursor<'_>) -> Result<Key> {
    Ok(match r.u8()? {
        0 => Key::Fs,
        1 => Key::Inode(r.u64()?),
        2 => Key::Dentry(r.u64()?, r.bytes_len8()?.to_vec()),
        3 => Key::Block(r.u64()?, r.u64()?),
        4 => Key::Xattr(r.u64()?, r.bytes_len8()?.to_vec()),
        t => return Err(bad(&format!("key tag {t}"))),
    })
}

/// Decode a snapshot.
///
/// # Errors
/// [`FsError::Corrupted`] for anything the format does not allow.
pub(crate) fn decode(bytes: &[u8]) -> Result<State> {
    let mut r = Cursor::new(bytes);
    if r.take(8)? != SNAPSHOT_MAGIC {
        return Err(bad("magic"));
    }
    if r.u32()? != SNAPSHOT_VERSION {
        return Err(bad("version"));
    }
    let mut st = State {
        block_size: r.u32()?,
        fs_ver: r.u64()?,
        next_ino: r.u64()?,
        next_ver: r.u64()?,
        ..State::default()
    };
    let n = r.count(4)?;
    for _ in 0..n {
        let Record::Inode { ver, attr, target } = Record::decode(r.bytes_len32()?)? else {
            return Err(bad("inode entry is not an inode record"));
        };
        let mut inode = Inode::new(attr, target, 0);
        inode.ver = ver;
        inode.dir = None;
        let nb = r.count(38)?;
        for _ in 0..nb {
            let b = r.u64()?;
            let ver = r.u64()?;
            let crc = r.u32()?;
            let addr = r.u64()?;
            let tx = TxId { stream: r.u16()?, seq: r.u64()? };
            inode.blocks.insert(b, Block { ver, crc, addr, tx: Some(tx), data: None });
        }
        match r.u8()? {
            0 => {}
            1 => {
                let mut dir = Dir::new(r.u64()?);
                let next_cookie = r.u64()?;
                let ne = r.count(26)?;
                for _ in 0..ne {
                    let name = r.bytes_len8()?.to_vec();
                    let ino = r.u64()?;
                    let code = r.u8()?;
                    let kind = FileKind::from_code(code).ok_or_else(|| bad("entry kind"))?;
                    let cookie = r.u64()?;
                    let ver = r.u64()?;
                    if cookie < crate::state::FIRST_COOKIE || cookie == u64::MAX {
                        return Err(bad("entry cookie"));
                    }
                    if dir.cookie_taken(cookie, &name) || dir.entries().contains_key(&name) {
                        return Err(bad("entry name or cookie given twice"));
                    }
                    dir.insert(name, Dentry { ino, kind, cookie, ver });
                }
                dir.next_cookie = dir.next_cookie.max(next_cookie);
                inode.dir = Some(dir);
            }
            _ => return Err(bad("directory flag")),
        }
        if (attr.kind == FileKind::Dir) != inode.dir.is_some() {
            return Err(bad("directory without a name map, or a map on a non-directory"));
        }
        let nx = r.u32()?;
        let mut xattrs = BTreeMap::new();
        for _ in 0..nx {
            let name = r.bytes_len8()?.to_vec();
            let value = r.bytes_len32()?.to_vec();
            let ver = r.u64()?;
            xattrs.insert(name, Xattr { value, ver });
        }
        inode.xattrs = xattrs;
        if st.inodes.insert(attr.ino, Box::new(inode)).is_some() {
            return Err(bad("an inode twice"));
        }
    }
    let n = r.count(5)?;
    let mut key_count = crate::state::KeyMap::with_capacity_and_hasher(n, Default::default());
    for _ in 0..n {
        let k = key(&mut r)?;
        key_count.insert(k, r.u32()?);
    }
    st.key_count = key_count;
    let n = r.count(12)?;
    for _ in 0..n {
        let i: Ino = r.u64()?;
        st.ino_count.insert(i, r.u32()?);
    }
    let n = r.count(9)?;
    for _ in 0..n {
        let k = key(&mut r)?;
        st.tombs.insert(k, r.u64()?);
    }
    let n = r.count(16)?;
    for _ in 0..n {
        let i = r.u64()?;
        st.freed.insert(i, r.u64()?);
    }
    if !r.at_end() {
        return Err(bad("trailing bytes"));
    }
    if st.fs_ver == 0 || st.inodes.get(&crate::types::ROOT).is_none_or(|i| i.dir.is_none()) {
        return Err(bad("no file-system record or no root"));
    }
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::fresh_attr;
    use crate::types::{Timespec, ROOT};

    fn sample() -> State {
        let mut st =
            State { block_size: 4096, fs_ver: 1, next_ino: 9, next_ver: 20, ..State::default() };
        let t = Timespec { sec: 5, nsec: 6 };
        let mut root =
            Inode::new(fresh_attr(ROOT, FileKind::Dir, 0o755, 0, 0, t), Vec::new(), ROOT);
        root.ver = 2;
        if let Some(d) = root.dir.as_mut() {
            d.insert(b"f".to_vec(), Dentry { ino: 7, kind: FileKind::File, cookie: 3, ver: 4 });
        }
        let mut f = Inode::new(fresh_attr(7, FileKind::File, 0o644, 1, 2, t), Vec::new(), ROOT);
        f.ver = 4;
        f.blocks.insert(
            3,
            Block { ver: 5, crc: 9, addr: 100, tx: Some(TxId { stream: 1, seq: 2 }), data: None },
        );
        f.xattrs.insert(b"user.x".to_vec(), Xattr { value: vec![1, 2], ver: 6 });
        st.inodes.insert(ROOT, Box::new(root));
        st.inodes.insert(7, Box::new(f));
        st.key_count.insert(Key::Dentry(ROOT, b"g".to_vec()), 2);
        st.ino_count.insert(7, 3);
        st.tombs.insert(Key::Dentry(ROOT, b"g".to_vec()), 8);
        st.freed.insert(8, 11);
        st
    }

    #[test]
    fn round_trip_keeps_everything() {
        let st = sample();
        let back = decode(&encode(&st)).unwrap();
        assert_eq!(encode(&back), encode(&st));
        assert_eq!(back.inodes[&7].blocks[&3].addr, 100);
        assert_eq!(back.inodes[&ROOT].dir.as_ref().unwrap().entries()[&b"f".to_vec()].cookie, 3);
        assert_eq!(back.tombs[&Key::Dentry(ROOT, b"g".to_vec())], 8);
    }

    /// A larger state: symlinks, directories with long names, attributes, tombstones of
    /// every key kind, freed inodes.
    fn larger() -> State {
        let mut st = sample();
        let t = Timespec { sec: 1, nsec: 2 };
        for i in 0..200u64 {
            let ino = 100 + i;
            let kind = [FileKind::File, FileKind::Dir, FileKind::Symlink][(i % 3) as usize];
            let target = if kind == FileKind::Symlink { vec![b'x'; i as usize] } else { vec![] };
            let mut inode = Inode::new(fresh_attr(ino, kind, 0o600, 0, 0, t), target, ROOT);
            for b in 0..i % 7 {
                inode.blocks.insert(b, Block { ver: b, crc: 1, addr: b, tx: None, data: None });
            }
            if let Some(d) = inode.dir.as_mut() {
                for e in 0..i % 5 {
                    let name = vec![b'n'; (e * 50 + 1) as usize];
                    d.insert(name, Dentry { ino: e, kind: FileKind::File, cookie: e, ver: e });
                }
            }
            let value = vec![7u8; (i * 13) as usize];
            inode.xattrs.insert(format!("user.a{i}").into_bytes(), Xattr { value, ver: i });
            st.inodes.insert(ino, Box::new(inode));
            st.key_count.insert(Key::Block(ino, i), 1);
            st.key_count.insert(Key::Xattr(ino, vec![b'q'; (i % 255) as usize]), 2);
            st.ino_count.insert(ino, 1);
            st.tombs.insert(Key::Inode(ino), i);
            st.tombs.insert(Key::Fs, i);
            st.freed.insert(1000 + i, i);
        }
        st
    }

    /// The record counts are written in group order, then key order ([`group_of`]), and the
    /// tombstones in [`Key`]'s own order (the bytes of a state do not depend on the sort
    /// used, nor on the maps' hashes): keys of every kind,
    /// names of one owner that share prefixes, owners and blocks whose high bits differ; with
    /// owners that fit the packed rank, and with one that does not (the fallback).
    #[test]
    fn keys_are_written_in_key_order() {
        let small = vec![0u64, 1, 2, 255, 256, 1 << 32, LAST_OWNER - 1];
        let mut large = small.clone();
        large.extend([LAST_OWNER, 1 << 61, u64::MAX - 1, u64::MAX]);
        for owners in [small, large] {
            let st = with_keys(&owners);
            let tail = bookkeeping_in_key_order(&st);
            assert!(encode(&st).ends_with(&tail), "not in key order, owners {owners:?}");
            let order: Vec<(u128, &Key)> =
                sorted_keys(&st.key_count).into_iter().map(|(k, _)| (group_of(k), k)).collect();
            assert!(order.windows(2).all(|w| w[0] < w[1]));
        }
    }

    /// [`larger`] with record counts and tombstones of every kind of key for each owner.
    fn with_keys(owners: &[u64]) -> State {
        let mut st = larger();
        for (n, &o) in owners.iter().enumerate() {
            let n = n as u64;
            for name in [&b""[..], b"a", b"a\0", b"ab", b"b", b"\xff", b"\xff\xff"] {
                st.key_count.insert(Key::Dentry(o, name.to_vec()), 3);
                st.key_count.insert(Key::Xattr(o, name.to_vec()), 4);
                st.tombs.insert(Key::Dentry(o, name.to_vec()), n);
            }
            for &b in owners.iter().chain(&[u64::MAX, 1 << 63]) {
                st.key_count.insert(Key::Block(o, b), 5);
                st.tombs.insert(Key::Block(b, o), n);
            }
            st.key_count.insert(Key::Inode(o), 6);
            st.ino_count.insert(o, 7);
            st.freed.insert(o, n);
        }
        st.key_count.insert(Key::Fs, 1);
        st
    }

    /// The snapshot's last four sections, each sorted by a `BTreeMap` (the record counts by
    /// group, then key).
    fn bookkeeping_in_key_order(st: &State) -> Vec<u8> {
        let mut tail = Appender::with_capacity(0);
        tail.len_u64(st.key_count.len());
        let counts: BTreeMap<_, _> =
            st.key_count.iter().map(|(k, c)| ((group_of(k), k), c)).collect();
        for ((_, k), &c) in counts {
            put_key(&mut tail, k);
            tail.u32(c);
        }
        tail.len_u64(st.ino_count.len());
        for (&i, &c) in st.ino_count.iter().collect::<BTreeMap<_, _>>() {
            tail.u64(i);
            tail.u32(c);
        }
        tail.len_u64(st.tombs.len());
        for (k, &v) in st.tombs.iter().collect::<BTreeMap<_, _>>() {
            put_key(&mut tail, k);
            tail.u64(v);
        }
        tail.len_u64(st.freed.len());
        for (&i, &v) in st.freed.iter().collect::<BTreeMap<_, _>>() {
            tail.u64(i);
            tail.u64(v);
        }
        tail.into_vec()
    }

    #[test]
    fn encoded_len_is_the_encoding_s_length() {
        for st in [State::default(), sample(), larger()] {
            assert_eq!(encoded_len(&st), encode(&st).len() as u64);
        }
        let rec = Record::Inode {
            ver: 1,
            attr: fresh_attr(3, FileKind::File, 0, 0, 0, Timespec { sec: 0, nsec: 0 }),
            target: Vec::new(),
        };
        assert_eq!(rec.encode().len() as u64, INODE_RECORD_FIXED);
    }

    /// Adding anything to a state grows its encoding by at most the growth bound of the keys
    /// the change touched.
    #[test]
    fn growth_bound_covers_what_a_key_adds() {
        let before = larger();
        let mut st = larger();
        let t = Timespec { sec: 1, nsec: 2 };
        let name = vec![b'z'; 255];
        let mut inode =
            Inode::new(fresh_attr(9000, FileKind::Symlink, 0, 0, 0, t), vec![b't'; 4000], ROOT);
        inode.xattrs.insert(b"user.big".to_vec(), Xattr { value: vec![1; 60_000], ver: 1 });
        inode.blocks.insert(5, Block { ver: 1, crc: 1, addr: 1, tx: None, data: None });
        st.inodes.insert(9000, Box::new(inode));
        if let Some(d) = st.inodes.get_mut(&ROOT).and_then(|r| r.dir.as_mut()) {
            d.insert(
                name.clone(),
                Dentry { ino: 9000, kind: FileKind::Symlink, cookie: 9, ver: 1 },
            );
        }
        let keys = [
            Key::Inode(9000),
            Key::Block(9000, 5),
            Key::Xattr(9000, b"user.big".to_vec()),
            Key::Dentry(ROOT, name),
        ];
        for k in &keys {
            st.key_count.insert(k.clone(), 1);
            st.tombs.insert(k.clone(), 3);
        }
        st.ino_count.insert(9000, 1);
        st.freed.insert(9000, 1);
        let grown = encoded_len(&st) - encoded_len(&before);
        let bound: u64 = keys.iter().map(|k| growth_bound(&st, k)).sum();
        assert!(grown <= bound, "grew {grown}, bound {bound}");
        assert!(bound < grown * 2, "bound {bound} far above growth {grown}");
    }

    /// The record counts kept in groups, merged after random counts and uncounts (blocks far
    /// apart and in one group, names sharing long prefixes, owners past 2^61 that share a
    /// group), are the counts sorted and encoded whole after every round.
    #[test]
    fn count_groups_merged_are_the_counts_encoded_whole() {
        let mut rng = fastrand::Rng::with_seed(5);
        let mut st = State::default();
        let owners = [1, 2, 3, 900, 5000, (1 << 61) - 2, (1 << 61) - 1, 1 << 61, u64::MAX];
        let key = |rng: &mut fastrand::Rng| {
            let owner = owners[rng.usize(..owners.len())];
            let name = |rng: &mut fastrand::Rng| {
                let mut n = vec![b'p'; rng.usize(0..20)];
                n.push(rng.u8(b'a'..=b'c'));
                n
            };
            match rng.u8(..5) {
                0 => Key::Fs,
                1 => Key::Inode(owner),
                2 => Key::Dentry(owner, name(rng)),
                3 => Key::Block(owner, [0, 1, 4095, 4096, 9000, u64::MAX][rng.usize(..6)]),
                _ => Key::Xattr(owner, name(rng)),
            }
        };
        let mut merged_some = false;
        for round in 0..200 {
            for _ in 0..rng.usize(0..30) {
                let k = key(&mut rng);
                if rng.bool() {
                    st.count(&k)
                } else {
                    st.uncount(&k)
                }
            }
            let groups = refresh_counts(&mut st);
            merged_some |= round > 0 && groups > 0;
            let kept: Vec<u8> = st.counts.groups.values().flat_map(|g| g.iter().copied()).collect();
            let mut whole = Appender::with_capacity(0);
            put_counts(&mut whole, &st);
            assert!(kept == whole.into_vec(), "round {round}: the groups differ");
        }
        assert!(merged_some);
    }

    /// Marks past [`CHANGED_MAX`] (no checkpoint to fold them) are dropped, and the next
    /// refresh encodes every group anew: memory stays bounded, the bytes stay right.
    #[test]
    fn too_many_marks_give_way_to_a_whole_encoding() {
        let mut st = State::default();
        st.count(&Key::Fs);
        refresh_counts(&mut st);
        for b in 0..CHANGED_MAX as u64 + 10 {
            st.count(&Key::Block(7, b));
        }
        assert!(!st.counts.built && st.counts.changed.is_empty(), "the marks were kept");
        refresh_counts(&mut st);
        let kept: Vec<u8> = st.counts.groups.values().flat_map(|g| g.iter().copied()).collect();
        let mut whole = Appender::with_capacity(0);
        put_counts(&mut whole, &st);
        assert!(kept == whole.into_vec(), "the groups differ from the whole encoding");
    }

    #[test]
    fn damaged_snapshots_are_errors_not_panics() {
        let bytes = encode(&sample());
        for n in 0..bytes.len() {
            assert!(decode(&bytes[..n]).is_err(), "cut at {n}");
        }
        let mut rng = fastrand::Rng::with_seed(11);
        for _ in 0..5000 {
            let mut b = bytes.clone();
            let i = rng.usize(..b.len());
            b[i] = rng.u8(..);
            let _ = decode(&b);
        }
    }

    /// A checkpoint's encoding in pieces — the header, each inode's chunk kept from the last
    /// checkpoint unless marked changed, the bookkeeping — is exactly the whole encoding,
    /// after every kind of change (data written, overwritten, truncated and punched, names
    /// made, renamed and removed, attributes, links, an explicit transaction aborted and one
    /// committed, cleaning, a remount), and only changed inodes are encoded again. The space
    /// accounting's totals, kept from the same marks, equal a walk's at every step too.
    #[test]
    fn the_encoding_in_pieces_is_the_whole_encoding_after_every_change() {
        use std::sync::Arc;
        use tally_media::{Device, MemDevice};

        use crate::{Fs, MkfsOptions, MountOptions, Owner, RenameFlags, SetAttr, XattrSet, ROOT};
        const ME: Owner = Owner { uid: 1000, gid: 1000 };
        let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, 4096).unwrap());
        Fs::mkfs(dev.clone(), &MkfsOptions { streams: 2, segment_blocks: 64, uuid: None }).unwrap();
        // Pieces against the whole, and how many chunks the refresh had to encode.
        let check = |fs: &Fs, what: &str| -> usize {
            let mut st = crate::fs::lock(&fs.state).unwrap();
            let marked = st.inodes.changed_count();
            refresh_chunks(&mut st);
            let groups = refresh_counts(&mut st);
            assert!(st.counts.built && st.counts.changed.is_empty(), "{what}: groups not ready");
            let whole = encode(&st);
            let pieces: Vec<u8> = encode_parts(&st, Vec::new()).seal().slices().concat();
            assert!(pieces == whole, "{what}: the pieces differ from the whole encoding");
            assert!(
                what != "one overwrite" || groups <= 3,
                "{what}: {groups} record-count groups encoded again"
            );
            let kept = crate::live::live_parts(&mut st);
            assert_eq!(kept, crate::live::live_parts_walked(&st), "{what}: statfs's totals");
            marked
        };
        let mut fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
        check(&fs, "mount");
        let d = fs.mkdir(None, ROOT, b"d", 0o755, ME).unwrap().ino;
        let mut files = Vec::new();
        for i in 0..40u32 {
            let ino = fs.create(None, d, format!("f{i}").as_bytes(), 0o644, ME).unwrap().ino;
            fs.write(None, ino, 0, &vec![i as u8; 3 * 4096 + 100]).unwrap();
            files.push(ino);
        }
        check(&fs, "creates and writes");
        fs.write(None, files[0], 4096, &[9; 4096]).unwrap();
        assert!(check(&fs, "one overwrite") <= 2, "more than the written file encoded again");
        fs.sync().unwrap();
        assert_eq!(check(&fs, "its bytes made durable and let go of"), 0);
        let trunc = SetAttr { size: Some(5000), ..SetAttr::default() };
        fs.setattr(None, files[1], &trunc).unwrap();
        check(&fs, "truncate");
        let punch = crate::FallocFlags { punch_hole: true, keep_size: true, zero_range: false };
        fs.fallocate(None, files[2], 0, 4096, punch).unwrap();
        check(&fs, "punch");
        fs.setxattr(None, files[3], b"user.k", b"v", XattrSet::Any).unwrap();
        check(&fs, "xattr");
        fs.link(None, files[4], ROOT, b"hard").unwrap();
        fs.symlink(None, ROOT, b"sym", b"d/f5", ME).unwrap();
        check(&fs, "link and symlink");
        fs.rename(None, d, b"f6", ROOT, b"moved", RenameFlags::default()).unwrap();
        fs.unlink(None, d, b"f7").unwrap();
        check(&fs, "rename and unlink");
        let t = fs.begin().unwrap();
        fs.write(Some(&t), files[8], 0, &[7; 2 * 4096]).unwrap();
        fs.unlink(Some(&t), d, b"f9").unwrap();
        fs.create(Some(&t), d, b"new", 0o644, ME).unwrap();
        fs.abort(t).unwrap();
        check(&fs, "an aborted transaction");
        let t = fs.begin().unwrap();
        fs.write(Some(&t), files[10], 0, &[8; 4096]).unwrap();
        fs.rename(Some(&t), d, b"f11", d, b"f11b", RenameFlags::default()).unwrap();
        fs.commit(t).unwrap();
        check(&fs, "a committed transaction");
        for round in 0..200u32 {
            fs.write(None, files[12], 0, &[round as u8; 8 * 4096]).unwrap();
        }
        fs.sync().unwrap();
        let moved: u64 = (0..2u16).map(|s| fs.clean(s, 4).unwrap().data_blocks_relocated).sum();
        assert!(moved > 0, "cleaning moved no data block");
        check(&fs, "cleaning");
        assert!(fs.fsck().is_clean());
        drop(fs);
        fs = Fs::mount(dev, MountOptions::default()).unwrap();
        check(&fs, "remount");
        assert_eq!(check(&fs, "nothing changed"), 0);
    }

    /// Bring `fs`'s kept pieces up to date and check them against the whole encoding (and
    /// the count of inodes with pieces); how many pieces of the sections `counted` were
    /// encoded again.
    fn pieces_refreshed(fs: &crate::Fs, what: &str, counted: impl Fn(u8) -> bool) -> usize {
        let mut st = crate::fs::lock(&fs.state).unwrap();
        let before: BTreeMap<PieceKey, Piece> =
            st.chunks.by_key.iter().map(|(k, v)| (*k, v.clone())).collect();
        refresh_chunks(&mut st);
        refresh_counts(&mut st);
        let whole = encode(&st);
        let pieces: Vec<u8> = encode_parts(&st, Vec::new()).seal().slices().concat();
        assert!(pieces == whole, "{what}: the pieces differ from the whole encoding");
        assert_eq!(st.chunks.inodes, st.inodes.len(), "{what}: inodes with pieces");
        st.chunks
            .by_key
            .iter()
            .filter(|(k, _)| counted(k.1))
            .filter(|(k, v)| before.get(k).is_none_or(|old| !std::sync::Arc::ptr_eq(old, v)))
            .count()
    }

    /// Check `fs`, unmount it, mount `dev` again: its pieces are the whole encoding, and a
    /// second refresh has nothing to encode.
    fn remount_and_check(
        fs: crate::Fs,
        dev: std::sync::Arc<dyn tally_media::Device>,
        counted: impl Fn(u8) -> bool + Copy,
    ) {
        assert!(fs.fsck().is_clean());
        drop(fs);
        let fs = crate::Fs::mount(dev, crate::MountOptions::default()).unwrap();
        pieces_refreshed(&fs, "remount", counted);
        assert_eq!(pieces_refreshed(&fs, "nothing changed", counted), 0);
    }

    /// A file of more than [`PIECE_SIZE`] blocks is kept in pieces of its block map, and a
    /// change encodes again its record's piece, its tail and the pieces of blocks it touched,
    /// not the rest: after every kind of change to big files (an overwrite, an append, a
    /// sparse write far out, a punched hole that empties a piece, a truncate below one piece
    /// and growth past it again, a file replaced under a reused name, an explicit transaction
    /// aborted, cleaning that moves blocks, an unlink, a remount) the pieces are exactly the
    /// whole encoding. A slice's budget bounds what one slice encodes of a big file.
    #[test]
    fn a_big_file_is_encoded_again_only_where_it_changed() {
        use std::sync::Arc;
        use tally_media::{Device, MemDevice};

        use crate::{FallocFlags, Fs, MkfsOptions, MountOptions, Owner, SetAttr, ROOT};
        const ME: Owner = Owner { uid: 1000, gid: 1000 };
        const BS: u64 = 4096;
        let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, 8192).unwrap());
        Fs::mkfs(dev.clone(), &MkfsOptions { streams: 2, segment_blocks: 64, uuid: None }).unwrap();
        let check = |fs: &Fs, what: &str| pieces_refreshed(fs, what, |_| true);
        let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
        let big = fs.create(None, ROOT, b"big", 0o644, ME).unwrap().ino;
        let pieces = 40u64;
        let blocks = pieces * PIECE_SIZE as u64;
        fs.write(None, big, 0, &vec![1; (blocks * BS) as usize]).unwrap();
        check(&fs, "written");
        fs.sync().unwrap();
        check(&fs, "made durable");
        let count = |fs: &Fs| crate::fs::lock(&fs.state).unwrap().chunks.by_key.len();
        assert_eq!(count(&fs), 1 + 1 + pieces as usize + 2, "root; big's head, pieces, dir, tail");

        fs.write(None, big, 17 * BS, &[2; 4096]).unwrap();
        fs.sync().unwrap();
        let again = check(&fs, "one block overwritten");
        assert!(again <= 4, "{again} pieces encoded again for one block (head, piece, dir, tail)");
        fs.write(None, big, blocks * BS, &[3; 4096]).unwrap();
        check(&fs, "appended");
        fs.write(None, big, 1_000_000 * BS, &[4; 100]).unwrap();
        check(&fs, "a sparse write far out");
        let punch = FallocFlags { punch_hole: true, keep_size: true, zero_range: false };
        fs.fallocate(None, big, 8 * BS, PIECE_SIZE as u64 * BS, punch).unwrap();
        check(&fs, "a piece punched out");
        assert!(
            !crate::fs::lock(&fs.state).unwrap().chunks.by_key.contains_key(&(big, BLOCKS, 2)),
            "a piece emptied by the hole is kept"
        );

        let t = fs.begin().unwrap();
        fs.write(Some(&t), big, 0, &vec![5; 3 * PIECE_SIZE * 4096]).unwrap();
        fs.setattr(Some(&t), big, &SetAttr { size: Some(2 * BS), ..SetAttr::default() }).unwrap();
        fs.abort(t).unwrap();
        check(&fs, "an aborted transaction");

        let shrink = SetAttr { size: Some(2 * BS), ..SetAttr::default() };
        fs.setattr(None, big, &shrink).unwrap();
        check(&fs, "truncated to one piece");
        assert_eq!(count(&fs), 2, "a file of one piece kept whole");
        fs.write(None, big, 0, &vec![6; 3 * PIECE_SIZE * 4096]).unwrap();
        check(&fs, "grown past one piece again");

        // Its name given to a new big file: the new inode's pieces, none of the old one's.
        let other = fs.create(None, ROOT, b"other", 0o644, ME).unwrap().ino;
        fs.write(None, other, 0, &vec![7; 2 * PIECE_SIZE * 4096]).unwrap();
        fs.rename(None, ROOT, b"other", ROOT, b"big", crate::RenameFlags::default()).unwrap();
        check(&fs, "replaced by a rename");

        // Every block of a big file changed: a slice encodes at most its budget of it.
        let big = fs.create(None, ROOT, b"big2", 0o644, ME).unwrap().ino;
        fs.write(None, big, 0, &vec![8; (blocks * BS) as usize]).unwrap();
        check(&fs, "a second big file");
        for round in 0..100u8 {
            fs.write(None, other, 0, &vec![round; 2 * PIECE_SIZE * 4096]).unwrap();
        }
        fs.sync().unwrap();
        check(&fs, "overwritten 100 times");
        let moved: u64 = (0..2u16).map(|s| fs.clean(s, 64).unwrap().data_blocks_relocated).sum();
        assert!(moved > 0, "cleaning moved no data block");
        check(&fs, "cleaning, which moves live blocks of big2");
        fs.write(None, big, 0, &vec![9; (blocks * BS) as usize]).unwrap();
        let mut marks = Marks::take(&mut crate::fs::lock(&fs.state).unwrap());
        marks.sort();
        let mut slices = 0;
        loop {
            let mut st = crate::fs::lock(&fs.state).unwrap();
            let before: BTreeMap<PieceKey, Piece> =
                st.chunks.by_key.iter().map(|(k, v)| (*k, v.clone())).collect();
            let done = marks.refresh_slice(&mut st, 1);
            let encoded = st
                .chunks
                .by_key
                .iter()
                .filter(|(k, _)| k.1 == BLOCKS || k.1 == ENTRIES)
                .filter(|(k, v)| before.get(k).is_none_or(|old| !Arc::ptr_eq(old, v)))
                .count();
            assert!(
                encoded * PIECE_SIZE <= SLICE_BLOCKS_PER_MARK + PIECE_SIZE,
                "one slice encoded {encoded} pieces of blocks"
            );
            slices += 1;
            if done {
                break;
            }
        }
        assert!(slices > 2, "the big file's pieces took {slices} slices");
        assert_eq!(check(&fs, "after the slices"), 0, "pieces left after the slices");
        fs.unlink(None, ROOT, b"big2").unwrap();
        check(&fs, "unlinked");
        remount_and_check(fs, dev, |_| true);
    }

    /// A directory of more than [`PIECE_SIZE`] entries is kept in pieces of cookies, and a
    /// change encodes again its head pieces and the pieces of the entries it touched: after
    /// creates, unlinks, renames within and across directories, an exchange, an explicit
    /// transaction aborted and one committed, cleaning, the directory shrinking to one piece
    /// and growing again, and a remount, the pieces are exactly the whole encoding.
    #[test]
    fn a_big_directory_is_encoded_again_only_where_it_changed() {
        use std::sync::Arc;
        use tally_media::{Device, MemDevice};

        use crate::{Fs, MkfsOptions, MountOptions, Owner, RenameFlags, ROOT};
        const ME: Owner = Owner { uid: 1000, gid: 1000 };
        let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, 8192).unwrap());
        Fs::mkfs(dev.clone(), &MkfsOptions { streams: 2, segment_blocks: 64, uuid: None }).unwrap();
        let check = |fs: &Fs, what: &str| pieces_refreshed(fs, what, |section| section == ENTRIES);
        let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
        let d = fs.mkdir(None, ROOT, b"d", 0o755, ME).unwrap().ino;
        let e = fs.mkdir(None, ROOT, b"e", 0o755, ME).unwrap().ino;
        let names = 60u32;
        for i in 0..names {
            fs.create(None, d, format!("f{i}").as_bytes(), 0o644, ME).unwrap();
        }
        check(&fs, "created");
        fs.sync().unwrap();
        check(&fs, "made durable");
        // Its names' record counts are kept in buckets, not in one group (merged whole again
        // for each name made).
        let groups = crate::fs::lock(&fs.state)
            .unwrap()
            .counts
            .groups
            .keys()
            .filter(|&&g| g >> 125 == 2 && (g >> 64) as u64 & LAST_OWNER == d)
            .count();
        assert!(groups > 16, "{names} names' counts in {groups} groups");
        fs.create(None, d, b"one-more", 0o644, ME).unwrap();
        let again = check(&fs, "one more name");
        assert!(again <= 1, "{again} pieces of entries encoded again for one name");
        fs.unlink(None, d, b"f7").unwrap();
        assert!(check(&fs, "one name removed") <= 1, "one name removed");
        fs.rename(None, d, b"f8", d, b"f8b", RenameFlags::default()).unwrap();
        check(&fs, "renamed within");
        fs.rename(None, d, b"f9", e, b"f9", RenameFlags::default()).unwrap();
        fs.rename(None, e, b"f9", d, b"f10", RenameFlags::default()).unwrap();
        check(&fs, "renamed across, over another");
        let exchange = RenameFlags { exchange: true, ..RenameFlags::default() };
        fs.rename(None, d, b"f11", d, b"f40", exchange).unwrap();
        check(&fs, "exchanged");
        let t = fs.begin().unwrap();
        fs.unlink(Some(&t), d, b"f12").unwrap();
        fs.create(Some(&t), d, b"new-in-t", 0o644, ME).unwrap();
        fs.rename(Some(&t), d, b"f13", d, b"f13b", RenameFlags::default()).unwrap();
        fs.abort(t).unwrap();
        check(&fs, "an aborted transaction");
        let t = fs.begin().unwrap();
        fs.unlink(Some(&t), d, b"f14").unwrap();
        fs.create(Some(&t), d, b"new-in-t", 0o644, ME).unwrap();
        fs.commit(t).unwrap();
        check(&fs, "a committed transaction");
        // Pieces brought up to date while a transaction is open (a checkpoint's slices run
        // then; its own hold does not): the commit's placement changes the entry again.
        let t = fs.begin().unwrap();
        fs.create(Some(&t), d, b"mid", 0o644, ME).unwrap();
        check(&fs, "mid-transaction");
        fs.commit(t).unwrap();
        check(&fs, "its commit");
        for round in 0..30u32 {
            fs.create(None, e, format!("churn{round}").as_bytes(), 0o644, ME).unwrap();
            fs.unlink(None, e, format!("churn{round}").as_bytes()).unwrap();
        }
        fs.sync().unwrap();
        let moved: u64 = (0..2u16).map(|s| fs.clean(s, 64).unwrap().records_relocated).sum();
        assert!(moved > 0, "cleaning moved no record");
        check(&fs, "cleaning");
        for i in 15..names {
            let _ = fs.unlink(None, d, format!("f{i}").as_bytes());
        }
        check(&fs, "shrunk");
        for i in 0..40u32 {
            fs.create(None, d, format!("g{i}").as_bytes(), 0o644, ME).unwrap();
        }
        check(&fs, "grown again");
        remount_and_check(fs, dev, |section| section == ENTRIES);
    }

    /// A block map the kept pieces do not describe (a new inode, a clone) put in an inode's
    /// place under its number is encoded whole: none of the pieces of the one it replaced
    /// stay. (Inode numbers are not reused today; this keeps the pieces right if they are.)
    #[test]
    fn an_inode_replaced_under_its_number_is_encoded_whole() {
        let t = Timespec { sec: 5, nsec: 6 };
        let file = |ino: Ino, first: u64, n: u64| {
            let mut f =
                Inode::new(fresh_attr(ino, FileKind::File, 0o644, 1, 2, t), Vec::new(), ROOT);
            for b in first..first + n {
                let tx = Some(TxId { stream: 1, seq: b });
                f.blocks.insert(b, Block { ver: b + 1, crc: 9, addr: b + 100, tx, data: None });
            }
            Box::new(f)
        };
        let mut st = State { block_size: 4096, next_ino: 9, next_ver: 20, ..State::default() };
        st.inodes.insert(5, file(5, 0, 40));
        st.inodes.insert(6, file(6, 100, 40));
        let agree = |st: &mut State| {
            refresh_chunks(st);
            let pieces: Vec<u8> = encode_parts(st, Vec::new()).seal().slices().concat();
            pieces == encode(st)
        };
        assert!(agree(&mut st));
        let copy = Box::new(st.inodes.get(&6).unwrap().clone());
        st.inodes.insert(5, copy);
        assert!(agree(&mut st), "a clone put in another inode's place");
        st.inodes.insert(6, file(6, 1000, 20));
        assert!(agree(&mut st), "a new inode put in another's place");

        let dir = |ino: Ino, first: u64, n: u64| {
            let mut d =
                Inode::new(fresh_attr(ino, FileKind::Dir, 0o755, 1, 2, t), Vec::new(), ROOT);
            if let Some(dir) = d.dir.as_mut() {
                for c in first..first + n {
                    let e = Dentry { ino: 100 + c, kind: FileKind::File, cookie: c, ver: c };
                    dir.insert(format!("n{c}").into_bytes(), e);
                }
            }
            Box::new(d)
        };
        st.inodes.insert(7, dir(7, 3, 40));
        st.inodes.insert(8, dir(8, 100, 40));
        assert!(agree(&mut st));
        let copy = Box::new(st.inodes.get(&8).unwrap().clone());
        st.inodes.insert(7, copy);
        assert!(agree(&mut st), "a directory's clone put in another's place");
        st.inodes.insert(8, dir(8, 1000, 20));
        assert!(agree(&mut st), "a new directory put in another's place");
    }

    /// A checkpoint brings the kept pieces up to date in slices, the state lock given up
    /// between them, while other threads change files (`Fs::refresh_kept_in_slices`): slices
    /// taken between changes, then the rest, still give exactly the whole encoding and the
    /// walked space totals; and the slices leave at most one slice's marks for the
    /// checkpoint's own hold.
    #[test]
    fn refreshing_in_slices_between_changes_gives_the_whole_encoding() {
        use std::sync::Arc;
        use tally_media::{Device, MemDevice};

        use crate::{Fs, MkfsOptions, MountOptions, Owner, SetAttr, ROOT};
        const ME: Owner = Owner { uid: 1000, gid: 1000 };
        let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, 8192).unwrap());
        Fs::mkfs(dev.clone(), &MkfsOptions { streams: 2, segment_blocks: 64, uuid: None }).unwrap();
        let fs = Fs::mount(dev, MountOptions::default()).unwrap();
        let d = fs.mkdir(None, ROOT, b"d", 0o755, ME).unwrap().ino;
        let mut files: Vec<(String, Ino)> = Vec::new();
        for i in 0..60u32 {
            let name = format!("f{i}");
            let ino = fs.create(None, d, name.as_bytes(), 0o644, ME).unwrap().ino;
            fs.write(None, ino, 0, &vec![i as u8; 2 * 4096]).unwrap();
            files.push((name, ino));
        }
        fs.checkpoint().unwrap();
        let mut rng = fastrand::Rng::with_seed(7);
        let mut change = |fs: &Fs, files: &mut Vec<(String, Ino)>, round: u32| {
            for k in 0..3 {
                let at = rng.usize(..files.len());
                let ino = files[at].1;
                match rng.u8(..4) {
                    0 => {
                        fs.write(None, ino, rng.u64(..4) * 4096, &[round as u8; 4096]).unwrap();
                    }
                    1 => {
                        let size =
                            SetAttr { size: Some(rng.u64(..3 * 4096)), ..SetAttr::default() };
                        fs.setattr(None, ino, &size).unwrap();
                    }
                    2 => {
                        let name = format!("n{round}-{k}");
                        let new = fs.create(None, d, name.as_bytes(), 0o644, ME).unwrap().ino;
                        files.push((name, new));
                    }
                    _ if files.len() > 1 => {
                        let (name, _) = files.swap_remove(at);
                        fs.unlink(None, d, name.as_bytes()).unwrap();
                    }
                    _ => {}
                }
            }
        };
        let mut round = 0;
        for _ in 0..10 {
            for _ in 0..5 {
                change(&fs, &mut files, round);
                round += 1;
            }
            // A pass: the marks taken, then worked through two at a time with more changes
            // (and the space totals' slices) between the slices.
            let mut marks = Marks::take(&mut crate::fs::lock(&fs.state).unwrap());
            marks.sort();
            loop {
                change(&fs, &mut files, round);
                round += 1;
                let mut st = crate::fs::lock(&fs.state).unwrap();
                let done = marks.refresh_slice(&mut st, 2);
                crate::live::live_parts_some(&mut st, 2);
                if done {
                    break;
                }
            }
        }
        let mut st = crate::fs::lock(&fs.state).unwrap();
        refresh_chunks(&mut st);
        refresh_counts(&mut st);
        let whole = encode(&st);
        let pieces: Vec<u8> = encode_parts(&st, Vec::new()).seal().slices().concat();
        assert!(pieces == whole, "the pieces refreshed in slices differ from the whole encoding");
        let kept = crate::live::live_parts(&mut st);
        assert_eq!(kept, crate::live::live_parts_walked(&st), "statfs's totals");
        drop(st);

        // Many changes since the last checkpoint: the slices leave at most one slice's marks.
        let marks = 8 * crate::fs::SLICE_MARKS;
        for i in 0..marks {
            let perm = SetAttr { perm: Some(0o600), ..SetAttr::default() };
            fs.setattr(None, files[i % files.len()].1, &perm).unwrap();
            let name = format!("m{i}");
            fs.create(None, d, name.as_bytes(), 0o644, ME).unwrap();
        }
        assert!(crate::fs::lock(&fs.state).unwrap().inodes.changed_count() > marks);
        fs.refresh_kept_in_slices().unwrap();
        let st = crate::fs::lock(&fs.state).unwrap();
        let left = st.inodes.changed_count().max(st.inodes.changed_live_len());
        let keys_left = st.counts.changed.len();
        assert!(keys_left <= 4 * crate::fs::SLICE_MARKS, "{keys_left} record keys left");
        assert!(left <= crate::fs::SLICE_MARKS, "{left} marks left for the checkpoint's own hold");
        drop(st);
        assert!(fs.checkpoint().unwrap());
        assert!(fs.fsck().is_clean());

        // A slice merges its budget of kept record-count groups again, not every group its
        // keys touch: names moved in a directory of 1,000, their inodes' and names' counts
        // spread over many groups.
        let n = 8;
        for i in (0..marks).step_by(25) {
            let (from, to) = (format!("m{i}"), format!("moved{i}"));
            fs.rename(None, d, from.as_bytes(), d, to.as_bytes(), Default::default()).unwrap();
        }
        let mut st = crate::fs::lock(&fs.state).unwrap();
        let mut marks = Marks::take(&mut st);
        marks.sort();
        let before: BTreeMap<u128, Piece> =
            st.counts.groups.iter().map(|(g, b)| (*g, b.clone())).collect();
        marks.refresh_slice(&mut st, n);
        let merged: Vec<usize> = before
            .iter()
            .filter(|(g, b)| st.counts.groups.get(*g).is_none_or(|now| !Arc::ptr_eq(now, b)))
            .map(|(_, b)| b.len())
            .collect();
        let largest = merged.iter().copied().max().unwrap_or(0);
        let bytes: usize = merged.iter().sum();
        assert!(
            !merged.is_empty() && bytes <= n * SLICE_COUNT_BYTES + largest,
            "one slice merged {} groups of {bytes} bytes",
            merged.len()
        );
        while !marks.refresh_slice(&mut st, n) {}
    }
}

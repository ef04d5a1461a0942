//! True space accounting: how many blocks what is live takes, counted from the DRAM state,
//! and what `statfs` reports from it.
//!
//! What is live is what the state describes: every committed data block of every file, and
//! the records that describe the state (an attribute record per inode, an entry record per
//! name, an extent record per block, a record per extended attribute), as cleaning packs them
//! (records in units of `block_size − UNIT_HEADER` bytes, at least one unit per
//! pack of data blocks). Everything else in the log is dead: superseded records,
//! overwritten or deleted blocks, units of transactions whose records all died. Dead space is
//! free space that cleaning still has to reclaim, and `statfs` counts it as free at once:
//!
//! `free = capacity − live − reserved`, with `capacity` the blocks of the log's segments and
//! `reserved` the space nothing but cleaning, deletes and unmount may use (each stream's
//! reserved next segment and the unused end of its current one, the reserve segments, the unmount snapshot's room, the checkpoint
//! snapshot in force, `fallocate`'s reservations) plus [`CLEANING_HEADROOM_PERCENT`] of the
//! capacity, the slack a log-structured store needs so that cleaning can always win space
//! back at a bounded cost, and that covers what the dense estimate of records misses (packs
//! cut at segment ends each take a unit; a transaction that does not fit the end of its
//! segment leaves a hole until cleaning moves what follows it). ext4 keeps 5 % for root, for
//! comparison; `tests/statfs_true.rs` writes what statfs calls free down to 2 % of the
//! capacity without `ENOSPC`.
//!
//! `statfs` gives as the file system's size `capacity − fixed`, where `fixed` is the part of
//! `reserved` that never varies (the streams' reserved next segments, the reserve segments and
//! the cleaning headroom), as ext4 leaves its journal and inode tables out of its size: `df`'s
//! "used" (size − free) is then what is live plus the reservations that come and go, and an
//! empty file system shows a few MiB used, not the 8 % headroom. Free and available are the
//! same number: no part of `reserved` is for root alone.
//!
//! The counts are derived from the state and kept per inode ([`LiveTotals`]): brought up to
//! date from the inodes changed since the last count, as the inode table marks them; a walk
//! of every inode and every directory's names (5–11 ms under the state lock for 105,000
//! files in one directory) is what `fsck` compares them with. The per-segment counts the
//! cleaning policy ranks the streams' heads by are kept as the block maps change ([`SegmentUsage`], LFS's segment usage
//! table, in memory only: built by one walk at mount): they were a walk over every block map
//! for each segment cleaned while space was low, under the state lock (100,000 files on a
//! nearly full 1 GiB image: 292 walks of about 30 ms in 20,000 creates, single operations
//! stalled for up to 0.9 s). `fsck` checks the table against a walk.

use std::collections::{BTreeMap, HashMap};

use crate::record::Record;
use crate::state::{Block, Inode, State};
use crate::types::Ino;
use crate::types::{Attr, FileKind, Timespec};
use crate::Fs;

use crate::fs::{lock, RESERVED_SEGMENTS};
use crate::Result;

/// Bytes of a unit that do not hold records (the log's header; conservative).
const UNIT_HEADER: u64 = 128;
/// Bytes each record costs in a unit beyond its own (its length).
const PER_RECORD: u64 = 4;
/// Share of the log's capacity kept free for cleaning, in percent.
pub(crate) const CLEANING_HEADROOM_PERCENT: u64 = 8;

/// Live data blocks of one segment, from the block maps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SegmentLive {
    /// Live data blocks in it.
    pub blocks: u64,
    /// The highest version among them (0 when none).
    pub youngest_ver: u64,
}

/// Live data blocks per segment, kept as blocks are placed, moved and dropped: for each
/// segment, how many committed data blocks of the block maps lie in it and the version of
/// each (a multiset, so the youngest is known after any of them dies). Exactly what
/// [`Fs::live_data_by_segment`] counts by walking every block map (`fsck` compares them).
/// A block counts once it is committed (`Block::tx` set): blocks of an operation or explicit
/// transaction in progress have no device address yet.
#[derive(Debug, Default)]
pub(crate) struct SegmentUsage {
    /// The log's geometry ([`tally_log::Log::segment_of`]); `segment_blocks` 0 (a state not
    /// yet mounted, or built by a test) counts nothing.
    first_block: u64,
    segment_blocks: u64,
    segment_count: u32,
    by_segment: HashMap<u32, SegmentVersions>,
}

#[derive(Debug, Default)]
struct SegmentVersions {
    blocks: u64,
    /// How many of the segment's live blocks carry each version.
    versions: BTreeMap<u64, u32>,
}

impl SegmentUsage {
    /// The table of the blocks of `inodes`, for a log of this geometry.
    pub(crate) fn build<'a>(
        first_block: u64,
        segment_blocks: u32,
        segment_count: u32,
        inodes: impl Iterator<Item = &'a Inode>,
    ) -> SegmentUsage {
        let mut u = SegmentUsage {
            first_block,
            segment_blocks: u64::from(segment_blocks),
            segment_count,
            by_segment: HashMap::new(),
        };
        for inode in inodes {
            u.add_inode(inode);
        }
        u
    }

    /// The segment holding device block `addr`, as [`tally_log::Log::segment_of`] says.
    fn segment(&self, addr: u64) -> Option<u32> {
        let s = addr.checked_sub(self.first_block)?.checked_div(self.segment_blocks)?;
        u32::try_from(s).ok().filter(|&s| s < self.segment_count)
    }

    /// `b` is now in a block map.
    pub(crate) fn add(&mut self, b: &Block) {
        let Some(s) = b.tx.and_then(|_| self.segment(b.addr)) else { return };
        let v = self.by_segment.entry(s).or_default();
        v.blocks += 1;
        *v.versions.entry(b.ver).or_default() += 1;
    }

    /// `b` is no longer in a block map (dropped, or about to change).
    pub(crate) fn remove(&mut self, b: &Block) {
        let Some(s) = b.tx.and_then(|_| self.segment(b.addr)) else { return };
        let Some(v) = self.by_segment.get_mut(&s) else { return };
        if let Some(n) = v.versions.get_mut(&b.ver) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                v.versions.remove(&b.ver);
            }
            v.blocks = v.blocks.saturating_sub(1);
        }
        if v.blocks == 0 {
            self.by_segment.remove(&s);
        }
    }

    /// Every block of `inode` is now in the table's maps (an inode put back).
    pub(crate) fn add_inode(&mut self, inode: &Inode) {
        for b in inode.blocks.values() {
            self.add(b);
        }
    }

    /// Every block of `inode` is gone (the inode freed).
    pub(crate) fn remove_inode(&mut self, inode: &Inode) {
        for b in inode.blocks.values() {
            self.remove(b);
        }
    }

    /// Live data blocks in `segment`, and the youngest one's version.
    pub(crate) fn get(&self, segment: u32) -> SegmentLive {
        self.by_segment.get(&segment).map_or_else(SegmentLive::default, |v| SegmentLive {
            blocks: v.blocks,
            youngest_ver: v.versions.keys().next_back().copied().unwrap_or(0),
        })
    }

    /// Every segment's count, for comparing with a walk.
    pub(crate) fn all(&self) -> HashMap<u32, SegmentLive> {
        self.by_segment.keys().map(|&s| (s, self.get(s))).collect()
    }
}

impl State {
    /// Put `block` at `b` of `ino`'s block map, keeping [`State::usage`]; the block it
    /// replaces, if any.
    pub(crate) fn insert_block(&mut self, ino: Ino, b: u64, block: Block) -> Result<Option<Block>> {
        let inode = self.inodes.get_mut(&ino).ok_or(crate::FsError::NotFound)?;
        let old = inode.blocks.insert(b, block);
        if let Some(old) = &old {
            self.usage.remove(old);
        }
        if let Some(new) = inode.blocks.get(&b) {
            self.usage.add(new);
        }
        Ok(old)
    }

    /// Drop block `b` of `ino`, keeping [`State::usage`]; the block dropped, if any.
    pub(crate) fn remove_block(&mut self, ino: Ino, b: u64) -> Result<Option<Block>> {
        let old = self.inode_mut(ino)?.blocks.remove(&b);
        if let Some(old) = &old {
            self.usage.remove(old);
        }
        Ok(old)
    }
}

/// What the live state takes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SpaceUsage {
    /// Blocks of the log's segments.
    pub capacity_blocks: u64,
    /// Committed (or pending) data blocks of files.
    pub data_blocks: u64,
    /// Bytes of the records that describe the state.
    pub record_bytes: u64,
    /// Blocks the live state takes, packed: data blocks and units of records.
    pub live_blocks: u64,
    /// Blocks kept from operations that grow (see the module's documentation).
    pub reserved_blocks: u64,
    /// The part of `reserved_blocks` that never varies (streams' next segments, the reserve
    /// segments, the cleaning headroom): left out of the size `statfs` reports.
    pub fixed_blocks: u64,
    /// `capacity − live − reserved`: what `statfs` reports free.
    pub free_blocks: u64,
    /// Blocks in free segments now (the rest of the free space is dead space in segments
    /// cleaning has not reclaimed yet).
    pub free_segment_blocks: u64,
}

/// Encoded sizes of records without their variable parts.
struct RecordSizes {
    inode: u64,
    dentry: u64,
    extent: u64,
    xattr: u64,
}

fn record_sizes() -> RecordSizes {
    let t = Timespec { sec: 0, nsec: 0 };
    let attr = Attr {
        ino: 0,
        kind: FileKind::File,
        perm: 0,
        uid: 0,
        gid: 0,
        nlink: 0,
        size: 0,
        rdev: 0,
        atime: t,
        mtime: t,
        ctime: t,
        crtime: t,
    };
    let len = |r: Record| r.encode().len() as u64 + PER_RECORD;
    RecordSizes {
        inode: len(Record::Inode { ver: 0, attr, target: Vec::new() }),
        dentry: len(Record::Dentry {
            ver: 0,
            dir: 0,
            name: Vec::new(),
            ino: 0,
            kind: FileKind::File,
            cookie: 0,
        }),
        extent: len(Record::Extent { ver: 0, ino: 0, block: 0, data: 0, crc: 0 }),
        xattr: len(Record::Xattr { ver: 0, ino: 0, name: Vec::new(), value: Some(Vec::new()) }),
    }
}

/// One inode's part of the live state: its data blocks, and the bytes of its records (its
/// attribute record, an extent per block, an entry per name if a directory, its extended
/// attributes). O(1) but for the extended attributes (a directory keeps its names' bytes).
fn inode_parts(sizes: &RecordSizes, inode: &Inode) -> (u64, u64) {
    let blocks = inode.blocks.len() as u64;
    let mut bytes = sizes.inode + inode.target.len() as u64 + blocks * sizes.extent;
    if let Some(dir) = &inode.dir {
        bytes += dir.entries().len() as u64 * sizes.dentry + dir.name_bytes;
    }
    bytes += inode
        .xattrs
        .iter()
        .map(|(n, x)| sizes.xattr + n.len() as u64 + x.value.len() as u64)
        .sum::<u64>();
    (blocks, bytes)
}

/// Data blocks and record bytes of the live state, by a walk of every inode and every
/// directory's names (what [`LiveTotals`] keeps; `fsck` compares them).
pub(crate) fn live_parts_walked(st: &State) -> (u64, u64) {
    let sizes = record_sizes();
    let mut data = 0u64;
    let mut bytes = sizes.inode; // the file-system record, about an inode's
    for inode in st.inodes.values() {
        let (d, b) = inode_parts(&sizes, inode);
        data += d;
        bytes += b;
        // The names counted one by one, not taken from the count the directory keeps.
        if let Some(dir) = &inode.dir {
            let names: u64 = dir.entries().keys().map(|n| n.len() as u64).sum();
            bytes = bytes.saturating_sub(dir.name_bytes).saturating_add(names);
        }
    }
    (data, bytes)
}

/// [`live_parts_walked`]'s totals, kept per inode: brought up to date from the inodes the
/// inode table marked changed since (`state.rs` `Inodes`), so `statfs`, `fallocate` and the
/// low-space check before operations cost what changed, not a walk of every inode and every
/// directory's names under the state lock (5–11 ms for 100,000 files in one directory).
#[derive(Debug, Default)]
pub(crate) struct LiveTotals {
    per_ino: crate::state::InoMap<(u64, u64)>,
    data: u64,
    bytes: u64,
}

/// Data blocks and record bytes of the live state ([`LiveTotals`], brought up to date).
pub(crate) fn live_parts(st: &mut State) -> (u64, u64) {
    let changed = st.inodes.take_changed_live();
    retotal(st, changed)
}

/// [`live_parts`] for at most `n` of the inodes marked changed: a slice of the work a
/// checkpoint does before it takes the state lock for the rest (`Fs::refresh_kept_in_slices`).
/// Returns how many inodes stay marked.
pub(crate) fn live_parts_some(st: &mut State, n: usize) -> usize {
    let some = st.inodes.take_changed_live_some(n);
    retotal(st, some);
    st.inodes.changed_live_len()
}

/// Bring the totals up to date with the inodes `changed`.
fn retotal(st: &mut State, changed: impl IntoIterator<Item = Ino>) -> (u64, u64) {
    let sizes = record_sizes();
    let State { inodes, live_totals: t, .. } = st;
    for ino in changed {
        if let Some((d, b)) = t.per_ino.remove(&ino) {
            t.data = t.data.saturating_sub(d);
            t.bytes = t.bytes.saturating_sub(b);
        }
        if let Some(inode) = inodes.get(&ino) {
            let (d, b) = inode_parts(&sizes, inode);
            t.data = t.data.saturating_add(d);
            t.bytes = t.bytes.saturating_add(b);
            t.per_ino.insert(ino, (d, b));
        }
    }
    // The file-system record, about an inode's.
    (t.data, t.bytes.saturating_add(sizes.inode))
}

/// Blocks `data` data blocks and `record_bytes` of records take once packed.
pub(crate) fn packed_blocks(data: u64, record_bytes: u64, block_size: u32, pack: u64) -> u64 {
    let payload = u64::from(block_size).saturating_sub(UNIT_HEADER).max(1);
    data + record_bytes.div_ceil(payload).max(data.div_ceil(pack.saturating_sub(1).max(1)))
}

impl Fs {
    /// How the log's space is used: what is live, reserved and free, as `statfs` counts it.
    ///
    /// # Errors
    /// After a panic stopped the file system.
    pub fn space(&self) -> Result<SpaceUsage> {
        let mut st = lock(&self.state)?;
        Ok(self.space_usage(&mut st))
    }

    /// How the log's space is used: what is live (counted from the state), what is reserved,
    /// and what is free (see the module's documentation). `statfs` reports its `free_blocks`.
    pub(crate) fn space_usage(&self, st: &mut State) -> SpaceUsage {
        let seg = u64::from(self.segment_blocks);
        let capacity = u64::from(self.log.segment_count()) * seg;
        let (data, record_bytes) = live_parts(st);
        let live = packed_blocks(data, record_bytes, self.bs, self.pack_blocks());
        // Each stream's reserved next segment, and the reserve segments.
        let fixed_segments = u64::from(self.streams) + u64::from(RESERVED_SEGMENTS);
        let fixed = fixed_segments * seg + capacity * CLEANING_HEADROOM_PERCENT / 100;
        let kept_segments = u64::from(self.snapshot_segments(st))
            + self.log.checkpoint_snapshot_segments().len() as u64;
        // The unused ends of the streams' current segments: only their own stream's commits
        // can use them, and the space checks of operations count free segments.
        let ends: u64 = (0..self.streams)
            .map(|s| u64::from(self.log.blocks_left_in_segment(s).unwrap_or(0)))
            .sum();
        let reserved =
            fixed + kept_segments * seg + ends + Self::reservation_cost(st.reserved.blocks());
        SpaceUsage {
            capacity_blocks: capacity,
            data_blocks: data,
            record_bytes,
            live_blocks: live,
            reserved_blocks: reserved,
            fixed_blocks: fixed.min(capacity),
            free_blocks: capacity.saturating_sub(live).saturating_sub(reserved),
            free_segment_blocks: u64::from(self.log.free_segments()) * seg,
        }
    }

    /// Live data blocks (committed) in each segment, from the files' block maps: what cleaning
    /// a segment would have to copy; with the version of the youngest of them (when its data
    /// was last written: relocation keeps versions), the age LFS's cost-benefit weighs.
    pub(crate) fn live_data_by_segment(&self, st: &State) -> HashMap<u32, SegmentLive> {
        #[cfg(test)]
        LIVE_WALKS.with(|n| n.set(n.get() + 1));
        let mut out: HashMap<u32, SegmentLive> = HashMap::new();
        for inode in st.inodes.values() {
            for b in inode.blocks.values().filter(|b| b.tx.is_some()) {
                if let Some(s) = self.log.segment_of(b.addr) {
                    let l = out.entry(s).or_default();
                    l.blocks += 1;
                    l.youngest_ver = l.youngest_ver.max(b.ver);
                }
            }
        }
        out
    }
}

#[cfg(test)]
thread_local! {
    /// Walks of the block maps by [`Fs::live_data_by_segment`] on this thread (tests count them).
    pub(crate) static LIVE_WALKS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_counts_a_unit_per_pack_or_per_payload_of_records() {
        assert_eq!(packed_blocks(0, 0, 4096, 32), 0);
        assert_eq!(packed_blocks(31, 100, 4096, 32), 32);
        assert_eq!(packed_blocks(32, 100, 4096, 32), 34);
        assert_eq!(packed_blocks(0, 3968, 4096, 32), 1);
        assert_eq!(packed_blocks(0, 3969, 4096, 32), 2);
        // Large packs: the records, not the pack size, set the units.
        assert_eq!(packed_blocks(252, 252 * 49, 4096, 128), 252 + 4);
    }
}

//! Who may use the free segments: the reserves, `fallocate`'s reservations, and the rest.
//!
//! Free segments are set aside, from the last one up:
//! 1. the clean-unmount snapshot's segments (measured from the state, [`Fs::snapshot_segments`]),
//!    so that unmount of a full file system still writes it and the next mount reads it;
//! 2. [`RESERVED_SEGMENTS`] for deletes, truncates and cleaning;
//! 3. the blocks `fallocate` reserved (`reserve.rs`).
//!
//! An operation that adds data or objects ("grows") gets `ENOSPC` unless it leaves all three
//! whole; a write into reserved blocks consumes the reservation and may use the second
//! reserve; deletes may use the second reserve too. Invariant: after any operation that grows
//! outside reservations, the free segments beyond the two reserves hold every reserved block.

use std::collections::BTreeSet;

use crate::state::{Key, SnapshotNeed, State};
use crate::txn::Cx;
use crate::types::Ino;
use crate::{FsError, Result};

use super::{Fs, RESERVED_SEGMENTS};

/// Log records of the blocks reserved: one block of records per this many data blocks
/// (an extent record is some 40 bytes).
const RECORD_BLOCKS_PER: u64 = 32;

impl Fs {
    /// Segments the clean-unmount snapshot needs, one spare included. Measured at mount
    /// ([`crate::snapshot::encoded_len`], linear in the state), and again only near the limit
    /// (free segments within two of the reserves) once what operations changed since may
    /// have outgrown the spare: each operation adds [`crate::snapshot::growth_bound`] of
    /// the keys it touched (`Fs::take_space`). Half the spare segment is left for the log's
    /// own part of the snapshot (its streams' state).
    ///
    /// Measuring after a fixed number of operations instead (every 32) made a full file
    /// system of 100,000 files spend most of its time sorting and encoding snapshots.
    pub(crate) fn snapshot_segments(&self, st: &mut State) -> u32 {
        if let Some(need) = st.snapshot_need {
            let far = self.log.free_segments() > RESERVED_SEGMENTS + need.segments + 2;
            if far || need.grown <= need.slack {
                return need.segments;
            }
        }
        let seg_bytes = u64::from(self.segment_blocks) * u64::from(self.bs);
        // Its header block, and the log's part within the spare.
        let total = crate::snapshot::encoded_len(st) + u64::from(self.bs);
        let needed = total.div_ceil(seg_bytes).saturating_add(1);
        let slack = needed.saturating_mul(seg_bytes).saturating_sub(total + seg_bytes / 2);
        let segments = u32::try_from(needed).unwrap_or(u32::MAX);
        st.snapshot_need = Some(SnapshotNeed { segments, slack, grown: 0 });
        segments
    }

    /// Free segments no growing operation may take: the reserve and the clean-unmount
    /// snapshot's room.
    pub(crate) fn kept_segments(&self, st: &mut State) -> u32 {
        RESERVED_SEGMENTS.saturating_add(self.snapshot_segments(st))
    }

    /// Blocks free for operations that grow outside reservations, before the reservations
    /// are taken from them.
    pub(crate) fn growth_blocks(&self, st: &mut State) -> u64 {
        let kept = self.kept_segments(st);
        let free = self.log.free_segments().saturating_sub(kept);
        u64::from(free) * u64::from(self.segment_blocks)
    }

    /// Blocks a reservation of `blocks` data blocks takes (their records included).
    pub(crate) fn reservation_cost(blocks: u64) -> u64 {
        blocks + blocks.div_ceil(RECORD_BLOCKS_PER)
    }

    /// After an operation's change and before its commit: may it have the space it needs?
    /// Consumes the reservations of the blocks it writes, and drops those of inodes it freed.
    /// `ENOSPC` (nothing consumed) when it grows outside its reservations and would leave a
    /// reserve or another reservation short.
    pub(crate) fn take_space(&self, st: &mut State, cx: &Cx, grows: bool) -> Result<()> {
        let mut written = 0u64;
        let mut consumed: Vec<(Ino, u64)> = Vec::new();
        let mut owners: BTreeSet<Ino> = BTreeSet::new();
        for key in &cx.touched {
            owners.insert(key.owner());
            let Key::Block(ino, b) = key else { continue };
            if st.inodes.get(ino).is_some_and(|i| i.blocks.contains_key(b)) {
                written += 1;
                if st.reserved.missing(*ino, *b, b + 1) == 0 {
                    consumed.push((*ino, *b));
                }
            }
        }
        let outside = written - consumed.len() as u64;
        if grows && !cx.touched.is_empty() && (written == 0 || outside > 0) {
            let free = self.log.free_segments();
            let room = self.growth_blocks(st);
            let left = Self::reservation_cost(st.reserved.blocks() - consumed.len() as u64);
            let kept = self.kept_segments(st);
            if free <= kept || room < left.saturating_add(outside) {
                return Err(FsError::NoSpace);
            }
        }
        for (ino, b) in consumed {
            st.reserved.remove(ino, b, b + 1);
        }
        if st.snapshot_need.is_some() {
            let grown: u64 = cx.touched.iter().map(|k| crate::snapshot::growth_bound(st, k)).sum();
            if let Some(need) = st.snapshot_need.as_mut() {
                need.grown = need.grown.saturating_add(grown);
            }
        }
        for ino in owners {
            if st.reserved.holds(ino) && !st.inodes.contains_key(&ino) {
                st.reserved.forget(ino);
            }
        }
        Ok(())
    }
}

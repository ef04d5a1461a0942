//! The segment allocator. It lives only in memory and is rebuilt at open from the streams'
//! chains: a segment is free iff no stream's chain (from its checkpoint segment through its
//! reserved next segment) contains it.
//!
//! Invariants:
//! - a segment is held by at most one owner (one stream's chain, one stream's reserved next
//!   segment, or the snapshot being read); [`Claims`] checks this for state read from the
//!   device before a [`Space`] is built from it, so the asserts below are reachable only by a
//!   bug, never by bytes;
//! - a released segment was held, so it is never released twice.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// Who holds a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// In the chain of this stream.
    Chain(u16),
    /// Reserved as this stream's next segment.
    Next(u16),
    /// Holds the clean-close snapshot being read.
    Snapshot,
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Owner::Chain(s) => write!(f, "stream {s}'s chain"),
            Owner::Next(s) => write!(f, "stream {s}'s next segment"),
            Owner::Snapshot => f.write_str("the snapshot"),
        }
    }
}

/// Segments claimed by owners read from the device, each at most once.
#[derive(Debug)]
pub struct Claims {
    owners: BTreeMap<u32, Owner>,
    segment_count: u32,
}

impl Claims {
    /// No segment of a log of `segment_count` segments claimed yet.
    pub fn new(segment_count: u32) -> Self {
        Claims { owners: BTreeMap::new(), segment_count }
    }

    /// Claim `segment` for `owner`.
    ///
    /// # Errors
    /// Why not, as text: the segment is outside the log or already held.
    pub fn claim(&mut self, segment: u32, owner: Owner) -> Result<(), String> {
        if segment >= self.segment_count {
            return Err(format!("segment {segment} of {owner} is outside the log"));
        }
        match self.owners.entry(segment) {
            Entry::Vacant(v) => {
                v.insert(owner);
                Ok(())
            }
            Entry::Occupied(o) => {
                Err(format!("segment {segment} is in {} and in {owner}", o.get()))
            }
        }
    }
}

/// Free segments, lowest first (so images stay compact and tests deterministic).
#[derive(Debug)]
pub struct Space {
    free: BTreeSet<u32>,
    segment_count: u32,
}

impl Space {
    /// All segments not in `used` are free.
    pub fn new(segment_count: u32, used: impl IntoIterator<Item = u32>) -> Self {
        let mut free: BTreeSet<u32> = (0..segment_count).collect();
        for seg in used {
            free.remove(&seg);
        }
        Space { free, segment_count }
    }

    /// Take a free segment.
    pub fn alloc(&mut self) -> Option<u32> {
        self.free.pop_first()
    }

    /// Return a segment to the pool.
    pub fn release(&mut self, segment: u32) {
        assert!(segment < self.segment_count, "released segment {segment} out of range");
        let fresh = self.free.insert(segment);
        assert!(fresh, "segment {segment} released twice");
    }

    /// Free segments.
    pub fn free_count(&self) -> u32 {
        // At most `segment_count` segments are free.
        u32::try_from(self.free.len()).unwrap_or(u32::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_refuse_a_segment_held_twice_or_outside_the_log() {
        let mut c = Claims::new(8);
        c.claim(0, Owner::Chain(0)).unwrap();
        c.claim(1, Owner::Next(0)).unwrap();
        c.claim(2, Owner::Chain(1)).unwrap();
        c.claim(5, Owner::Snapshot).unwrap();
        let twice = c.claim(1, Owner::Chain(1)).unwrap_err();
        assert!(twice.contains("stream 0's next segment") && twice.contains("stream 1's chain"));
        assert!(c.claim(8, Owner::Chain(0)).is_err());
        // A refused claim changes nothing.
        assert!(c.claim(1, Owner::Chain(0)).unwrap_err().contains("stream 0's next segment"));
    }

    #[test]
    #[should_panic(expected = "released twice")]
    fn a_double_release_is_a_bug() {
        let mut space = Space::new(4, [0, 1]);
        space.release(0);
        space.release(0);
    }
}

//! The segment allocator. It lives only in memory and is rebuilt at open from the streams'
//! chains: a segment is free iff no stream's chain (from its checkpoint segment through its
//! reserved next segment) contains it.

use std::collections::BTreeSet;

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
        self.free.len() as u32
    }
}

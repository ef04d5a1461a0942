//! Space reserved by `fallocate` for blocks not yet written (DRAM only).
//!
//! Copy-on-write gives a written block a new place, so "allocating" a range cannot mean
//! setting blocks aside on the device: what `fallocate` promises is that the first write of
//! each block of the range will find room. The file system keeps that promise by counting
//! reserved blocks against its free space: operations that need space beyond the
//! reservations get `ENOSPC` first, and a write that consumes a reservation is let through.
//!
//! Invariants:
//! - the ranges of one inode are disjoint, non-empty and not adjacent (merged);
//! - `blocks` is the sum of the lengths of all ranges;
//! - a block leaves its range when it is written (consumed), punched, truncated away, or its
//!   inode is freed; reservations are not persisted: a remount (or a crash) forgets them.

use std::collections::{BTreeMap, HashMap};

use crate::types::Ino;

/// Blocks reserved per inode, as ranges `start → end` (block indices, `end` exclusive).
#[derive(Debug, Default)]
pub(crate) struct Reservations {
    ranges: HashMap<Ino, BTreeMap<u64, u64>>,
    blocks: u64,
}

impl Reservations {
    /// Blocks reserved in all.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    /// Whether `ino` holds any reservation.
    pub fn holds(&self, ino: Ino) -> bool {
        self.ranges.contains_key(&ino)
    }

    /// Blocks of `start..end` of `ino` not reserved yet.
    pub fn missing(&self, ino: Ino, start: u64, end: u64) -> u64 {
        let reserved: u64 = self.ranges.get(&ino).map_or(0, |r| {
            r.range(..end).map(|(&s, &e)| e.min(end).saturating_sub(s.max(start))).sum()
        });
        end.saturating_sub(start) - reserved
    }

    /// Reserve `start..end` of `ino` (what was already reserved stays, counted once).
    pub fn add(&mut self, ino: Ino, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let added = self.missing(ino, start, end);
        let r = self.ranges.entry(ino).or_default();
        let (mut s, mut e) = (start, end);
        // Merge with every range that overlaps or touches `s..e`.
        let touching: Vec<(u64, u64)> =
            r.range(..=e).filter(|&(_, &re)| re >= s).map(|(&rs, &re)| (rs, re)).collect();
        for (rs, re) in touching {
            r.remove(&rs);
            s = s.min(rs);
            e = e.max(re);
        }
        r.insert(s, e);
        self.blocks += added;
        self.check(ino);
    }

    /// Release `start..end` of `ino`; returns how many blocks were reserved there.
    pub fn remove(&mut self, ino: Ino, start: u64, end: u64) -> u64 {
        if start >= end {
            return 0;
        }
        let Some(r) = self.ranges.get_mut(&ino) else { return 0 };
        let overlapping: Vec<(u64, u64)> =
            r.range(..end).filter(|&(_, &re)| re > start).map(|(&rs, &re)| (rs, re)).collect();
        let mut removed = 0;
        for (rs, re) in overlapping {
            r.remove(&rs);
            if rs < start {
                r.insert(rs, start);
            }
            if re > end {
                r.insert(end, re);
            }
            removed += re.min(end) - rs.max(start);
        }
        if r.is_empty() {
            self.ranges.remove(&ino);
        }
        self.blocks -= removed;
        self.check(ino);
        removed
    }

    /// Release everything `ino` holds.
    pub fn forget(&mut self, ino: Ino) {
        if let Some(r) = self.ranges.remove(&ino) {
            self.blocks -= r.iter().map(|(s, e)| e - s).sum::<u64>();
        }
    }

    /// Cheap checks of the invariants for `ino` (O(its ranges) in debug builds only).
    fn check(&self, ino: Ino) {
        #[cfg(debug_assertions)]
        if let Some(r) = self.ranges.get(&ino) {
            let mut last_end = None;
            for (&s, &e) in r {
                assert!(s < e, "empty reserved range");
                assert!(last_end.is_none_or(|l| l < s), "reserved ranges overlap or touch");
                last_end = Some(e);
            }
        }
        let _ = ino;
    }
}

#[cfg(test)]
mod tests {
    use super::Reservations;

    #[test]
    fn ranges_merge_split_and_count_once() {
        let mut r = Reservations::default();
        r.add(1, 10, 20);
        r.add(1, 15, 30);
        assert_eq!(r.blocks(), 20);
        assert_eq!(r.missing(1, 0, 40), 20);
        r.add(1, 30, 31);
        assert_eq!(r.blocks(), 21);
        assert_eq!(r.remove(1, 12, 14), 2);
        assert_eq!(r.remove(1, 16, 15), 0, "an empty range (a punch inside one block)");
        assert_eq!(r.blocks(), 19);
        assert_eq!(r.missing(1, 10, 20), 2);
        r.add(2, 0, 5);
        assert_eq!(r.remove(1, 0, 100), 19);
        assert!(!r.holds(1));
        r.forget(2);
        assert_eq!(r.blocks(), 0);
    }
}

//! The fate model of one uncertain block write, shared by enumeration and sampling.
//!
//! Invariants:
//! - a [`Fate::Torn`] mask is a non-empty strict subset of the block's units;
//! - the final content of a block is computed from the durable content by applying its present
//!   writes in an order that respects [`precedes`]; a torn write replaces only its units.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// Most atomic units a block is cut into for tearing; a larger count enlarges the unit.
pub(crate) const UNIT_COUNT_MAX: u32 = 128;

/// Which units of a block a torn write persisted (bit `i` = unit `i`).
pub(crate) type UnitMask = u128;

/// What became of one uncertain block write at the crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Nothing of it reached the media.
    Absent,
    /// All of it reached the media.
    Whole,
    /// Exactly the units in the mask reached the media.
    Torn(UnitMask),
}

impl Fate {
    /// Whether any byte of the write persisted.
    pub(crate) fn is_present(self) -> bool {
        !matches!(self, Fate::Absent)
    }
}

/// One block of one submitted write: the unit of the fate model.
#[derive(Debug, Clone)]
pub(crate) struct BlockWrite {
    /// Global issue order: block writes are numbered as they are submitted.
    pub(crate) id: u64,
    /// The submission it belongs to.
    pub(crate) ticket: u64,
    /// The block written.
    pub(crate) block: u64,
    /// Exactly one block of data.
    pub(crate) data: Arc<[u8]>,
    /// Logical time of its submission.
    pub(crate) submitted_at: u64,
    /// Logical time of its completion; `None` while in flight.
    pub(crate) completed_at: Option<u64>,
}

/// Whether `x` must reach the media before `y` when both do (same block assumed).
///
/// `x` precedes `y` iff `x` completed before `y` was submitted, or both completed and `x`
/// completed first (a cache applies writes in completion order). Two writes that were in flight
/// together, neither completed, are unordered; an in-flight write is unordered with a cached one
/// that had not yet completed when the in-flight one was submitted.
pub(crate) fn precedes(x: &BlockWrite, y: &BlockWrite) -> bool {
    match x.completed_at {
        None => false,
        Some(cx) => y.submitted_at > cx || y.completed_at.is_some_and(|cy| cy > cx),
    }
}

/// How blocks are cut into atomic units for tearing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Units {
    /// Bytes per unit.
    pub(crate) unit_size: u32,
    /// Units per block; 1 means the block cannot tear.
    pub(crate) unit_count: u32,
}

impl Units {
    /// Units of a `block_size` block when tearing at `torn_unit` bytes, never finer than the
    /// device's `atomic_write_size`. `tearing == false` gives one unit.
    pub(crate) fn new(
        block_size: u32,
        atomic_write_size: u32,
        torn_unit: u32,
        tearing: bool,
    ) -> Self {
        if !tearing {
            return Units { unit_size: block_size, unit_count: 1 };
        }
        let floor = block_size.div_ceil(UNIT_COUNT_MAX).max(1);
        // A unit must divide the block. Block sizes are powers of two, so rounding the unit up
        // to one makes it divide.
        let unit_size =
            torn_unit.max(atomic_write_size).max(floor).next_power_of_two().min(block_size);
        let unit_count = block_size / unit_size;
        assert!((1..=UNIT_COUNT_MAX).contains(&unit_count));
        assert_eq!(unit_count * unit_size, block_size);
        Units { unit_size, unit_count }
    }

    /// Whether a block may tear at all.
    pub(crate) fn can_tear(self) -> bool {
        self.unit_count > 1
    }

    /// Mask of all units.
    pub(crate) fn full_mask(self) -> UnitMask {
        if self.unit_count == UNIT_COUNT_MAX {
            UnitMask::MAX
        } else {
            (1u128 << self.unit_count) - 1
        }
    }

    /// The fates enumerated exhaustively for one write: absent, whole, and when tearing, the
    /// prefixes and suffixes of `k` units for `k` in `1..unit_count`.
    pub(crate) fn exhaustive_fates(self) -> Vec<Fate> {
        let n = self.unit_count;
        let mut fates = vec![Fate::Absent, Fate::Whole];
        for k in 1..n {
            let low = (1u128 << k) - 1;
            fates.push(Fate::Torn(low));
            fates.push(Fate::Torn(low << (n - k)));
        }
        fates
    }

    /// A uniformly random non-empty strict subset of the units (needs `can_tear`).
    pub(crate) fn random_mask(self, rng: &mut fastrand::Rng) -> UnitMask {
        let full = self.full_mask();
        loop {
            let mask = (u128::from(rng.u64(..)) << 64 | u128::from(rng.u64(..))) & full;
            if mask != 0 && mask != full {
                return mask;
            }
        }
    }
}

/// A block's content with its hash, so images can be compared cheaply and exactly.
#[derive(Debug, Clone)]
pub(crate) struct Content {
    /// Exactly one block.
    pub(crate) data: Arc<[u8]>,
    /// [`hash_bytes`] of `data`.
    pub(crate) hash: u64,
}

impl Content {
    /// Wrap `data`, hashing it.
    pub(crate) fn new(data: Arc<[u8]>) -> Self {
        let hash = hash_bytes(&data);
        Content { data, hash }
    }

    /// Byte equality, short-cut by pointer and hash.
    pub(crate) fn same(&self, other: &Content) -> bool {
        Arc::ptr_eq(&self.data, &other.data)
            || (self.hash == other.hash && self.data[..] == other.data[..])
    }
}

/// A 64-bit hash of bytes (SipHash through the standard hasher). Used only to find candidate
/// duplicates in one process; equal hashes are always confirmed by comparing bytes.
pub(crate) fn hash_bytes(bytes: &[u8]) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

/// Apply `order` (present writes' contents with their fates, first applied first) over `base`.
pub(crate) fn compose(base: &Content, order: &[(&Content, Fate)], units: Units) -> Content {
    // Only writes after the last whole one matter.
    let start = order.iter().rposition(|(_, f)| *f == Fate::Whole);
    let (seed, rest) = match start {
        Some(i) => (order[i].0, &order[i + 1..]),
        None => (base, order),
    };
    let unit = units.unit_size as usize;
    let mut current: Option<Vec<u8>> = None;
    for (w, fate) in rest {
        let Fate::Torn(mask) = *fate else { continue };
        let buf = current.get_or_insert_with(|| seed.data.to_vec());
        for u in 0..units.unit_count as usize {
            if mask >> u & 1 == 1 {
                let range = u * unit..(u + 1) * unit;
                buf[range.clone()].copy_from_slice(&w.data[range]);
            }
        }
    }
    match current {
        Some(buf) => Content::new(buf.into()),
        None => seed.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bw(id: u64, data: u8, submitted_at: u64, completed_at: Option<u64>) -> BlockWrite {
        BlockWrite {
            id,
            ticket: id,
            block: 0,
            data: vec![data; 2048].into(),
            submitted_at,
            completed_at,
        }
    }

    #[test]
    fn units_respect_atomic_size_and_tearing_switch() {
        assert_eq!(Units::new(4096, 512, 512, true), Units { unit_size: 512, unit_count: 8 });
        assert_eq!(Units::new(4096, 4096, 512, true).unit_count, 1);
        assert_eq!(Units::new(4096, 1024, 512, true).unit_size, 1024);
        assert_eq!(Units::new(4096, 512, 1000, true).unit_size, 1024);
        assert_eq!(Units::new(4096, 512, 512, false).unit_count, 1);
        assert_eq!(Units::new(1 << 20, 512, 512, true).unit_count, UNIT_COUNT_MAX);
    }

    #[test]
    fn exhaustive_fates_are_prefixes_and_suffixes() {
        let units = Units::new(2048, 512, 512, true);
        let fates = units.exhaustive_fates();
        let want = [
            Fate::Absent,
            Fate::Whole,
            Fate::Torn(0b0001),
            Fate::Torn(0b1000),
            Fate::Torn(0b0011),
            Fate::Torn(0b1100),
            Fate::Torn(0b0111),
            Fate::Torn(0b1110),
        ];
        assert_eq!(fates, want);
        let mut rng = fastrand::Rng::with_seed(1);
        for _ in 0..100 {
            let m = units.random_mask(&mut rng);
            assert!(m != 0 && m != 0b1111 && m & !0b1111 == 0);
        }
    }

    #[test]
    fn precedence_follows_completion_and_submission() {
        let cached_early = bw(1, 1, 1, Some(2));
        let cached_late = bw(2, 2, 3, Some(5));
        let concurrent = bw(3, 3, 4, None); // submitted before cached_late completed
        let after = bw(4, 4, 6, None);
        assert!(precedes(&cached_early, &cached_late));
        assert!(!precedes(&cached_late, &cached_early));
        assert!(precedes(&cached_early, &concurrent));
        assert!(!precedes(&cached_late, &concurrent) && !precedes(&concurrent, &cached_late));
        assert!(precedes(&cached_late, &after));
        assert!(!precedes(&concurrent, &after) && !precedes(&after, &concurrent));
    }

    #[test]
    fn compose_tears_at_unit_boundaries() {
        let units = Units::new(2048, 512, 512, true);
        let base = Content::new(vec![0u8; 2048].into());
        let a = Content::new(vec![1u8; 2048].into());
        let b = Content::new(vec![2u8; 2048].into());
        let got = compose(&base, &[(&a, Fate::Whole), (&b, Fate::Torn(0b0101))], units);
        let want: Vec<u8> = [2u8, 1, 2, 1].iter().flat_map(|&x| [x; 512]).collect();
        assert_eq!(&got.data[..], &want[..]);
        assert_eq!(got.hash, hash_bytes(&want));
        let got = compose(&base, &[(&a, Fate::Torn(0b1000)), (&b, Fate::Whole)], units);
        assert!(Arc::ptr_eq(&got.data, &b.data));
        let got = compose(&base, &[(&a, Fate::Torn(0b1000))], units);
        let want: Vec<u8> = [0u8, 0, 0, 1].iter().flat_map(|&x| [x; 512]).collect();
        assert_eq!(&got.data[..], &want[..]);
        assert!(compose(&base, &[], units).same(&base));
    }
}

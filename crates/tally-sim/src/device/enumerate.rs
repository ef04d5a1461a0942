//! Exhaustive enumeration of post-crash images.
//!
//! Fates are independent per block write and a write touches one block, so the set of
//! post-crash images is exactly the Cartesian product, over the affected blocks, of the set of
//! contents each block can end with. Each block's set is computed once by walking every
//! combination of its writes' fates and, for each, every legal order of its present writes; the
//! product is then walked lazily, one image per step. Per-block sets are deduplicated by
//! content, so the product holds no duplicate image.
//!
//! Orders: when every present write is whole only the last one matters, so the candidates are
//! the present writes that precede no other present write; when one is torn, every linear
//! extension of the precedence order is composed.
//!
//! Bounds: a block with `k` writes and `f` fates each costs at most `f^k × k!` (tearing) or
//! `f^k × k` candidates; enumeration is refused (the caller samples) when that exceeds the
//! image bound, or when the number of images does.

use std::collections::HashMap;

use tally_media::Image;

use super::crash::{Group, Plan};
use super::fate::{compose, precedes, Content, Fate};

/// The lazily walked product of per-block content sets.
pub(crate) struct Exhaustive {
    /// Per group: distinct final contents; index 0 is the durable content.
    options: Vec<Vec<Content>>,
    /// Current choice per group (an odometer, first group fastest).
    counter: Vec<usize>,
    done: bool,
    candidates: u64,
    image_count: u64,
}

impl Exhaustive {
    /// Enumerate `plan` if its image count is at most `images_max`; `None` otherwise.
    pub(crate) fn new(plan: &Plan, images_max: u64) -> Option<Self> {
        let fates = plan.units.exhaustive_fates();
        let can_tear = plan.units.can_tear();
        let too_costly = plan
            .groups
            .iter()
            .any(|g| candidate_bound(g.members.len(), fates.len(), can_tear) > images_max);
        if too_costly {
            return None;
        }
        let mut options = Vec::with_capacity(plan.groups.len());
        let (mut candidates, mut image_count) = (1u64, 1u64);
        for group in &plan.groups {
            let (contents, group_candidates) = block_outcomes(plan, group, &fates);
            candidates = candidates.saturating_mul(group_candidates);
            image_count = image_count.saturating_mul(contents.len() as u64);
            if image_count > images_max {
                return None;
            }
            options.push(contents);
        }
        let counter = vec![0; options.len()];
        Some(Exhaustive { options, counter, done: false, candidates, image_count })
    }

    /// Fate combinations × orders considered (saturating).
    pub(crate) fn candidates(&self) -> u64 {
        self.candidates
    }

    /// Distinct images this enumeration yields in total.
    pub(crate) fn image_count(&self) -> u64 {
        self.image_count
    }

    /// The next image; the first is the durable image.
    pub(crate) fn next_image(&mut self, plan: &Plan) -> Option<Image> {
        if self.done {
            return None;
        }
        let mut image = plan.durable.clone();
        for (g, &choice) in self.counter.iter().enumerate() {
            if choice != 0 {
                image.set_block(plan.groups[g].block, self.options[g][choice].data.clone());
            }
        }
        self.done = true;
        for (g, digit) in self.counter.iter_mut().enumerate() {
            *digit += 1;
            if *digit < self.options[g].len() {
                self.done = false;
                break;
            }
            *digit = 0;
        }
        Some(image)
    }
}

/// Upper bound of the candidates of a block with `k` writes of `f` fates each.
fn candidate_bound(k: usize, f: usize, can_tear: bool) -> u64 {
    let combos = (f as u64).saturating_pow(u32::try_from(k).unwrap_or(u32::MAX));
    let orders =
        if can_tear { (1..=k as u64).fold(1u64, u64::saturating_mul) } else { (k as u64).max(1) };
    combos.saturating_mul(orders)
}

/// Distinct contents, deduplicated by hash and confirmed by bytes.
pub(crate) struct Distinct {
    contents: Vec<Content>,
    by_hash: HashMap<u64, Vec<usize>>,
}

impl Distinct {
    /// A set holding `first` at index 0.
    pub(crate) fn new(first: Content) -> Self {
        let mut set = Distinct { contents: Vec::new(), by_hash: HashMap::new() };
        set.insert(first);
        set
    }

    /// Add `content` unless an equal one is present; returns whether it was added.
    pub(crate) fn insert(&mut self, content: Content) -> bool {
        let slot = self.by_hash.entry(content.hash).or_default();
        if slot.iter().any(|&i| self.contents[i].same(&content)) {
            return false;
        }
        slot.push(self.contents.len());
        self.contents.push(content);
        true
    }
}

/// Every distinct final content of `group`'s block, durable content first, and the number of
/// candidates considered.
fn block_outcomes(plan: &Plan, group: &Group, fates: &[Fate]) -> (Vec<Content>, u64) {
    let mut distinct = Distinct::new(group.base.clone());
    let mut candidates = 0u64;
    let mut digits = vec![0usize; group.members.len()];
    loop {
        let present: Vec<(usize, Fate)> = group
            .members
            .iter()
            .zip(&digits)
            .map(|(&m, &d)| (m, fates[d]))
            .filter(|(_, f)| f.is_present())
            .collect();
        if present.is_empty() {
            candidates += 1;
            distinct.insert(group.base.clone());
        } else if present.iter().all(|(_, f)| *f == Fate::Whole) {
            for &(m, _) in &present {
                let last =
                    present.iter().all(|&(q, _)| !precedes(&plan.writes[m], &plan.writes[q]));
                if last {
                    candidates += 1;
                    distinct.insert(plan.contents[m].clone());
                }
            }
        } else {
            let mut perm: Vec<usize> = (0..present.len()).collect();
            loop {
                if is_legal_order(plan, &present, &perm) {
                    candidates += 1;
                    let order: Vec<(&Content, Fate)> = perm
                        .iter()
                        .map(|&i| (&plan.contents[present[i].0], present[i].1))
                        .collect();
                    distinct.insert(compose(&group.base, &order, plan.units));
                }
                if !next_permutation(&mut perm) {
                    break;
                }
            }
        }
        if !advance(&mut digits, fates.len()) {
            break;
        }
    }
    (distinct.contents, candidates)
}

/// Whether applying `present` in the order `perm` respects precedence.
fn is_legal_order(plan: &Plan, present: &[(usize, Fate)], perm: &[usize]) -> bool {
    perm.iter().enumerate().all(|(i, &later)| {
        perm[..i].iter().all(|&earlier| {
            !precedes(&plan.writes[present[later].0], &plan.writes[present[earlier].0])
        })
    })
}

/// Advance a base-`radix` odometer (first digit fastest); false when it wraps to all zeros.
fn advance(digits: &mut [usize], radix: usize) -> bool {
    for d in digits.iter_mut() {
        *d += 1;
        if *d < radix {
            return true;
        }
        *d = 0;
    }
    false
}

/// Rearrange into the next lexicographic permutation; false when `v` was the last one.
fn next_permutation(v: &mut [usize]) -> bool {
    let Some(i) = v.windows(2).rposition(|w| w[0] < w[1]) else {
        return false;
    };
    let Some(j) = v.iter().rposition(|&x| x > v[i]) else {
        return false;
    };
    v.swap(i, j);
    v[i + 1..].reverse();
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutations_are_all_visited_once() {
        let mut v = vec![0, 1, 2, 3];
        let mut seen = std::collections::HashSet::new();
        loop {
            assert!(seen.insert(v.clone()));
            if !next_permutation(&mut v) {
                break;
            }
        }
        assert_eq!(seen.len(), 24);
    }

    #[test]
    fn odometer_counts_every_combination() {
        let mut digits = vec![0; 3];
        let mut n = 1;
        while advance(&mut digits, 4) {
            n += 1;
        }
        assert_eq!((n, digits), (64, vec![0, 0, 0]));
        assert!(!advance(&mut [], 2), "no digits: one combination");
    }

    #[test]
    fn bounds_grow_with_tearing() {
        assert_eq!(candidate_bound(0, 2, false), 1);
        assert_eq!(candidate_bound(3, 2, false), 24);
        assert_eq!(candidate_bound(3, 16, true), 4096 * 6);
        assert_eq!(candidate_bound(40, 16, true), u64::MAX);
    }
}

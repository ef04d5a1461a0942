//! Seeded sampling of post-crash images, for states too many to enumerate.
//!
//! Each draw picks a fate for every uncertain write by one strategy, a random legal order for
//! the present writes of each block, and composes the image. Draw 0 loses every write, draw 1
//! keeps every write whole; later draws rotate through:
//! - **random**: each write absent or whole (or torn, when tearing) with equal probability;
//! - **prefix**: the first `k` writes in issue order present, the rest absent;
//! - **all-but-one**: every write present except one;
//! - **only-one**: one write present;
//! - **omit-one-keep-later**: writes before `i` present, `i` absent, one later write `j`
//!   present, the rest absent — the smallest witness of a later write outliving an earlier one.
//!
//! In the structured strategies a present write is torn with probability 1/4 when tearing is on;
//! a torn write keeps a uniformly random non-empty strict subset of its units.
//!
//! Invariant: the same seed and plan give the same image sequence; images are deduplicated by
//! their delta from the durable image (hash, then byte comparison), duplicates are counted.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use tally_media::Image;

use super::crash::Plan;
use super::fate::{compose, precedes, Content, Fate};

/// A delta from the durable image: (block, content) for each block that differs, block order.
type Delta = Vec<(u64, Content)>;

/// Strategies after the two fixed first draws, rotated by draw number.
const STRATEGY_COUNT: u64 = 5;

/// The sampler's state.
pub(crate) struct Sampler {
    rng: fastrand::Rng,
    draws_max: u64,
    draws: u64,
    duplicates: u64,
    seen: HashMap<u64, Vec<Delta>>,
}

impl Sampler {
    /// A sampler making `samples` draws from `seed`.
    pub(crate) fn new(seed: u64, samples: usize) -> Self {
        Sampler {
            rng: fastrand::Rng::with_seed(seed),
            draws_max: samples as u64,
            draws: 0,
            duplicates: 0,
            seen: HashMap::new(),
        }
    }

    /// Draws made so far.
    pub(crate) fn draws(&self) -> u64 {
        self.draws
    }

    /// Draws dropped because their image was already yielded.
    pub(crate) fn duplicates(&self) -> u64 {
        self.duplicates
    }

    /// The next distinct image, or `None` when the draws are spent.
    pub(crate) fn next_image(&mut self, plan: &Plan) -> Option<Image> {
        while self.draws < self.draws_max {
            let fates = self.draw_fates(plan, self.draws);
            self.draws += 1;
            let delta = self.compose_delta(plan, &fates);
            if self.insert(&delta) {
                return Some(plan.image_with(&delta));
            }
            self.duplicates += 1;
        }
        None
    }

    /// A fate for every write of `plan` by the strategy of draw `draw`.
    fn draw_fates(&mut self, plan: &Plan, draw: u64) -> Vec<Fate> {
        let n = plan.writes.len();
        let units = plan.units;
        let rng = &mut self.rng;
        if n == 0 {
            return Vec::new();
        }
        let keep: Vec<bool> = match draw {
            0 => return vec![Fate::Absent; n],
            1 => return vec![Fate::Whole; n],
            _ => match (draw - 2) % STRATEGY_COUNT {
                0 => {
                    let random = |rng: &mut fastrand::Rng| {
                        if !units.can_tear() {
                            return if rng.bool() { Fate::Whole } else { Fate::Absent };
                        }
                        match rng.u8(..3) {
                            0 => Fate::Absent,
                            1 => Fate::Whole,
                            _ => Fate::Torn(units.random_mask(rng)),
                        }
                    };
                    return (0..n).map(|_| random(rng)).collect();
                }
                1 => {
                    let k = rng.usize(..=n);
                    (0..n).map(|i| i < k).collect()
                }
                2 => {
                    let omit = rng.usize(..n);
                    (0..n).map(|i| i != omit).collect()
                }
                3 => {
                    let only = rng.usize(..n);
                    (0..n).map(|i| i == only).collect()
                }
                _ if n >= 2 => {
                    let omit = rng.usize(..n - 1);
                    let later = rng.usize(omit + 1..n);
                    (0..n).map(|i| i < omit || i == later).collect()
                }
                _ => vec![true],
            },
        };
        let present = |rng: &mut fastrand::Rng| {
            if units.can_tear() && rng.u8(..4) == 0 {
                Fate::Torn(units.random_mask(rng))
            } else {
                Fate::Whole
            }
        };
        keep.into_iter().map(|k| if k { present(rng) } else { Fate::Absent }).collect()
    }

    /// Compose each affected block with a random legal order; keep blocks that changed.
    fn compose_delta(&mut self, plan: &Plan, fates: &[Fate]) -> Delta {
        let mut delta = Vec::new();
        for group in &plan.groups {
            let mut remaining: Vec<usize> =
                group.members.iter().copied().filter(|&m| fates[m].is_present()).collect();
            if remaining.is_empty() {
                continue;
            }
            // A random linear extension: repeatedly take any write nothing remaining precedes.
            let mut order: Vec<(&Content, Fate)> = Vec::with_capacity(remaining.len());
            while !remaining.is_empty() {
                let ready: Vec<usize> = (0..remaining.len())
                    .filter(|&i| {
                        let w = &plan.writes[remaining[i]];
                        remaining.iter().all(|&q| !precedes(&plan.writes[q], w))
                    })
                    .collect();
                // Precedence is acyclic (it follows logical time), so something is ready.
                assert!(!ready.is_empty(), "precedence cycle among writes to one block");
                let taken = remaining.swap_remove(ready[self.rng.usize(..ready.len())]);
                order.push((&plan.contents[taken], fates[taken]));
            }
            let content = compose(&group.base, &order, plan.units);
            if !content.same(&group.base) {
                delta.push((group.block, content));
            }
        }
        delta
    }

    /// Remember `delta`; false if an equal delta was already seen.
    fn insert(&mut self, delta: &Delta) -> bool {
        let mut h = std::hash::DefaultHasher::new();
        for (block, content) in delta {
            (block, content.hash).hash(&mut h);
        }
        let slot = self.seen.entry(h.finish()).or_default();
        let equal = |other: &Delta| {
            other.len() == delta.len()
                && other.iter().zip(delta).all(|(a, b)| a.0 == b.0 && a.1.same(&b.1))
        };
        if slot.iter().any(equal) {
            return false;
        }
        slot.push(delta.clone());
        true
    }
}

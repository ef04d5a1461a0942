//! The images a crash can leave: enumerated when few enough, else sampled by seed.
//!
//! Lines are independent, so the images are the Cartesian product over pending lines of the
//! distinct contents each line can end with (a prefix of its cached pieces and any subset of
//! its non-temporal pieces). Exhaustive enumeration walks that product in mixed-radix order,
//! first image the durable one; distinct per-line contents make every image distinct.
//!
//! Sampling (when a line has more choices than `line_choices_max` or the product exceeds
//! `images_max`): draw 0 keeps nothing pending, draw 1 keeps everything; later draws rotate
//! through *uniform* (every line a random prefix and random subset), *one line* (one random line
//! changed, the rest durable) and *all but one* (every line whole but one, random). Identical
//! images are yielded once. The same seed and state give the same sequence.

use std::collections::HashSet;

use super::line::{LineBytes, LineState};

/// How to produce crash images.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PmemCrashOptions {
    /// Enumerate when the product of per-line contents is at most this.
    pub images_max: u64,
    /// A line with more (prefix, subset) choices than this forces sampling.
    pub line_choices_max: u64,
    /// Draws when sampling.
    pub samples: u64,
    /// Seed of the sampler.
    pub seed: u64,
}

impl Default for PmemCrashOptions {
    fn default() -> Self {
        PmemCrashOptions { images_max: 65_536, line_choices_max: 4096, samples: 1000, seed: 0 }
    }
}

/// One pending line of the crash plan.
pub(super) struct PlanLine {
    /// First byte of the line in the region.
    pub(super) start: usize,
    /// Bytes of the line inside the region (64, or fewer for a short last line).
    pub(super) len: usize,
    pub(super) durable: LineBytes,
    pub(super) state: LineState,
    /// Distinct contents a crash can leave, durable first; `None` if too many choices.
    contents: Option<Vec<LineBytes>>,
}

impl PlanLine {
    pub(super) fn new(
        start: usize,
        len: usize,
        durable: LineBytes,
        state: LineState,
        max: u64,
    ) -> Self {
        let contents = state.choice_count().filter(|&n| n <= max).map(|_| {
            let mut seen = HashSet::new();
            let mut contents = Vec::new();
            for prefix in 0..=state.cached.len() {
                for subset in 0..1u64 << state.nt.len() {
                    let line = state.compose(&durable, prefix, |i| subset >> i & 1 == 1);
                    if seen.insert(line) {
                        contents.push(line);
                    }
                }
            }
            contents
        });
        PlanLine { start, len, durable, state, contents }
    }
}

/// The durable image and the pending lines.
pub(super) struct Plan {
    pub(super) durable: Vec<u8>,
    pub(super) lines: Vec<PlanLine>,
}

impl Plan {
    /// Number of distinct images, if every line was enumerable and the product fits.
    fn combinations(&self) -> Option<u64> {
        self.lines
            .iter()
            .try_fold(1u64, |acc, l| acc.checked_mul(l.contents.as_ref()?.len() as u64))
    }

    fn image_with(&self, line_contents: impl Fn(usize) -> LineBytes) -> Vec<u8> {
        let mut image = self.durable.clone();
        for (i, line) in self.lines.iter().enumerate() {
            image[line.start..line.start + line.len].copy_from_slice(&line_contents(i)[..line.len]);
        }
        image
    }
}

enum Walk {
    /// Mixed-radix index of the next image; `None` when done.
    Exhaustive(Option<Vec<usize>>),
    Sampled(Sampler),
}

/// The images a crash can leave, one `Vec<u8>` of the whole region each. Collect them, or
/// iterate to keep one at a time.
pub struct PmemCrashImages {
    plan: Plan,
    combinations: Option<u64>,
    walk: Walk,
}

impl PmemCrashImages {
    pub(super) fn new(plan: Plan, options: &PmemCrashOptions) -> Self {
        let combinations = plan.combinations();
        let walk = match combinations {
            Some(n) if n <= options.images_max => Walk::Exhaustive(Some(vec![0; plan.lines.len()])),
            _ => Walk::Sampled(Sampler::new(options.seed, options.samples)),
        };
        PmemCrashImages { plan, combinations, walk }
    }

    /// Whether every possible image is (or was) produced.
    #[must_use]
    pub fn is_exhaustive(&self) -> bool {
        matches!(self.walk, Walk::Exhaustive(_))
    }

    /// Number of distinct images a crash can leave, when it could be counted (every line within
    /// `line_choices_max` and the product within `u64`).
    #[must_use]
    pub fn combinations(&self) -> Option<u64> {
        self.combinations
    }

    /// Pending lines (the others hold their durable bytes in every image).
    #[must_use]
    pub fn pending_line_count(&self) -> usize {
        self.plan.lines.len()
    }

    /// Sampler draws dropped as duplicates so far (0 when exhaustive).
    #[must_use]
    pub fn duplicates(&self) -> u64 {
        match &self.walk {
            Walk::Exhaustive(_) => 0,
            Walk::Sampled(s) => s.duplicates,
        }
    }
}

impl Iterator for PmemCrashImages {
    type Item = Vec<u8>;

    fn next(&mut self) -> Option<Vec<u8>> {
        match &mut self.walk {
            Walk::Exhaustive(next) => {
                let index = next.take()?;
                let lines = &self.plan.lines;
                let contents = |i: usize| match &lines[i].contents {
                    Some(c) => c[index[i]],
                    None => lines[i].durable, // unreachable: exhaustive needs every list
                };
                let image = self.plan.image_with(contents);
                *next = advance(index, lines);
                Some(image)
            }
            Walk::Sampled(sampler) => sampler.next_image(&self.plan),
        }
    }
}

/// The mixed-radix successor of `index`, or `None` after the last.
fn advance(mut index: Vec<usize>, lines: &[PlanLine]) -> Option<Vec<usize>> {
    for (i, line) in lines.iter().enumerate() {
        let radix = line.contents.as_ref().map_or(1, Vec::len);
        index[i] += 1;
        if index[i] < radix {
            return Some(index);
        }
        index[i] = 0;
    }
    None
}

/// Seeded draws of per-line choices.
struct Sampler {
    rng: fastrand::Rng,
    draws: u64,
    draws_max: u64,
    duplicates: u64,
    seen: HashSet<Vec<u8>>,
}

/// Strategies after the two fixed first draws.
const STRATEGY_COUNT: u64 = 3;

impl Sampler {
    fn new(seed: u64, draws_max: u64) -> Self {
        Sampler {
            rng: fastrand::Rng::with_seed(seed),
            draws: 0,
            draws_max,
            duplicates: 0,
            seen: HashSet::new(),
        }
    }

    fn next_image(&mut self, plan: &Plan) -> Option<Vec<u8>> {
        while self.draws < self.draws_max {
            let draw = self.draws;
            self.draws += 1;
            let lines = self.draw_lines(plan, draw);
            let delta: Vec<u8> = lines.iter().flat_map(|l| l.iter().copied()).collect();
            if self.seen.insert(delta) {
                return Some(plan.image_with(|i| lines[i]));
            }
            self.duplicates += 1;
        }
        None
    }

    /// The content of every pending line for draw number `draw`.
    fn draw_lines(&mut self, plan: &Plan, draw: u64) -> Vec<LineBytes> {
        let n = plan.lines.len();
        let whole = |l: &PlanLine| l.state.compose(&l.durable, l.state.cached.len(), |_| true);
        match draw {
            0 => plan.lines.iter().map(|l| l.durable).collect(),
            1 => plan.lines.iter().map(whole).collect(),
            _ => {
                let strategy = (draw - 2) % STRATEGY_COUNT;
                let special = if n == 0 { 0 } else { self.rng.usize(0..n) };
                let mut out = Vec::with_capacity(n);
                for (i, line) in plan.lines.iter().enumerate() {
                    out.push(match strategy {
                        0 => self.random(line),
                        1 if i == special => self.random(line),
                        1 => line.durable,
                        _ if i == special => self.random(line),
                        _ => whole(line),
                    });
                }
                out
            }
        }
    }

    fn random(&mut self, line: &PlanLine) -> LineBytes {
        let prefix = self.rng.usize(0..=line.state.cached.len());
        let present: Vec<bool> = (0..line.state.nt.len()).map(|_| self.rng.bool()).collect();
        line.state.compose(&line.durable, prefix, |i| present[i])
    }
}

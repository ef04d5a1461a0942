//! Post-crash images: options, the snapshot they are built from, the iterator and its report.
//!
//! Invariants:
//! - a [`Plan`] is a frozen snapshot: the iterator never looks at the device again;
//! - every image yielded is distinct from every other image the same iterator yielded
//!   (exhaustive: by construction, a product of per-block distinct contents; sampled: by an
//!   explicit set of deltas, hashes confirmed by byte comparison);
//! - once the iterator is exhausted, `images_yielded + duplicates_dropped == candidates`.

use std::collections::BTreeMap;

use tally_media::Image;

use super::enumerate::Exhaustive;
use super::fate::{BlockWrite, Content, Units};
use super::sample::Sampler;

/// How to build post-crash images.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrashOptions {
    /// Enumerate exhaustively when there are at most this many uncertain block writes.
    pub exhaustive_max: usize,
    /// …and when exhaustive enumeration yields at most this many images (tearing multiplies
    /// the count; beyond this bound the images are sampled instead).
    pub exhaustive_images_max: u64,
    /// Crash states drawn when sampling (duplicates among them are dropped, not redrawn).
    pub samples: usize,
    /// Seed of the sampler; `None` derives it from the device's seed.
    pub seed: Option<u64>,
    /// Whether a block write may be torn (some of its atomic units persisted, not all).
    pub tearing: bool,
    /// Granularity of tearing in bytes, never finer than the device's atomic write size.
    pub torn_unit: u32,
}

impl Default for CrashOptions {
    fn default() -> Self {
        CrashOptions {
            exhaustive_max: 12,
            exhaustive_images_max: 1 << 16,
            samples: 256,
            seed: None,
            tearing: false,
            torn_unit: 512,
        }
    }
}

/// What a [`CrashImages`] iterator did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CrashReport {
    /// Seed of the sampler (print it with any failure).
    pub seed: u64,
    /// Block writes whose fate a crash decides (cached and in flight).
    pub uncertain_writes: usize,
    /// Whether every combination of fates (and legal orders) is covered.
    pub exhaustive: bool,
    /// Crash states considered: fate combinations × orders (exhaustive, saturating, known at
    /// once) or draws made so far (sampled).
    pub candidates: u64,
    /// Distinct images yielded so far.
    pub images_yielded: u64,
    /// Candidates whose image equalled one already yielded (exhaustive: known at once).
    pub duplicates_dropped: u64,
}

/// The uncertain writes touching one block, with the block's durable content.
#[derive(Debug, Clone)]
pub(crate) struct Group {
    /// The block.
    pub(crate) block: u64,
    /// Its durable content.
    pub(crate) base: Content,
    /// Indices into [`Plan::writes`], in issue order.
    pub(crate) members: Vec<usize>,
}

/// A frozen snapshot of a device's uncertain state.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// The durable image.
    pub(crate) durable: Image,
    /// Uncertain block writes in issue order.
    pub(crate) writes: Vec<BlockWrite>,
    /// The data of each write, hashed once.
    pub(crate) contents: Vec<Content>,
    /// Affected blocks in block order.
    pub(crate) groups: Vec<Group>,
    /// Tearing granularity.
    pub(crate) units: Units,
}

impl Plan {
    /// Snapshot `writes` (uncertain, issue order) over `durable`.
    pub(crate) fn new(durable: Image, writes: Vec<BlockWrite>, options: &CrashOptions) -> Self {
        let geometry = durable.geometry();
        let units = Units::new(
            geometry.block_size,
            geometry.atomic_write_size,
            options.torn_unit,
            options.tearing,
        );
        let mut by_block: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        for (i, w) in writes.iter().enumerate() {
            by_block.entry(w.block).or_default().push(i);
        }
        let mut groups = Vec::with_capacity(by_block.len());
        for (block, members) in by_block {
            let base = Content::new(durable.block(block).into());
            groups.push(Group { block, base, members });
        }
        let contents = writes.iter().map(|w| Content::new(w.data.clone())).collect();
        Plan { durable, writes, contents, groups, units }
    }

    /// The durable image with `delta` (block, content) applied.
    pub(crate) fn image_with(&self, delta: &[(u64, Content)]) -> Image {
        let mut image = self.durable.clone();
        for (block, content) in delta {
            image.set_block(*block, content.data.clone());
        }
        image
    }
}

/// Iterator over the distinct post-crash images of a device at one moment.
pub struct CrashImages {
    plan: Plan,
    mode: Mode,
    report: CrashReport,
}

enum Mode {
    Exhaustive(Exhaustive),
    Sampled(Sampler),
}

impl CrashImages {
    /// Choose exhaustive or sampled mode for `plan`.
    pub(crate) fn new(plan: Plan, options: &CrashOptions, seed: u64) -> Self {
        let uncertain_writes = plan.writes.len();
        let exhaustive = if uncertain_writes <= options.exhaustive_max {
            Exhaustive::new(&plan, options.exhaustive_images_max)
        } else {
            None
        };
        let mut report = CrashReport { seed, uncertain_writes, ..CrashReport::default() };
        let mode = match exhaustive {
            Some(e) => {
                report.exhaustive = true;
                report.candidates = e.candidates();
                report.duplicates_dropped = e.candidates().saturating_sub(e.image_count());
                Mode::Exhaustive(e)
            }
            None => Mode::Sampled(Sampler::new(seed, options.samples)),
        };
        CrashImages { plan, mode, report }
    }

    /// What was done so far (complete once the iterator returned `None`).
    #[must_use]
    pub fn report(&self) -> CrashReport {
        self.report
    }

    /// The image a crash leaves if every uncertain write is lost.
    #[must_use]
    pub fn durable_image(&self) -> &Image {
        &self.plan.durable
    }
}

impl Iterator for CrashImages {
    type Item = Image;

    fn next(&mut self) -> Option<Image> {
        let image = match &mut self.mode {
            Mode::Exhaustive(e) => e.next_image(&self.plan)?,
            Mode::Sampled(s) => {
                let image = s.next_image(&self.plan);
                self.report.candidates = s.draws();
                self.report.duplicates_dropped = s.duplicates();
                image?
            }
        };
        self.report.images_yielded += 1;
        Some(image)
    }
}

impl std::fmt::Debug for CrashImages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CrashImages({:?})", self.report)
    }
}

//! The medium the file-system explorer runs on: the block crash simulator ([`CrashDevice`]) or
//! persistent memory on the cache-line simulator ([`PmemSimDevice`]). Everything else — the
//! workloads, the model, the invariants — is the same for both.
//!
//! On persistent memory the crash points are the states before every line flush and every
//! fence inside an operation (the device records them), plus the state after it; a point's
//! images are drawn from [`crate::PmemSim`]'s crash model (any prefix of each line's cached
//! stores, any subset of its non-temporal words). Recovery itself runs on a fresh
//! [`PmemSimDevice`] that records too, so the I6 images of a crash inside recovery are drawn
//! from the points before its fences.

use std::sync::Arc;

use tally_media::pmem::{BlockMutant, BlockView};
use tally_media::{Device, Geometry, Image};

use crate::pmem::bytes_image;
use crate::{
    CrashConfig, CrashDevice, CrashOptions, CrashPoint, FaultPlan, PmemCrashOptions,
    PmemCrashPoint, PmemSimDevice, RecordingDevice,
};

/// What the workloads run on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Medium {
    /// A block device with a volatile write cache, blocks torn at 512-byte sectors.
    #[default]
    Block,
    /// Persistent memory: cache lines, 8-byte failure-atomic words, flushes and fences.
    Pmem,
}

impl Medium {
    /// The medium's name on the command line.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Medium::Block => "block",
            Medium::Pmem => "pmem",
        }
    }

    /// The medium called `name`.
    #[must_use]
    pub fn from_name(name: &str) -> Option<Self> {
        [Medium::Block, Medium::Pmem].into_iter().find(|m| m.name() == name)
    }
}

/// The block protocol the explorer runs on persistent memory: writes of four blocks or more are
/// copied non-temporally, smaller ones (log units with the data of a small operation) through
/// the cache with their lines written back, so both paths of the protocol are crashed. (With
/// single blocks cached only, the cached path saw little but units whose last line is zero
/// padding, and a flush skipping that line went unseen.)
#[must_use]
pub fn explorer_view(block_size: u32, mutant: Option<BlockMutant>) -> BlockView {
    BlockView { nt_copy_min: 4 * block_size, mutant }
}

/// The device a workload runs on, recording crash points inside operations.
#[derive(Clone)]
pub(crate) enum Recorder {
    Block(Arc<RecordingDevice>),
    Pmem(Arc<PmemSimDevice>),
}

/// A frozen crash state on either medium.
pub(crate) enum Point {
    Block(CrashPoint),
    Pmem(PmemCrashPoint),
}

impl Recorder {
    pub(crate) fn new(medium: Medium, image: &Image, seed: u64, view: BlockView) -> Self {
        match medium {
            Medium::Block => Recorder::Block(RecordingDevice::new(CrashDevice::from_image(
                image.clone(),
                CrashConfig::with_seed(seed),
            ))),
            Medium::Pmem => Recorder::Pmem(Arc::new(PmemSimDevice::from_image(image, view))),
        }
    }

    pub(crate) fn device(&self) -> Arc<dyn Device> {
        match self {
            Recorder::Block(d) => d.clone(),
            Recorder::Pmem(d) => d.clone(),
        }
    }

    pub(crate) fn set_recording(&self, on: bool) {
        match self {
            Recorder::Block(d) => d.set_recording(on),
            Recorder::Pmem(d) => d.set_recording(on),
        }
    }

    pub(crate) fn take_points(&self) -> Vec<Point> {
        match self {
            Recorder::Block(d) => d.take_points().into_iter().map(Point::Block).collect(),
            Recorder::Pmem(d) => d.take_points().into_iter().map(Point::Pmem).collect(),
        }
    }

    /// A process crash: every write in flight completes (into the volatile cache; the device
    /// keeps it). Persistent memory has nothing in flight: its stores are already in the
    /// simulated caches, which a process crash leaves as they are.
    pub(crate) fn complete_all(&self) {
        match self {
            Recorder::Block(d) => d.inner().complete_all(),
            Recorder::Pmem(_) => {}
        }
    }

    pub(crate) fn point_now(&self) -> Point {
        match self {
            Recorder::Block(d) => Point::Block(d.inner().crash_point()),
            Recorder::Pmem(d) => Point::Pmem(d.crash_point()),
        }
    }
}

/// The images of one pass at a point, and whether the pass was exhaustive.
pub(crate) struct Pass {
    pub(crate) images: Vec<Image>,
    pub(crate) exhaustive: bool,
    /// The untorn pass of a block point (its exhaustiveness is what `all_exhaustive` reports);
    /// every pmem pass counts.
    pub(crate) primary: bool,
}

/// The passes at `point`: untorn then torn images on a block device; one pass of cache-line
/// images on persistent memory, `samples + torn_samples` draws when too many to enumerate.
pub(crate) fn passes(
    point: &Point,
    geometry: Geometry,
    samples: usize,
    torn_samples: usize,
    seed: u64,
) -> Vec<Pass> {
    match point {
        Point::Block(point) => {
            let untorn = CrashOptions {
                tearing: false,
                samples,
                exhaustive_images_max: 4096,
                seed: Some(seed),
                ..CrashOptions::default()
            };
            let mut options = vec![untorn];
            if torn_samples > 0 {
                options.push(CrashOptions {
                    tearing: true,
                    samples: torn_samples,
                    exhaustive_images_max: torn_samples as u64,
                    seed: Some(seed),
                    ..CrashOptions::default()
                });
            }
            options
                .into_iter()
                .enumerate()
                .map(|(i, o)| {
                    let mut images = point.crash_images(o);
                    let list: Vec<Image> = images.by_ref().collect();
                    Pass { images: list, exhaustive: images.report().exhaustive, primary: i == 0 }
                })
                .collect()
        }
        Point::Pmem(point) => {
            let options = PmemCrashOptions {
                images_max: 4096,
                line_choices_max: 4096,
                samples: (samples + torn_samples) as u64,
                seed,
            };
            let images = point.crash_images(&options);
            let exhaustive = images.is_exhaustive();
            let list = images.map(|bytes| bytes_image(&bytes, geometry)).collect();
            vec![Pass { images: list, exhaustive, primary: true }]
        }
    }
}

/// Images whose recovery a power-loss choice tries, at most.
const CUT_TRIES_MAX: usize = 64;

/// Half the time, the index of an image of `images` (among the first [`CUT_TRIES_MAX`] in an
/// order drawn from `rng`) whose recovery cuts a transaction for a lost dependency: the state
/// that leaves a cut transaction on the media for later generations to trip over. A
/// multi-generation power loss takes it when there is one, else an image drawn uniformly.
pub(crate) fn cutting_image(
    images: &[Image],
    rng: &mut fastrand::Rng,
    options: tally_log::OpenOptions,
) -> Option<usize> {
    if !rng.bool() {
        return None;
    }
    let mut order: Vec<usize> = (0..images.len()).collect();
    rng.shuffle(&mut order);
    order.into_iter().take(CUT_TRIES_MAX).find(|&i| {
        let dev = Arc::new(tally_media::MemDevice::from_image(images[i].clone()));
        let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            tally_log::Log::open(dev, options)
        }));
        matches!(opened, Ok(Ok((_, rec))) if rec.streams.iter().any(|s| s.cut_by_dependency > 0))
    })
}

/// A judged image mounted on its medium, with what a later check needs.
pub(crate) enum Mounted {
    Block(Arc<CrashDevice>),
    Pmem(Arc<PmemSimDevice>),
}

impl Mounted {
    /// A device holding `image` as its durable contents; on persistent memory it records the
    /// crash points of the recovery about to run on it.
    pub(crate) fn new(medium: Medium, image: &Image, seed: u64, view: BlockView) -> Self {
        match medium {
            Medium::Block => Mounted::Block(Arc::new(CrashDevice::from_image(
                image.clone(),
                CrashConfig::with_seed(seed),
            ))),
            Medium::Pmem => {
                let dev = Arc::new(PmemSimDevice::from_image(image, view));
                dev.set_recording(true);
                Mounted::Pmem(dev)
            }
        }
    }

    pub(crate) fn device(&self) -> Arc<dyn Device> {
        match self {
            Mounted::Block(d) => d.clone(),
            Mounted::Pmem(d) => d.clone(),
        }
    }

    /// What survives a crash that keeps nothing pending.
    pub(crate) fn durable_image(&self) -> Image {
        match self {
            Mounted::Block(d) => d.durable_image(),
            Mounted::Pmem(d) => d.durable_image(),
        }
    }

    /// Images of a crash right after the recovery that ran on this device, and of one inside
    /// it (at most `max` each), to be mounted again for I6. Call once, after the mount.
    ///
    /// Block: inside = a second recovery whose first flush fails, its crash images. Pmem:
    /// inside = images drawn at the points recorded before the recovery's flushes and fences.
    pub(crate) fn recovery_crash_images(
        &self,
        image: &Image,
        max: usize,
        seed: u64,
        mount: impl Fn(Arc<dyn Device>),
    ) -> Vec<(Image, &'static str)> {
        match self {
            Mounted::Block(dev) => {
                let options =
                    CrashOptions { tearing: false, samples: max, ..CrashOptions::default() };
                let inside = Arc::new(CrashDevice::from_image(
                    image.clone(),
                    CrashConfig {
                        faults: FaultPlan { flush_eio_nth: Some(1), ..FaultPlan::none() },
                        ..CrashConfig::with_seed(seed)
                    },
                ));
                mount(inside.clone());
                let after = dev.crash_images(options.clone()).take(max);
                let during = inside.crash_images(options).take(max);
                after.map(|i| (i, "right after")).chain(during.map(|i| (i, "inside"))).collect()
            }
            Mounted::Pmem(dev) => {
                let points = dev.take_points();
                let geometry = dev.geometry();
                let mut out = vec![(dev.durable_image(), "right after")];
                // Spread the draws over the recovery's points, newest first (the most written).
                let per_point = max.div_ceil(points.len().max(1)).max(2) as u64;
                for (k, point) in points.iter().rev().enumerate() {
                    let options = PmemCrashOptions {
                        images_max: per_point,
                        line_choices_max: 4096,
                        samples: per_point,
                        seed: seed ^ (k as u64).rotate_left(17),
                    };
                    // Draw 0 is the durable image, already there.
                    for bytes in point.crash_images(&options).skip(1) {
                        if out.len() > max {
                            return out;
                        }
                        out.push((bytes_image(&bytes, geometry), "inside"));
                    }
                }
                out
            }
        }
    }
}

//! `CrashDevice`: a simulated disk with a volatile write cache, whose crashes can be enumerated.
//!
//! # Fault model
//!
//! **State.** A durable image (what the media holds), a volatile cache of *completed* block
//! writes in completion order, and the *in-flight* block writes (submitted, not completed).
//! Every multi-block [`Write`] is split into one write per block: a device may persist any
//! subset of a multi-block request.
//!
//! **Completion.** `submit` puts writes in flight and returns a ticket; the simulator decides
//! when they complete. `wait(t)` completes `t` (its writes in issue order). Under
//! [`CompletionPolicy::Shuffle`] it first completes a seeded-random subset of the other
//! in-flight submissions in random order (out-of-order completion); under
//! [`CompletionPolicy::InOrder`] it completes only `t`. [`CrashDevice::complete_all`] and
//! [`CrashDevice::complete_some`] complete submissions without waiting.
//!
//! **Durability.** `flush` applies the cache, in completion order, to the durable image: it
//! covers exactly the writes completed before it was called (the simulator completes nothing
//! during a flush); in-flight writes stay uncertain. A FUA write becomes durable when it
//! completes, not when it is submitted, and supersedes the cached writes to its block (they
//! completed earlier, so none of them can land after it).
//!
//! **Reads** return the newest completed content: the durable image overlaid with the cache in
//! completion order. They never see in-flight writes. A real device may return either the old
//! or the new content of a block with a write in flight, so callers must not read such blocks;
//! [`CrashDevice::reads_of_in_flight`] counts reads that did.
//!
//! **Crash.** Every cached or in-flight block write is independently *absent*, *whole*, or —
//! only when [`CrashOptions::tearing`] is on — *torn*: a non-empty strict subset of its atomic
//! units persisted (units of [`CrashOptions::torn_unit`] bytes, never finer than the geometry's
//! `atomic_write_size`; a block no larger than the atomic size never tears). Present writes to
//! one block land in an order that respects *precedence*: `x` lands before `y` if `x`
//! completed before `y` was submitted, or both completed and `x` completed first. Writes in
//! flight together are unordered, so when two present in-flight writes hit one block both
//! orders are produced; writes to distinct blocks commute.
//!
//! **Enumeration** ([`CrashDevice::crash_images`]) is exhaustive when there are at most
//! [`CrashOptions::exhaustive_max`] uncertain block writes and the distinct images number at
//! most [`CrashOptions::exhaustive_images_max`]. Exhaustive torn fates are limited to the
//! prefixes and suffixes of `k` units, `k` in `1..n`: a tear in the middle of a block, or one
//! keeping scattered units, is reached only by sampling. Beyond the bounds, `samples` crash
//! states are drawn by seed (see `sample.rs`). Identical images are yielded once.
//!
//! **Faults** ([`FaultPlan`], set at construction or with [`CrashDevice::set_faults`]): EIO on
//! the N-th write request (it never lands; its submission fails at `wait`), on the N-th flush
//! (nothing is made durable by it: the writes it would have covered stay uncertain, so after a
//! crash each of them may or may not be there — a failed flush tells the caller nothing about
//! them), or on the N-th read; a flipped bit in the buffer of the N-th read or of random reads
//! (the media is not changed); `ignore_flushes` (flushes succeed and do nothing). After a failed
//! write or flush the device is fail-stop: `submit` and `flush` return
//! [`MediaError::Failed`](tally_media::MediaError::Failed);
//! reads, waits and crash enumeration still work. The write failure takes effect when its
//! submission completes, which is when a real backend would see it.
//!
//! **Determinism.** One `u64` seed ([`CrashConfig::seed`]) drives completion order and bit
//! flips, and by default the crash sampler. A test that fails on a crash image must print
//! [`CrashDevice::seed`] and [`CrashReport::seed`] so the run can be replayed.
//!
//! Counters follow [`tally_media::Counters`]; `submit_syscalls` stays 0 (nothing is a system
//! call here).

mod crash;
mod enumerate;
mod fate;
mod fault;
mod recording;
mod sample;
mod state;

use std::sync::{Mutex, MutexGuard, PoisonError};

use tally_media::{
    Counters, Device, DeviceStats, Geometry, Image, Result, Ticket, Write, WriteFlags,
};

pub use crash::{CrashImages, CrashOptions, CrashReport};
pub use fault::FaultPlan;
pub use recording::RecordingDevice;

use crash::Plan;
use state::State;

/// When in-flight writes complete.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CompletionPolicy {
    /// `wait(t)` completes only `t`.
    #[default]
    InOrder,
    /// `wait(t)` first completes a seeded-random subset of the other in-flight submissions, in
    /// random order, then `t`.
    Shuffle,
}

/// How a [`CrashDevice`] behaves.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CrashConfig {
    /// Drives every random choice of the device.
    pub seed: u64,
    /// When in-flight writes complete.
    pub completion: CompletionPolicy,
    /// Faults to inject from the start.
    pub faults: FaultPlan,
}

impl CrashConfig {
    /// In-order completion, no faults, the given seed.
    #[must_use]
    pub fn with_seed(seed: u64) -> Self {
        CrashConfig { seed, ..CrashConfig::default() }
    }
}

/// A device with a volatile write cache whose possible post-crash images can be enumerated.
pub struct CrashDevice {
    geometry: Geometry,
    seed: u64,
    completion: CompletionPolicy,
    state: Mutex<State>,
    counters: Counters,
}

impl CrashDevice {
    /// An all-zero device.
    #[must_use]
    pub fn new(geometry: Geometry, config: CrashConfig) -> Self {
        Self::from_image(Image::new(geometry), config)
    }

    /// A device whose durable contents are `image` (e.g. a post-crash image, to test
    /// recovery and a second crash during it).
    #[must_use]
    pub fn from_image(image: Image, config: CrashConfig) -> Self {
        CrashDevice {
            geometry: image.geometry(),
            seed: config.seed,
            completion: config.completion,
            state: Mutex::new(State::new(image, config.faults, config.seed)),
            counters: Counters::default(),
        }
    }

    /// The seed driving this device; print it with any failure.
    #[must_use]
    pub fn seed(&self) -> u64 {
        self.seed
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic under the lock leaves the state consistent at block-write granularity (each
        // step is a push, a drain or a whole-block store), so keep serving it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Replace the fault plan; occurrences keep counting from the device's creation.
    pub fn set_faults(&self, faults: FaultPlan) {
        self.lock().faults = faults;
    }

    /// The current fault plan.
    #[must_use]
    pub fn faults(&self) -> FaultPlan {
        self.lock().faults.clone()
    }

    /// Whether a write or flush failed (fail-stop).
    #[must_use]
    pub fn is_failed(&self) -> bool {
        self.lock().failed.is_some()
    }

    /// Complete every in-flight submission, in submission order.
    pub fn complete_all(&self) {
        let mut state = self.lock();
        for ticket in state.in_flight_tickets() {
            // The ticket came from the device itself, so it is known.
            let completed = state.complete(ticket);
            debug_assert!(completed.is_ok());
        }
    }

    /// Complete each in-flight submission with probability 1/2, in an order drawn from `rng`.
    pub fn complete_some(&self, rng: &mut fastrand::Rng) {
        let completed = self.lock().complete_random(rng, None);
        debug_assert!(completed.is_ok());
    }

    /// Block writes in flight (submitted, not completed).
    #[must_use]
    pub fn in_flight_count(&self) -> usize {
        self.lock().in_flight.len()
    }

    /// Block writes whose fate a crash decides: cached and in flight.
    #[must_use]
    pub fn uncertain_count(&self) -> usize {
        let state = self.lock();
        state.cache.len() + state.in_flight.len()
    }

    /// Reads that touched a block with a write in flight (a caller bug: see the fault model).
    #[must_use]
    pub fn reads_of_in_flight(&self) -> u64 {
        self.lock().reads_of_in_flight
    }

    /// What survives a crash that loses every uncertain write.
    #[must_use]
    pub fn durable_image(&self) -> Image {
        self.lock().durable.clone()
    }

    /// Every write applied whole: the cache in completion order, then in-flight writes in
    /// issue order.
    #[must_use]
    pub fn volatile_image(&self) -> Image {
        self.lock().volatile_image()
    }

    /// The distinct images a crash now could leave (exhaustive or sampled; see the module
    /// documentation). The iterator works on a snapshot and does not hold the device.
    #[must_use]
    pub fn crash_images(&self, options: CrashOptions) -> CrashImages {
        self.crash_point().crash_images(options)
    }

    /// The device's state at this instant, frozen: what a crash right now could leave, to be
    /// enumerated later (e.g. at every device operation inside one call of the layer above).
    #[must_use]
    pub fn crash_point(&self) -> CrashPoint {
        let state = self.lock();
        CrashPoint { durable: state.durable.clone(), uncertain: state.uncertain(), seed: self.seed }
    }
}

/// A frozen crash state of a [`CrashDevice`]: its durable image and its uncertain writes.
#[derive(Debug, Clone)]
pub struct CrashPoint {
    durable: Image,
    uncertain: Vec<fate::BlockWrite>,
    seed: u64,
}

impl CrashPoint {
    /// The distinct images a crash at this point can leave (see [`CrashDevice::crash_images`]).
    #[must_use]
    pub fn crash_images(&self, options: CrashOptions) -> CrashImages {
        let plan = Plan::new(self.durable.clone(), self.uncertain.clone(), &options);
        let seed = options.seed.unwrap_or_else(|| derive_sampler_seed(self.seed));
        CrashImages::new(plan, &options, seed)
    }

    /// What survives if a crash at this point loses every uncertain write: the worst case for
    /// anything acknowledged as durable.
    #[must_use]
    pub fn durable_image(&self) -> &Image {
        &self.durable
    }

    /// Uncertain block writes at this point.
    #[must_use]
    pub fn uncertain_count(&self) -> usize {
        self.uncertain.len()
    }
}

/// The sampler's default seed: a fixed function of the device seed, decorrelated from the
/// device's own random stream.
fn derive_sampler_seed(seed: u64) -> u64 {
    (seed ^ 0x5851_F42D_4C95_7F2D).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

impl Device for CrashDevice {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn read(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        self.lock().read(block, buf, &self.counters)
    }

    fn submit(&self, writes: Vec<Write>, flags: WriteFlags) -> Result<Ticket> {
        self.lock().submit(writes, flags, &self.counters)
    }

    fn wait(&self, ticket: Ticket) -> Result<()> {
        let mut state = self.lock();
        if state.is_in_flight(ticket)? {
            if self.completion == CompletionPolicy::Shuffle {
                let mut rng = state.rng.clone();
                state.complete_random(&mut rng, Some(ticket))?;
                state.rng = rng;
            }
            state.complete(ticket)?;
        }
        state.outcome(ticket)
    }

    fn flush(&self) -> Result<()> {
        self.lock().flush(&self.counters)
    }

    fn stats(&self) -> DeviceStats {
        self.counters.snapshot()
    }
}

impl std::fmt::Debug for CrashDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CrashDevice(seed {}, {:?})", self.seed, self.geometry)
    }
}

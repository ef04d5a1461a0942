//! `PmemSim`: a persistent-memory region whose crashes can be enumerated at cache-line
//! granularity.
//!
//! # Crash model
//!
//! **State.** A region of `len` bytes: a durable image, and for each 64-byte line the stores
//! not yet durable. Every store is cut into *pieces*, one per aligned 8-byte word it touches,
//! in ascending address order.
//!
//! **Operations.**
//! - `store(off, bytes)`: cached stores. Each piece joins its line's *cached queue*.
//! - `store_u64_atomic(off, v)`: one aligned 8-byte store (one piece); `off % 8 != 0` is refused.
//! - `store_nt(off, bytes)`: non-temporal stores. Each piece joins its line's *NT set*.
//! - `flush(off, len)`: for every line overlapping the range, marks the cached pieces queued so
//!   far as flushed (`clwb`). It makes nothing durable by itself.
//! - `fence()`: for every line, the flushed cached pieces and all NT pieces become durable; the
//!   cached pieces stored after the line's last flush stay pending.
//! - `read` sees every store (the program's view); `durable_image()` is the crash that keeps
//!   nothing pending; `volatile_image()` the crash that keeps everything.
//!
//! **A crash** leaves, independently for each line: a *prefix* of its cached queue (stores to
//! one line persist in program order, so a later store is never durable without the earlier
//! ones) and *any subset* of its NT pieces (write-combining buffers drain in any order). The
//! chosen pieces are applied to the durable bytes in program order. Hence:
//! - an aligned 8-byte word is never torn (a piece lies in one word);
//! - a store larger than a word can tear at word boundaries, within a line only as a prefix in
//!   address order (the model assumes a forward copy), across lines in any combination;
//! - different lines are unordered until flushed and fenced: a flush without a fence leaves the
//!   line as uncertain as before.
//!
//! **Cached and NT stores to one word.** An NT store to a word with a pending cached store is
//! ordered after it (x86 evicts a cached line before a non-temporal store to it): at the fence
//! that makes the NT piece durable, the older cached bytes it covers are dropped. A cached store
//! to a word with a pending (unfenced) NT store is refused with [`PmemError::Unmodelled`]:
//! whether the write-combining buffer or the cache lands last is not defined here, and a correct
//! program fences its NT data before touching it again.
//!
//! **Enumeration** ([`PmemSim::crash_images`]): exhaustive when every line has at most
//! [`PmemCrashOptions::line_choices_max`] (prefix, subset) choices and the distinct images
//! number at most [`PmemCrashOptions::images_max`]; else [`PmemCrashOptions::samples`] draws
//! from [`PmemCrashOptions::seed`] (see `images.rs`). Images are distinct; the first is the
//! durable image. `docs/PMEM-CRASH-MODEL.md` states the same model with examples.

mod device;
mod images;
mod line;

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use tally_media::pmem::{check_range, Pmem, PmemError, LINE_SIZE, WORD_SIZE};

pub use device::{bytes_image, image_bytes, PmemSimDevice};
pub use images::{PmemCrashImages, PmemCrashOptions};

use images::{Plan, PlanLine};
use line::{LineBytes, LineState};

/// What a [`PmemSim`] was asked to do so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PmemSimStats {
    /// Cached store calls (including atomic ones).
    pub stores: u64,
    /// Non-temporal store calls.
    pub nt_stores: u64,
    /// Lines named by flushes.
    pub lines_flushed: u64,
    /// Fences.
    pub fences: u64,
}

struct State {
    durable: Vec<u8>,
    /// Durable bytes with every pending store applied: what reads return.
    volatile: Vec<u8>,
    /// Pending stores by line index; lines with nothing pending are absent.
    lines: BTreeMap<u64, LineState>,
    seq: u64,
    stats: PmemSimStats,
}

/// A simulated persistent-memory region. See the module documentation for its crash model.
pub struct PmemSim {
    len: u64,
    state: Mutex<State>,
}

impl PmemSim {
    /// An all-zero region of `len` bytes.
    #[must_use]
    pub fn new(len: usize) -> Self {
        Self::from_image(vec![0; len])
    }

    /// A region whose durable contents are `image`, nothing pending (e.g. a crash image, to
    /// run recovery on).
    #[must_use]
    pub fn from_image(image: Vec<u8>) -> Self {
        PmemSim {
            len: image.len() as u64,
            state: Mutex::new(State {
                volatile: image.clone(),
                durable: image,
                lines: BTreeMap::new(),
                seq: 0,
                stats: PmemSimStats::default(),
            }),
        }
    }

    /// Size of the region.
    #[must_use]
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the region has no bytes.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Cached stores of `bytes` at `off`.
    ///
    /// # Errors
    /// [`PmemError::OutOfRange`]; [`PmemError::Unmodelled`] when a byte has a pending
    /// non-temporal store. Nothing is stored then.
    pub fn store(&self, off: u64, bytes: &[u8]) -> Result<(), PmemError> {
        check_range(off, bytes.len(), self.len)?;
        let mut state = self.lock();
        let pieces = line::split(off, bytes, state.seq);
        for (line, piece) in &pieces {
            if state.lines.get(line).is_some_and(|l| l.nt_overlaps(piece)) {
                let off = line * LINE_SIZE + u64::from(piece.word) * WORD_SIZE;
                let reason = "cached store to a word with an unfenced non-temporal store";
                return Err(PmemError::Unmodelled { off, reason });
            }
        }
        state.stats.stores += 1;
        state.apply_volatile(off, bytes);
        for (line, piece) in pieces {
            state.lines.entry(line).or_default().cached.push(piece);
        }
        Ok(())
    }

    /// One aligned 8-byte cached store of `value`, little-endian: never torn.
    ///
    /// # Errors
    /// [`PmemError::Misaligned`], and as [`PmemSim::store`].
    pub fn store_u64_atomic(&self, off: u64, value: u64) -> Result<(), PmemError> {
        if !off.is_multiple_of(WORD_SIZE) {
            return Err(PmemError::Misaligned { off, align: WORD_SIZE });
        }
        self.store(off, &value.to_le_bytes())
    }

    /// Non-temporal stores of `bytes` at `off`: durable at the next fence.
    ///
    /// # Errors
    /// [`PmemError::OutOfRange`].
    pub fn store_nt(&self, off: u64, bytes: &[u8]) -> Result<(), PmemError> {
        check_range(off, bytes.len(), self.len)?;
        let mut state = self.lock();
        let pieces = line::split(off, bytes, state.seq);
        state.stats.nt_stores += 1;
        state.apply_volatile(off, bytes);
        for (line, piece) in pieces {
            state.lines.entry(line).or_default().nt.push(piece);
        }
        Ok(())
    }

    /// Flush (`clwb`) every line overlapping `len` bytes at `off`.
    ///
    /// # Errors
    /// [`PmemError::OutOfRange`].
    pub fn flush(&self, off: u64, len: u64) -> Result<(), PmemError> {
        let len_usize = usize::try_from(len).map_err(|_| PmemError::OutOfRange {
            off,
            len,
            region_len: self.len,
        })?;
        check_range(off, len_usize, self.len)?;
        if len == 0 {
            return Ok(());
        }
        let mut state = self.lock();
        let (first, last) = (off / LINE_SIZE, (off + len - 1) / LINE_SIZE);
        state.stats.lines_flushed += last - first + 1;
        for (_, line) in state.lines.range_mut(first..=last) {
            line.flushed = line.cached.len();
        }
        Ok(())
    }

    /// Fence: flushed lines and non-temporal stores become durable.
    pub fn fence(&self) {
        let mut state = self.lock();
        state.stats.fences += 1;
        let State { durable, lines, .. } = &mut *state;
        for (&index, line) in lines.iter_mut() {
            let (start, end) = line_bounds(index, self.len);
            let mut bytes = line_bytes(durable, start, end);
            line.fence(&mut bytes);
            durable[start..end].copy_from_slice(&bytes[..end - start]);
        }
        lines.retain(|_, line| !line.is_empty());
    }

    /// Copy `buf.len()` bytes at `off`: the program's view, every store included.
    ///
    /// # Errors
    /// [`PmemError::OutOfRange`].
    pub fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), PmemError> {
        let (start, end) = check_range(off, buf.len(), self.len)?;
        buf.copy_from_slice(&self.lock().volatile[start..end]);
        Ok(())
    }

    /// The image a crash leaves when nothing pending persists.
    #[must_use]
    pub fn durable_image(&self) -> Vec<u8> {
        self.lock().durable.clone()
    }

    /// The image a crash leaves when everything pending persists (equal to what reads see).
    #[must_use]
    pub fn volatile_image(&self) -> Vec<u8> {
        self.lock().volatile.clone()
    }

    /// Lines with stores not yet durable.
    #[must_use]
    pub fn pending_line_count(&self) -> usize {
        self.lock().lines.len()
    }

    /// Counters so far.
    #[must_use]
    pub fn stats(&self) -> PmemSimStats {
        self.lock().stats
    }

    /// The images a crash now could leave: every one when few enough, else a seeded sample.
    /// The simulator's state is unchanged.
    #[must_use]
    pub fn crash_images(&self, options: &PmemCrashOptions) -> PmemCrashImages {
        self.crash_point().crash_images(options)
    }

    /// The simulator's state at this instant, frozen: what a crash right now could leave, to be
    /// enumerated later (e.g. before every fence inside one operation of the layer above).
    #[must_use]
    pub fn crash_point(&self) -> PmemCrashPoint {
        let state = self.lock();
        PmemCrashPoint {
            durable: state.durable.clone(),
            lines: state.lines.iter().map(|(&i, l)| (i, l.clone())).collect(),
            len: self.len,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves a consistent state (every method mutates only
        // after its checks), so keep serving.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl State {
    fn apply_volatile(&mut self, off: u64, bytes: &[u8]) {
        // Callers checked the range; the store's sequence number moves on.
        let start = off as usize;
        self.volatile[start..start + bytes.len()].copy_from_slice(bytes);
        self.seq += 1;
    }
}

/// A frozen crash state of a [`PmemSim`]: its durable bytes and its pending lines.
#[derive(Debug, Clone)]
pub struct PmemCrashPoint {
    durable: Vec<u8>,
    lines: Vec<(u64, LineState)>,
    len: u64,
}

impl PmemCrashPoint {
    /// The distinct images a crash at this point can leave (see [`PmemSim::crash_images`]).
    #[must_use]
    pub fn crash_images(&self, options: &PmemCrashOptions) -> PmemCrashImages {
        let lines = self
            .lines
            .iter()
            .map(|(index, line)| {
                let (start, end) = line_bounds(*index, self.len);
                let durable = line_bytes(&self.durable, start, end);
                PlanLine::new(start, end - start, durable, line.clone(), options.line_choices_max)
            })
            .collect();
        PmemCrashImages::new(Plan { durable: self.durable.clone(), lines }, options)
    }

    /// What survives if a crash at this point keeps nothing pending.
    #[must_use]
    pub fn durable_image(&self) -> &[u8] {
        &self.durable
    }

    /// Lines with stores not yet durable at this point.
    #[must_use]
    pub fn pending_line_count(&self) -> usize {
        self.lines.len()
    }
}

/// Byte bounds of line `index` inside a region of `len` bytes.
fn line_bounds(index: u64, len: u64) -> (usize, usize) {
    let start = index * LINE_SIZE;
    let end = (start + LINE_SIZE).min(len);
    // Lines come from checked ranges of an in-memory region, so both fit in usize.
    (start as usize, end as usize)
}

/// The bytes of `image[start..end]` as a line, zero-padded.
fn line_bytes(image: &[u8], start: usize, end: usize) -> LineBytes {
    let mut bytes = [0u8; LINE_SIZE as usize];
    bytes[..end - start].copy_from_slice(&image[start..end]);
    bytes
}

impl Pmem for PmemSim {
    fn len(&self) -> u64 {
        self.len
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), PmemError> {
        PmemSim::read(self, off, buf)
    }
    fn write(&self, off: u64, bytes: &[u8]) -> Result<(), PmemError> {
        self.store(off, bytes)
    }
    fn memcpy_nt(&self, off: u64, src: &[u8]) -> Result<(), PmemError> {
        self.store_nt(off, src)
    }
    fn store_u64_atomic(&self, off: u64, value: u64) -> Result<(), PmemError> {
        PmemSim::store_u64_atomic(self, off, value)
    }
    fn flush(&self, off: u64, len: u64) -> Result<(), PmemError> {
        PmemSim::flush(self, off, len)
    }
    fn fence(&self) {
        PmemSim::fence(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn images(sim: &PmemSim) -> Vec<Vec<u8>> {
        let all = sim.crash_images(&PmemCrashOptions::default());
        assert!(all.is_exhaustive());
        all.collect()
    }

    #[test]
    fn nothing_pending_leaves_one_image() {
        let sim = PmemSim::new(256);
        assert_eq!(images(&sim), vec![vec![0u8; 256]]);
        sim.store(3, &[1, 2, 3]).unwrap();
        sim.flush(0, 64).unwrap();
        sim.fence();
        assert_eq!(sim.pending_line_count(), 0);
        assert_eq!(images(&sim), vec![sim.volatile_image()]);
        assert_eq!(sim.durable_image()[3..6], [1, 2, 3]);
    }

    #[test]
    fn bad_requests_are_refused_without_effect() {
        let sim = PmemSim::new(100);
        assert!(matches!(sim.store(99, &[1, 2]), Err(PmemError::OutOfRange { .. })));
        assert!(matches!(sim.store_nt(u64::MAX, &[1]), Err(PmemError::OutOfRange { .. })));
        assert!(matches!(sim.store_u64_atomic(4, 1), Err(PmemError::Misaligned { .. })));
        assert!(matches!(sim.store_u64_atomic(96, 1), Err(PmemError::OutOfRange { .. })));
        assert!(matches!(sim.flush(50, 51), Err(PmemError::OutOfRange { .. })));
        assert!(matches!(sim.flush(1, u64::MAX), Err(PmemError::OutOfRange { .. })));
        let mut buf = [0u8; 2];
        assert!(matches!(sim.read(99, &mut buf), Err(PmemError::OutOfRange { .. })));
        sim.store_nt(8, &[5]).unwrap();
        assert!(matches!(sim.store(8, &[6]), Err(PmemError::Unmodelled { off: 8, .. })));
        sim.store(9, &[6]).unwrap(); // another byte of the word: no overlap
        sim.fence();
        sim.store(8, &[7]).unwrap(); // fenced: allowed
        assert_eq!(
            sim.stats(),
            PmemSimStats { stores: 2, nt_stores: 1, lines_flushed: 0, fences: 1 }
        );
    }

    #[test]
    fn short_last_line_stays_in_bounds() {
        let sim = PmemSim::new(70);
        sim.store(66, &[1, 2, 3, 4]).unwrap();
        let all = images(&sim);
        assert_eq!(all.len(), 2);
        assert!(all.iter().all(|image| image.len() == 70));
        sim.flush(64, 6).unwrap();
        sim.fence();
        assert_eq!(sim.durable_image()[66..], [1, 2, 3, 4]);
    }
}

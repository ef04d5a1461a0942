//! Fault injection: which operations of a [`super::CrashDevice`] fail or lie.
//!
//! Occurrences are numbered from 1 over the life of the device, counting exactly what
//! [`tally_media::DeviceStats`] counts (write requests, flush calls that reach the device, read
//! calls), so `stats().writes + 1` names the next write. Refused requests are not counted.

use tally_media::MediaError;

/// Faults to inject. The default injects nothing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FaultPlan {
    /// Fail the N-th write request with EIO: it never lands, its submission reports
    /// [`MediaError::Injected`] at `wait`, and the device fails when that submission completes.
    pub write_eio_nth: Option<u64>,
    /// Fail the N-th flush with EIO: nothing is made durable by it (the writes it would have
    /// covered stay uncertain) and the device fails.
    pub flush_eio_nth: Option<u64>,
    /// Fail the N-th read with EIO (the buffer is left untouched; the device does not fail).
    pub read_eio_nth: Option<u64>,
    /// Flip one seeded-random bit of the buffer returned by the N-th read (media untouched).
    pub read_flip_nth: Option<u64>,
    /// Flip one seeded-random bit of each read's buffer with this probability (0 disables).
    pub read_flip_probability: f64,
    /// Flushes return success and do nothing. Exists only to prove that checks catch it.
    pub ignore_flushes: bool,
}

impl FaultPlan {
    /// No faults.
    #[must_use]
    pub fn none() -> Self {
        FaultPlan::default()
    }

    /// Whether the `nth` write request fails.
    pub(crate) fn write_fails(&self, nth: u64) -> bool {
        self.write_eio_nth == Some(nth)
    }

    /// Whether the `nth` flush fails.
    pub(crate) fn flush_fails(&self, nth: u64) -> bool {
        self.flush_eio_nth == Some(nth)
    }

    /// Whether the `nth` read fails.
    pub(crate) fn read_fails(&self, nth: u64) -> bool {
        self.read_eio_nth == Some(nth)
    }

    /// Whether the `nth` read gets a flipped bit; draws from `rng` only when a probability is
    /// set, so plans without one consume no randomness.
    pub(crate) fn read_flips(&self, nth: u64, rng: &mut fastrand::Rng) -> bool {
        let by_nth = self.read_flip_nth == Some(nth);
        let by_chance = self.read_flip_probability > 0.0 && rng.f64() < self.read_flip_probability;
        by_nth || by_chance
    }
}

/// An injected failure remembered by a submission, reported again at every `wait`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Injected {
    /// The operation, `"write"`, `"flush"` or `"read"`.
    pub(crate) op: &'static str,
    /// Its occurrence number.
    pub(crate) nth: u64,
}

impl Injected {
    /// The error value.
    pub(crate) fn error(self) -> MediaError {
        MediaError::Injected { op: self.op, nth: self.nth }
    }
}

/// Flip one random bit of `buf` (no-op on an empty buffer).
pub(crate) fn flip_bit(buf: &mut [u8], rng: &mut fastrand::Rng) {
    if buf.is_empty() {
        return;
    }
    let byte = rng.usize(..buf.len());
    let bit = rng.u8(..8);
    buf[byte] ^= 1 << bit;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nth_matching_is_exact() {
        let plan =
            FaultPlan { write_eio_nth: Some(3), flush_eio_nth: Some(1), ..FaultPlan::none() };
        assert!(!plan.write_fails(2) && plan.write_fails(3) && !plan.write_fails(4));
        assert!(plan.flush_fails(1) && !plan.flush_fails(2));
        assert!(!plan.read_fails(1));
        let mut rng = fastrand::Rng::with_seed(7);
        let before = rng.clone().u64(..);
        assert!(!plan.read_flips(1, &mut rng));
        assert_eq!(rng.u64(..), before, "no probability set: no randomness consumed");
    }

    #[test]
    fn flip_changes_exactly_one_bit() {
        let mut rng = fastrand::Rng::with_seed(9);
        for _ in 0..50 {
            let mut buf = vec![0u8; 64];
            flip_bit(&mut buf, &mut rng);
            assert_eq!(buf.iter().map(|b| b.count_ones()).sum::<u32>(), 1);
        }
    }
}

//! `Region`: the mapped bytes and the raw operations on them. Lives behind the device's lock, so
//! each method has the bytes to itself; callers have already checked ranges and the fail-stop
//! state.

use super::cpu::{self, FlushKind, LINE_SIZE, WORD_SIZE};
use super::map::Mapping;

/// The mapping plus the fail-stop state.
pub(super) struct Region {
    pub(super) map: Mapping,
    /// The first persistence error; once set, writes and flushes are refused.
    pub(super) failed: Option<String>,
}

impl Region {
    /// Copy `len` bytes at `start` into `buf` (`buf.len()` bytes; range checked by the caller).
    pub(super) fn read(&self, start: usize, buf: &mut [u8]) {
        debug_assert!(start + buf.len() <= self.map.len());
        // SAFETY: start..start+buf.len() is inside the mapping (checked by the caller); the lock
        // held by the caller means no write races with this read in this process; buf is a
        // distinct Rust allocation, so the ranges do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(self.map.base().add(start), buf.as_mut_ptr(), buf.len());
        }
    }

    /// Cached stores of `bytes` at `start`.
    pub(super) fn write(&mut self, start: usize, bytes: &[u8]) {
        debug_assert!(start + bytes.len() <= self.map.len());
        // SAFETY: in range (checked by the caller), exclusive (&mut self under the lock), and
        // `bytes` cannot overlap the mapping's bytes held exclusively here.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.map.base().add(start), bytes.len());
        }
    }

    /// One 8-byte store of `value` at `start`, which the caller checked is 8-byte aligned.
    pub(super) fn store_u64_atomic(&mut self, start: usize, value: u64) {
        debug_assert!(start.is_multiple_of(WORD_SIZE as usize));
        // SAFETY: the mapping is page-aligned and start is a multiple of 8, so the pointer is
        // aligned for AtomicU64; the 8 bytes are in range and ours (&mut self under the lock).
        let word = unsafe { &*self.map.base().add(start).cast::<std::sync::atomic::AtomicU64>() };
        // One aligned 8-byte store instruction: the hardware never tears it.
        word.store(value.to_le(), std::sync::atomic::Ordering::Release);
    }

    /// Write back every line overlapping `start..end` with `kind`; returns the line count.
    /// Does nothing (and returns 0) for an empty range or [`FlushKind::Msync`].
    pub(super) fn flush_lines(&self, kind: FlushKind, start: usize, end: usize) -> u64 {
        if start >= end || kind == FlushKind::Msync {
            return 0;
        }
        let line = LINE_SIZE as usize;
        let mut at = start - start % line;
        let mut count = 0;
        while at < end {
            // SAFETY: `at` is inside the mapping (at < end <= len, and lines of a page-aligned
            // mapping never cross its end), and `kind` came from cpu_flush_kind.
            unsafe { cpu::flush_line(kind, self.map.base().add(at)) };
            at += line;
            count += 1;
        }
        count
    }

    /// Non-temporal copy of `src` to `start` on x86-64: the 8-byte-aligned middle with `movnti`,
    /// the unaligned head and tail with cached stores whose lines are then written back with
    /// `kind`. Everything is durable after the caller's next fence. Returns (lines flushed,
    /// bytes stored non-temporally).
    #[cfg(target_arch = "x86_64")]
    pub(super) fn copy_nt(&mut self, kind: FlushKind, start: usize, src: &[u8]) -> (u64, u64) {
        let word = WORD_SIZE as usize;
        let end = start + src.len();
        let body_start = start.next_multiple_of(word).min(end);
        let body_end = (end - end % word).max(body_start);
        let (head, rest) = src.split_at(body_start - start);
        let (body, tail) = rest.split_at(body_end - body_start);
        let mut lines = 0;
        if !head.is_empty() {
            self.write(start, head);
            lines += self.flush_lines(kind, start, body_start);
        }
        for (i, chunk) in body.chunks_exact(word).enumerate() {
            let mut value = [0u8; 8];
            value.copy_from_slice(chunk);
            // SAFETY: body_start + 8i is 8-byte aligned (the mapping is page-aligned), its 8
            // bytes are inside start..end (in range) and ours (&mut self under the lock); the
            // caller fences before anyone reads them as durable.
            unsafe {
                cpu::store_nt_u64(
                    self.map.base().add(body_start + i * word),
                    u64::from_ne_bytes(value),
                );
            }
        }
        if !tail.is_empty() {
            self.write(body_end, tail);
            lines += self.flush_lines(kind, body_end, end);
        }
        (lines, body.len() as u64)
    }
}

//! Copies into the region on top of the [`Pmem`] primitives, counting the persistence work.
//!
//! A non-temporal copy stores the 8-byte-aligned middle with `memcpy_nt` (durable at the next
//! fence) and the unaligned head and tail with cached stores whose lines it flushes itself —
//! the tail that NOVA once left in the cache. A cached copy stores everything and flushes every
//! line it touched. Either way, everything is durable after the caller's next fence.

use tally_media::Pmem;

use crate::format::LINE_SIZE;
use crate::mutant::{self, Mutant};
use crate::PmemLogError;

/// Persistence work done through a [`Persister`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LogStats {
    /// Transactions committed.
    pub commits: u64,
    /// Fences issued (commits, releases, the epoch bump at open).
    pub fences: u64,
    /// Cache lines named by flushes.
    pub lines_flushed: u64,
    /// Bytes stored with cached stores.
    pub bytes_cached: u64,
    /// Bytes stored non-temporally.
    pub bytes_nt: u64,
    /// 8-byte atomic stores.
    pub atomic_stores: u64,
}

/// The region plus counters.
pub(crate) struct Persister<'a> {
    pub(crate) pm: &'a dyn Pmem,
    pub(crate) stats: LogStats,
    pub(crate) mutant: Option<Mutant>,
}

impl Persister<'_> {
    /// Cached stores of `bytes` at `off`, then flush their lines (unless `flush` is false).
    pub(crate) fn copy_cached(
        &mut self,
        off: u64,
        bytes: &[u8],
        flush: bool,
    ) -> Result<(), PmemLogError> {
        self.pm.write(off, bytes)?;
        self.stats.bytes_cached += bytes.len() as u64;
        if flush {
            self.flush(off, bytes.len() as u64)?;
        }
        Ok(())
    }

    /// Non-temporal copy of `bytes` to `off`: aligned middle non-temporal, unaligned head and
    /// tail cached and flushed. Durable after the next fence.
    pub(crate) fn copy_nt(&mut self, off: u64, bytes: &[u8]) -> Result<(), PmemLogError> {
        let end = off + bytes.len() as u64;
        let body_start = off.next_multiple_of(8).min(end);
        let body_end = (end - end % 8).max(body_start);
        let head_len = (body_start - off) as usize;
        let body_len = (body_end - body_start) as usize;
        let (head, rest) = bytes.split_at(head_len);
        let (body, tail) = rest.split_at(body_len);
        if !head.is_empty() {
            self.copy_cached(off, head, true)?;
        }
        if !body.is_empty() {
            self.pm.memcpy_nt(body_start, body)?;
            self.stats.bytes_nt += body.len() as u64;
        }
        if !tail.is_empty() {
            let flush = !mutant::is(self.mutant, Mutant::NtCopySkipsUnalignedTail);
            self.copy_cached(body_end, tail, flush)?;
        }
        Ok(())
    }

    /// Flush every line overlapping `len` bytes at `off`.
    pub(crate) fn flush(&mut self, off: u64, len: u64) -> Result<(), PmemLogError> {
        if len == 0 {
            return Ok(());
        }
        self.pm.flush(off, len)?;
        self.stats.lines_flushed += (off + len - 1) / LINE_SIZE - off / LINE_SIZE + 1;
        Ok(())
    }

    /// One 8-byte atomic store, flushed.
    pub(crate) fn store_word(
        &mut self,
        off: u64,
        value: u64,
        flush: bool,
    ) -> Result<(), PmemLogError> {
        self.pm.store_u64_atomic(off, value)?;
        self.stats.atomic_stores += 1;
        if flush {
            self.flush(off, 8)?;
        }
        Ok(())
    }

    pub(crate) fn fence(&mut self) {
        self.pm.fence();
        self.stats.fences += 1;
    }
}

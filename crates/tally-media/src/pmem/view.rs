//! The block protocol on persistent memory, written once over [`Pmem`] so the mapped region
//! ([`super::PmemDevice`]'s [`crate::Device`] view) and `tally-crash`'s cache-line simulator run
//! the same code.
//!
//! A submission copies each write into place and then fences once:
//! - a write of at least [`BlockView::nt_copy_min`] bytes is copied non-temporally. Writes are
//!   whole blocks, so the copy is line-aligned: it has no unaligned head or tail and needs no
//!   line flush; the fence makes it durable;
//! - a smaller write is stored through the cache and every line it touched is written back
//!   (cheaper than non-temporal stores for a few lines that are read again soon).
//!
//! `flush()` is one more fence (the submission's own fence already covered its writes; the one
//! in `flush()` keeps the trait's promise for a caller that never submitted on this thread).
//!
//! A power failure can tear a block at any aligned 8-byte word (the failure-atomic unit of
//! persistent memory): the log's unit crc and the data crcs in its records are what detect it.

use super::{Pmem, PmemError, LINE_SIZE};

/// A deliberately broken variant of the block protocol, to prove the crash explorers catch it.
/// Takes effect only in a build with the `mutants` feature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockMutant {
    /// No fence at all, neither after a submission nor in `flush()`: non-temporal data sits in
    /// write-combining buffers and flushed lines are not ordered before durability is reported
    /// (the block view's "missing fence before the watermark").
    FenceMissing,
    /// A cached copy writes back every line but its last (NOVA's unflushed tail): the fence does
    /// not make that line durable.
    CopySkipsTailFlush,
}

impl BlockMutant {
    /// Every block-view mutant.
    pub const ALL: [BlockMutant; 2] = [BlockMutant::FenceMissing, BlockMutant::CopySkipsTailFlush];

    /// The mutant's name.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            BlockMutant::FenceMissing => "pmem-fence-missing",
            BlockMutant::CopySkipsTailFlush => "pmem-copy-skips-tail-flush",
        }
    }

    /// The mutant called `name`.
    #[must_use]
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// Whether this build has the `mutants` feature (else a [`BlockView::mutant`] does nothing).
#[must_use]
pub fn block_mutants_available() -> bool {
    cfg!(feature = "mutants")
}

/// How blocks are copied into persistent memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockView {
    /// Writes of at least this many bytes are copied non-temporally; smaller ones through the
    /// cache with their lines written back.
    pub nt_copy_min: u32,
    /// A deliberately broken protocol (only with the `mutants` feature).
    pub mutant: Option<BlockMutant>,
}

impl BlockView {
    /// Every block copied non-temporally (the mapped device's choice: blocks are written once
    /// and not read back soon, so they need not pass through the cache).
    #[must_use]
    pub fn non_temporal(block_size: u32) -> Self {
        BlockView { nt_copy_min: block_size, mutant: None }
    }

    fn is(&self, m: BlockMutant) -> bool {
        cfg!(feature = "mutants") && self.mutant == Some(m)
    }

    /// Copy `data` (whole blocks) to byte offset `off`; durable after the next fence. Returns
    /// whether the copy was non-temporal.
    ///
    /// # Errors
    /// The region's errors (out of range, failed, `msync`).
    pub fn store(&self, pm: &dyn Pmem, off: u64, data: &[u8]) -> Result<bool, PmemError> {
        let len = data.len() as u64;
        if len >= u64::from(self.nt_copy_min) {
            pm.memcpy_nt(off, data)?;
            return Ok(true);
        }
        pm.write(off, data)?;
        let flushed = if self.is(BlockMutant::CopySkipsTailFlush) {
            // The range stops short of the last line the copy touched.
            let end = off + len;
            let last_line = (end - 1) / LINE_SIZE * LINE_SIZE;
            last_line.saturating_sub(off)
        } else {
            len
        };
        pm.flush(off, flushed)?;
        Ok(false)
    }

    /// Copy every `(offset, bytes)` write, then fence once.
    ///
    /// # Errors
    /// As [`BlockView::store`]; the fence is skipped after an error (the caller fails stop).
    pub fn submit(&self, pm: &dyn Pmem, writes: &[(u64, &[u8])]) -> Result<(), PmemError> {
        for &(off, data) in writes {
            self.store(pm, off, data)?;
        }
        self.fence(pm);
        Ok(())
    }

    /// The fence that makes copied blocks durable (`Device::flush`).
    pub fn fence(&self, pm: &dyn Pmem) {
        if !self.is(BlockMutant::FenceMissing) {
            pm.fence();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Records the calls a view makes.
    #[derive(Default)]
    struct Calls(Mutex<Vec<String>>);

    impl Pmem for Calls {
        fn len(&self) -> u64 {
            1 << 20
        }
        fn read(&self, _: u64, _: &mut [u8]) -> Result<(), PmemError> {
            Ok(())
        }
        fn write(&self, off: u64, b: &[u8]) -> Result<(), PmemError> {
            self.0.lock().unwrap().push(format!("write {off} {}", b.len()));
            Ok(())
        }
        fn memcpy_nt(&self, off: u64, b: &[u8]) -> Result<(), PmemError> {
            self.0.lock().unwrap().push(format!("nt {off} {}", b.len()));
            Ok(())
        }
        fn store_u64_atomic(&self, _: u64, _: u64) -> Result<(), PmemError> {
            Ok(())
        }
        fn flush(&self, off: u64, len: u64) -> Result<(), PmemError> {
            self.0.lock().unwrap().push(format!("flush {off} {len}"));
            Ok(())
        }
        fn fence(&self) {
            self.0.lock().unwrap().push("fence".into());
        }
    }

    #[test]
    fn large_writes_go_non_temporal_small_ones_cached_and_flushed_then_one_fence() {
        let pm = Calls::default();
        let view = BlockView { nt_copy_min: 2048, mutant: None };
        view.submit(&pm, &[(4096, &[0u8; 2048]), (1024, &[0u8; 1024])]).unwrap();
        assert_eq!(
            *pm.0.lock().unwrap(),
            vec!["nt 4096 2048", "write 1024 1024", "flush 1024 1024", "fence"]
        );
    }

    #[test]
    fn mutants_change_the_protocol_only_with_the_feature() {
        let pm = Calls::default();
        let view = BlockView { nt_copy_min: 4096, mutant: Some(BlockMutant::CopySkipsTailFlush) };
        view.submit(&pm, &[(1024, &[0u8; 1024])]).unwrap();
        let view = BlockView { mutant: Some(BlockMutant::FenceMissing), ..view };
        view.fence(&pm);
        let want: Vec<&str> = if block_mutants_available() {
            vec!["write 1024 1024", "flush 1024 960", "fence"]
        } else {
            vec!["write 1024 1024", "flush 1024 1024", "fence", "fence"]
        };
        assert_eq!(*pm.0.lock().unwrap(), want);
        assert_eq!(BlockMutant::from_name("pmem-fence-missing"), Some(BlockMutant::FenceMissing));
    }
}

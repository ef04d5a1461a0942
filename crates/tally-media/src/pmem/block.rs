//! The block view of a [`PmemDevice`]: the [`Device`] trait, so block-based code (the log) runs
//! on persistent memory unchanged.
//!
//! A submission copies each write into the region non-temporally (`view.rs`, the code the
//! cache-line simulator runs too), then fences once, on the submitting thread. The fence is there because `sfence` only covers the thread that
//! issues it: without it, a `flush()` called on another thread could not honour the trait's
//! promise that it makes durable every write completed before it. So every completed write is
//! already durable, FUA costs nothing extra, and `flush()` is a fence. In msync mode a write is
//! a copy, FUA is an `msync` of its range and `flush()` an `msync` of the whole region.

use std::sync::atomic::Ordering::Relaxed;

use super::{BlockView, FlushKind, PmemDevice, PmemMode};
use crate::{
    check_read, check_write, Device, DeviceStats, Geometry, MediaError, Result, Ticket, Write,
    WriteFlags,
};

impl PmemDevice {
    fn byte_offset(&self, block: u64) -> u64 {
        // check_read/check_write bound block by block_count, so this cannot overflow.
        block * u64::from(self.geometry.block_size)
    }
}

impl Device for PmemDevice {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn read(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        check_read(&self.geometry, block, buf)?;
        self.counters.read(buf.len());
        PmemDevice::read(self, self.byte_offset(block), buf).map_err(MediaError::from)
    }

    fn submit(&self, writes: Vec<Write>, flags: WriteFlags) -> Result<Ticket> {
        check_write(&self.geometry, &writes)?;
        if self.flush_kind != FlushKind::Msync {
            // The protocol shared with the cache-line simulator (`view.rs`): non-temporal copies
            // of whole blocks, one fence on the submitting thread.
            drop(self.lock_writable()?);
            self.counters.submission();
            let view = BlockView::non_temporal(self.geometry.block_size);
            let copies: Vec<(u64, &[u8])> =
                writes.iter().map(|w| (self.byte_offset(w.block), &w.data[..])).collect();
            view.submit(self, &copies)?;
            for w in &writes {
                self.counters.write(w.data.len(), flags.fua);
            }
            return Ok(Ticket(self.next_ticket.fetch_add(1, Relaxed)));
        }
        let mut region = self.lock_writable()?;
        self.counters.submission();
        for w in &writes {
            let off = self.byte_offset(w.block);
            let (start, end) = super::check_range(off, w.data.len(), self.len)?;
            region.write(start, &w.data);
            self.counters.write(w.data.len(), flags.fua);
            if flags.fua {
                self.msync(&mut region, start, end)?;
            }
        }
        let c = &self.pmem_counters;
        c.bytes_stored.fetch_add(writes.iter().map(|w| w.data.len() as u64).sum(), Relaxed);
        Ok(Ticket(self.next_ticket.fetch_add(1, Relaxed)))
    }

    fn wait(&self, ticket: Ticket) -> Result<()> {
        // Writes complete inside submit.
        if ticket.0 == 0 || ticket.0 >= self.next_ticket.load(Relaxed) {
            return Err(MediaError::UnknownTicket(ticket.0));
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        let mut region = self.lock_writable()?;
        self.counters.flush();
        if self.mode == PmemMode::Msync || self.flush_kind == FlushKind::Msync {
            let len = region.map.len();
            return self.msync(&mut region, 0, len).map_err(MediaError::from);
        }
        drop(region);
        self.fence();
        Ok(())
    }

    fn stats(&self) -> DeviceStats {
        self.counters.snapshot()
    }
}

//! `MemDevice`: a device in memory. Writes complete at submission and are always durable; it
//! exists for unit tests and for measuring CPU cost without a disk.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::{
    check_read, check_write, Counters, Device, DeviceStats, Geometry, Image, Result, Ticket, Write,
    WriteFlags,
};

/// A device held in memory.
pub struct MemDevice {
    image: Mutex<Image>,
    geometry: Geometry,
    next_ticket: AtomicU64,
    counters: Counters,
}

impl MemDevice {
    /// An all-zero device.
    ///
    /// # Errors
    /// An invalid geometry.
    pub fn new(block_size: u32, block_count: u64) -> Result<Self> {
        let geometry = Geometry::new(block_size, block_count, block_size)?;
        Ok(Self::from_image(Image::new(geometry)))
    }

    /// A device whose contents are `image`.
    #[must_use]
    pub fn from_image(image: Image) -> Self {
        MemDevice {
            geometry: image.geometry(),
            image: Mutex::new(image),
            next_ticket: AtomicU64::new(1),
            counters: Counters::default(),
        }
    }

    /// A copy of the current contents.
    #[must_use]
    pub fn image(&self) -> Image {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Image> {
        // A poisoned lock means a panic elsewhere mid-write; the image itself is still whole
        // blocks, so keep serving it.
        self.image.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Device for MemDevice {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn read(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        check_read(&self.geometry, block, buf)?;
        self.counters.read(buf.len());
        self.lock().read(block, buf)
    }

    fn submit(&self, writes: Vec<Write>, flags: WriteFlags) -> Result<Ticket> {
        check_write(&self.geometry, &writes)?;
        self.counters.submission();
        let mut image = self.lock();
        for w in &writes {
            self.counters.write(w.data.len(), flags.fua);
            image.write(w.block, &w.data);
        }
        Ok(Ticket(self.next_ticket.fetch_add(1, Ordering::Relaxed)))
    }

    fn wait(&self, ticket: Ticket) -> Result<()> {
        if ticket.0 == 0 || ticket.0 >= self.next_ticket.load(Ordering::Relaxed) {
            return Err(crate::MediaError::UnknownTicket(ticket.0));
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        self.counters.flush();
        Ok(())
    }

    fn stats(&self) -> DeviceStats {
        self.counters.snapshot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{IoBuf, MediaError};

    fn block_of(byte: u8) -> IoBuf {
        IoBuf::from_slice(&[byte; 512])
    }

    #[test]
    fn round_trip_and_counters() {
        let dev = MemDevice::new(512, 16).unwrap();
        let t1 = dev
            .submit(vec![Write::new(3, block_of(1)), Write::new(5, block_of(2))], WriteFlags::NONE)
            .unwrap();
        let t2 = dev.submit(vec![Write::new(3, block_of(9))], WriteFlags::FUA).unwrap();
        // Completion order does not matter for a memory device: wait in reverse.
        dev.wait(t2).unwrap();
        dev.wait(t1).unwrap();
        dev.flush().unwrap();
        let mut buf = vec![0u8; 3 * 512];
        dev.read(3, &mut buf).unwrap();
        assert!(buf[..512].iter().all(|&b| b == 9));
        assert!(buf[512..1024].iter().all(|&b| b == 0));
        assert!(buf[1024..].iter().all(|&b| b == 2));
        let s = dev.stats();
        assert_eq!((s.writes, s.bytes_written, s.fua_writes, s.flushes), (3, 1536, 1, 1));
        assert_eq!((s.submissions, s.reads, s.bytes_read), (2, 1, 1536));
    }

    #[test]
    fn bad_requests_are_refused() {
        let dev = MemDevice::new(512, 4).unwrap();
        let mut odd = vec![0u8; 100];
        assert!(matches!(dev.read(0, &mut odd), Err(MediaError::Misaligned { .. })));
        let mut two = vec![0u8; 1024];
        assert!(matches!(dev.read(3, &mut two), Err(MediaError::OutOfRange { .. })));
        assert!(matches!(dev.read(u64::MAX, &mut two), Err(MediaError::OutOfRange { .. })));
        let err = dev.submit(vec![Write::new(4, block_of(1))], WriteFlags::NONE);
        assert!(matches!(err, Err(MediaError::OutOfRange { .. })));
        assert_eq!(dev.stats().writes, 0, "a refused submission writes nothing");
        assert!(matches!(dev.wait(Ticket(77)), Err(MediaError::UnknownTicket(77))));
        assert!(matches!(MemDevice::new(500, 4), Err(MediaError::InvalidGeometry { .. })));
        assert!(matches!(MemDevice::new(512, 0), Err(MediaError::InvalidGeometry { .. })));
    }
}

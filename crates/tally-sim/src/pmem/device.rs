//! `PmemSimDevice`: the block [`Device`] view of persistent memory on the cache-line simulator,
//! so the log and the file system run on simulated persistent memory unchanged.
//!
//! Writes go through [`BlockView`], the protocol code the mapped [`tally_media::PmemDevice`]
//! runs too: whole blocks copied non-temporally (or, below the view's `nt_copy_min`, stored
//! through the cache and written back line by line), one fence per submission, and a fence as
//! `flush()`. Writes complete inside `submit`.
//!
//! While recording is on, the device keeps a [`PmemCrashPoint`] before every line flush and
//! before every fence: the crash points inside an operation of the layer above. A point before
//! a fence can leave any subset of the 8-byte words of its non-temporal copies and any prefix of
//! each line's cached stores, so a block can be torn at any word, across lines in any
//! combination. The points before the flushes add the images in which the later writes of the
//! submission were not stored yet (contained in the fence's images, but rarely drawn when those
//! are sampled).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, PoisonError};

use tally_media::pmem::{BlockView, Pmem, PmemError};
use tally_media::{
    check_read, check_write, Counters, Device, DeviceStats, Geometry, Image, MediaError, Ticket,
    Write, WriteFlags,
};

use super::{PmemCrashPoint, PmemSim};

/// A block device on the cache-line simulator. See the module documentation.
pub struct PmemSimDevice {
    sim: PmemSim,
    view: BlockView,
    geometry: Geometry,
    next_ticket: AtomicU64,
    counters: Counters,
    /// `None` while not recording.
    points: Mutex<Option<Vec<PmemCrashPoint>>>,
}

impl PmemSimDevice {
    /// A device whose durable contents are `image` (its geometry's atomic write size is
    /// replaced by the 8-byte word persistent memory promises).
    ///
    /// # Panics
    /// If the image does not fit in memory (a bug for in-memory images).
    #[must_use]
    pub fn from_image(image: &Image, view: BlockView) -> Self {
        let g = image.geometry();
        let geometry = Geometry { atomic_write_size: 8, ..g };
        Self::with_bytes(image_bytes(image), geometry, view)
    }

    /// A device over `bytes` (a whole number of `geometry`'s blocks) as its durable contents.
    #[must_use]
    pub fn with_bytes(bytes: Vec<u8>, geometry: Geometry, view: BlockView) -> Self {
        debug_assert_eq!(bytes.len() as u64, geometry.size_bytes());
        PmemSimDevice {
            sim: PmemSim::from_image(bytes),
            view,
            geometry,
            next_ticket: AtomicU64::new(1),
            counters: Counters::default(),
            points: Mutex::new(None),
        }
    }

    /// The simulator underneath.
    #[must_use]
    pub fn sim(&self) -> &PmemSim {
        &self.sim
    }

    /// The block protocol in use.
    #[must_use]
    pub fn view(&self) -> BlockView {
        self.view
    }

    /// The state now, frozen.
    #[must_use]
    pub fn crash_point(&self) -> PmemCrashPoint {
        self.sim.crash_point()
    }

    /// What a crash that keeps nothing pending leaves, as blocks.
    #[must_use]
    pub fn durable_image(&self) -> Image {
        bytes_image(&self.sim.durable_image(), self.geometry)
    }

    /// Start (dropping what was recorded) or stop recording crash points.
    pub fn set_recording(&self, on: bool) {
        *self.guard() = on.then(Vec::new);
    }

    /// The points recorded since recording started; recording stops.
    pub fn take_points(&self) -> Vec<PmemCrashPoint> {
        self.guard().take().unwrap_or_default()
    }

    fn guard(&self) -> MutexGuard<'_, Option<Vec<PmemCrashPoint>>> {
        self.points.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn record(&self) {
        if let Some(points) = self.guard().as_mut() {
            points.push(self.sim.crash_point());
        }
    }

    fn byte_offset(&self, block: u64) -> u64 {
        // check_read/check_write bound block by block_count, so this cannot overflow.
        block * u64::from(self.geometry.block_size)
    }
}

/// The simulator as the view sees it: a crash point recorded before every flush and fence.
struct Recorded<'a>(&'a PmemSimDevice);

impl Pmem for Recorded<'_> {
    fn len(&self) -> u64 {
        self.0.sim.len()
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), PmemError> {
        self.0.sim.read(off, buf)
    }
    fn write(&self, off: u64, bytes: &[u8]) -> Result<(), PmemError> {
        self.0.sim.store(off, bytes)
    }
    fn memcpy_nt(&self, off: u64, src: &[u8]) -> Result<(), PmemError> {
        self.0.sim.store_nt(off, src)
    }
    fn store_u64_atomic(&self, off: u64, value: u64) -> Result<(), PmemError> {
        self.0.sim.store_u64_atomic(off, value)
    }
    fn flush(&self, off: u64, len: u64) -> Result<(), PmemError> {
        self.0.record();
        self.0.sim.flush(off, len)
    }
    fn fence(&self) {
        self.0.record();
        self.0.sim.fence();
    }
}

impl Device for PmemSimDevice {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn read(&self, block: u64, buf: &mut [u8]) -> tally_media::Result<()> {
        check_read(&self.geometry, block, buf)?;
        self.counters.read(buf.len());
        self.sim.read(self.byte_offset(block), buf).map_err(MediaError::from)
    }

    fn submit(&self, writes: Vec<Write>, flags: WriteFlags) -> tally_media::Result<Ticket> {
        check_write(&self.geometry, &writes)?;
        self.counters.submission();
        let copies: Vec<(u64, &[u8])> =
            writes.iter().map(|w| (self.byte_offset(w.block), &w.data[..])).collect();
        self.view.submit(&Recorded(self), &copies)?;
        for w in &writes {
            self.counters.write(w.data.len(), flags.fua);
        }
        Ok(Ticket(self.next_ticket.fetch_add(1, Relaxed)))
    }

    fn wait(&self, ticket: Ticket) -> tally_media::Result<()> {
        // Writes complete inside submit.
        if ticket.0 == 0 || ticket.0 >= self.next_ticket.load(Relaxed) {
            return Err(MediaError::UnknownTicket(ticket.0));
        }
        Ok(())
    }

    fn flush(&self) -> tally_media::Result<()> {
        self.counters.flush();
        self.view.fence(&Recorded(self));
        Ok(())
    }

    fn stats(&self) -> DeviceStats {
        self.counters.snapshot()
    }
}

/// The bytes of `image`, block after block.
#[must_use]
pub fn image_bytes(image: &Image) -> Vec<u8> {
    let g = image.geometry();
    let mut bytes = Vec::with_capacity(usize::try_from(g.size_bytes()).unwrap_or(0));
    for block in 0..g.block_count {
        bytes.extend_from_slice(image.block(block));
    }
    bytes
}

/// `bytes` as an image of `geometry` (blocks of zeros stay unwritten, so images share them).
#[must_use]
pub fn bytes_image(bytes: &[u8], geometry: Geometry) -> Image {
    let mut image = Image::new(geometry);
    let bs = geometry.block_size as usize;
    for (i, chunk) in bytes.chunks_exact(bs).enumerate() {
        if chunk.iter().any(|&b| b != 0) {
            image.set_block(i as u64, chunk.into());
        }
    }
    image
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PmemCrashOptions;
    use tally_media::IoBuf;

    fn geometry() -> Geometry {
        Geometry { block_size: 1024, block_count: 8, atomic_write_size: 8 }
    }

    fn buf(fill: u8, len: usize) -> IoBuf {
        IoBuf::from_slice(&vec![fill; len])
    }

    #[test]
    fn writes_are_durable_after_submit_and_torn_at_words_before_its_fence() {
        let view = BlockView { nt_copy_min: 2048, mutant: None };
        let dev = PmemSimDevice::with_bytes(vec![0; 8192], geometry(), view);
        dev.set_recording(true);
        dev.write_sync(
            vec![Write::new(1, buf(7, 1024)), Write::new(2, buf(9, 2048))],
            WriteFlags::NONE,
        )
        .unwrap();
        let points = dev.take_points();
        // Before the flush of the cached block, then before the fence.
        assert_eq!(points.len(), 2);
        assert_eq!(points[1].pending_line_count(), 16 + 32);
        let options = PmemCrashOptions { samples: 40, ..PmemCrashOptions::default() };
        let torn = points[1]
            .crash_images(&options)
            .filter(|i| {
                let nt = &i[2048..4096];
                nt.contains(&9) && nt.contains(&0)
            })
            .count();
        assert!(torn > 0, "a non-temporal copy can be torn before the fence");
        assert_eq!(dev.durable_image().block(2), &[9u8; 1024][..]);
        let mut back = vec![0u8; 1024];
        dev.read(1, &mut back).unwrap();
        assert_eq!(back, vec![7u8; 1024]);
        assert!(dev.sim().pending_line_count() == 0);
        dev.flush().unwrap();
        assert!(dev.wait(Ticket(99)).is_err());
    }

    #[test]
    fn image_bytes_round_trip() {
        let mut image = Image::new(geometry());
        image.set_block(3, vec![5u8; 1024].into());
        let bytes = image_bytes(&image);
        assert_eq!(bytes.len(), 8192);
        assert_eq!(bytes_image(&bytes, geometry()), image);
    }
}

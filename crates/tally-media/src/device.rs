//! The `Device` trait: the only way Tally touches storage.

use crate::{DeviceStats, IoBuf, MediaError, Result};

/// Shape of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Geometry {
    /// Logical block size in bytes: the unit of addressing. A power of two, at least 512.
    pub block_size: u32,
    /// Number of blocks.
    pub block_count: u64,
    /// Bytes a single write is guaranteed to persist all-or-nothing (power-fail atomicity).
    /// At most `block_size`; a block larger than this may be torn by a power failure.
    pub atomic_write_size: u32,
}

impl Geometry {
    /// A geometry, validated.
    ///
    /// # Errors
    /// [`MediaError::InvalidGeometry`] when a size is zero, not a power of two, the block size
    /// is below 512, or the atomic unit exceeds the block.
    pub fn new(block_size: u32, block_count: u64, atomic_write_size: u32) -> Result<Self> {
        let bad = |reason: String| Err(MediaError::InvalidGeometry { reason });
        if block_size < 512 || !block_size.is_power_of_two() {
            return bad(format!("block size {block_size} is not a power of two >= 512"));
        }
        if atomic_write_size == 0
            || !atomic_write_size.is_power_of_two()
            || atomic_write_size > block_size
        {
            return bad(format!(
                "atomic write size {atomic_write_size} must be a power of two <= block size {block_size}"
            ));
        }
        if block_count == 0 {
            return bad("device has no blocks".to_string());
        }
        Ok(Geometry { block_size, block_count, atomic_write_size })
    }

    /// Size of the device in bytes.
    #[must_use]
    pub fn size_bytes(&self) -> u64 {
        self.block_count * u64::from(self.block_size)
    }
}

/// One contiguous write: `data.len()` must be a whole number of blocks.
#[derive(Debug, Clone)]
pub struct Write {
    /// First block written.
    pub block: u64,
    /// The bytes; a multiple of the block size.
    pub data: IoBuf,
}

impl Write {
    /// A write of `data` starting at `block`.
    #[must_use]
    pub fn new(block: u64, data: IoBuf) -> Self {
        Write { block, data }
    }
}

/// Options of a submission.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteFlags {
    /// Force unit access: each write of the submission is durable when it completes.
    pub fua: bool,
}

impl WriteFlags {
    /// No flags: durable only after a later flush.
    pub const NONE: WriteFlags = WriteFlags { fua: false };
    /// Force unit access.
    pub const FUA: WriteFlags = WriteFlags { fua: true };
}

/// Names one submission. Tickets of one device increase with each `submit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket(pub u64);

/// A block device, real or simulated.
///
/// Writes are asynchronous: [`Device::submit`] hands a batch of writes to the device (one
/// submission; backends that can do so use one system call) and returns a [`Ticket`]; the writes
/// of one or several submissions may complete in any order. [`Device::wait`] blocks until every
/// write of a ticket has completed. A completed write is *not* durable: only [`Device::flush`]
/// (for writes completed before it was called) or FUA (for that write alone) makes it so.
pub trait Device: Send + Sync {
    /// The device's shape.
    fn geometry(&self) -> Geometry;

    /// Read `buf.len()` bytes (a whole number of blocks) starting at `block`.
    ///
    /// # Errors
    /// Misaligned or out-of-range requests, and I/O errors.
    fn read(&self, block: u64, buf: &mut [u8]) -> Result<()>;

    /// Submit `writes` as one batch. Returns at once; the writes are in flight.
    ///
    /// # Errors
    /// Misaligned or out-of-range requests (nothing is submitted then), a failed device, and
    /// errors of the submission itself.
    fn submit(&self, writes: Vec<Write>, flags: WriteFlags) -> Result<Ticket>;

    /// Submit `writes` on behalf of log stream `stream`. The stream is a hint: a backend with
    /// several queues (an NBD device with one connection per stream, RIO's stream-to-queue
    /// mapping) keeps each stream on its own queue, so one stream's slow requests do not hold
    /// up another's. Ordering never depends on it. The default ignores it.
    ///
    /// # Errors
    /// As [`Device::submit`].
    fn submit_stream(&self, stream: u16, writes: Vec<Write>, flags: WriteFlags) -> Result<Ticket> {
        let _ = stream;
        self.submit(writes, flags)
    }

    /// Block until every write of `ticket` has completed; report the first error among them.
    /// Waiting again on a completed ticket returns the same outcome.
    ///
    /// # Errors
    /// The write's I/O error, or [`MediaError::UnknownTicket`].
    fn wait(&self, ticket: Ticket) -> Result<()>;

    /// Make durable every write that completed before this call.
    ///
    /// # Errors
    /// I/O errors; after one, the device is failed.
    fn flush(&self) -> Result<()>;

    /// Counters of what was done so far.
    fn stats(&self) -> DeviceStats;

    /// Submit `writes` and wait for them: a synchronous convenience.
    ///
    /// # Errors
    /// As [`Device::submit`] and [`Device::wait`].
    fn write_sync(&self, writes: Vec<Write>, flags: WriteFlags) -> Result<()> {
        let ticket = self.submit(writes, flags)?;
        self.wait(ticket)
    }
}

impl<D: Device + ?Sized> Device for std::sync::Arc<D> {
    fn geometry(&self) -> Geometry {
        (**self).geometry()
    }
    fn read(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        (**self).read(block, buf)
    }
    fn submit(&self, writes: Vec<Write>, flags: WriteFlags) -> Result<Ticket> {
        (**self).submit(writes, flags)
    }
    fn submit_stream(&self, stream: u16, writes: Vec<Write>, flags: WriteFlags) -> Result<Ticket> {
        (**self).submit_stream(stream, writes, flags)
    }
    fn wait(&self, ticket: Ticket) -> Result<()> {
        (**self).wait(ticket)
    }
    fn flush(&self) -> Result<()> {
        (**self).flush()
    }
    fn stats(&self) -> DeviceStats {
        (**self).stats()
    }
}

/// Validate a block range of `len` bytes at `block` against `geometry`; returns the block count.
pub(crate) fn check_range(
    geometry: &Geometry,
    block: u64,
    len: usize,
    what: &'static str,
) -> Result<u32> {
    let block_size = geometry.block_size;
    if !(len as u64).is_multiple_of(u64::from(block_size)) {
        return Err(MediaError::Misaligned { what, value: len as u64, block_size });
    }
    let count_u64 = len as u64 / u64::from(block_size);
    let count = u32::try_from(count_u64).unwrap_or(u32::MAX);
    let end = block.checked_add(count_u64);
    if end.is_none_or(|end| end > geometry.block_count) {
        return Err(MediaError::OutOfRange { block, count, block_count: geometry.block_count });
    }
    Ok(count)
}

/// Validate a read request.
///
/// # Errors
/// [`MediaError::Misaligned`] or [`MediaError::OutOfRange`].
pub fn check_read(geometry: &Geometry, block: u64, buf: &[u8]) -> Result<u32> {
    check_range(geometry, block, buf.len(), "read length")
}

/// Validate every write of a submission before any of it is issued.
///
/// # Errors
/// [`MediaError::Misaligned`] or [`MediaError::OutOfRange`] for the first bad write.
pub fn check_write(geometry: &Geometry, writes: &[Write]) -> Result<()> {
    for w in writes {
        check_range(geometry, w.block, w.data.len(), "write length")?;
    }
    Ok(())
}

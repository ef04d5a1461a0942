//! `OverlayDevice`: a copy-on-write view of a device that never writes it.
//!
//! Checking tools (`tally fsck`, `tally inspect`) must run the log's recovery, and recovery
//! writes (it bumps epochs durably before anything else). The overlay lets it: writes land in
//! memory, reads see them over the base, and the base is only ever read. Opened from a path, the
//! base file is opened `O_RDONLY`, so not even a bug above can change the image.
//!
//! Invariants:
//! - the base receives reads only (a file base cannot be written at all: it is open read-only);
//! - a block written through the overlay reads back as written; every other block reads as the
//!   base holds it;
//! - writes are durable at once (in memory, for the overlay's lifetime): flush has nothing to do.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::{FileExt as _, FileTypeExt as _};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::file::block_device_shape;
use crate::{
    check_read, check_write, Counters, Device, DeviceStats, Geometry, MediaError, Result, Ticket,
    Write, WriteFlags, ATOMIC_WRITE_SIZE_DEFAULT, BLOCK_SIZE_DEFAULT,
};

/// Where unwritten blocks come from.
enum Base {
    /// A file or block device opened read-only.
    File(File),
    /// Any device; only its `read` is called.
    Device(Arc<dyn Device>),
}

/// A device whose writes stay in memory over a base that is only read.
pub struct OverlayDevice {
    base: Base,
    geometry: Geometry,
    /// Blocks written through the overlay, by block number.
    written: Mutex<BTreeMap<u64, Box<[u8]>>>,
    next_ticket: AtomicU64,
    counters: Counters,
}

impl OverlayDevice {
    /// An overlay over `base`, which it will only read.
    #[must_use]
    pub fn new(base: Arc<dyn Device>) -> Self {
        let geometry = base.geometry();
        Self::with_base(Base::Device(base), geometry)
    }

    /// An overlay over the file or block device at `path`, opened read-only, with the geometry
    /// [`crate::FileDevice::open`] gives it by default (blocks of 4096 bytes, or the device's
    /// logical block size if larger).
    ///
    /// # Errors
    /// [`MediaError::Open`] if the path cannot be opened or is neither a file nor a block
    /// device; [`MediaError::TooSmall`] if it holds less than one block.
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_read_only_with_block_size(path, None)
    }

    /// As [`Self::open_read_only`], with blocks of `block_size` bytes (`None`: the default), as
    /// [`crate::FileOptions::block_size`] gives them: an image made with another block size is
    /// only readable in its own.
    ///
    /// # Errors
    /// As [`Self::open_read_only`]; [`MediaError::InvalidGeometry`] if `block_size` is not a
    /// power of two or is smaller than the device's logical block size.
    pub fn open_read_only_with_block_size(
        path: impl AsRef<Path>,
        block_size: Option<u32>,
    ) -> Result<Self> {
        let path = path.as_ref();
        let open_error = |source| MediaError::Open { path: path.to_path_buf(), source };
        let file = File::open(path).map_err(open_error)?;
        let metadata = file.metadata().map_err(open_error)?;
        let (logical_block_size, size_bytes) = if metadata.file_type().is_block_device() {
            block_device_shape(&file)?
        } else if metadata.is_file() {
            (512, metadata.len())
        } else {
            let source = std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not a regular file or a block device",
            );
            return Err(open_error(source));
        };
        let block_size = match block_size {
            None => BLOCK_SIZE_DEFAULT.max(logical_block_size),
            Some(bs) if bs.is_power_of_two() && bs >= logical_block_size => bs,
            Some(bs) => {
                return Err(MediaError::InvalidGeometry {
                    reason: format!(
                        "block size {bs} is not a power of two of at least the device's logical \
                         block size {logical_block_size}"
                    ),
                })
            }
        };
        let block_count = size_bytes / u64::from(block_size);
        if block_count == 0 {
            return Err(MediaError::TooSmall { size_bytes, block_size });
        }
        let atomic = ATOMIC_WRITE_SIZE_DEFAULT.min(block_size);
        let geometry = Geometry::new(block_size, block_count, atomic)?;
        Ok(Self::with_base(Base::File(file), geometry))
    }

    fn with_base(base: Base, geometry: Geometry) -> Self {
        OverlayDevice {
            base,
            geometry,
            written: Mutex::new(BTreeMap::new()),
            next_ticket: AtomicU64::new(1),
            counters: Counters::default(),
        }
    }

    /// Blocks written through the overlay so far (held in memory, never on the base).
    #[must_use]
    pub fn written_block_count(&self) -> u64 {
        self.lock().len() as u64
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Box<[u8]>>> {
        // A panic elsewhere mid-insert leaves whole blocks in the map: keep serving it.
        self.written.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Device for OverlayDevice {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn read(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        check_read(&self.geometry, block, buf)?;
        self.counters.read(buf.len());
        match &self.base {
            Base::File(file) => {
                let offset = block * u64::from(self.geometry.block_size);
                // A file truncated under us reads short: an I/O error, not zeros.
                file.read_exact_at(buf, offset)
                    .map_err(|source| MediaError::Io { op: "pread", source })?;
            }
            Base::Device(dev) => dev.read(block, buf)?,
        }
        let bs = self.geometry.block_size as usize;
        let count = (buf.len() / bs) as u64;
        for (&b, data) in self.lock().range(block..block + count) {
            let at = (b - block) as usize * bs;
            buf[at..at + bs].copy_from_slice(data);
        }
        Ok(())
    }

    fn submit(&self, writes: Vec<Write>, flags: WriteFlags) -> Result<Ticket> {
        check_write(&self.geometry, &writes)?;
        self.counters.submission();
        let bs = self.geometry.block_size as usize;
        let mut written = self.lock();
        for w in &writes {
            self.counters.write(w.data.len(), flags.fua);
            for (i, chunk) in w.data.chunks_exact(bs).enumerate() {
                written.insert(w.block + i as u64, chunk.into());
            }
        }
        Ok(Ticket(self.next_ticket.fetch_add(1, Ordering::Relaxed)))
    }

    fn wait(&self, ticket: Ticket) -> Result<()> {
        if ticket.0 == 0 || ticket.0 >= self.next_ticket.load(Ordering::Relaxed) {
            return Err(MediaError::UnknownTicket(ticket.0));
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
    use crate::{IoBuf, MemDevice};

    #[test]
    fn writes_stay_in_the_overlay_and_read_back_over_the_base() {
        let base = Arc::new(MemDevice::new(512, 8).unwrap());
        base.write_sync(vec![Write::new(2, IoBuf::from_slice(&[7u8; 1024]))], WriteFlags::NONE)
            .unwrap();
        let before = base.image();
        let overlay = OverlayDevice::new(base.clone());
        let t = overlay
            .submit(vec![Write::new(3, IoBuf::from_slice(&[9u8; 1024]))], WriteFlags::FUA)
            .unwrap();
        overlay.wait(t).unwrap();
        overlay.flush().unwrap();
        let mut buf = vec![0u8; 4 * 512];
        overlay.read(1, &mut buf).unwrap();
        assert!(buf[..512].iter().all(|&b| b == 0));
        assert!(buf[512..1024].iter().all(|&b| b == 7), "block 2 from the base");
        assert!(buf[1024..].iter().all(|&b| b == 9), "blocks 3 and 4 from the overlay");
        assert_eq!(overlay.written_block_count(), 2);
        let after = base.image();
        for b in 0..8 {
            assert_eq!(before.block(b), after.block(b), "the base changed at block {b}");
        }
        assert!(matches!(overlay.wait(Ticket(99)), Err(MediaError::UnknownTicket(99))));
    }

    #[test]
    fn a_file_base_is_read_only_and_a_short_file_reads_as_an_error() {
        let dir = std::env::temp_dir().join(format!("tally-overlay-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("image");
        std::fs::write(&path, vec![5u8; 3 * 4096 + 100]).unwrap();
        let overlay = OverlayDevice::open_read_only(&path).unwrap();
        assert_eq!(overlay.geometry().block_count, 3, "a partial block is not a block");
        overlay
            .write_sync(vec![Write::new(0, IoBuf::from_slice(&[1u8; 4096]))], WriteFlags::NONE)
            .unwrap();
        let mut buf = vec![0u8; 2 * 4096];
        overlay.read(0, &mut buf).unwrap();
        assert!(buf[..4096].iter().all(|&b| b == 1) && buf[4096..].iter().all(|&b| b == 5));
        assert_eq!(std::fs::read(&path).unwrap(), vec![5u8; 3 * 4096 + 100], "file unchanged");
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(4096).unwrap();
        assert!(matches!(overlay.read(1, &mut buf[..4096]), Err(MediaError::Io { .. })));
        let empty = dir.join("empty");
        std::fs::write(&empty, b"").unwrap();
        assert!(matches!(OverlayDevice::open_read_only(&empty), Err(MediaError::TooSmall { .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! `FileDevice`: a [`Device`] on a regular file or a block device.
//!
//! Chosen at open, and reported by [`FileDevice::direct`] and [`FileDevice::engine`]:
//! - `O_DIRECT` where the target accepts it (tried with an aligned read of block 0), else the
//!   page cache;
//! - writes through io_uring (one `io_uring_enter` per submission, a reaper thread for
//!   completions), else through a pool of threads doing `pwritev2`.
//!
//! Reads are synchronous `pread`s; flush is `fdatasync`; FUA is `RWF_DSYNC` on the write.
//!
//! Invariants:
//! - requests are validated (`check_read` / `check_write`) before any I/O or counting;
//! - the geometry never changes after open; the file's bytes past the last whole block are
//!   never touched;
//! - after the first failed write or flush, `submit` and `flush` return
//!   [`MediaError::Failed`]; reads still work;
//! - dropping the device waits for every write in flight before the file is closed.

mod sys;
mod threads;
pub(crate) mod tracker;
mod uring;

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::buf::IO_ALIGN;
use crate::{
    check_read, check_write, Counters, Device, DeviceStats, Geometry, IoBuf, MediaError, Result,
    Ticket, Write, WriteFlags,
};
use threads::ThreadPool;
use tracker::{Failure, Tracker};
use uring::Uring;

pub(crate) use sys::block_device_shape;
pub use sys::fallocate;

/// Default block size of a `FileDevice` on a regular file.
pub const BLOCK_SIZE_DEFAULT: u32 = 4096;
/// Default power-fail atomic write unit: one 512-byte sector, all that every disk promises.
pub const ATOMIC_WRITE_SIZE_DEFAULT: u32 = 512;
/// Largest chunk read through a bounce buffer at a time.
const BOUNCE_SIZE_MAX: usize = 1 << 20;

/// Whether to bypass the page cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DirectMode {
    /// Use `O_DIRECT` if the target accepts it, else buffered I/O (logged).
    #[default]
    Auto,
    /// Require `O_DIRECT`; fail to open otherwise.
    On,
    /// Buffered I/O through the page cache.
    Off,
}

/// Which write engine to use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Engine {
    /// io_uring if a ring can be set up, else the thread pool (logged).
    #[default]
    Auto,
    /// Require io_uring; fail to open otherwise.
    IoUring,
    /// A pool of threads doing `pwritev2`.
    Threads,
}

/// The write engine a device ended up with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    /// io_uring.
    IoUring,
    /// Thread pool doing `pwritev2`.
    Threads,
}

impl std::fmt::Display for EngineKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EngineKind::IoUring => "io_uring",
            EngineKind::Threads => "threads",
        })
    }
}

/// How to open a [`FileDevice`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileOptions {
    /// Block size; `None`: 4096, or the device's logical block size if larger.
    pub block_size: Option<u32>,
    /// Bypass the page cache?
    pub direct: DirectMode,
    /// Write engine.
    pub engine: Engine,
    /// Bytes the medium writes all-or-nothing.
    pub atomic_write_size: u32,
    /// Bound on writes in flight (io_uring entries, or the thread pool's queue).
    pub queue_depth: u32,
    /// Threads of the thread-pool engine.
    pub thread_count: u32,
}

impl Default for FileOptions {
    fn default() -> Self {
        FileOptions {
            block_size: None,
            direct: DirectMode::Auto,
            engine: Engine::Auto,
            atomic_write_size: ATOMIC_WRITE_SIZE_DEFAULT,
            queue_depth: 128,
            thread_count: 4,
        }
    }
}

enum Writer {
    Uring(Uring),
    Threads(ThreadPool),
}

impl Writer {
    /// The engine `options` ask for, and why io_uring was passed over when it was.
    fn start(
        options: &FileOptions,
        file: &Arc<File>,
        tracker: &Arc<Tracker>,
        counters: &Arc<Counters>,
    ) -> Result<(Writer, Option<String>)> {
        let queue_depth = options.queue_depth.max(1);
        let start_threads = || {
            let thread_count = usize::try_from(options.thread_count.max(1)).unwrap_or(1);
            let queue_depth = usize::try_from(queue_depth).unwrap_or(1);
            let (file, tracker, counters) = (file.clone(), tracker.clone(), counters.clone());
            ThreadPool::start(file, tracker, counters, thread_count, queue_depth)
                .map(Writer::Threads)
        };
        let start_uring = || {
            let (file, tracker, counters) = (file.clone(), tracker.clone(), counters.clone());
            Uring::start(file, tracker, counters, queue_depth).map(Writer::Uring)
        };
        match options.engine {
            Engine::Threads => Ok((start_threads()?, None)),
            Engine::IoUring => {
                let writer = start_uring()
                    .map_err(|source| MediaError::Io { op: "io_uring setup", source })?;
                Ok((writer, None))
            }
            Engine::Auto => match start_uring() {
                Ok(writer) => Ok((writer, None)),
                Err(error) => {
                    let note = format!("io_uring unavailable ({error})");
                    tracing::warn!("{note}; using a pwritev2 thread pool");
                    Ok((start_threads()?, Some(note)))
                }
            },
        }
    }

    fn kind(&self) -> EngineKind {
        match self {
            Writer::Uring(_) => EngineKind::IoUring,
            Writer::Threads(_) => EngineKind::Threads,
        }
    }
}

/// A device backed by a regular file or a block device.
pub struct FileDevice {
    // Declared first so it is dropped (and its writes drained) before `file` closes; Drop also
    // shuts it down explicitly.
    writer: Writer,
    file: Arc<File>,
    path: PathBuf,
    geometry: Geometry,
    direct: bool,
    direct_note: Option<String>,
    engine_note: Option<String>,
    tracker: Arc<Tracker>,
    counters: Arc<Counters>,
}

fn open_file(path: &Path, direct: bool) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true).write(true);
    if direct {
        options.custom_flags(libc::O_DIRECT);
    }
    options.open(path)
}

fn is_einval(error: &io::Error) -> bool {
    error.raw_os_error() == Some(libc::EINVAL)
}

impl FileDevice {
    /// Open `path` (a regular file or a block device) as a device.
    ///
    /// # Errors
    /// [`MediaError::Open`] if the path cannot be opened (missing, a directory, no
    /// permission, or `O_DIRECT` refused when required); [`MediaError::TooSmall`] if it holds
    /// less than one block; [`MediaError::InvalidGeometry`] for bad sizes; [`MediaError::Io`]
    /// if io_uring was required and cannot be set up.
    pub fn open(path: impl AsRef<Path>, options: FileOptions) -> Result<Self> {
        let path = path.as_ref();
        let open_error = |source| MediaError::Open { path: path.to_path_buf(), source };
        let want_direct = options.direct != DirectMode::Off;
        let mut direct_note = None;
        let mut file = match open_file(path, want_direct) {
            Ok(file) => file,
            Err(error)
                if want_direct && options.direct == DirectMode::Auto && is_einval(&error) =>
            {
                let note = format!("open with O_DIRECT failed ({error})");
                tracing::warn!(path = %path.display(), "{note}; using buffered I/O");
                direct_note = Some(note);
                open_file(path, false).map_err(open_error)?
            }
            Err(error) => return Err(open_error(error)),
        };
        let mut direct = want_direct && direct_note.is_none();

        let metadata = file.metadata().map_err(open_error)?;
        let (logical_block_size, size_bytes) = if metadata.file_type().is_block_device() {
            sys::block_device_shape(&file)?
        } else if metadata.is_file() {
            (512, metadata.len())
        } else {
            let source =
                io::Error::new(io::ErrorKind::InvalidInput, "not a regular file or a block device");
            return Err(open_error(source));
        };
        let block_size = options.block_size.unwrap_or(BLOCK_SIZE_DEFAULT.max(logical_block_size));
        if logical_block_size == 0 || !block_size.is_multiple_of(logical_block_size) {
            return Err(MediaError::InvalidGeometry {
                reason: format!(
                    "block size {block_size} is not a multiple of the device's logical block size {logical_block_size}"
                ),
            });
        }
        let block_count = size_bytes / u64::from(block_size);
        if block_count == 0 {
            return Err(MediaError::TooSmall { size_bytes, block_size });
        }
        let geometry = Geometry::new(block_size, block_count, options.atomic_write_size)?;

        if direct {
            // Some file systems accept O_DIRECT at open and refuse it at the first I/O (or only
            // for some alignments): try one aligned block.
            let mut probe = IoBuf::zeroed(block_size as usize);
            if let Err(error) = file.read_exact_at(&mut probe, 0) {
                if !is_einval(&error) {
                    return Err(MediaError::Io { op: "pread", source: error });
                }
                if options.direct == DirectMode::On {
                    return Err(open_error(error));
                }
                let note = format!("aligned O_DIRECT read of {block_size} bytes failed ({error})");
                tracing::warn!(path = %path.display(), "{note}; using buffered I/O");
                direct_note = Some(note);
                file = open_file(path, false).map_err(open_error)?;
                direct = false;
            }
        }

        let file = Arc::new(file);
        let tracker = Arc::new(Tracker::new());
        let counters = Arc::new(Counters::default());
        let (writer, engine_note) = Writer::start(&options, &file, &tracker, &counters)?;
        tracing::debug!(
            path = %path.display(), ?geometry, direct,
            engine = %writer.kind(),
            "opened file device"
        );
        Ok(FileDevice {
            writer,
            file,
            path: path.to_path_buf(),
            geometry,
            direct,
            direct_note,
            engine_note,
            tracker,
            counters,
        })
    }

    /// Whether I/O bypasses the page cache (`O_DIRECT`).
    #[must_use]
    pub fn direct(&self) -> bool {
        self.direct
    }

    /// The write engine in use.
    #[must_use]
    pub fn engine(&self) -> EngineKind {
        self.writer.kind()
    }

    /// Why `O_DIRECT` is not in use, if it was tried and refused.
    #[must_use]
    pub fn direct_fallback(&self) -> Option<&str> {
        self.direct_note.as_deref()
    }

    /// Why io_uring is not in use, if it was tried and failed.
    #[must_use]
    pub fn engine_fallback(&self) -> Option<&str> {
        self.engine_note.as_deref()
    }

    /// The path the device was opened at.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn byte_offset(&self, block: u64) -> u64 {
        // In range after check_read/check_write, so the product fits (size_bytes fits in u64).
        block * u64::from(self.geometry.block_size)
    }

    fn pread(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.file.read_exact_at(buf, offset).map_err(|error| {
            let source = if error.kind() == io::ErrorKind::UnexpectedEof {
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "read of {} bytes at offset {offset} is past the end of {} (truncated since open?)",
                        buf.len(),
                        self.path.display()
                    ),
                )
            } else {
                error
            };
            MediaError::Io { op: "pread", source }
        })
    }

    /// [`Device::submit_stream`], [`uring::NO_STREAM`] for a plain [`Device::submit`].
    fn submit_for(&self, stream: u16, writes: Vec<Write>, flags: WriteFlags) -> Result<Ticket> {
        check_write(&self.geometry, &writes)?;
        let ticket = self.tracker.begin(writes.len())?;
        self.counters.submission();
        let jobs: Vec<(u64, IoBuf)> = writes
            .into_iter()
            .map(|write| {
                self.counters.write(write.data.len(), flags.fua);
                (self.byte_offset(write.block), write.data)
            })
            .collect();
        if jobs.is_empty() {
            return Ok(ticket);
        }
        match &self.writer {
            Writer::Uring(ring) => ring.submit(ticket, stream, jobs, flags.fua)?,
            Writer::Threads(pool) => pool.submit(ticket, jobs, flags.fua),
        }
        Ok(ticket)
    }
}

impl Device for FileDevice {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn read(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        check_read(&self.geometry, block, buf)?;
        self.counters.read(buf.len());
        let offset = self.byte_offset(block);
        if !self.direct || (buf.as_ptr() as usize).is_multiple_of(IO_ALIGN) {
            return self.pread(buf, offset);
        }
        // O_DIRECT needs an aligned buffer: bounce through one, a bounded chunk at a time.
        let chunk_size = BOUNCE_SIZE_MAX.min(buf.len());
        let mut bounce = IoBuf::zeroed(chunk_size);
        let mut chunk_offset = offset;
        for chunk in buf.chunks_mut(chunk_size) {
            let staging = &mut bounce[..chunk.len()];
            self.pread(staging, chunk_offset)?;
            chunk.copy_from_slice(staging);
            chunk_offset += chunk.len() as u64;
        }
        Ok(())
    }

    fn submit(&self, writes: Vec<Write>, flags: WriteFlags) -> Result<Ticket> {
        self.submit_for(uring::NO_STREAM, writes, flags)
    }

    /// The io_uring engine shares its room between streams (a heavy stream leaves some to the
    /// others: `uring.rs`); the thread pool's queue is first come, first served.
    fn submit_stream(&self, stream: u16, writes: Vec<Write>, flags: WriteFlags) -> Result<Ticket> {
        self.submit_for(stream, writes, flags)
    }

    fn wait(&self, ticket: Ticket) -> Result<()> {
        self.tracker.wait(ticket)
    }

    fn flush(&self) -> Result<()> {
        self.tracker.check_alive()?;
        self.counters.flush();
        self.file.sync_data().map_err(|error| {
            // Never retried: after a failed fdatasync the kernel may have dropped the dirty
            // pages, so a later success would prove nothing.
            let failure = Failure::from_io("fdatasync", &error);
            self.tracker.fail_stop(&failure);
            failure.to_error()
        })
    }

    fn stats(&self) -> DeviceStats {
        self.counters.snapshot()
    }
}

impl Drop for FileDevice {
    fn drop(&mut self) {
        match &mut self.writer {
            Writer::Uring(ring) => ring.shutdown(),
            Writer::Threads(pool) => pool.shutdown(),
        }
        let pending = self.tracker.pending_count();
        if pending > 0 {
            tracing::error!(pending, path = %self.path.display(), "closing with tickets unfinished");
        }
    }
}

impl std::fmt::Debug for FileDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileDevice")
            .field("path", &self.path)
            .field("geometry", &self.geometry)
            .field("direct", &self.direct)
            .field("engine", &self.engine())
            .finish_non_exhaustive()
    }
}

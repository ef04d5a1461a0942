//! `PmemDevice`: byte-addressable persistent memory, mapped from a file.
//!
//! Chosen at open and reported by [`PmemDevice::mode`]:
//! - [`PmemMode::Dax`]: the file is on a DAX file system and mapped with
//!   `MAP_SHARED_VALIDATE | MAP_SYNC`; a line flush plus a fence makes stores durable;
//! - [`PmemMode::Emulated`]: the file is on tmpfs (e.g. under `/dev/shm`): DRAM stands in for
//!   persistent memory, as NOVA's own evaluation did. The same instructions run as on real
//!   persistent memory, so costs and ordering are exercised, but nothing survives a reboot;
//! - [`PmemMode::Msync`]: any other file: only `msync` makes stores durable, so `flush` is an
//!   `msync` of the pages holding the range, durable when it returns.
//!
//! The line flush is `clwb`, else `clflushopt`, else `clflush` (CPUID; [`PmemDevice::flush_kind`]
//! says which); off x86-64 there is none and every mode persists with `msync` instead.
//!
//! Persistence protocol (the same one `tally-crash`'s cache-line simulator models):
//! - `write` is cached stores: durable only after `flush` of its lines and then `fence`;
//! - `memcpy_nt` stores the 8-byte-aligned middle non-temporally and the unaligned head and
//!   tail with cached stores whose lines it flushes itself (NOVA once left such a tail in the
//!   cache): all of it is durable after the next `fence`;
//! - `store_u64_atomic` is one aligned 8-byte store, never torn by a power failure;
//! - `fence` orders the calling thread's earlier stores and flushes: each thread fences its own.
//!
//! Invariants:
//! - every byte offset is checked against the region before any access: out-of-range requests
//!   are refused with [`PmemError::OutOfRange`], never a panic;
//! - the mapping's base is page-aligned, so region lines are hardware lines;
//! - the bytes are only touched under one lock, so reads and writes of this process never race;
//!   another process mapping the same file is outside this crate's control;
//! - after the first failed `msync` the region is failed: writes and flushes return
//!   [`PmemError::Failed`]; reads still work.
//!
//! A store into a page the file system cannot back (a full tmpfs, a truncated file) faults with
//! SIGBUS; `create` reserves the file's blocks with `fallocate` to rule that out for the region.

mod block;
mod cpu;
mod error;
mod map;
mod region;
mod view;

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, PoisonError};

use serde::Serialize;

use crate::{Counters, Geometry, BLOCK_SIZE_DEFAULT};
use map::Mapping;
use region::Region;

pub use cpu::{cpu_flush_kind, FlushKind, LINE_SIZE, WORD_SIZE};
pub use error::{check_range, PmemError};
pub use view::{block_mutants_available, BlockMutant, BlockView};

/// How stores to a [`PmemDevice`] become durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PmemMode {
    /// Real persistent memory: a DAX file mapped with `MAP_SYNC`; line flush + fence.
    Dax,
    /// DRAM standing in for persistent memory (a tmpfs file); line flush + fence.
    Emulated,
    /// A page-cache mapping: `msync` makes stores durable.
    Msync,
}

impl std::fmt::Display for PmemMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PmemMode::Dax => "dax",
            PmemMode::Emulated => "emulated",
            PmemMode::Msync => "msync",
        })
    }
}

/// How to open a [`PmemDevice`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PmemOptions {
    /// Block size of the [`crate::Device`] view (a power of two, at least 512).
    pub block_size: u32,
    /// Use `msync` for persistence even where line flushes would do (for testing that path).
    pub force_msync: bool,
}

impl Default for PmemOptions {
    fn default() -> Self {
        PmemOptions { block_size: BLOCK_SIZE_DEFAULT, force_msync: false }
    }
}

/// Byte-addressed persistent memory: what a program needs to persist data at cache-line
/// granularity. [`PmemDevice`] implements it on a mapping; `tally-crash`'s cache-line simulator
/// implements it too, so the same code runs on both.
pub trait Pmem: Send + Sync {
    /// Size of the region in bytes.
    fn len(&self) -> u64;

    /// Whether the region has no bytes (never true for a device that opened).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copy `buf.len()` bytes at `off` into `buf`: the newest stores, durable or not.
    ///
    /// # Errors
    /// [`PmemError::OutOfRange`].
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), PmemError>;

    /// Cached stores of `bytes` at `off`: durable after `flush` of their lines and `fence`.
    ///
    /// # Errors
    /// [`PmemError::OutOfRange`], [`PmemError::Failed`].
    fn write(&self, off: u64, bytes: &[u8]) -> Result<(), PmemError>;

    /// Non-temporal copy of `src` to `off`: durable after the next `fence`, no `flush` needed.
    ///
    /// # Errors
    /// As [`Pmem::write`].
    fn memcpy_nt(&self, off: u64, src: &[u8]) -> Result<(), PmemError>;

    /// One 8-byte store of `value` (little-endian) at `off`, a multiple of 8: never torn.
    ///
    /// # Errors
    /// [`PmemError::Misaligned`], and as [`Pmem::write`].
    fn store_u64_atomic(&self, off: u64, value: u64) -> Result<(), PmemError>;

    /// Write back every cache line overlapping `len` bytes at `off`; durable after `fence`.
    ///
    /// # Errors
    /// [`PmemError::OutOfRange`], [`PmemError::Failed`], and `msync` errors in msync mode.
    fn flush(&self, off: u64, len: u64) -> Result<(), PmemError>;

    /// Wait until this thread's earlier flushes and non-temporal stores are durable, before any
    /// later store.
    fn fence(&self);
}

/// Counters of persistence work, for reporting fences and flushed lines per transaction.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PmemStats {
    /// Cache lines written back by flush instructions.
    pub lines_flushed: u64,
    /// Fences issued.
    pub fences: u64,
    /// `msync` calls.
    pub msyncs: u64,
    /// Bytes stored with cached stores (including the head and tail of non-temporal copies).
    pub bytes_stored: u64,
    /// Bytes stored non-temporally.
    pub bytes_nt: u64,
    /// 8-byte atomic stores.
    pub atomic_stores: u64,
}

impl std::ops::Sub for PmemStats {
    type Output = PmemStats;
    fn sub(self, o: PmemStats) -> PmemStats {
        PmemStats {
            lines_flushed: self.lines_flushed - o.lines_flushed,
            fences: self.fences - o.fences,
            msyncs: self.msyncs - o.msyncs,
            bytes_stored: self.bytes_stored - o.bytes_stored,
            bytes_nt: self.bytes_nt - o.bytes_nt,
            atomic_stores: self.atomic_stores - o.atomic_stores,
        }
    }
}

#[derive(Default)]
struct PmemCounters {
    lines_flushed: AtomicU64,
    fences: AtomicU64,
    msyncs: AtomicU64,
    bytes_stored: AtomicU64,
    bytes_nt: AtomicU64,
    atomic_stores: AtomicU64,
}

/// Persistent memory mapped from a file. See the module documentation.
pub struct PmemDevice {
    region: Mutex<Region>,
    path: PathBuf,
    len: u64,
    mode: PmemMode,
    flush_kind: FlushKind,
    map_note: String,
    geometry: Geometry,
    next_ticket: AtomicU64,
    counters: Counters,
    pmem_counters: PmemCounters,
}

impl PmemDevice {
    /// Create (or truncate) the file at `path` as a zeroed region of `len` bytes, reserve its
    /// blocks, and map it.
    ///
    /// # Errors
    /// [`PmemError::BadSize`] for a zero or unmappable size or one below a block,
    /// [`PmemError::Open`], and mapping errors.
    pub fn create(path: &Path, len: u64, options: PmemOptions) -> Result<Self, PmemError> {
        check_size(len, options.block_size)?;
        let open_error = |source| PmemError::Open { path: path.to_path_buf(), source };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(open_error)?;
        file.set_len(len).map_err(open_error)?;
        match crate::file::fallocate(&file, len) {
            // Some file systems cannot reserve blocks; the region still works until one fills.
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {}
            other => other.map_err(open_error)?,
        }
        Self::map(file, path, len, options)
    }

    /// Map the existing file at `path`; the region is the whole file.
    ///
    /// # Errors
    /// As [`PmemDevice::create`].
    pub fn open(path: &Path, options: PmemOptions) -> Result<Self, PmemError> {
        let open_error = |source| PmemError::Open { path: path.to_path_buf(), source };
        let file = OpenOptions::new().read(true).write(true).open(path).map_err(open_error)?;
        let len = file.metadata().map_err(open_error)?.len();
        check_size(len, options.block_size)?;
        Self::map(file, path, len, options)
    }

    fn map(file: File, path: &Path, len: u64, options: PmemOptions) -> Result<Self, PmemError> {
        let len_usize = usize::try_from(len)
            .map_err(|_| PmemError::BadSize { len, reason: "exceeds the address space" })?;
        let geometry = Geometry::new(
            options.block_size,
            len / u64::from(options.block_size),
            // Persistent memory promises 8 bytes all-or-nothing; a block may tear at any word.
            WORD_SIZE as u32,
        )
        .map_err(|e| PmemError::BadSize { len, reason: bad_geometry_reason(&e) })?;
        let (map, map_note) = Mapping::new(&file, len_usize, !options.force_msync)?;
        assert_eq!(map.base() as usize % 4096, 0, "mmap returned an address not page-aligned");
        assert_eq!(map.len(), len_usize);
        let tmpfs =
            map::on_tmpfs(&file).map_err(|source| PmemError::Io { op: "fstatfs", source })?;
        let mode = match (&map, options.force_msync, tmpfs) {
            (Mapping::Sync { .. }, _, _) => PmemMode::Dax,
            (Mapping::Shared(_), false, true) => PmemMode::Emulated,
            (Mapping::Shared(_), _, _) => PmemMode::Msync,
        };
        let flush_kind = if mode == PmemMode::Msync { FlushKind::Msync } else { cpu_flush_kind() };
        tracing::debug!(path = %path.display(), %mode, %flush_kind, "pmem region mapped");
        Ok(PmemDevice {
            region: Mutex::new(Region { map, failed: None }),
            path: path.to_path_buf(),
            len,
            mode,
            flush_kind,
            map_note,
            geometry,
            next_ticket: AtomicU64::new(1),
            counters: Counters::default(),
            pmem_counters: PmemCounters::default(),
        })
        // `file` closes here; the mapping keeps the file's pages.
    }

    /// How stores become durable on this region.
    #[must_use]
    pub fn mode(&self) -> PmemMode {
        self.mode
    }

    /// The mechanism `flush` uses: a line instruction, or `msync`.
    #[must_use]
    pub fn flush_kind(&self) -> FlushKind {
        self.flush_kind
    }

    /// Why `MAP_SYNC` was not used (empty in [`PmemMode::Dax`]).
    #[must_use]
    pub fn map_note(&self) -> &str {
        &self.map_note
    }

    /// The mapped file.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Size of the region in bytes.
    #[must_use]
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Always false: an empty region is refused at open.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Persistence counters so far.
    #[must_use]
    pub fn pmem_stats(&self) -> PmemStats {
        let c = &self.pmem_counters;
        PmemStats {
            lines_flushed: c.lines_flushed.load(Relaxed),
            fences: c.fences.load(Relaxed),
            msyncs: c.msyncs.load(Relaxed),
            bytes_stored: c.bytes_stored.load(Relaxed),
            bytes_nt: c.bytes_nt.load(Relaxed),
            atomic_stores: c.atomic_stores.load(Relaxed),
        }
    }

    /// Copy `buf.len()` bytes at `off` into `buf`.
    ///
    /// # Errors
    /// [`PmemError::OutOfRange`].
    pub fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), PmemError> {
        let (start, _) = check_range(off, buf.len(), self.len)?;
        self.lock().read(start, buf);
        Ok(())
    }

    /// Cached stores of `bytes` at `off`; durable after `flush` and `fence`.
    ///
    /// # Errors
    /// [`PmemError::OutOfRange`], [`PmemError::Failed`].
    pub fn write(&self, off: u64, bytes: &[u8]) -> Result<(), PmemError> {
        let (start, _) = check_range(off, bytes.len(), self.len)?;
        let mut region = self.lock_writable()?;
        region.write(start, bytes);
        self.pmem_counters.bytes_stored.fetch_add(bytes.len() as u64, Relaxed);
        Ok(())
    }

    /// Non-temporal copy of `src` to `off`, durable after the next [`PmemDevice::fence`]. The
    /// unaligned head and tail are stored cached and their lines flushed here. In msync mode
    /// (or off x86-64) a plain copy followed by `msync`, durable on return.
    ///
    /// # Errors
    /// [`PmemError::OutOfRange`], [`PmemError::Failed`], `msync` errors.
    pub fn memcpy_nt(&self, off: u64, src: &[u8]) -> Result<(), PmemError> {
        let (start, end) = check_range(off, src.len(), self.len)?;
        let mut region = self.lock_writable()?;
        #[cfg(target_arch = "x86_64")]
        if self.flush_kind != FlushKind::Msync {
            let (lines, nt_bytes) = region.copy_nt(self.flush_kind, start, src);
            let c = &self.pmem_counters;
            c.lines_flushed.fetch_add(lines, Relaxed);
            c.bytes_nt.fetch_add(nt_bytes, Relaxed);
            c.bytes_stored.fetch_add(src.len() as u64 - nt_bytes, Relaxed);
            return Ok(());
        }
        region.write(start, src);
        self.pmem_counters.bytes_stored.fetch_add(src.len() as u64, Relaxed);
        self.msync(&mut region, start, end)
    }

    /// One 8-byte store of `value` (little-endian) at `off`, a multiple of 8. Never torn by a
    /// power failure; durable after `flush` and `fence` like any cached store.
    ///
    /// # Errors
    /// [`PmemError::Misaligned`], [`PmemError::OutOfRange`], [`PmemError::Failed`].
    pub fn store_u64_atomic(&self, off: u64, value: u64) -> Result<(), PmemError> {
        if !off.is_multiple_of(WORD_SIZE) {
            return Err(PmemError::Misaligned { off, align: WORD_SIZE });
        }
        let (start, _) = check_range(off, WORD_SIZE as usize, self.len)?;
        let mut region = self.lock_writable()?;
        region.store_u64_atomic(start, value);
        self.pmem_counters.atomic_stores.fetch_add(1, Relaxed);
        Ok(())
    }

    /// Write back every cache line overlapping `len` bytes at `off` (durable after
    /// [`PmemDevice::fence`]); in msync mode, `msync` of their pages (durable on return).
    ///
    /// # Errors
    /// [`PmemError::OutOfRange`], [`PmemError::Failed`], `msync` errors (after which the
    /// region is failed).
    pub fn flush(&self, off: u64, len: u64) -> Result<(), PmemError> {
        let len_usize = usize::try_from(len).map_err(|_| PmemError::OutOfRange {
            off,
            len,
            region_len: self.len,
        })?;
        let (start, end) = check_range(off, len_usize, self.len)?;
        let mut region = self.lock_writable()?;
        if self.flush_kind == FlushKind::Msync {
            return self.msync(&mut region, start, end);
        }
        let lines = region.flush_lines(self.flush_kind, start, end);
        self.pmem_counters.lines_flushed.fetch_add(lines, Relaxed);
        Ok(())
    }

    /// Wait until this thread's earlier flushes and non-temporal stores are durable, before
    /// any later store (`sfence`).
    pub fn fence(&self) {
        cpu::store_fence();
        self.pmem_counters.fences.fetch_add(1, Relaxed);
    }

    /// `flush` then `fence`.
    ///
    /// # Errors
    /// As [`PmemDevice::flush`].
    pub fn persist(&self, off: u64, len: u64) -> Result<(), PmemError> {
        self.flush(off, len)?;
        self.fence();
        Ok(())
    }

    /// `msync` `start..end`; on failure the region becomes failed.
    fn msync(&self, region: &mut Region, start: usize, end: usize) -> Result<(), PmemError> {
        if start >= end {
            return Ok(());
        }
        self.pmem_counters.msyncs.fetch_add(1, Relaxed);
        region.map.msync(start, end - start).map_err(|source| {
            let error = PmemError::Io { op: "msync", source };
            region.failed.get_or_insert_with(|| error.to_string());
            error
        })
    }

    fn lock(&self) -> MutexGuard<'_, Region> {
        // A poisoned lock means a panic elsewhere while holding it; the bytes are plain memory
        // and the fail-stop state is still meaningful, so keep serving.
        self.region.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The lock, unless the region is failed.
    fn lock_writable(&self) -> Result<MutexGuard<'_, Region>, PmemError> {
        let region = self.lock();
        match &region.failed {
            Some(first_error) => Err(PmemError::Failed { first_error: first_error.clone() }),
            None => Ok(region),
        }
    }

    /// Mark the region failed, as a persistence error would (for tests of fail-stop).
    #[cfg(test)]
    fn fail_for_test(&self, why: &str) {
        self.lock().failed = Some(why.to_string());
    }
}

impl Pmem for PmemDevice {
    fn len(&self) -> u64 {
        self.len
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), PmemError> {
        PmemDevice::read(self, off, buf)
    }
    fn write(&self, off: u64, bytes: &[u8]) -> Result<(), PmemError> {
        PmemDevice::write(self, off, bytes)
    }
    fn memcpy_nt(&self, off: u64, src: &[u8]) -> Result<(), PmemError> {
        PmemDevice::memcpy_nt(self, off, src)
    }
    fn store_u64_atomic(&self, off: u64, value: u64) -> Result<(), PmemError> {
        PmemDevice::store_u64_atomic(self, off, value)
    }
    fn flush(&self, off: u64, len: u64) -> Result<(), PmemError> {
        PmemDevice::flush(self, off, len)
    }
    fn fence(&self) {
        PmemDevice::fence(self);
    }
}

fn check_size(len: u64, block_size: u32) -> Result<(), PmemError> {
    if len == 0 {
        return Err(PmemError::BadSize { len, reason: "a region needs at least one byte" });
    }
    if len < u64::from(block_size) {
        return Err(PmemError::BadSize { len, reason: "smaller than one block" });
    }
    Ok(())
}

fn bad_geometry_reason(error: &crate::MediaError) -> &'static str {
    match error {
        crate::MediaError::InvalidGeometry { .. } => "block size is not a power of two >= 512",
        _ => "invalid geometry",
    }
}

#[cfg(test)]
mod tests;

//! The mapping of a region: `MAP_SYNC` where the file system supports it, else a plain shared
//! mapping through `memmap2`.
//!
//! Invariants: the base address is page-aligned (so cache lines of the region are lines of the
//! mapping); the length never changes; the mapping lives exactly as long as this value.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;

use super::PmemError;

/// A live shared, writable mapping of a whole file.
pub(super) enum Mapping {
    /// Mapped with `MAP_SHARED_VALIDATE | MAP_SYNC`: stores reach the medium with a line flush
    /// and a fence, no `msync` needed.
    Sync { base: NonNull<u8>, len: usize },
    /// A plain `MAP_SHARED` mapping.
    Shared(memmap2::MmapRaw),
}

// SAFETY: the mapping is plain memory owned by this value; the `Sync` variant's pointer is only
// an address (the device serialises access to the bytes behind a lock).
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` only hands out the address and issues msync.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Map `len` bytes of `file`, trying `MAP_SYNC` first when `try_sync`. Returns the mapping
    /// and why `MAP_SYNC` was not used, if it was not.
    pub(super) fn new(
        file: &File,
        len: usize,
        try_sync: bool,
    ) -> Result<(Self, String), PmemError> {
        let mut note = "MAP_SYNC not tried".to_string();
        if try_sync {
            match map_sync(file, len) {
                Ok(base) => return Ok((Mapping::Sync { base, len }, String::new())),
                // EOPNOTSUPP: the file system is not DAX; EINVAL: a kernel older than
                // MAP_SHARED_VALIDATE. Both mean "no synchronous faults here", not a failure.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EINVAL)) => {
                    note = format!("MAP_SYNC refused: {e}");
                }
                Err(source) => return Err(PmemError::Io { op: "mmap(MAP_SYNC)", source }),
            }
        }
        let raw = memmap2::MmapOptions::new()
            .len(len)
            .map_raw(file)
            .map_err(|source| PmemError::Io { op: "mmap", source })?;
        Ok((Mapping::Shared(raw), note))
    }

    /// First byte of the mapping.
    pub(super) fn base(&self) -> *mut u8 {
        match self {
            Mapping::Sync { base, .. } => base.as_ptr(),
            Mapping::Shared(raw) => raw.as_mut_ptr(),
        }
    }

    /// Bytes mapped.
    pub(super) fn len(&self) -> usize {
        match self {
            Mapping::Sync { len, .. } => *len,
            Mapping::Shared(raw) => raw.len(),
        }
    }

    /// `msync(MS_SYNC)` of the pages holding `len` bytes at `off` (already range-checked).
    pub(super) fn msync(&self, off: usize, len: usize) -> io::Result<()> {
        match self {
            Mapping::Shared(raw) => raw.flush_range(off, len),
            Mapping::Sync { base, .. } => {
                let page = page_size();
                let start = off - off % page;
                // SAFETY: start..off+len lies inside the mapping (the caller checked off+len);
                // msync only reads the address range.
                let rc = unsafe {
                    libc::msync(base.as_ptr().add(start).cast(), off + len - start, libc::MS_SYNC)
                };
                if rc == 0 {
                    Ok(())
                } else {
                    Err(io::Error::last_os_error())
                }
            }
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if let Mapping::Sync { base, len } = self {
            // SAFETY: base/len are exactly what mmap returned and nothing refers to the bytes
            // once the mapping is dropped. A failure leaves a leaked mapping, nothing worse.
            unsafe { libc::munmap(base.as_ptr().cast(), *len) };
        }
        // The Shared variant unmaps itself.
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no memory arguments.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096).max(1)
}

/// `mmap(MAP_SHARED_VALIDATE | MAP_SYNC)`.
fn map_sync(file: &File, len: usize) -> io::Result<NonNull<u8>> {
    // SAFETY: a fresh mapping at an address the kernel picks; no existing memory is affected.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED_VALIDATE | libc::MAP_SYNC,
            file.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))
}

/// Whether `file` lives on tmpfs (memory standing in for persistent memory).
pub(super) fn on_tmpfs(file: &File) -> io::Result<bool> {
    let mut stat = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: fstatfs fills the statfs struct the pointer points at, which lives on this stack.
    let rc = unsafe { libc::fstatfs(file.as_raw_fd(), stat.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstatfs succeeded, so it initialised the struct (and it was zeroed before).
    let stat = unsafe { stat.assume_init() };
    // f_type's integer type differs between architectures and libcs.
    #[allow(clippy::unnecessary_cast)]
    let on_tmpfs = stat.f_type as i64 == libc::TMPFS_MAGIC as i64;
    Ok(on_tmpfs)
}

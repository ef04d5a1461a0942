//! The few raw system calls of the file backend, each wrapped once with its error handling.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};

use super::tracker::Failure;
use crate::{Counters, MediaError};

/// Largest byte count Linux moves in one read or write call (`MAX_RW_COUNT`).
pub(crate) const RW_COUNT_MAX: usize = 0x7fff_f000;

/// `BLKGETSIZE64` = `_IOR(0x12, 114, size_t)`; libc does not export it. These architectures
/// put the "read" direction in bit 30 instead of bit 31.
const BLKGETSIZE64: u64 = if cfg!(any(
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "sparc",
    target_arch = "sparc64"
)) {
    0x4008_1272
} else {
    0x8008_1272
};

/// Logical block size and size in bytes of the block device open as `file`.
pub(crate) fn block_device_shape(file: &File) -> crate::Result<(u32, u64)> {
    let fd = file.as_raw_fd();
    let mut logical: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one c_int through the pointer, which points at a live c_int.
    let rc = unsafe { libc::ioctl(fd, libc::BLKSSZGET, std::ptr::addr_of_mut!(logical)) };
    if rc < 0 {
        return Err(MediaError::last_os("ioctl(BLKSSZGET)"));
    }
    let mut size_bytes: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points at a live u64. The
    // request number's type differs between libcs (c_ulong / c_int), hence the inferred cast.
    let rc = unsafe { libc::ioctl(fd, BLKGETSIZE64 as _, std::ptr::addr_of_mut!(size_bytes)) };
    if rc < 0 {
        return Err(MediaError::last_os("ioctl(BLKGETSIZE64)"));
    }
    let logical = u32::try_from(logical).map_err(|_| MediaError::InvalidGeometry {
        reason: format!("BLKSSZGET returned {logical}"),
    })?;
    Ok((logical, size_bytes))
}

/// Write all of `data` at byte `offset` with `pwritev2`, one call per attempt (each counted as
/// a submission syscall), looping over short writes and EINTR. `fua` sets `RWF_DSYNC`.
pub(crate) fn pwrite_all(
    fd: RawFd,
    data: &[u8],
    offset: u64,
    fua: bool,
    counters: &Counters,
) -> Result<(), Failure> {
    let flags = if fua { libc::RWF_DSYNC } else { 0 };
    let mut done = 0usize;
    while done < data.len() {
        let rest = &data[done..];
        let len = rest.len().min(RW_COUNT_MAX);
        let iov = libc::iovec { iov_base: rest.as_ptr() as *mut libc::c_void, iov_len: len };
        let position = offset
            .checked_add(done as u64)
            .and_then(|p| libc::off_t::try_from(p).ok())
            .ok_or_else(|| {
                Failure::other(
                    "pwritev2",
                    io::ErrorKind::InvalidInput,
                    format!("offset {offset} + {done} overflows off_t"),
                )
            })?;
        counters.syscalls(1);
        // SAFETY: iov describes `len` readable bytes of `data`, which outlives the call; the
        // kernel only reads through iov_base despite the *mut in the C signature.
        let written = unsafe { libc::pwritev2(fd, &iov, 1, position, flags) };
        if written < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(Failure::from_io("pwritev2", &error));
        }
        if written == 0 {
            return Err(Failure::other(
                "pwritev2",
                io::ErrorKind::WriteZero,
                format!("wrote 0 bytes at offset {position} with {} left", rest.len()),
            ));
        }
        done += written.unsigned_abs();
    }
    Ok(())
}

/// `fallocate(fd, 0, 0, len)`: reserve the blocks of a file so later writes need no allocation.
pub fn fallocate(file: &File, len: u64) -> io::Result<()> {
    let len = libc::off_t::try_from(len)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "length overflows off_t"))?;
    loop {
        // SAFETY: plain syscall on a valid fd; no memory is passed.
        let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) };
        if rc == 0 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

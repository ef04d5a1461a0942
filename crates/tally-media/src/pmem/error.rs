//! `PmemError`: why a byte-addressed persistent-memory operation failed.

use std::io;
use std::path::PathBuf;

use crate::MediaError;

/// Why a persistent-memory operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PmemError {
    /// A byte range reaches outside the region. Nothing was done.
    #[error("bytes {off}..{off}+{len} are outside the {region_len}-byte region")]
    OutOfRange {
        /// First byte of the request.
        off: u64,
        /// Bytes requested.
        len: u64,
        /// Size of the region.
        region_len: u64,
    },
    /// An offset that must be aligned is not. Nothing was done.
    #[error("offset {off} is not a multiple of {align}")]
    Misaligned {
        /// The offset given.
        off: u64,
        /// The alignment required.
        align: u64,
    },
    /// The file could not be opened or sized.
    #[error("cannot open {}: {source}", path.display())]
    Open {
        /// The path given.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The operating system reported an error.
    #[error("{op} failed: {source}")]
    Io {
        /// The operation, e.g. `"mmap"` or `"msync"`.
        op: &'static str,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A region size that cannot be mapped (zero, or beyond the address space).
    #[error("region of {len} bytes cannot be used: {reason}")]
    BadSize {
        /// The size.
        len: u64,
        /// Why.
        reason: &'static str,
    },
    /// An earlier persistence operation failed; the region refuses further writes (fail-stop).
    #[error("region failed earlier ({first_error}); reopen it to continue")]
    Failed {
        /// The first error, as text.
        first_error: String,
    },
    /// A crash simulator was asked for something its model does not define (see its docs).
    #[error("outside the crash model at byte {off}: {reason}")]
    Unmodelled {
        /// The byte concerned.
        off: u64,
        /// What the model does not define.
        reason: &'static str,
    },
}

impl From<PmemError> for MediaError {
    fn from(error: PmemError) -> Self {
        match error {
            PmemError::Io { op, source } => MediaError::Io { op, source },
            PmemError::Open { path, source } => MediaError::Open { path, source },
            PmemError::Failed { first_error } => MediaError::Failed { first_error },
            other => MediaError::Io {
                op: "pmem",
                source: io::Error::new(io::ErrorKind::InvalidInput, other.to_string()),
            },
        }
    }
}

/// Check that `len` bytes at `off` lie inside a region of `region_len` bytes; returns the range
/// as `usize` offsets.
///
/// # Errors
/// [`PmemError::OutOfRange`] when the range overflows or reaches past the end.
pub fn check_range(off: u64, len: usize, region_len: u64) -> Result<(usize, usize), PmemError> {
    let len_u64 = len as u64;
    let bad = || PmemError::OutOfRange { off, len: len_u64, region_len };
    let end = off.checked_add(len_u64).ok_or_else(bad)?;
    if end > region_len {
        return Err(bad());
    }
    let start = usize::try_from(off).map_err(|_| bad())?;
    let end = usize::try_from(end).map_err(|_| bad())?;
    Ok((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_checked_without_overflow() {
        assert_eq!(check_range(0, 64, 64).unwrap(), (0, 64));
        assert_eq!(check_range(64, 0, 64).unwrap(), (64, 64));
        assert!(matches!(check_range(1, 64, 64), Err(PmemError::OutOfRange { .. })));
        assert!(matches!(check_range(65, 0, 64), Err(PmemError::OutOfRange { .. })));
        assert!(matches!(check_range(u64::MAX, 2, u64::MAX), Err(PmemError::OutOfRange { .. })));
        let media: MediaError = PmemError::Misaligned { off: 3, align: 8 }.into();
        assert!(matches!(media, MediaError::Io { op: "pmem", .. }));
        let media: MediaError = PmemError::Failed { first_error: "x".into() }.into();
        assert!(matches!(media, MediaError::Failed { .. }));
    }
}

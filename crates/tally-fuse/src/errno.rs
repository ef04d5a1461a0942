//! The one place where a failure becomes an errno.
//!
//! The file system's errors carry their errno ([`FsError::errno`]); the adapter adds only the
//! few failures it finds itself (a flag it does not support, a request after a panic).

use fuser::Errno;
use tally_fs::FsError;

/// Why a request failed.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The file system refused or failed.
    Fs(FsError),
    /// A request flag or mode the file system does not implement (`EOPNOTSUPP`).
    Unsupported(&'static str),
    /// An ioctl that writes needs a file open for writing (`EBADF`, as F2FS answers).
    NotWritable,
    /// Only the file's owner (or root) may do this (`EACCES`).
    NotOwner,
    /// An earlier request panicked inside the file system: every later request fails with
    /// `EIO` (fail-stop), and unmount writes no snapshot, so the next mount replays the log.
    Stopped,
}

impl From<FsError> for Failure {
    fn from(e: FsError) -> Self {
        Failure::Fs(e)
    }
}

/// The errno for a failure: the file system's own mapping, nothing else.
pub(crate) fn errno(failure: &Failure) -> Errno {
    let code = match failure {
        Failure::Fs(e) => e.errno(),
        Failure::Unsupported(_) => libc::EOPNOTSUPP,
        Failure::Stopped => libc::EIO,
        Failure::NotWritable => libc::EBADF,
        Failure::NotOwner => libc::EACCES,
    };
    Errno::from_i32(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_system_errors_keep_their_errno() {
        for e in [FsError::NotFound, FsError::Exists, FsError::NotEmpty, FsError::Range] {
            let want = e.errno();
            assert_eq!(errno(&Failure::Fs(e)).code(), want);
        }
        assert_eq!(errno(&Failure::Unsupported("x")).code(), libc::EOPNOTSUPP);
        assert_eq!(errno(&Failure::Stopped).code(), libc::EIO);
    }
}

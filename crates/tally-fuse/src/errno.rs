//! The one place where a failure becomes an errno.
//!
//! The file system's errors say what happened ([`FsError`]); [`errno`] chooses the errno a
//! POSIX caller expects for each of them and for the few failures the adapter finds itself (a
//! flag it does not support, a request after a panic). No other code makes an errno.

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

/// The errno for a failure.
pub(crate) fn errno(failure: &Failure) -> Errno {
    let code = match failure {
        Failure::Fs(e) => fs_errno(e),
        Failure::Unsupported(_) => libc::EOPNOTSUPP,
        Failure::Stopped => libc::EIO,
        Failure::NotWritable => libc::EBADF,
        Failure::NotOwner => libc::EACCES,
    };
    Errno::from_i32(code)
}

/// The errno of a file-system error: what ext4 answers for the same condition.
fn fs_errno(e: &FsError) -> i32 {
    match e {
        FsError::NotFound => libc::ENOENT,
        FsError::Exists => libc::EEXIST,
        FsError::NotDir => libc::ENOTDIR,
        FsError::IsDir => libc::EISDIR,
        FsError::NotEmpty => libc::ENOTEMPTY,
        FsError::Invalid(_) | FsError::NoTxn => libc::EINVAL,
        FsError::NameTooLong => libc::ENAMETOOLONG,
        FsError::NoSpace => libc::ENOSPC,
        FsError::FileTooBig => libc::EFBIG,
        FsError::TooManyLinks => libc::EMLINK,
        FsError::NotPermitted => libc::EPERM,
        FsError::NotSupported(_) => libc::EOPNOTSUPP,
        FsError::NoAttr => libc::ENODATA,
        FsError::Range => libc::ERANGE,
        FsError::Busy => libc::EBUSY,
        FsError::ReadOnly { .. } => libc::EROFS,
        // Io, Corrupted, Poisoned, Log, and whatever a later tally-fs adds: never wrong data.
        _ => libc::EIO,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tally_fs::IoCause;

    use super::*;

    #[test]
    fn file_system_errors_keep_their_errno() {
        let io = || FsError::io(IoCause::NoBytes { ino: 2, block: 0 });
        let cases = [
            (FsError::NotFound, libc::ENOENT),
            (FsError::Exists, libc::EEXIST),
            (FsError::NotDir, libc::ENOTDIR),
            (FsError::IsDir, libc::EISDIR),
            (FsError::NotEmpty, libc::ENOTEMPTY),
            (FsError::Invalid("x"), libc::EINVAL),
            (FsError::NoTxn, libc::EINVAL),
            (FsError::NameTooLong, libc::ENAMETOOLONG),
            (FsError::NoSpace, libc::ENOSPC),
            (FsError::FileTooBig, libc::EFBIG),
            (FsError::TooManyLinks, libc::EMLINK),
            (FsError::NotPermitted, libc::EPERM),
            (FsError::NotSupported("x"), libc::EOPNOTSUPP),
            (FsError::NoAttr, libc::ENODATA),
            (FsError::Range, libc::ERANGE),
            (FsError::Busy, libc::EBUSY),
            (FsError::Poisoned, libc::EIO),
            (io(), libc::EIO),
            (FsError::corrupted("record", "x"), libc::EIO),
            (FsError::read_only(&Arc::new(io())), libc::EROFS),
        ];
        for (e, want) in cases {
            let shown = e.to_string();
            assert_eq!(errno(&Failure::Fs(e)).code(), want, "{shown}");
        }
        assert_eq!(errno(&Failure::Unsupported("x")).code(), libc::EOPNOTSUPP);
        assert_eq!(errno(&Failure::Stopped).code(), libc::EIO);
    }
}

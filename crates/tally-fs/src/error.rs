use tally_log::LogError;

/// Result of a file-system operation.
pub type Result<T, E = FsError> = std::result::Result<T, E>;

/// Why a file-system operation failed. Each variant maps to one errno ([`FsError::errno`]);
/// the FUSE adapter uses that mapping and nothing else.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FsError {
    /// No such file, directory or attribute owner.
    #[error("no such file or directory")]
    NotFound,
    /// The name is taken.
    #[error("file exists")]
    Exists,
    /// A path component or the target is not a directory.
    #[error("not a directory")]
    NotDir,
    /// A directory where a non-directory is required.
    #[error("is a directory")]
    IsDir,
    /// rmdir or rename onto a directory that has entries.
    #[error("directory not empty")]
    NotEmpty,
    /// Bad argument (rename into its own subtree, `.` or `..` as a name, bad flags, …).
    #[error("invalid argument: {0}")]
    Invalid(&'static str),
    /// A name longer than [`crate::NAME_MAX`] bytes.
    #[error("file name too long")]
    NameTooLong,
    /// Out of space. The file system is unchanged by the failed operation.
    #[error("no space left on device")]
    NoSpace,
    /// A write or truncate past [`crate::FILE_SIZE_MAX`].
    #[error("file too large")]
    FileTooBig,
    /// Too many links to one inode.
    #[error("too many links")]
    TooManyLinks,
    /// The operation is not allowed on this object (hard link to a directory, …).
    #[error("operation not permitted")]
    NotPermitted,
    /// Something this file system does not do (POSIX ACLs, some `fallocate` modes): the
    /// caller falls back (to `chmod`, to writing zeros).
    #[error("operation not supported: {0}")]
    NotSupported(&'static str),
    /// The extended attribute does not exist.
    #[error("no such attribute")]
    NoAttr,
    /// A buffer too small or a value too large (extended attributes).
    #[error("result out of range")]
    Range,
    /// An object is held by another open explicit transaction.
    #[error("object busy in another transaction")]
    Busy,
    /// The explicit transaction handle is unknown (already committed or aborted).
    #[error("no such transaction")]
    NoTxn,
    /// A checksum did not match, or the device failed: never wrong data.
    #[error("I/O error: {0}")]
    Io(String),
    /// The file system is read-only after an earlier I/O error (fail-stop); remount it.
    #[error("read-only after an earlier I/O error: {0}")]
    ReadOnly(String),
    /// The image is not a Tally file system, or its records are inconsistent.
    #[error("corrupted file system: {0}")]
    Corrupted(String),
    /// An earlier call panicked while holding the file system's state (a bug), which may have
    /// left it half changed: every later call fails (fail-stop), maintenance stops, and unmount
    /// writes no snapshot; the next mount rebuilds the state from the log.
    #[error("stopped after a panic in an earlier operation; remount")]
    Poisoned,
    /// A log error not covered above.
    #[error(transparent)]
    Log(LogError),
}

impl FsError {
    /// The errno a POSIX caller expects.
    #[must_use]
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotFound => libc::ENOENT,
            FsError::Exists => libc::EEXIST,
            FsError::NotDir => libc::ENOTDIR,
            FsError::IsDir => libc::EISDIR,
            FsError::NotEmpty => libc::ENOTEMPTY,
            FsError::Invalid(_) => libc::EINVAL,
            FsError::NameTooLong => libc::ENAMETOOLONG,
            FsError::NoSpace => libc::ENOSPC,
            FsError::FileTooBig => libc::EFBIG,
            FsError::TooManyLinks => libc::EMLINK,
            FsError::NotPermitted => libc::EPERM,
            FsError::NotSupported(_) => libc::EOPNOTSUPP,
            FsError::NoAttr => libc::ENODATA,
            FsError::Range => libc::ERANGE,
            FsError::Busy => libc::EBUSY,
            FsError::NoTxn => libc::EINVAL,
            FsError::Io(_) | FsError::Corrupted(_) | FsError::Log(_) | FsError::Poisoned => {
                libc::EIO
            }
            FsError::ReadOnly(_) => libc::EROFS,
        }
    }
}

impl From<LogError> for FsError {
    fn from(e: LogError) -> Self {
        match e {
            LogError::NoSpace { .. } | LogError::TooLarge { .. } => FsError::NoSpace,
            LogError::Failed { first_error } => FsError::ReadOnly(first_error),
            LogError::Media(m) => FsError::Io(m.to_string()),
            other => FsError::Log(other),
        }
    }
}

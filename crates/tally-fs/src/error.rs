use std::sync::Arc;

use tally_log::LogError;
use tally_media::MediaError;

use crate::Ino;

/// Result of a file-system operation.
pub type Result<T, E = FsError> = std::result::Result<T, E>;

/// Why a file-system operation failed. Each variant names what happened, with typed fields
/// where there is more to say, so a caller matches on it instead of parsing text; the errno a
/// POSIX caller sees is chosen in one place, the FUSE adapter's mapping (`tally-fuse`'s
/// `errno.rs`).
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
    #[error("I/O error: {cause}")]
    Io {
        /// What failed.
        cause: IoCause,
    },
    /// The file system is read-only after an earlier failure (fail-stop); remount it.
    #[error("read-only after an earlier I/O error: {}", .cause.detail())]
    ReadOnly {
        /// The first failure (an [`FsError::Io`], or an [`FsError::Corrupted`] found while
        /// cleaning); later ones are not kept.
        cause: Arc<FsError>,
    },
    /// The image is not a Tally file system, or its records are inconsistent.
    #[error("corrupted file system: {what}: {detail}")]
    Corrupted {
        /// The structure found inconsistent: `"record"`, `"snapshot"`, `"log replay"`, ...
        what: &'static str,
        /// What was wrong with it.
        detail: String,
    },
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
    /// An [`FsError::Io`] of `cause`.
    #[must_use]
    pub fn io(cause: IoCause) -> Self {
        FsError::Io { cause }
    }

    /// An [`FsError::Corrupted`]: `what` structure, `detail` what was wrong.
    #[must_use]
    pub fn corrupted(what: &'static str, detail: impl Into<String>) -> Self {
        FsError::Corrupted { what, detail: detail.into() }
    }

    /// An [`FsError::ReadOnly`] because of `first`, the failure that stopped the file system.
    #[must_use]
    pub fn read_only(first: &Arc<FsError>) -> Self {
        FsError::ReadOnly { cause: first.clone() }
    }

    /// The failure that makes the file system read-only when this error ends an operation:
    /// itself for an I/O error, the first failure for a read-only one, `None` for the rest.
    #[must_use]
    pub fn stops_writes(&self) -> Option<Arc<FsError>> {
        match self {
            FsError::ReadOnly { cause } => Some(cause.clone()),
            FsError::Io { cause } => Some(Arc::new(FsError::Io { cause: cause.clone() })),
            _ => None,
        }
    }

    /// The message without its prefix ("I/O error: ", "corrupted file system: "), to follow
    /// another one.
    fn detail(&self) -> String {
        match self {
            FsError::Io { cause } => cause.to_string(),
            FsError::ReadOnly { cause } => cause.detail(),
            FsError::Corrupted { what, detail } => format!("{what}: {detail}"),
            other => other.to_string(),
        }
    }
}

/// What an [`FsError::Io`] is about: never wrong data, but which failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IoCause {
    /// The device (or the log writing to it) failed.
    #[error("{message}")]
    Device {
        /// The operating system's error number, when the device reported one.
        os_error: Option<i32>,
        /// The device's or log's message.
        message: String,
    },
    /// A block read back does not match its checksum: the device returned other bytes.
    #[error("checksum mismatch in block {block} of inode {ino} (device block {addr})")]
    Checksum {
        /// The file.
        ino: Ino,
        /// The block of the file.
        block: u64,
        /// Where it is on the device.
        addr: u64,
    },
    /// A committed block whose bytes the state never had (a bug: refused, not guessed).
    #[error("block {block} of inode {ino} has no bytes")]
    NoBytes {
        /// The file.
        ino: Ino,
        /// The block of the file.
        block: u64,
    },
    /// A write stored fewer bytes than it was given.
    #[error("short write: {written} of {len}")]
    ShortWrite {
        /// Bytes written.
        written: usize,
        /// Bytes given.
        len: usize,
    },
}

impl From<&MediaError> for IoCause {
    fn from(e: &MediaError) -> Self {
        let os_error = match e {
            MediaError::Io { source, .. } | MediaError::Open { source, .. } => {
                source.raw_os_error()
            }
            _ => None,
        };
        IoCause::Device { os_error, message: e.to_string() }
    }
}

impl From<LogError> for FsError {
    fn from(e: LogError) -> Self {
        match e {
            LogError::NoSpace { .. } | LogError::TooLarge { .. } => FsError::NoSpace,
            LogError::Failed { first_error } => FsError::ReadOnly {
                cause: Arc::new(FsError::io(IoCause::Device {
                    os_error: None,
                    message: first_error,
                })),
            },
            LogError::Media(m) => FsError::io(IoCause::from(&m)),
            other => FsError::Log(other),
        }
    }
}

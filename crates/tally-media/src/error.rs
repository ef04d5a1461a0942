use std::io;
use std::path::PathBuf;

/// Result of a media operation.
pub type Result<T, E = MediaError> = std::result::Result<T, E>;

/// Why a media operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MediaError {
    /// The operating system reported an error.
    #[error("{op} failed: {source}")]
    Io {
        /// The operation, e.g. `"pwritev"` or `"fdatasync"`.
        op: &'static str,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A path could not be opened.
    #[error("cannot open {}: {source}", path.display())]
    Open {
        /// The path given.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A request names blocks past the end of the device.
    #[error("request for blocks {block}..{} is past the end of the device ({block_count} blocks)", block.saturating_add(u64::from(*count)))]
    OutOfRange {
        /// First block of the request.
        block: u64,
        /// Blocks requested.
        count: u32,
        /// Blocks on the device.
        block_count: u64,
    },
    /// A buffer length or offset is not a whole number of blocks.
    #[error("{what} is {value}, not a multiple of the block size {block_size}")]
    Misaligned {
        /// What was misaligned.
        what: &'static str,
        /// Its value.
        value: u64,
        /// The block size it must be a multiple of.
        block_size: u32,
    },
    /// The device cannot hold even one block.
    #[error("device of {size_bytes} bytes is smaller than one {block_size}-byte block")]
    TooSmall {
        /// Size of the device in bytes.
        size_bytes: u64,
        /// Block size required.
        block_size: u32,
    },
    /// A geometry that makes no sense (zero or non-power-of-two sizes, …).
    #[error("invalid geometry: {reason}")]
    InvalidGeometry {
        /// Why.
        reason: String,
    },
    /// An earlier write or flush failed; the device refuses further writes (fail-stop).
    #[error("device failed earlier ({first_error}); reopen it to continue")]
    Failed {
        /// The first error, as text.
        first_error: String,
    },
    /// A fault injected by a test device.
    #[error("injected fault: {op} #{nth}")]
    Injected {
        /// The operation the fault was injected into.
        op: &'static str,
        /// Which occurrence of it (1-based).
        nth: u64,
    },
    /// A network block device (NBD) server or connection failed: an error reply, a dropped
    /// connection, a timeout or a reply that breaks the protocol. An I/O error like any other:
    /// after a failed write or flush the device is failed.
    #[error("{op} failed: {source}")]
    Nbd {
        /// The operation, e.g. `"nbd write"` or `"nbd connect"`.
        op: &'static str,
        /// What went wrong.
        #[source]
        source: Box<crate::NbdError>,
    },
    /// The targets given for a multi-target image are not that image's, in its order: one is
    /// missing, extra, swapped, repeated, of another image, damaged or too small.
    #[error("multi-target image: {source}")]
    Span {
        /// Which target and what is wrong.
        #[source]
        source: Box<crate::SpanError>,
    },
    /// A ticket that this device never issued.
    #[error("unknown ticket {0}")]
    UnknownTicket(u64),
}

impl MediaError {
    /// An I/O error from the last OS call.
    pub(crate) fn last_os(op: &'static str) -> Self {
        MediaError::Io { op, source: io::Error::last_os_error() }
    }
}

use tally_media::MediaError;

/// Result of a log operation.
pub type Result<T, E = LogError> = std::result::Result<T, E>;

/// Why a log operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    /// The device failed.
    #[error(transparent)]
    Media(#[from] MediaError),
    /// An earlier write or flush failed; the log refuses commits until it is reopened.
    #[error("log is read-only after an earlier I/O error ({first_error}); reopen it to recover")]
    Failed {
        /// The first error, as text.
        first_error: String,
    },
    /// Bytes on the device are not what the format allows.
    #[error("corrupted {what} at block {block}: {reason}")]
    Corrupted {
        /// The structure being decoded.
        what: &'static str,
        /// Where.
        block: u64,
        /// What was wrong.
        reason: String,
    },
    /// A transaction that a later unit of its stream proves durable is damaged or missing:
    /// corruption, not a torn tail. Nothing was written; opening with `salvage` keeps the
    /// longest safe prefix instead.
    #[error(
        "corrupted log: stream {stream} lost a transaction after seq {kept_seq} (at block \
         {block}) that a later unit proves durable (up to seq {proven_seq}); nothing was \
         written; salvage keeps the prefix up to seq {kept_seq}"
    )]
    DurableTransactionLost {
        /// The stream.
        stream: u16,
        /// The last transaction the chain keeps.
        kept_seq: u64,
        /// Where the first missing transaction starts (or would start).
        block: u64,
        /// A unit proves every transaction of the stream up to this one durable.
        proven_seq: u64,
    },
    /// Neither superblock copy is valid: not a Tally log, or destroyed.
    #[error("no valid Tally superblock: {reason}")]
    NotFormatted {
        /// What was found instead.
        reason: String,
    },
    /// No free segment for a stream to continue in. Checkpoint to free space.
    #[error("out of log space on stream {stream}: no free segment")]
    NoSpace {
        /// The stream that needed a segment.
        stream: u16,
    },
    /// A transaction too large for one segment.
    #[error("transaction needs {blocks} blocks but a segment holds {segment_blocks}")]
    TooLarge {
        /// Blocks the transaction needs.
        blocks: u64,
        /// Blocks in a segment.
        segment_blocks: u32,
    },
    /// A request that makes no sense (bad stream, bad configuration, unknown ticket…).
    #[error("invalid argument: {0}")]
    Invalid(String),
}

pub(crate) fn corrupted(what: &'static str, block: u64, reason: impl Into<String>) -> LogError {
    LogError::Corrupted { what, block, reason: reason.into() }
}

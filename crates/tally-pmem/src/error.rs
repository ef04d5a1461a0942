//! `PmemLogError`: why a log operation failed.

use tally_media::PmemError;

/// Why a log on persistent memory refused or failed an operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PmemLogError {
    /// The region failed (range, alignment, a failed `msync`). The log is now read-only.
    #[error("persistent memory: {0}")]
    Pmem(#[from] PmemError),
    /// The region holds no log header.
    #[error("the region holds no Tally log (no header magic)")]
    NotFormatted,
    /// Bytes that a legal crash image never holds.
    #[error("corrupted log at byte {at}: {what}")]
    Corrupted {
        /// Byte offset concerned.
        at: u64,
        /// What is wrong.
        what: &'static str,
    },
    /// A configuration the log cannot use.
    #[error("bad log configuration: {0}")]
    BadConfig(&'static str),
    /// The transaction does not fit in the free slots; release older transactions first.
    #[error("log full: {needed} units needed, {free} free")]
    Full {
        /// Units the transaction needs.
        needed: u64,
        /// Units free.
        free: u64,
    },
    /// The transaction is larger than any log of this geometry can hold.
    #[error("transaction of {bytes} payload bytes is too large for this log")]
    TooLarge {
        /// Encoded payload bytes.
        bytes: u64,
    },
    /// `release_before` named a transaction that is not live.
    #[error("transaction {seq} is not live in the log")]
    NotLive {
        /// The sequence number given.
        seq: u64,
    },
    /// An earlier write or flush failed; reopen the log to continue (fail-stop).
    #[error("the log failed earlier ({first_error}); reopen it to recover")]
    Failed {
        /// The first error, as text.
        first_error: String,
    },
}

//! The one error type of the benchmarks.

use tally_log::LogError;
use tally_media::MediaError;

use crate::probe::ProbeError;
use crate::scratch::ScratchError;

/// Why a benchmark did not run or did not finish.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// The options make no sense, or the target path cannot be used (see [`crate::target`]).
    #[error("{reason}")]
    BadInput {
        /// Why.
        reason: String,
    },
    /// Preparing or cleaning up the target file failed (what it refuses is [`BadInput`]).
    ///
    /// [`BadInput`]: BenchError::BadInput
    #[error(transparent)]
    Target(ScratchError),
    /// The device failed or could not be opened.
    #[error(transparent)]
    Media(#[from] MediaError),
    /// The log failed.
    #[error(transparent)]
    Log(#[from] LogError),
    /// The flush-latency probe failed.
    #[error("probe: {0}")]
    Probe(#[from] ProbeError),
    /// What recovery found is not what was written.
    #[error("recovery check failed: {0}")]
    Mismatch(String),
    /// The file system failed, or found something else than was written.
    #[error("file system: {reason}")]
    Failed {
        /// Why.
        reason: String,
    },
}

impl BenchError {
    /// Whether the caller asked for something impossible (as opposed to a failure while running).
    #[must_use]
    pub fn is_bad_input(&self) -> bool {
        match self {
            BenchError::BadInput { .. } => true,
            BenchError::Target(e) => e.is_bad_input(),
            BenchError::Probe(e) => e.is_bad_input(),
            _ => false,
        }
    }
}

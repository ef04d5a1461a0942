//! The one error type of the benchmarks.

use std::io;
use std::path::PathBuf;

use tally_log::LogError;
use tally_media::probe::ProbeError;
use tally_media::MediaError;

/// Why a benchmark did not run or did not finish.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// The options make no sense.
    #[error("{reason}")]
    BadInput {
        /// Why.
        reason: String,
    },
    /// The path holds data the benchmark would overwrite.
    #[error("refusing to use {}: {reason}; pass --force to overwrite it", path.display())]
    Refused {
        /// The path given.
        path: PathBuf,
        /// What is there.
        reason: String,
    },
    /// Preparing or cleaning up the file failed.
    #[error("{op} {} failed: {source}", path.display())]
    Io {
        /// The operation.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
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
}

impl BenchError {
    /// Whether the caller asked for something impossible (as opposed to a failure while running).
    #[must_use]
    pub fn is_bad_input(&self) -> bool {
        match self {
            BenchError::BadInput { .. } | BenchError::Refused { .. } => true,
            BenchError::Probe(e) => e.is_bad_input(),
            _ => false,
        }
    }
}

/// Wrap an `io::Error` of `op` on `path`.
pub(crate) fn io_error(
    op: &'static str,
    path: &std::path::Path,
) -> impl FnOnce(io::Error) -> BenchError {
    let path = path.to_path_buf();
    move |source| BenchError::Io { op, path, source }
}

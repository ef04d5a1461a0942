//! The file a benchmark runs on, prepared by [`crate::scratch`] with the benchmarks' choices:
//! - a missing path is created, sized, preallocated, and removed at the end unless `keep`;
//! - an existing *empty* regular file is sized and used, and truncated back to empty unless
//!   `keep`;
//! - anything else that exists (a non-empty file, a block device) is refused unless `force`;
//!   with `force` it is used as it is (a regular file is extended if too small) and left there.

use std::path::Path;

use crate::scratch::{Occupant, Scratch, ScratchError, ScratchOptions, ScratchWarning};
use crate::BenchError;

/// A prepared benchmark file; dropping it undoes what preparing it did (unless `keep`).
#[derive(Debug)]
pub struct Target(Scratch);

impl Target {
    /// Decide whether `path` may be used, and give it at least `size_bytes` bytes. With
    /// `fill`, every byte of a file the benchmark sized is written once (zeros) and synced, so
    /// that later writes overwrite allocated blocks in place instead of converting unwritten
    /// extents (which adds a file-system journal commit to every flush).
    ///
    /// # Errors
    /// [`BenchError::BadInput`] for data the benchmark would overwrite, a directory or a missing
    /// parent, [`BenchError::Target`] when sizing fails.
    pub fn prepare(
        path: &Path,
        size_bytes: u64,
        fill: bool,
        keep: bool,
        force: bool,
    ) -> Result<Target, BenchError> {
        let options = ScratchOptions { size_bytes, keep, force, fill, extend_forced: true, warn };
        Ok(Target(Scratch::prepare(path, options)?))
    }

    /// The path.
    #[must_use]
    pub fn path(&self) -> &Path {
        self.0.path()
    }

    /// Whether preparing wrote every byte of the file once.
    #[must_use]
    pub fn filled(&self) -> bool {
        self.0.filled()
    }

    /// Whether the benchmark created the file.
    #[must_use]
    pub fn created(&self) -> bool {
        self.0.created()
    }
}

/// The benchmarks' words for what they refuse; I/O failures keep the scratch target's.
impl From<ScratchError> for BenchError {
    fn from(error: ScratchError) -> Self {
        let reason = match &error {
            ScratchError::Directory { path } => {
                format!("{} is a directory; give a file path", path.display())
            }
            ScratchError::Refused { path, occupant: Occupant::BlockDevice } => format!(
                "refusing to use {}: it is a block device and the benchmark overwrites it; \
                 pass --force to overwrite it",
                path.display()
            ),
            ScratchError::Refused { .. } | ScratchError::BadInput { .. } => error.to_string(),
            _ => return BenchError::Target(error),
        };
        BenchError::BadInput { reason }
    }
}

fn warn(warning: &ScratchWarning) {
    match warning {
        ScratchWarning::Fallocate { path, error } => {
            eprintln!("warning: fallocate {} failed: {error}", path.display());
        }
        ScratchWarning::Cleanup { path, error } => {
            eprintln!("warning: could not clean up {}: {error}", path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // What is refused and undone is tested with `crate::scratch`; this is the wording.
    #[test]
    fn refusals_are_bad_input_in_the_benchmarks_words() {
        let err = Target::prepare(&std::env::temp_dir(), 1 << 20, true, false, false).unwrap_err();
        assert!(err.is_bad_input(), "{err}");
        assert!(err.to_string().ends_with("is a directory; give a file path"), "{err}");
    }
}

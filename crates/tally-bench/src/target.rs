//! The file a benchmark runs on, and the rule that keeps other people's data safe:
//! - a missing path is created, sized, preallocated, and removed at the end unless `keep`;
//! - an existing *empty* regular file is sized and used, and truncated back to empty unless
//!   `keep`;
//! - anything else that exists (a non-empty file, a block device) is refused unless `force`;
//!   with `force` it is used as it is (a regular file is extended if too small) and left there.

use std::fs::{File, OpenOptions};
use std::io::{self, Write as _};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use crate::error::io_error;
use crate::BenchError;

/// Bytes written per call when filling a file.
const FILL_CHUNK_BYTES: usize = 1 << 20;

/// A prepared benchmark file; dropping it undoes what preparing it did (unless `keep`).
#[derive(Debug)]
pub struct Target {
    path: PathBuf,
    created: bool,
    filled: bool,
    undo: Option<Undo>,
}

#[derive(Debug, Clone, Copy)]
enum Undo {
    Remove,
    TruncateToEmpty,
}

impl Target {
    /// Decide whether `path` may be used, and give it at least `size_bytes` bytes. With
    /// `fill`, every byte of a file the benchmark sized is written once (zeros) and synced, so
    /// that later writes overwrite allocated blocks in place instead of converting unwritten
    /// extents (which adds a file-system journal commit to every flush).
    ///
    /// # Errors
    /// [`BenchError::Refused`] for data the benchmark would overwrite, [`BenchError::BadInput`]
    /// for a directory or a missing parent, [`BenchError::Io`] when sizing fails.
    pub fn prepare(
        path: &Path,
        size_bytes: u64,
        fill: bool,
        keep: bool,
        force: bool,
    ) -> Result<Target, BenchError> {
        let mut target =
            Target { path: path.to_path_buf(), created: false, filled: fill, undo: None };
        match std::fs::metadata(path) {
            Ok(m) if m.is_dir() => Err(BenchError::BadInput {
                reason: format!("{} is a directory; give a file path", path.display()),
            }),
            Ok(m) if m.file_type().is_block_device() => {
                target.filled = false;
                if force {
                    Ok(target)
                } else {
                    let reason = "it is a block device and the benchmark overwrites it".into();
                    Err(BenchError::Refused { path: path.to_path_buf(), reason })
                }
            }
            Ok(m) if m.is_file() => {
                if m.len() == 0 {
                    let file = OpenOptions::new()
                        .write(true)
                        .open(path)
                        .map_err(io_error("open", path))?;
                    if !keep {
                        target.undo = Some(Undo::TruncateToEmpty);
                    }
                    size_file(&file, path, size_bytes, fill)?;
                    Ok(target)
                } else if force {
                    target.filled = false;
                    if m.len() < size_bytes {
                        let file = OpenOptions::new()
                            .write(true)
                            .open(path)
                            .map_err(io_error("open", path))?;
                        file.set_len(size_bytes).map_err(io_error("extend", path))?;
                    }
                    Ok(target)
                } else {
                    let reason = format!("it is a file of {} bytes", m.len());
                    Err(BenchError::Refused { path: path.to_path_buf(), reason })
                }
            }
            Ok(_) => Err(BenchError::BadInput {
                reason: format!("{} is neither a regular file nor a block device", path.display()),
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let parent = match path.parent() {
                    Some(p) if !p.as_os_str().is_empty() => p,
                    _ => Path::new("."),
                };
                if !parent.is_dir() {
                    return Err(BenchError::BadInput {
                        reason: format!("directory {} does not exist", parent.display()),
                    });
                }
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .open(path)
                    .map_err(io_error("create", path))?;
                target.created = true;
                if !keep {
                    target.undo = Some(Undo::Remove);
                }
                size_file(&file, path, size_bytes, fill)?;
                Ok(target)
            }
            Err(e) => Err(io_error("stat", path)(e)),
        }
    }

    /// The path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether preparing wrote every byte of the file once.
    #[must_use]
    pub fn filled(&self) -> bool {
        self.filled
    }

    /// Whether the benchmark created the file.
    #[must_use]
    pub fn created(&self) -> bool {
        self.created
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let outcome = match self.undo {
            Some(Undo::Remove) => std::fs::remove_file(&self.path),
            Some(Undo::TruncateToEmpty) => {
                OpenOptions::new().write(true).open(&self.path).and_then(|f| f.set_len(0))
            }
            None => Ok(()),
        };
        if let Err(error) = outcome {
            eprintln!("warning: could not clean up {}: {error}", self.path.display());
        }
    }
}

/// Size `file`: preallocate where the file system can, then optionally write every byte once.
fn size_file(file: &File, path: &Path, size_bytes: u64, fill: bool) -> Result<(), BenchError> {
    file.set_len(size_bytes).map_err(io_error("extend", path))?;
    let len = libc::off_t::try_from(size_bytes).unwrap_or(libc::off_t::MAX);
    // SAFETY: a plain system call on a file descriptor that `file` keeps open.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) };
    if rc != 0 {
        // Not fatal (tmpfs and some file systems refuse); the fill below still allocates.
        let error = io::Error::last_os_error();
        eprintln!("warning: fallocate {} failed: {error}", path.display());
    }
    if fill {
        let zeros = vec![0u8; FILL_CHUNK_BYTES];
        let mut writer = io::BufWriter::with_capacity(FILL_CHUNK_BYTES, file);
        let mut left = size_bytes;
        while left > 0 {
            let n = usize::try_from(left).unwrap_or(FILL_CHUNK_BYTES).min(FILL_CHUNK_BYTES);
            writer.write_all(&zeros[..n]).map_err(io_error("fill", path))?;
            left -= n as u64;
        }
        writer.flush().map_err(io_error("fill", path))?;
        drop(writer);
        file.sync_all().map_err(io_error("fsync", path))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_data_and_cleans_up() {
        let dir = std::env::temp_dir().join(format!("tally-bench-target-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let precious = dir.join("precious");
        std::fs::write(&precious, b"data").unwrap();
        let err = Target::prepare(&precious, 1 << 20, true, false, false).unwrap_err();
        assert!(err.is_bad_input(), "{err}");
        assert_eq!(std::fs::read(&precious).unwrap(), b"data");

        let fresh = dir.join("fresh");
        let t = Target::prepare(&fresh, 1 << 20, true, false, false).unwrap();
        assert!(t.created());
        assert_eq!(std::fs::metadata(&fresh).unwrap().len(), 1 << 20);
        drop(t);
        assert!(!fresh.exists());

        let kept = dir.join("kept");
        drop(Target::prepare(&kept, 1 << 20, false, true, false).unwrap());
        assert!(kept.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! A scratch target: a file or block device prepared for destructive use (a probe, a benchmark),
//! and the rule that keeps other people's data safe, in one place:
//! - a missing path is created (sparse, then preallocated with `fallocate`, then optionally
//!   written once), and removed when the [`Scratch`] is dropped, unless `keep`;
//! - an existing *empty* regular file is sized the same way, and truncated back to empty on drop,
//!   unless `keep`;
//! - anything else that exists (a non-empty file, a block device) is refused unless `force`;
//!   with `force` it is used as it is (or, with `extend_forced`, a regular file that is too short
//!   is extended, never shrunk) and left there on drop;
//! - a directory, a path that is neither a regular file nor a block device, and a missing parent
//!   directory are bad input; nothing is created or written before these checks pass.

use std::fs::{File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use tally_media::fallocate;

/// Bytes written per call when filling a file.
const FILL_CHUNK_BYTES: usize = 1 << 20;

/// How to prepare a scratch target.
#[derive(Debug, Clone, Copy)]
pub struct ScratchOptions {
    /// Size given to a file that preparing creates or finds empty.
    pub size_bytes: u64,
    /// Leave a file that preparing created (or sized) in place on drop.
    pub keep: bool,
    /// Allow using an existing non-empty file or a block device (its contents get overwritten).
    pub force: bool,
    /// Write every byte of a file that preparing sizes once (zeros) and sync it, so that later
    /// writes overwrite allocated blocks in place instead of converting unwritten extents (which
    /// adds a file-system journal commit to every flush).
    pub fill: bool,
    /// With `force`, extend an existing non-empty regular file shorter than `size_bytes`.
    pub extend_forced: bool,
    /// Told of problems that do not stop preparing or undoing it.
    pub warn: fn(&ScratchWarning),
}

/// A problem that does not stop preparing (or undoing) a scratch target.
#[derive(Debug)]
#[non_exhaustive]
pub enum ScratchWarning {
    /// `fallocate` failed (not fatal: tmpfs and some file systems refuse); the file is sparse.
    Fallocate {
        /// The file.
        path: PathBuf,
        /// Why.
        error: io::Error,
    },
    /// Removing or truncating the file on drop failed.
    Cleanup {
        /// The file.
        path: PathBuf,
        /// Why.
        error: io::Error,
    },
}

/// What stands at a path that preparing refuses to overwrite without `force`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Occupant {
    /// A block device.
    BlockDevice,
    /// A regular file holding data.
    File {
        /// Its length.
        len_bytes: u64,
    },
}

impl std::fmt::Display for Occupant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Occupant::BlockDevice => write!(f, "it is a block device"),
            Occupant::File { len_bytes } => write!(f, "it is a file of {len_bytes} bytes"),
        }
    }
}

/// Why a path could not be prepared as a scratch target.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScratchError {
    /// The path is a directory.
    #[error("{} is a directory; give a file or block device path", path.display())]
    Directory {
        /// The path given.
        path: PathBuf,
    },
    /// The path makes no sense (a missing parent directory, neither a file nor a device, …).
    #[error("{reason}")]
    BadInput {
        /// Why.
        reason: String,
    },
    /// The path holds data that using it would overwrite.
    #[error("refusing to use {}: {occupant}; pass --force to overwrite it", path.display())]
    Refused {
        /// The path given.
        path: PathBuf,
        /// What is there.
        occupant: Occupant,
    },
    /// Preparing the file failed.
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
}

impl ScratchError {
    /// Whether the caller asked for something impossible (as opposed to an I/O failure).
    #[must_use]
    pub fn is_bad_input(&self) -> bool {
        match self {
            ScratchError::Directory { .. }
            | ScratchError::BadInput { .. }
            | ScratchError::Refused { .. } => true,
            ScratchError::Io { .. } => false,
        }
    }
}

/// A prepared scratch target; dropping it undoes what preparing did (unless `keep`).
#[derive(Debug)]
pub struct Scratch {
    path: PathBuf,
    created: bool,
    filled: bool,
    is_block_device: bool,
    undo: Option<Undo>,
    warn: fn(&ScratchWarning),
}

#[derive(Debug, Clone, Copy)]
enum Undo {
    Remove,
    TruncateToEmpty,
}

impl Scratch {
    /// Decide whether `path` may be used, and prepare it (see the module documentation).
    ///
    /// # Errors
    /// [`ScratchError::Refused`] for data that would be overwritten,
    /// [`ScratchError::Directory`] / [`ScratchError::BadInput`] for a path that cannot be used
    /// (both before anything is written), [`ScratchError::Io`] when creating or sizing fails.
    pub fn prepare(path: &Path, options: ScratchOptions) -> Result<Scratch, ScratchError> {
        let mut scratch = Scratch {
            path: path.to_path_buf(),
            created: false,
            filled: false,
            is_block_device: false,
            undo: None,
            warn: options.warn,
        };
        let refused = |occupant| ScratchError::Refused { path: path.to_path_buf(), occupant };
        match std::fs::metadata(path) {
            Ok(metadata) if metadata.is_dir() => {
                Err(ScratchError::Directory { path: path.to_path_buf() })
            }
            Ok(metadata) if metadata.file_type().is_block_device() => {
                if !options.force {
                    return Err(refused(Occupant::BlockDevice));
                }
                scratch.is_block_device = true;
                Ok(scratch)
            }
            Ok(metadata) if metadata.is_file() => {
                let len_bytes = metadata.len();
                if len_bytes == 0 {
                    let file = open_write(path).map_err(io_error("open", path))?;
                    if !options.keep {
                        scratch.undo = Some(Undo::TruncateToEmpty);
                    }
                    scratch.filled = size_file(&file, path, &options)?;
                    Ok(scratch)
                } else if !options.force {
                    Err(refused(Occupant::File { len_bytes }))
                } else {
                    if options.extend_forced && len_bytes < options.size_bytes {
                        let file = open_write(path).map_err(io_error("open", path))?;
                        file.set_len(options.size_bytes).map_err(io_error("extend", path))?;
                    }
                    Ok(scratch)
                }
            }
            Ok(_) => Err(ScratchError::BadInput {
                reason: format!("{} is neither a regular file nor a block device", path.display()),
            }),
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                let parent = match path.parent() {
                    Some(parent) if !parent.as_os_str().is_empty() => parent,
                    _ => Path::new("."),
                };
                if !parent.is_dir() {
                    return Err(ScratchError::BadInput {
                        reason: format!("directory {} does not exist", parent.display()),
                    });
                }
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .open(path)
                    .map_err(io_error("create", path))?;
                scratch.created = true;
                if !options.keep {
                    scratch.undo = Some(Undo::Remove);
                }
                scratch.filled = size_file(&file, path, &options)?;
                Ok(scratch)
            }
            Err(error) => Err(io_error("stat", path)(error)),
        }
    }

    /// The path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether preparing created the file.
    #[must_use]
    pub fn created(&self) -> bool {
        self.created
    }

    /// Whether preparing wrote every byte of the file once.
    #[must_use]
    pub fn filled(&self) -> bool {
        self.filled
    }

    /// Whether the path is a block device.
    #[must_use]
    pub fn is_block_device(&self) -> bool {
        self.is_block_device
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let outcome = match self.undo {
            Some(Undo::Remove) => std::fs::remove_file(&self.path),
            Some(Undo::TruncateToEmpty) => open_write(&self.path).and_then(|f| f.set_len(0)),
            None => Ok(()),
        };
        if let Err(error) = outcome {
            (self.warn)(&ScratchWarning::Cleanup { path: self.path.clone(), error });
        }
    }
}

fn open_write(path: &Path) -> io::Result<File> {
    OpenOptions::new().write(true).open(path)
}

fn io_error(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> ScratchError {
    let path = path.to_path_buf();
    move |source| ScratchError::Io { op, path, source }
}

/// Give `file` its size: sparse first, preallocated where the file system can, then (with
/// `fill`) written once and synced. Returns whether it was filled.
fn size_file(file: &File, path: &Path, options: &ScratchOptions) -> Result<bool, ScratchError> {
    file.set_len(options.size_bytes).map_err(io_error("extend", path))?;
    if let Err(error) = fallocate(file, options.size_bytes) {
        (options.warn)(&ScratchWarning::Fallocate { path: path.to_path_buf(), error });
    }
    if !options.fill {
        return Ok(false);
    }
    let zeros = vec![0u8; FILL_CHUNK_BYTES];
    let mut writer = io::BufWriter::with_capacity(FILL_CHUNK_BYTES, file);
    let mut left = options.size_bytes;
    while left > 0 {
        let n = usize::try_from(left).unwrap_or(FILL_CHUNK_BYTES).min(FILL_CHUNK_BYTES);
        writer.write_all(&zeros[..n]).map_err(io_error("fill", path))?;
        left -= n as u64;
    }
    writer.flush().map_err(io_error("fill", path))?;
    drop(writer);
    file.sync_all().map_err(io_error("fsync", path))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(size_bytes: u64) -> ScratchOptions {
        ScratchOptions {
            size_bytes,
            keep: false,
            force: false,
            fill: false,
            extend_forced: false,
            warn: |_| {},
        }
    }

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tally-scratch-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn refuses_before_writing() {
        let dir = temp_dir("refuse");
        let precious = dir.join("precious");
        std::fs::write(&precious, b"data").unwrap();
        let err = Scratch::prepare(&precious, options(1 << 20)).unwrap_err();
        assert!(matches!(
            err,
            ScratchError::Refused { occupant: Occupant::File { len_bytes: 4 }, .. }
        ));
        assert!(err.is_bad_input(), "{err}");
        assert_eq!(std::fs::read(&precious).unwrap(), b"data");
        let err = Scratch::prepare(&dir, options(1 << 20)).unwrap_err();
        assert!(matches!(err, ScratchError::Directory { .. }), "{err}");
        let err = Scratch::prepare(&dir.join("missing/x"), options(1 << 20)).unwrap_err();
        assert!(err.is_bad_input() && err.to_string().contains("does not exist"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    // Moved from tally-bench's `target` with the code it tests: the benchmarks' options.
    #[test]
    fn refuses_data_and_cleans_up() {
        let dir = temp_dir("bench");
        let bench =
            |keep, fill| ScratchOptions { keep, fill, extend_forced: true, ..options(1 << 20) };
        let precious = dir.join("precious");
        std::fs::write(&precious, b"data").unwrap();
        let err = Scratch::prepare(&precious, bench(false, true)).unwrap_err();
        assert!(err.is_bad_input(), "{err}");
        assert_eq!(std::fs::read(&precious).unwrap(), b"data");

        let fresh = dir.join("fresh");
        let t = Scratch::prepare(&fresh, bench(false, true)).unwrap();
        assert!(t.created());
        assert_eq!(std::fs::metadata(&fresh).unwrap().len(), 1 << 20);
        drop(t);
        assert!(!fresh.exists());

        let kept = dir.join("kept");
        drop(Scratch::prepare(&kept, bench(true, false)).unwrap());
        assert!(kept.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn forced_file_is_used_as_it_is_or_extended() {
        let dir = temp_dir("force");
        let data = dir.join("data");
        std::fs::write(&data, b"data").unwrap();
        let forced = ScratchOptions { force: true, fill: true, ..options(1 << 20) };
        let scratch = Scratch::prepare(&data, forced).unwrap();
        assert!(!scratch.created() && !scratch.filled() && !scratch.is_block_device());
        drop(scratch);
        assert_eq!(std::fs::read(&data).unwrap(), b"data", "used as it is, and left there");
        drop(Scratch::prepare(&data, ScratchOptions { extend_forced: true, ..forced }).unwrap());
        assert_eq!(std::fs::metadata(&data).unwrap().len(), 1 << 20, "extended, and left there");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn undoes_what_it_made() {
        let dir = temp_dir("undo");
        let empty = dir.join("empty");
        File::create(&empty).unwrap();
        let scratch = Scratch::prepare(&empty, ScratchOptions { fill: true, ..options(1 << 20) });
        let scratch = scratch.unwrap();
        assert!(!scratch.created() && scratch.filled());
        assert_eq!(std::fs::metadata(&empty).unwrap().len(), 1 << 20);
        drop(scratch);
        assert_eq!(std::fs::metadata(&empty).unwrap().len(), 0, "truncated back to empty");

        let gone = dir.join("gone");
        let scratch = Scratch::prepare(&gone, options(1 << 20)).unwrap();
        assert!(scratch.created() && !scratch.filled());
        assert_eq!(std::fs::metadata(&gone).unwrap().len(), 1 << 20);
        drop(scratch);
        assert!(!gone.exists());

        let kept = dir.join("kept");
        drop(Scratch::prepare(&kept, ScratchOptions { keep: true, ..options(1 << 20) }).unwrap());
        assert_eq!(std::fs::metadata(&kept).unwrap().len(), 1 << 20);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

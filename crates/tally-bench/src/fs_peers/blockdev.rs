//! What a block device did, from the kernel's own counters (`/sys/dev/block/MAJ:MIN/stat`): the
//! flushes that reached it and the bytes written to it. The same counters serve Tally (a block
//! device opened directly) and its peers (files on a mounted ext4), so flushes per operation are
//! measured the same way on both sides, whatever each stack does above the block layer.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::BenchError;

/// The counters of one block device.
#[derive(Debug, Clone)]
pub struct BlockDev {
    stat_path: PathBuf,
    /// `MAJ:MIN`, for the report.
    pub id: String,
}

/// A reading of [`BlockDev`]'s counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockCounters {
    /// Flush requests completed (the 16th field; kernels since 5.5).
    pub flushes: u64,
    /// Bytes written (sectors of 512 bytes, as the kernel counts them).
    pub bytes_written: u64,
}

impl std::ops::Sub for BlockCounters {
    type Output = BlockCounters;
    fn sub(self, o: BlockCounters) -> BlockCounters {
        BlockCounters {
            flushes: self.flushes.saturating_sub(o.flushes),
            bytes_written: self.bytes_written.saturating_sub(o.bytes_written),
        }
    }
}

// glibc's encoding of dev_t (what `major(3)`/`minor(3)` compute).
fn major_minor(dev: u64) -> (u64, u64) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (major, minor)
}

impl BlockDev {
    /// The device `path` is (a block special file), or the device holding `path` (anything
    /// else: the file system it lives on).
    ///
    /// # Errors
    /// [`BenchError::BadInput`] when the path cannot be examined or the kernel keeps no
    /// counters with flushes for its device.
    pub fn of(path: &Path) -> Result<BlockDev, BenchError> {
        let meta = std::fs::metadata(path)
            .map_err(|e| BenchError::BadInput { reason: format!("{}: {e}", path.display()) })?;
        let dev = if meta.file_type().is_block_device() { meta.rdev() } else { meta.dev() };
        let (major, minor) = major_minor(dev);
        let id = format!("{major}:{minor}");
        let d = BlockDev { stat_path: PathBuf::from(format!("/sys/dev/block/{id}/stat")), id };
        d.read().map_err(|e| BenchError::BadInput {
            reason: format!("{}: no block-device counters ({e})", path.display()),
        })?;
        Ok(d)
    }

    /// Read the counters now.
    ///
    /// # Errors
    /// The stat file cannot be read or has fewer than 17 fields (no flush counter).
    pub fn read(&self) -> Result<BlockCounters, BenchError> {
        let text = std::fs::read_to_string(&self.stat_path).map_err(|e| BenchError::Failed {
            reason: format!("{}: {e}", self.stat_path.display()),
        })?;
        parse_stat(&text).ok_or_else(|| BenchError::Failed {
            reason: format!(
                "{}: expected at least 17 numeric fields (a kernel with flush counters)",
                self.stat_path.display()
            ),
        })
    }
}

/// Fields (Documentation/block/stat.rst): 7th = sectors written, 16th = flush requests.
fn parse_stat(text: &str) -> Option<BlockCounters> {
    let fields: Vec<u64> =
        text.split_whitespace().map(str::parse).collect::<Result<_, _>>().ok()?;
    if fields.len() < 17 {
        return None;
    }
    Some(BlockCounters { flushes: fields[15], bytes_written: fields[6].checked_mul(512)? })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_parse_and_short_ones_are_refused() {
        let line = "  0 0 0 0 20 0 80 11 0 12 15 0 0 0 0 10 4\n";
        assert_eq!(parse_stat(line), Some(BlockCounters { flushes: 10, bytes_written: 80 * 512 }));
        assert_eq!(parse_stat("0 0 0 0 20 0 80 11 0 12 15"), None);
        assert_eq!(parse_stat("0 0 x 0 20 0 80 11 0 12 15 0 0 0 0 10 4"), None);
        assert_eq!(major_minor((7 << 8) | 3), (7, 3));
        assert_eq!(major_minor((259 << 8) | 1), (259, 1));
    }
}

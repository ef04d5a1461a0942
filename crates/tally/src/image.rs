//! The block size an existing image was made with, so that every command opens it in its own
//! geometry (`tally mkfs --block-size` makes images whose blocks are not the default 4096 bytes).

use std::fs::File;
use std::path::Path;

use tally_log::LogError;

/// The block size recorded in the superblock of the image at `path`; `None` if neither copy
/// looks like a Tally superblock, so that the caller opens with the default geometry and its
/// usual open reports "not a Tally image" exactly as for any other image.
///
/// # Errors
/// The text of an open or read failure.
pub fn block_size_of(path: &Path) -> Result<Option<u32>, String> {
    let mut file = File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    match tally_log::probe_block_size(&mut file) {
        Ok(bs) => Ok(Some(bs)),
        Err(LogError::NotFormatted { .. }) => Ok(None),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

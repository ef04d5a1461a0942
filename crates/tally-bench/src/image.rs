//! A fresh file system in an image file, mounted as `tally mount` runs it (the log's
//! write-behind on): what the library examples (`examples/small_tx.rs`,
//! `examples/small_beside_large.rs`) measure on.

use std::path::Path;
use std::sync::Arc;

use tally_fs::{Fs, MkfsOptions, MountOptions};
use tally_media::{Device, FileDevice, FileOptions};

/// Make `path` a `bytes`-long image file (overwriting it), make a file system on it with the
/// default options and mount it with the log's default write-behind.
///
/// # Errors
/// The file's creation, the device's open, `mkfs` and `mount`.
pub fn fresh_image_fs(
    path: &Path,
    bytes: u64,
) -> Result<Fs, Box<dyn std::error::Error + Send + Sync>> {
    let file = std::fs::File::create(path)?;
    file.set_len(bytes)?;
    drop(file);
    let dev: Arc<dyn Device> = Arc::new(FileDevice::open(path, FileOptions::default())?);
    Fs::mkfs(dev.clone(), &MkfsOptions::default())?;
    let opts = MountOptions {
        write_behind: Some(tally_log::WriteBehind::default()),
        ..MountOptions::default()
    };
    Ok(Fs::mount(dev, opts)?)
}

//! A fresh file system in an image file, mounted as `tally mount` runs it (the log's
//! write-behind on): what the library examples (`examples/small_tx.rs`,
//! `examples/small_beside_large.rs`, `examples/checkpoint_hold.rs`) measure on.

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
    let opts = MountOptions {
        write_behind: Some(tally_log::WriteBehind::default()),
        ..MountOptions::default()
    };
    fresh_image_fs_with(path, bytes, opts)
}

/// [`fresh_image_fs`], mounted with `opts`.
///
/// # Errors
/// The file's creation, the device's open, `mkfs` and `mount`.
pub fn fresh_image_fs_with(
    path: &Path,
    bytes: u64,
    opts: MountOptions,
) -> Result<Fs, Box<dyn std::error::Error + Send + Sync>> {
    let file = std::fs::File::create(path)?;
    file.set_len(bytes)?;
    drop(file);
    let dev: Arc<dyn Device> = Arc::new(FileDevice::open(path, FileOptions::default())?);
    Fs::mkfs(dev.clone(), &MkfsOptions::default())?;
    Ok(Fs::mount(dev, opts)?)
}

/// Unmount `fs` (no other holder may be left) and remove its image file `path`.
///
/// # Errors
/// Another holder of `fs` is left; the unmount; the removal.
pub fn unmount_and_remove(
    fs: Arc<Fs>,
    path: &Path,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let fs = Arc::try_unwrap(fs).map_err(|_| "file system still shared")?;
    fs.unmount()?;
    std::fs::remove_file(path)?;
    Ok(())
}

//! The block size an existing image was made with, so that every command opens it in its own
//! geometry (`tally mkfs --block-size` makes images whose blocks are not the default 4096 bytes);
//! and images on NBD exports (`nbd://host[:port]/export`, `nbd+unix:///export?socket=PATH`),
//! which every command that takes an image also takes.

use std::fs::File;
use std::io::Cursor;
use std::os::unix::io::AsRawFd as _;
use std::path::{Path, PathBuf};

use tally_log::format::superblock::{Superblock, SB_BLOCKS};
use tally_log::LogError;
use tally_media::nbd::NbdError;
use tally_media::{Device, MediaError, NbdDevice, NbdOptions, NbdTarget};

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

/// Most NBD connections a command opens (one per stream, up to this).
pub const NBD_CONNECTION_COUNT_MAX: u32 = 16;
/// Bytes at the start of an export that hold both superblock copies for any block size.
const NBD_HEAD_BYTES: u64 = 256 << 10;

/// The NBD export an IMAGE argument names, if it is an `nbd://` or `nbd+unix://` URI; `None`
/// for a path.
///
/// # Errors
/// The text of a URI that cannot be used (TLS, no socket, bad port, ...).
pub fn nbd_target(image: &Path) -> Result<Option<NbdTarget>, String> {
    let Some(text) = image.to_str().filter(|t| NbdTarget::is_uri(t)) else { return Ok(None) };
    NbdTarget::parse(text).map(Some).map_err(|e| e.to_string())
}

/// How the CLI opens an export: `block_size` as recorded (or default), one connection per
/// stream up to [`NBD_CONNECTION_COUNT_MAX`] (the server may allow only one).
#[must_use]
pub fn nbd_options(block_size: Option<u32>, streams: u16) -> NbdOptions {
    let connection_count = u32::from(streams).clamp(1, NBD_CONNECTION_COUNT_MAX);
    NbdOptions { block_size, connection_count, ..NbdOptions::default() }
}

/// Whether an error opening an export is the user's (a bad URI, an unknown export, a block size
/// the export cannot have) rather than the network's or the server's.
#[must_use]
pub fn nbd_is_bad_input(error: &MediaError) -> bool {
    match error {
        MediaError::Nbd { source, .. } => {
            matches!(**source, NbdError::BadUri { .. } | NbdError::Refused { .. })
        }
        MediaError::InvalidGeometry { .. } | MediaError::TooSmall { .. } => true,
        _ => false,
    }
}

/// Block size and stream count recorded in the superblock of the image on `target` (`None`:
/// not a Tally image), read over one connection.
///
/// # Errors
/// The export cannot be opened or read.
pub fn nbd_shape_of(target: &NbdTarget) -> Result<Option<(u32, u16)>, MediaError> {
    let probe = NbdDevice::open(target, nbd_options(None, 1))?;
    let g = probe.geometry();
    let head_blocks = (NBD_HEAD_BYTES / u64::from(g.block_size)).min(g.block_count);
    let mut head = vec![0u8; usize::try_from(head_blocks * u64::from(g.block_size)).unwrap_or(0)];
    probe.read(0, &mut head)?;
    drop(probe);
    let Ok(block_size) = tally_log::probe_block_size(&mut Cursor::new(&head)) else {
        return Ok(None);
    };
    let bs = block_size as usize;
    let best = SB_BLOCKS
        .iter()
        .filter_map(|&block| {
            let at = usize::try_from(block).ok()?.checked_mul(bs)?;
            Superblock::decode(head.get(at..at.checked_add(bs)?)?, block).ok()
        })
        .max_by_key(|sb| sb.generation);
    let streams = best.map_or(1, |sb| u16::try_from(sb.streams.len()).unwrap_or(u16::MAX));
    Ok(Some((block_size, streams)))
}

/// Open the Tally image on `target` in its own block size, with a connection per stream.
///
/// # Errors
/// The export cannot be opened or read.
pub fn open_nbd(target: &NbdTarget) -> Result<NbdDevice, MediaError> {
    let (block_size, streams) = match nbd_shape_of(target)? {
        Some((bs, streams)) => (Some(bs), streams),
        None => (None, 1),
    };
    NbdDevice::open(target, nbd_options(block_size, streams))
}

/// The lock file standing for an export on this machine: a mount's daemon holds it exclusive,
/// fsck and inspect shared, umount waits on it (a file image is locked itself).
#[must_use]
pub fn nbd_lock_path(target: &NbdTarget) -> PathBuf {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let name: String = target
        .to_string()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' { c } else { '_' })
        .collect();
    std::env::temp_dir().join(format!("tally-{uid}")).join(format!("nbd-{name}.lock"))
}

/// Take the lock of `target` (exclusive or shared) without waiting; `Ok(None)` when another
/// process holds it in a conflicting way.
///
/// # Errors
/// The text of a failure to create or lock the file.
pub fn lock_nbd(target: &NbdTarget, exclusive: bool) -> Result<Option<File>, String> {
    let path = nbd_lock_path(target);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("lock directory {}: {e}", dir.display()))?;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("lock file {}: {e}", path.display()))?;
    let how = if exclusive { libc::LOCK_EX } else { libc::LOCK_SH };
    // SAFETY: flock on a descriptor owned by `file`.
    if unsafe { libc::flock(file.as_raw_fd(), how | libc::LOCK_NB) } == 0 {
        return Ok(Some(file));
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(None)
    } else {
        Err(format!("cannot lock {}: {e}", path.display()))
    }
}

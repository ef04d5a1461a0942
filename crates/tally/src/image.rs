//! The block size an existing image was made with, so that every command opens it in its own
//! geometry (`tally mkfs --block-size` makes images whose blocks are not the default 4096 bytes);
//! and images on NBD exports (`nbd://host[:port]/export`, `nbd+unix:///export?socket=PATH`),
//! which every command that takes an image also takes.

use std::fs::File;
use std::io::Cursor;
use std::os::unix::io::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tally_log::format::superblock::{Superblock, SB_BLOCKS};
use tally_log::LogError;
use tally_media::nbd::NbdError;
use tally_media::{Device, MediaError, NbdDevice, NbdOptions, NbdTarget, SpanDevice, SpanLayout};

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
        // Targets missing, swapped, repeated, of another image.
        MediaError::Span { .. } => true,
        _ => false,
    }
}

/// Block size and stream count recorded in the superblock of the image on `target` (`None`:
/// not a Tally image), read over one connection.
///
/// # Errors
/// The export cannot be opened or read.
pub fn nbd_shape_of(target: &NbdTarget) -> Result<Option<(u32, u16)>, MediaError> {
    shape_of(&NbdDevice::open(target, nbd_options(None, 1))?)
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

/// The NBD exports an IMAGE argument names: one export, or, for a multi-target image, every
/// target in its recorded order. Shown (and passed to the mount's daemon) as the URIs joined
/// by spaces.
#[derive(Debug, Clone)]
pub struct Remote {
    /// The exports, in order.
    pub targets: Vec<NbdTarget>,
}

impl std::fmt::Display for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let texts: Vec<String> = self.targets.iter().map(ToString::to_string).collect();
        f.write_str(&texts.join(" "))
    }
}

/// Blocks before the log's first segment (its two superblocks): on target 0 of a
/// multi-target image, ahead of the stripes.
const LOG_LEAD_BLOCKS: u32 = 2;

/// One IMAGE from the command line's list: the path or URI itself, or, for several, the URIs
/// of a multi-target image joined by spaces (what [`remote`] reads back).
///
/// # Errors
/// Several images where one is not an NBD URI, or more targets than an image may span.
pub fn join_images(images: &[PathBuf]) -> Result<PathBuf, String> {
    match images {
        [] => Err("no image given".to_string()),
        [one] => Ok(one.clone()),
        several => {
            let max = usize::from(tally_media::span::TARGET_COUNT_MAX);
            if several.len() > max {
                return Err(format!(
                    "{} targets given; an image spans at most {max}",
                    several.len()
                ));
            }
            let mut texts = Vec::with_capacity(several.len());
            for image in several {
                let text = image.to_str().filter(|t| NbdTarget::is_uri(t)).ok_or_else(|| {
                    format!(
                        "{} is not an NBD URI: several images name the targets of one \
                         multi-target image, each nbd://... or nbd+unix://...",
                        image.display()
                    )
                })?;
                texts.push(text.to_string());
            }
            Ok(PathBuf::from(texts.join(" ")))
        }
    }
}

/// The exports an IMAGE (as [`join_images`] made it) names; `None` for a path.
///
/// # Errors
/// The text of a URI that cannot be used.
pub fn remote(image: &Path) -> Result<Option<Remote>, String> {
    let Some(text) = image.to_str() else { return Ok(None) };
    let parts: Vec<&str> = text.split(' ').collect();
    if !parts.first().is_some_and(|p| NbdTarget::is_uri(p)) {
        return Ok(None);
    }
    let targets = parts
        .iter()
        .map(|p| NbdTarget::parse(p).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(Remote { targets }))
}

/// Locks held for a command's lifetime: an image file's, or every target's lock file.
pub struct Lock(#[allow(dead_code)] Vec<File>);

impl From<File> for Lock {
    fn from(file: File) -> Self {
        Lock(vec![file])
    }
}

/// Take every target's lock (see [`lock_nbd`]); `Ok(None)` when one is held elsewhere.
///
/// # Errors
/// The text of a failure to create or lock a file.
pub fn lock_remote(remote: &Remote, exclusive: bool) -> Result<Option<Lock>, String> {
    let mut files = Vec::with_capacity(remote.targets.len());
    for target in &remote.targets {
        match lock_nbd(target, exclusive)? {
            Some(file) => files.push(file),
            None => return Ok(None),
        }
    }
    Ok(Some(Lock(files)))
}

/// The lock file `tally umount` waits on: the first target's (the daemon holds all of them).
#[must_use]
pub fn remote_lock_path(remote: &Remote) -> PathBuf {
    remote.targets.first().map_or_else(std::env::temp_dir, nbd_lock_path)
}

/// Block size and stream count recorded in the image on `dev` (`None`: no Tally superblock).
///
/// # Errors
/// The device cannot be read.
fn shape_of(dev: &dyn Device) -> Result<Option<(u32, u16)>, MediaError> {
    let g = dev.geometry();
    let head_blocks = (NBD_HEAD_BYTES / u64::from(g.block_size)).min(g.block_count);
    let mut head = vec![0u8; usize::try_from(head_blocks * u64::from(g.block_size)).unwrap_or(0)];
    dev.read(0, &mut head)?;
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

/// Open every target of `remote` with `options`.
fn open_targets(remote: &Remote, options: &NbdOptions) -> Result<Vec<Arc<dyn Device>>, MediaError> {
    remote
        .targets
        .iter()
        .map(|t| NbdDevice::open(t, *options).map(|d| Arc::new(d) as Arc<dyn Device>))
        .collect()
}

/// Open the Tally image on `remote`: one export as [`open_nbd`] does, or a multi-target image
/// checked target by target (missing, swapped, repeated or foreign targets are refused with
/// [`MediaError::Span`]), in its own block size with a connection per stream on each target.
/// One export that is a target of a multi-target image is refused the same way (the others
/// are missing).
///
/// # Errors
/// The exports cannot be opened or read, or are not one image's targets in order.
pub fn open_remote(remote: &Remote) -> Result<Arc<dyn Device>, MediaError> {
    if let [one] = &remote.targets[..] {
        let probe = NbdDevice::open(one, nbd_options(None, 1))?;
        if tally_media::span::target_header_of(&probe)?.is_some() {
            // Refused with the places of the targets not given (a set of one opens).
            return Ok(Arc::new(SpanDevice::open(vec![Arc::new(probe) as Arc<dyn Device>])?));
        }
        drop(probe);
        return Ok(Arc::new(open_nbd(one)?));
    }
    let first = NbdDevice::open(&remote.targets[0], nbd_options(None, 1))?;
    let block_size = tally_media::span::target_header_of(&first)?.map(|h| h.block_size);
    drop(first);
    let probe = SpanDevice::open(open_targets(remote, &nbd_options(block_size, 1))?)?;
    let streams = shape_of(&probe)?.map_or(1, |(_, streams)| streams);
    drop(probe);
    Ok(Arc::new(SpanDevice::open(open_targets(remote, &nbd_options(block_size, streams))?)?))
}

/// Open the targets of `remote` for `tally mkfs` (block size and streams as asked), refusing a
/// read-only one.
///
/// # Errors
/// The text of why, and whether it is the user's input (else the network's or the server's).
pub fn open_targets_for_mkfs(
    remote: &Remote,
    block_size: Option<u32>,
    streams: u16,
) -> Result<Vec<NbdDevice>, (bool, String)> {
    let mut devices = Vec::with_capacity(remote.targets.len());
    for target in &remote.targets {
        let dev = NbdDevice::open(target, nbd_options(block_size, streams)).map_err(|e| {
            let bad = nbd_is_bad_input(&e);
            (bad, format!("cannot {} {target}: {e}", if bad { "use" } else { "open" }))
        })?;
        if dev.read_only() {
            return Err((true, format!("{target} is read-only (the server says so)")));
        }
        devices.push(dev);
    }
    Ok(devices)
}

/// Make a multi-target image over `devices` (in order): target headers, stripes of
/// `stripe_blocks` (the log's segment size).
///
/// # Errors
/// As [`SpanDevice::format`].
pub fn format_span(devices: Vec<NbdDevice>, stripe_blocks: u32) -> Result<SpanDevice, MediaError> {
    let targets = devices.into_iter().map(|d| Arc::new(d) as Arc<dyn Device>).collect();
    SpanDevice::format(targets, SpanLayout { stripe_blocks, lead_blocks: LOG_LEAD_BLOCKS })
}

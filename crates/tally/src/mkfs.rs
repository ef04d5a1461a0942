//! `tally mkfs IMAGE --size SIZE [--streams N] [--block-size B]`: make an empty Tally file
//! system on a file or block device.
//!
//! It never destroys data silently: a file or device that already holds a Tally image,
//! another recognisable file system, or any non-zero byte where it looks is refused without
//! `--force`.

use std::fs::{File, OpenOptions};
use std::io::{self, Read as _, Seek as _, SeekFrom};
use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
use std::os::unix::io::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use tally_bench::measure::parse_size_like;
use tally_fs::{Fs, MkfsOptions};
use tally_media::{Device, FileDevice, FileOptions};

use crate::{EXIT_BAD_INPUT, EXIT_IO_FAILURE};

/// Exit code when the target holds data or a file system and `--force` was not given.
pub const EXIT_REFUSED: u8 = 3;

/// Arguments of `tally mkfs`.
#[derive(Debug, clap::Args)]
#[command(after_long_help = "\
Examples:
  tally mkfs /var/tmp/tally.img --size 4G     a new sparse 4 GiB image file
  tally mkfs /dev/nvme1n1 --force             the whole device, whatever it held
  tally mkfs big.img --size 64G --block-size 64K   for large sequential writes
  tally mkfs nbd://storage.example:10809/tally    an NBD export (its size is the server's)
  tally mkfs 'nbd+unix:///disk?socket=/run/nbd.sock'   an export on a Unix socket

The image is a log of segments (4 MiB each, whatever the block size) shared by the streams; one operation's \
transaction must fit in half a segment (larger writes are split); an explicit transaction (`tally \
atomic`) is bounded by free space. The root directory belongs to whoever runs mkfs (mode \
0755). `tally mount IMAGE DIR` serves it.

Exit codes: 0 made; 1 I/O error; 2 bad arguments; 3 refused (the target holds data or a file \
system: give --force to overwrite it).")]
pub struct Args {
    /// Image file (created sparse if missing), block device, or NBD export
    /// (`nbd://host[:port]/export`, `nbd+unix:///export?socket=PATH`); several NBD exports make
    /// one multi-target image over all of them (give the same list, in the same order, to
    /// mount, fsck and inspect).
    #[arg(value_name = "IMAGE", required = true, num_args = 1..)]
    images: Vec<PathBuf>,
    /// The IMAGE list as one (see `image::join_images`).
    #[arg(skip)]
    image: PathBuf,
    /// Size of the image file, e.g. 512M, 4G (K/M/G/T are powers of 1024). Needed for a new
    /// file; resizes an existing file only with --force; not for block devices.
    #[arg(long, value_parser = parse_size)]
    size: Option<u64>,
    /// Log streams (independent ordering domains; operations on a file use stream
    /// `inode % streams`).
    #[arg(long, default_value_t = MkfsOptions::default().streams,
          value_parser = clap::value_parser!(u16).range(1..=256))]
    streams: u16,
    /// Block size: a power of two from 4K to 64K, at least the device's logical block size
    /// [default: 4K, or the logical block size if larger]. Bigger blocks split a large write
    /// into fewer units; every commit still writes whole blocks, so small commits (an fsync
    /// after a small change) write more bytes.
    #[arg(long, value_name = "B", value_parser = parse_block_size)]
    block_size: Option<u32>,
    /// Overwrite whatever the target holds (a Tally image, another file system, data).
    #[arg(long)]
    force: bool,
}

fn parse_size(text: &str) -> Result<u64, String> {
    parse_size_like(text, "4G")
}

/// Smallest and largest `--block-size`: 4 KiB is the page and the common device block; past
/// 64 KiB a one-byte commit would write more than a whole FUSE write request carries.
const BLOCK_SIZE_RANGE: std::ops::RangeInclusive<u64> = 4096..=65536;

fn parse_block_size(text: &str) -> Result<u32, String> {
    let bytes = parse_size_like(text, "16K")?;
    if !bytes.is_power_of_two() || !BLOCK_SIZE_RANGE.contains(&bytes) {
        return Err(format!(
            "block size {bytes} must be 4K, 8K, 16K, 32K or 64K (a power of two from 4 to 64 KiB)"
        ));
    }
    u32::try_from(bytes).map_err(|_| format!("block size {bytes} is too large"))
}

/// Bytes per log segment, kept whatever the block size so that the largest transaction (half a
/// segment) and the number of segments of an image do not depend on it.
const SEGMENT_BYTES: u32 = 4 << 20;

/// Why mkfs stopped.
enum Stop {
    BadInput(String),
    Refused(String),
    Io(String),
}

/// Make the file system; the exit code says how it went.
pub fn run(args: &Args) -> ExitCode {
    match make(args) {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(stop) => {
            let (text, code) = match stop {
                Stop::BadInput(t) => (t, EXIT_BAD_INPUT),
                Stop::Refused(t) => (t, EXIT_REFUSED),
                Stop::Io(t) => (t, EXIT_IO_FAILURE),
            };
            eprintln!("tally mkfs: error: {text}");
            ExitCode::from(code)
        }
    }
}

fn make(args: &Args) -> Result<String, Stop> {
    let image = crate::image::join_images(&args.images).map_err(Stop::BadInput)?;
    let args = &Args { image, images: Vec::new(), ..*args };
    if let Some(remote) = crate::image::remote(&args.image).map_err(Stop::BadInput)? {
        if remote.targets.len() > 1 {
            return make_on_span(args, &remote);
        }
    }
    if let Some(target) = crate::image::nbd_target(&args.image).map_err(Stop::BadInput)? {
        return make_on_nbd(args, &target);
    }
    let created = !args.image.exists();
    let made = make_on(args);
    if made.is_err() && created {
        // Leave nothing behind that was not there before.
        let _ = std::fs::remove_file(&args.image);
    }
    made
}

fn make_on(args: &Args) -> Result<String, Stop> {
    let path = &args.image;
    let shown = path.display();
    let meta = match std::fs::metadata(path) {
        Ok(m) => Some(m),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(Stop::Io(format!("{shown}: {e}"))),
    };
    match &meta {
        None => {
            let size = args.size.ok_or_else(|| {
                Stop::BadInput(format!("{shown} does not exist: give --size to create it"))
            })?;
            let file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(|e| Stop::Io(format!("cannot create {shown}: {e}")))?;
            file.set_len(size).map_err(|e| Stop::Io(format!("cannot size {shown}: {e}")))?;
        }
        Some(m) if m.file_type().is_block_device() => {
            if args.size.is_some() {
                return Err(Stop::BadInput(format!(
                    "{shown} is a block device: its size is its own (drop --size)"
                )));
            }
            refuse_unless_forced(path, args.force)?;
        }
        Some(m) if m.is_file() => {
            refuse_unless_forced(path, args.force)?;
            if let Some(size) = args.size.filter(|&s| s != m.len()) {
                if m.len() != 0 && !args.force {
                    return Err(Stop::Refused(format!(
                        "{shown} is {} bytes, not {size}: give --force to resize it",
                        m.len()
                    )));
                }
                let file = OpenOptions::new()
                    .write(true)
                    .open(path)
                    .map_err(|e| Stop::Io(format!("{shown}: {e}")))?;
                file.set_len(size).map_err(|e| Stop::Io(format!("cannot size {shown}: {e}")))?;
            }
        }
        Some(_) => {
            return Err(Stop::BadInput(format!("{shown} is not a regular file or a block device")))
        }
    }
    let options = FileOptions { block_size: args.block_size, ..FileOptions::default() };
    let dev = FileDevice::open(path, options).map_err(|e| match e {
        // A block smaller than (or not a multiple of) the device's logical block.
        tally_media::MediaError::InvalidGeometry { .. } => {
            Stop::BadInput(format!("block size on {shown}: {e}"))
        }
        e => Stop::Io(format!("cannot open {shown}: {e}")),
    })?;
    make_fs(Arc::new(dev), &shown.to_string(), args)
}

/// `tally mkfs nbd://...`: the export's size is its own; what it holds is judged by its head.
fn make_on_nbd(args: &Args, target: &tally_media::NbdTarget) -> Result<String, Stop> {
    if args.size.is_some() {
        return Err(Stop::BadInput(format!(
            "{target} is an NBD export: its size is the server's (drop --size)"
        )));
    }
    let _lock = crate::image::lock_nbd(target, true).map_err(Stop::Io)?.ok_or_else(|| {
        Stop::Refused(format!("{target} is in use: a tally mount on this machine serves it"))
    })?;
    let options = crate::image::nbd_options(args.block_size, args.streams);
    let dev = tally_media::NbdDevice::open(target, options).map_err(|e| {
        if crate::image::nbd_is_bad_input(&e) {
            Stop::BadInput(format!("cannot use {target}: {e}"))
        } else {
            Stop::Io(format!("cannot open {target}: {e}"))
        }
    })?;
    if dev.read_only() {
        return Err(Stop::BadInput(format!("{target} is read-only (the server says so)")));
    }
    if !args.force {
        let g = dev.geometry();
        let head_blocks = (HEAD_BYTES as u64 / u64::from(g.block_size)).min(g.block_count);
        let mut head = vec![0u8; usize::try_from(head_blocks).unwrap_or(0) * g.block_size as usize];
        dev.read(0, &mut head).map_err(|e| Stop::Io(format!("cannot read {target}: {e}")))?;
        let found = recognise(&head).or_else(|| head.iter().any(|&b| b != 0).then_some("data"));
        if let Some(what) = found {
            return Err(Stop::Refused(format!(
                "{target} holds {what}: give --force to overwrite it"
            )));
        }
    }
    make_fs(Arc::new(dev), &target.to_string(), args)
}

/// `tally mkfs nbd://a nbd://b ...`: a multi-target image, each target's head judged as one
/// export's is, then a target header on each and the file system over them all.
fn make_on_span(args: &Args, remote: &crate::image::Remote) -> Result<String, Stop> {
    if args.size.is_some() {
        return Err(Stop::BadInput(format!(
            "{remote} are NBD exports: their sizes are the servers' (drop --size)"
        )));
    }
    let _lock = crate::image::lock_remote(remote, true).map_err(Stop::Io)?.ok_or_else(|| {
        Stop::Refused(format!("{remote}: a target is in use by a tally mount on this machine"))
    })?;
    let devices = crate::image::open_targets_for_mkfs(remote, args.block_size, args.streams)
        .map_err(|(bad, text)| if bad { Stop::BadInput(text) } else { Stop::Io(text) })?;
    if !args.force {
        for (dev, target) in devices.iter().zip(&remote.targets) {
            let g = dev.geometry();
            let head_blocks = (HEAD_BYTES as u64 / u64::from(g.block_size)).min(g.block_count);
            let mut head =
                vec![0u8; usize::try_from(head_blocks).unwrap_or(0) * g.block_size as usize];
            dev.read(0, &mut head).map_err(|e| Stop::Io(format!("cannot read {target}: {e}")))?;
            let span_magic = head.get(..8) == Some(&tally_media::span::TARGET_MAGIC[..]);
            let found = recognise(&head)
                .or(span_magic.then_some("a target of a multi-target Tally image"))
                .or_else(|| head.iter().any(|&b| b != 0).then_some("data"));
            if let Some(what) = found {
                return Err(Stop::Refused(format!(
                    "{target} holds {what}: give --force to overwrite it"
                )));
            }
        }
    }
    let block_size = devices.first().map_or(4096, |d| d.geometry().block_size);
    let span = crate::image::format_span(devices, SEGMENT_BYTES / block_size).map_err(|e| {
        if crate::image::nbd_is_bad_input(&e) {
            Stop::BadInput(format!("cannot make a multi-target image on {remote}: {e}"))
        } else {
            Stop::Io(format!("cannot write the target headers of {remote}: {e}"))
        }
    })?;
    let count = span.targets().len();
    let made = make_fs(Arc::new(span), &remote.to_string(), args)?;
    Ok(format!("{made}, over {count} targets"))
}

/// Make the file system on an opened device; `shown` names it in messages.
fn make_fs(dev: Arc<dyn Device>, shown: &str, args: &Args) -> Result<String, Stop> {
    let geometry = dev.geometry();
    let opts = MkfsOptions {
        streams: args.streams,
        segment_blocks: SEGMENT_BYTES / geometry.block_size,
        ..MkfsOptions::default()
    };
    Fs::mkfs(dev.clone(), &opts).map_err(|e| match e {
        tally_fs::FsError::Io { .. } | tally_fs::FsError::ReadOnly { .. } => {
            Stop::Io(format!("mkfs on {shown} failed: {e}"))
        }
        // The rest are shapes the log refuses: too small for the streams, too many streams.
        e => Stop::BadInput(format!("cannot make a file system on {shown}: {e}")),
    })?;
    give_root_to_caller(dev).map_err(|e| Stop::Io(format!("mkfs on {shown} failed: {e}")))?;
    let bytes = geometry.block_count * u64::from(geometry.block_size);
    Ok(format!(
        "made a Tally file system on {shown}: {} ({} blocks of {} bytes), {} streams, \
         segments of {} blocks",
        human(bytes),
        geometry.block_count,
        geometry.block_size,
        opts.streams,
        opts.segment_blocks
    ))
}

/// The root directory belongs to whoever made the file system (as mke2fs does), so a user can
/// mount and fill an image they made. Root's own images need nothing: it is created 0:0.
fn give_root_to_caller(dev: Arc<dyn Device>) -> tally_fs::Result<()> {
    // SAFETY: geteuid and getegid have no preconditions.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    if uid == 0 && gid == 0 {
        return Ok(());
    }
    let fs = Fs::mount(dev, tally_fs::MountOptions::default())?;
    let set = tally_fs::SetAttr { uid: Some(uid), gid: Some(gid), ..tally_fs::SetAttr::default() };
    fs.setattr(None, tally_fs::ROOT, &set)?;
    fs.unmount().map(drop)
}

/// Bytes in the largest binary unit that keeps one decimal.
fn human(bytes: u64) -> String {
    let units = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < units.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} bytes")
    } else {
        format!("{value:.1} {}", units[unit])
    }
}

/// Bytes read from the start of the target to recognise what it holds.
const HEAD_BYTES: usize = 1 << 20;

/// Refuse a target that holds something, unless `force`.
fn refuse_unless_forced(path: &Path, force: bool) -> Result<(), Stop> {
    if force {
        return Ok(());
    }
    let mut file = File::open(path).map_err(|e| Stop::Io(format!("{}: {e}", path.display())))?;
    let mut head = Vec::with_capacity(HEAD_BYTES);
    (&mut file)
        .take(HEAD_BYTES as u64)
        .read_to_end(&mut head)
        .map_err(|e| Stop::Io(format!("cannot read {}: {e}", path.display())))?;
    let found = recognise(&head).map(str::to_owned).or_else(|| {
        if head.iter().any(|&b| b != 0) || data_past_head(&mut file) {
            Some("data".to_owned())
        } else {
            None
        }
    });
    match found {
        Some(what) => Err(Stop::Refused(format!(
            "{} holds {what}: give --force to overwrite it",
            path.display()
        ))),
        None => Ok(()),
    }
}

/// What the first bytes of a target say it is, if anything known.
fn recognise(head: &[u8]) -> Option<&'static str> {
    let at = |offset: usize, magic: &[u8]| head.get(offset..offset + magic.len()) == Some(magic);
    // The log's superblock, in either of its two copies (blocks 0 and 1, whatever the size).
    let probed = tally_log::probe_block_size(&mut io::Cursor::new(head)).is_ok();
    if at(0, b"TALLYSB1") || at(4096, b"TALLYSB1") || probed {
        return Some("a Tally file system");
    }
    if at(1080, &0xEF53u16.to_le_bytes()) {
        return Some("an ext2/3/4 file system");
    }
    if at(0, b"XFSB") {
        return Some("an XFS file system");
    }
    if at(0x1_0040, b"_BHRfS_M") {
        return Some("a btrfs file system");
    }
    if at(510, &[0x55, 0xAA]) {
        return Some("a partition table or boot sector");
    }
    if at(0, b"LUKS\xBA\xBE") {
        return Some("a LUKS volume");
    }
    if at(4086, b"SWAPSPACE2") {
        return Some("swap space");
    }
    None
}

/// Does a sparse file hold data past the bytes already looked at? (`SEEK_DATA`; a block
/// device or a file system without it answers no, having been checked by its head.)
fn data_past_head(file: &mut File) -> bool {
    let fd = file.as_raw_fd();
    // SAFETY: lseek on a descriptor this function borrows; no memory is passed.
    let at = unsafe { libc::lseek(fd, HEAD_BYTES as libc::off_t, libc::SEEK_DATA) };
    if at < 0 {
        return false;
    }
    let mut chunk = vec![0u8; 64 << 10];
    if file.seek(SeekFrom::Start(at as u64)).is_err() {
        return false;
    }
    let n = file.read(&mut chunk).unwrap_or(0);
    chunk[..n].iter().any(|&b| b != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_file_systems() {
        let mut head = vec![0u8; HEAD_BYTES];
        assert_eq!(recognise(&head), None);
        head[1080..1082].copy_from_slice(&0xEF53u16.to_le_bytes());
        assert_eq!(recognise(&head), Some("an ext2/3/4 file system"));
        let mut head = vec![0u8; HEAD_BYTES];
        head[4096..4104].copy_from_slice(b"TALLYSB1");
        assert_eq!(recognise(&head), Some("a Tally file system"));
        let mut head = vec![0u8; HEAD_BYTES];
        head[..4].copy_from_slice(b"XFSB");
        assert_eq!(recognise(&head), Some("an XFS file system"));
        assert_eq!(recognise(b"short"), None);
        // Only the second copy of a 16 KiB image left: at 16 KiB, recording 16 KiB.
        let mut head = vec![0u8; HEAD_BYTES];
        head[16384..16392].copy_from_slice(b"TALLYSB1");
        head[16384 + 12..16384 + 16].copy_from_slice(&16384u32.to_le_bytes());
        assert_eq!(recognise(&head), Some("a Tally file system"));
    }

    #[test]
    fn block_sizes() {
        assert_eq!(parse_block_size("16K"), Ok(16384));
        assert_eq!(parse_block_size("4096"), Ok(4096));
        assert_eq!(parse_block_size("64k"), Ok(65536));
        for bad in ["3000", "2K", "128K", "0", "1M", "", "K"] {
            assert!(parse_block_size(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(512), "512 bytes");
        assert_eq!(human(4 << 30), "4.0 GiB");
    }
}

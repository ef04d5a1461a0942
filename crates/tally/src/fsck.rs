//! `tally fsck IMAGE [--json]`: verify a Tally image without changing a byte of it.
//!
//! Mounting runs the log's recovery, which writes (it bumps every stream's epoch durably). The
//! check mounts through an [`OverlayDevice`]: the image is opened read-only and recovery's
//! writes stay in memory. Then [`tally_fs::Fs::fsck`] reads every live data block against its
//! crc and checks every cross-reference. The image must not be in use: a mount's daemon holds an
//! exclusive `flock` on it, and fsck holds a shared one while it reads, so no mount can start
//! meanwhile.

use std::fs::File;
use std::io::IsTerminal as _;
use std::os::unix::fs::FileTypeExt as _;
use std::os::unix::io::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tally_fs::{Fs, FsError, FsckReport, MountOptions, MountReport};
use tally_log::format::superblock::{Superblock, SB_BLOCKS};
use tally_log::LogError;
use tally_media::{Device, MediaError, OverlayDevice};

use crate::EXIT_BAD_INPUT;

/// Exit code: the image is in use by a mount (its daemon holds the lock).
pub const EXIT_IN_USE: u8 = 3;
/// Exit code: the image is a Tally image, and something in it is wrong.
pub const EXIT_CORRUPT: u8 = 4;
/// Exit code: the image cannot be checked at all: not a Tally image (no valid superblock),
/// truncated, or unreadable.
pub const EXIT_UNUSABLE: u8 = 8;

/// Arguments of `tally fsck`.
#[derive(Debug, clap::Args)]
#[command(after_long_help = "\
Examples:
  tally fsck /var/tmp/tally.img            check, print a summary
  tally fsck /var/tmp/tally.img --json     the same as one JSON object on stdout

The image is opened read-only and never written: recovery (which a mount after a crash runs, \
and which writes) runs on an in-memory copy-on-write view of it. Every live data block is read \
and checked against its crc32c; every directory entry, link count, parent, size and block \
address is checked against the rest. An image served by `tally mount` is refused: unmount it \
first.

What fsck cannot tell apart: a transaction torn by a crash and one damaged at the tail of the \
log look alike (both fail their crc), and recovery drops both; that is the log's contract, not \
corruption.

A transaction that later units of its stream prove durable (their durable watermark) but that \
is damaged or missing is corruption, not a torn tail: the image is reported corrupt (exit 4) and \
neither mount nor fsck changes it. `tally fsck --salvage --force IMAGE` then opens it for writing, \
keeps the longest safe prefix of the log, says exactly which transactions it dropped, writes the \
result back, and checks it again: acknowledged data is lost, so it needs --force.

Exit codes: 0 clean; 2 bad arguments; 3 in use by a mount; 4 corruption found; 8 unusable \
image (not a Tally image, truncated, or unreadable). After --salvage --force: 0 when the salvaged \
image checks clean.

JSON (--json): {\"image\", \"status\": \"clean\"|\"corrupt\"|\"unusable\"|\"in_use\"|\"bad_arguments\", \"exit_code\", \
\"superblocks\": [{\"block\", \"valid\", \"generation\", \"error\"}], \"mount\": {\"from_snapshot\", \"from_checkpoint\", \
\"blocks_read\", \"transactions_replayed\", \"inodes\", \"orphans_freed\", \"time\"} or null, \
\"checked\": {\"inodes\", \"entries\", \"data_blocks\", \"problems\"} or null, \"salvaged\": \
[{\"stream\", \"kept_seq\", \"block\", \"proven_seq\", \"dropped_seqs\"}] or null, \"error\": text or null}; \
docs/CLI.md describes each field.")]
pub struct Args {
    /// Image file, block device or NBD export (`nbd://...`, `nbd+unix://...`) made by
    /// `tally mkfs`; for a multi-target image, every target in mkfs's order.
    #[arg(value_name = "IMAGE", required = true, num_args = 1..)]
    images: Vec<PathBuf>,
    /// Print the result as one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Repair a log that proves a durable transaction damaged: keep the longest safe prefix,
    /// drop the rest (reported), write the image. Needs --force.
    #[arg(long)]
    salvage: bool,
    /// Confirm --salvage: it writes to the image and drops transactions that were acknowledged
    /// durable.
    #[arg(long, requires = "salvage")]
    force: bool,
}

/// One superblock copy as found on the image.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CopyReport {
    /// Block holding the copy.
    pub block: u64,
    /// Whether it decodes (magic, version, crc, reserved bytes).
    pub valid: bool,
    /// Its generation, when valid.
    pub generation: Option<u64>,
    /// Why it does not decode, when invalid.
    pub error: Option<String>,
}

/// Everything `tally fsck --json` prints.
#[derive(Debug, serde::Serialize)]
struct Report {
    image: String,
    status: &'static str,
    exit_code: u8,
    superblocks: Vec<CopyReport>,
    mount: Option<MountReport>,
    checked: Option<FsckReport>,
    salvaged: Option<Vec<tally_log::Damage>>,
    error: Option<String>,
}

/// Why an image could not be opened for checking, with its exit code.
pub struct Stop {
    /// Exit code.
    pub code: u8,
    /// What to tell the user.
    pub text: String,
}

/// The image opened for reading: the overlay over it, its lock, and its superblock copies.
pub struct Opened {
    /// Copy-on-write view of the image (reads from it, writes in memory).
    pub dev: Arc<dyn Device>,
    /// Held shared while checking; a mount's daemon holds it exclusive.
    pub _lock: crate::image::Lock,
    /// Both superblock copies, decoded or not.
    pub copies: Vec<(CopyReport, Option<Superblock>)>,
}

/// Open `path` read-only behind a fresh overlay and decode its superblock copies. `refuse_in_use`
/// makes an image held by a mount an error (else it is a warning on stderr).
///
/// # Errors
/// A [`Stop`] with the exit code for it: bad arguments, in use, or unusable.
pub fn open_image(path: &Path, command: &str, refuse_in_use: bool) -> Result<Opened, Stop> {
    let target = crate::image::remote(path).map_err(|text| Stop { code: EXIT_BAD_INPUT, text })?;
    if let Some(target) = target {
        return open_nbd_image(&target, command, refuse_in_use);
    }
    let shown = path.display();
    let meta = std::fs::metadata(path)
        .map_err(|e| Stop { code: EXIT_BAD_INPUT, text: format!("{shown}: {e}") })?;
    if !meta.is_file() && !meta.file_type().is_block_device() {
        return Err(Stop {
            code: EXIT_BAD_INPUT,
            text: format!("{shown} is not a file or a block device"),
        });
    }
    let unusable = |text: String| Stop { code: EXIT_UNUSABLE, text };
    let lock = File::open(path).map_err(|e| unusable(format!("cannot open {shown}: {e}")))?;
    // SAFETY: flock on a descriptor owned by `lock`.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } != 0 {
        let text = format!("{shown} is in use: a tally mount serves it (unmount it first)");
        if refuse_in_use {
            return Err(Stop { code: EXIT_IN_USE, text });
        }
        eprintln!("tally {command}: warning: {text}; what follows is the image as last written");
    }
    let block_size = crate::image::block_size_of(path).map_err(unusable)?;
    let dev =
        OverlayDevice::open_read_only_with_block_size(path, block_size).map_err(|e| match e {
            MediaError::TooSmall { .. } => unusable(format!("{shown} is truncated: {e}")),
            e => unusable(format!("{shown}: {e}")),
        })?;
    let dev: Arc<dyn Device> = Arc::new(dev);
    opened(dev, &shown.to_string(), lock.into())
}

/// [`open_image`] on an NBD export: a copy-on-write view over the export (nothing is written
/// to it), its lock file held shared.
fn open_nbd_image(
    target: &crate::image::Remote,
    command: &str,
    refuse_in_use: bool,
) -> Result<Opened, Stop> {
    let unusable = |text: String| Stop { code: EXIT_UNUSABLE, text };
    let lock = crate::image::lock_remote(target, false).map_err(unusable)?;
    let lock = match lock {
        Some(lock) => lock,
        None => {
            let text = format!("{target} is in use: a tally mount on this machine serves it");
            if refuse_in_use {
                return Err(Stop { code: EXIT_IN_USE, text });
            }
            eprintln!(
                "tally {command}: warning: {text}; what follows is the image as last written"
            );
            // Held by nobody: the shared lock was refused, so hold an unlocked handle.
            File::open(crate::image::remote_lock_path(target))
                .map_err(|e| unusable(e.to_string()))?
                .into()
        }
    };
    let dev = crate::image::open_remote(target).map_err(|e| Stop {
        code: if crate::image::nbd_is_bad_input(&e) { EXIT_BAD_INPUT } else { EXIT_UNUSABLE },
        text: format!("cannot open {target}: {e}"),
    })?;
    let dev: Arc<dyn Device> = Arc::new(OverlayDevice::new(dev));
    opened(dev, &target.to_string(), lock)
}

/// Decode the superblock copies of `dev` and check the image is whole.
fn opened(dev: Arc<dyn Device>, shown: &str, lock: crate::image::Lock) -> Result<Opened, Stop> {
    let unusable = |text: String| Stop { code: EXIT_UNUSABLE, text };
    let copies = read_copies(&*dev).map_err(|e| unusable(format!("cannot read {shown}: {e}")))?;
    let best = copies.iter().filter_map(|(_, sb)| sb.as_ref()).max_by_key(|sb| sb.generation);
    let Some(sb) = best else {
        let why: Vec<String> = copies.iter().filter_map(|(c, _)| c.error.clone()).collect();
        return Err(unusable(format!("{shown} is not a Tally image ({})", why.join("; "))));
    };
    let g = dev.geometry();
    if sb.block_size != g.block_size || sb.block_count > g.block_count {
        return Err(unusable(format!(
            "{shown} is truncated or not whole: its superblock describes {} blocks of {} bytes, \
             the image holds {} of {}",
            sb.block_count, sb.block_size, g.block_count, g.block_size
        )));
    }
    Ok(Opened { dev, _lock: lock, copies })
}

/// `--salvage --force`: mount `path` for writing with the log's salvage option (the longest
/// safe prefix), unmount it cleanly, and return what was dropped.
fn salvage(path: &Path) -> Result<Vec<tally_log::Damage>, Stop> {
    let target = crate::image::remote(path).map_err(|text| Stop { code: EXIT_BAD_INPUT, text })?;
    if let Some(target) = target {
        return salvage_nbd(&target);
    }
    let shown = path.display();
    let unusable = |text: String| Stop { code: EXIT_UNUSABLE, text };
    let lock = File::open(path).map_err(|e| unusable(format!("cannot open {shown}: {e}")))?;
    // SAFETY: flock on a descriptor owned by `lock`.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(Stop {
            code: EXIT_IN_USE,
            text: format!("{shown} is in use: a tally mount serves it (unmount it first)"),
        });
    }
    let block_size = crate::image::block_size_of(path).map_err(unusable)?;
    let options = tally_media::FileOptions { block_size, ..tally_media::FileOptions::default() };
    let dev = tally_media::FileDevice::open(path, options)
        .map_err(|e| unusable(format!("cannot open {shown} for writing: {e}")))?;
    let damage = salvage_on(Arc::new(dev), &shown.to_string())?;
    drop(lock);
    Ok(damage)
}

/// `--salvage --force` on an NBD export.
fn salvage_nbd(target: &crate::image::Remote) -> Result<Vec<tally_log::Damage>, Stop> {
    let unusable = |text: String| Stop { code: EXIT_UNUSABLE, text };
    let lock = crate::image::lock_remote(target, true).map_err(unusable)?.ok_or_else(|| Stop {
        code: EXIT_IN_USE,
        text: format!("{target} is in use: a tally mount on this machine serves it"),
    })?;
    let dev = crate::image::open_remote(target)
        .map_err(|e| unusable(format!("cannot open {target} for writing: {e}")))?;
    let damage = salvage_on(dev, &target.to_string())?;
    drop(lock);
    Ok(damage)
}

/// Mount `dev` with the log's salvage option and unmount it cleanly.
fn salvage_on(dev: Arc<dyn Device>, shown: &str) -> Result<Vec<tally_log::Damage>, Stop> {
    let unusable = |text: String| Stop { code: EXIT_UNUSABLE, text };
    let opts = MountOptions { salvage: true, ..MountOptions::default() };
    let fs = Fs::mount(dev, opts).map_err(|e| Stop {
        code: classify_mount_error(&e),
        text: format!("salvage could not mount {shown}: {e}"),
    })?;
    let damage = fs.mount_report().damage;
    fs.unmount().map_err(|e| unusable(format!("salvage could not unmount {shown}: {e}")))?;
    Ok(damage)
}

/// Both superblock copies: decoded, or why not.
fn read_copies(dev: &dyn Device) -> tally_media::Result<Vec<(CopyReport, Option<Superblock>)>> {
    let bs = dev.geometry().block_size as usize;
    let mut out = Vec::with_capacity(SB_BLOCKS.len());
    for &block in &SB_BLOCKS {
        let mut buf = vec![0u8; bs];
        dev.read(block, &mut buf)?;
        out.push(match Superblock::decode(&buf, block) {
            Ok(sb) => (
                CopyReport { block, valid: true, generation: Some(sb.generation), error: None },
                Some(sb),
            ),
            Err(e) => (
                CopyReport { block, valid: false, generation: None, error: Some(e.to_string()) },
                None,
            ),
        });
    }
    Ok(out)
}

/// Exit code and text for a mount that failed on an image whose superblock is valid.
pub fn classify_mount_error(error: &FsError) -> u8 {
    match error {
        FsError::Log(LogError::Media(_) | LogError::NotFormatted { .. }) => EXIT_UNUSABLE,
        _ => EXIT_CORRUPT,
    }
}

/// A progress bar on stderr when it is a terminal, hidden otherwise.
pub fn progress_bar(json: bool) -> ProgressBar {
    if json || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
}

/// Run `tally fsck`.
pub fn run(args: &Args) -> ExitCode {
    let report = check(args);
    if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(text) => println!("{text}"),
            Err(e) => eprintln!("tally fsck: error: cannot encode the report: {e}"),
        }
    } else {
        print_text(&report);
    }
    ExitCode::from(report.exit_code)
}

fn check(args: &Args) -> Report {
    let joined = crate::image::join_images(&args.images);
    let image = joined.clone().unwrap_or_else(|_| args.images.first().cloned().unwrap_or_default());
    let mut report = Report {
        image: image.display().to_string(),
        status: "unusable",
        exit_code: EXIT_UNUSABLE,
        superblocks: Vec::new(),
        mount: None,
        checked: None,
        salvaged: None,
        error: None,
    };
    if let Err(text) = joined {
        report.exit_code = EXIT_BAD_INPUT;
        report.status = "bad_arguments";
        report.error = Some(text);
        return report;
    }
    if args.salvage {
        if !args.force {
            report.exit_code = EXIT_BAD_INPUT;
            report.status = "bad_arguments";
            report.error = Some(
                "--salvage writes to the image and drops transactions that were acknowledged \
                 durable; add --force to do it (run plain `tally fsck` first to see what is wrong)"
                    .into(),
            );
            return report;
        }
        match salvage(&image) {
            Ok(damage) => report.salvaged = Some(damage),
            Err(stop) => {
                report.exit_code = stop.code;
                report.status = if stop.code == EXIT_IN_USE { "in_use" } else { "unusable" };
                report.error = Some(stop.text);
                return report;
            }
        }
    }
    let opened = match open_image(&image, "fsck", true) {
        Ok(o) => o,
        Err(stop) => {
            report.exit_code = stop.code;
            report.status = match stop.code {
                EXIT_UNUSABLE => "unusable",
                EXIT_IN_USE => "in_use",
                _ => "bad_arguments",
            };
            report.error = Some(stop.text);
            return report;
        }
    };
    report.superblocks = opened.copies.iter().map(|(c, _)| c.clone()).collect();
    let bar = progress_bar(args.json);
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg} {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.set_message("recovering (in memory)");
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    let fs = match Fs::mount(opened.dev.clone(), MountOptions::default()) {
        Ok(fs) => fs,
        Err(e) => {
            bar.finish_and_clear();
            report.exit_code = classify_mount_error(&e);
            report.status = if report.exit_code == EXIT_CORRUPT { "corrupt" } else { "unusable" };
            report.error = Some(format!("cannot mount {}: {e}", image.display()));
            return report;
        }
    };
    report.mount = Some(fs.mount_report());
    bar.disable_steady_tick();
    bar.set_style(
        ProgressStyle::with_template("checking data blocks {bar:40} {pos}/{len} {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let checked = fs.fsck_with_progress(&mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    });
    bar.finish_and_clear();
    // Nothing of the mount reaches the image; the in-memory state is simply dropped (an
    // unmount would write a snapshot, into memory, for nothing).
    drop(fs);
    (report.status, report.exit_code) =
        if checked.is_clean() { ("clean", 0) } else { ("corrupt", EXIT_CORRUPT) };
    report.checked = Some(checked);
    report
}

fn print_text(report: &Report) {
    for c in &report.superblocks {
        match (&c.generation, &c.error) {
            (Some(g), _) => println!("superblock copy at block {}: valid, generation {g}", c.block),
            (None, Some(e)) => println!(
                "superblock copy at block {}: invalid ({e}); a torn update leaves one copy so, \
                 the other serves",
                c.block
            ),
            (None, None) => {}
        }
    }
    if let Some(salvaged) = &report.salvaged {
        if salvaged.is_empty() {
            println!("salvage: nothing proven durable was missing; nothing dropped");
        }
        for d in salvaged {
            println!(
                "salvage: stream {} kept up to seq {}; dropped {} transaction(s) {:?} that a \
                 later unit proved durable up to seq {} (damage at block {})",
                d.stream,
                d.kept_seq,
                d.dropped_seqs.len(),
                d.dropped_seqs,
                d.proven_seq,
                d.block
            );
        }
    }
    if let Some(m) = &report.mount {
        if m.from_checkpoint {
            println!(
                "mounted from a checkpoint snapshot, then {} transactions after it replayed ({} \
                 blocks read), {} inodes, {} orphans freed (in memory; the image is unchanged)",
                m.transactions_replayed, m.blocks_read, m.inodes, m.orphans_freed
            );
        } else if m.from_snapshot {
            println!(
                "mounted from the clean-unmount snapshot ({} blocks read), {} inodes",
                m.blocks_read, m.inodes
            );
        } else {
            println!(
                "recovered from the log: {} blocks scanned, {} transactions replayed, {} inodes, \
                 {} orphans freed (in memory; the image is unchanged)",
                m.blocks_read, m.transactions_replayed, m.inodes, m.orphans_freed
            );
        }
    }
    if let Some(c) = &report.checked {
        println!(
            "checked {} inodes, {} directory entries, {} data blocks (each read and crc-checked)",
            c.inodes, c.entries, c.data_blocks
        );
        for p in &c.problems {
            println!("problem: {p}");
        }
    }
    match report.status {
        "clean" => println!("{}: clean", report.image),
        "corrupt" => {
            if let Some(e) = &report.error {
                eprintln!("tally fsck: error: {e}");
            }
            let n = report.checked.as_ref().map_or(0, |c| c.problems.len());
            if n > 0 {
                println!("{}: CORRUPT, {n} problems", report.image);
            } else {
                println!("{}: CORRUPT, it cannot be mounted", report.image);
            }
        }
        _ => {
            if let Some(e) = &report.error {
                eprintln!("tally fsck: error: {e}");
            }
        }
    }
}

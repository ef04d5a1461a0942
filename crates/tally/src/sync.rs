//! `tally sync [PATH…]`: make everything committed on a Tally mount durable.
//!
//! `sync(1)`, `sync(2)` and `syncfs(2)` do not reach a FUSE server: Linux (up to at least 6.18)
//! sends `FUSE_SYNCFS` only to servers it trusts to stall `sync` (virtiofs), so on a Tally mount
//! they return at once and changes still ordered in memory (write-behind, up to the commit
//! interval) stay there. `fsync` of a file does reach Tally. This command asks the daemon
//! itself, through the `TALLY_IOC_SYNC` ioctl: one flush round of the whole file system.

use std::fs::File;
use std::os::fd::AsRawFd as _;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `tally sync`.
#[derive(Debug, clap::Args)]
#[command(after_long_help = "\
Why it exists: on Linux (up to at least 6.18) `sync` and `syncfs` are not forwarded to FUSE \
file systems, so a plain `sync` does not make a Tally mount durable: what the daemon still holds \
in memory (at most the commit interval, `-o commit_ms`, 5 s by default) is lost if the machine \
or the daemon dies. `fsync` of a file is forwarded and makes that file durable. `tally sync` \
makes everything committed on the mount durable, whoever committed it, with one flush.

Without PATH: every Tally mount this process can see, then sync(2) for all other file systems \
(a superset of `sync`). With PATH: the mount holding each PATH; a PATH not on a Tally mount gets \
syncfs(2), as `sync -f PATH` would.

Exit status: 0 when everything asked for is durable; 1 when a PATH could not be opened or a \
mount failed to sync (after an I/O error the mount is read-only and nothing more is promised); \
2 for a usage error.

Examples:
  tar xf big.tar -C /mnt/tally/src && tally sync /mnt/tally
  tally sync            # every Tally mount, then every other file system")]
pub struct Args {
    /// Any file or directory on the mount to sync (default: every Tally mount).
    pub paths: Vec<PathBuf>,
}

/// Run `tally sync`.
pub fn run(args: &Args) -> ExitCode {
    let mut failed = false;
    if args.paths.is_empty() {
        // Every FUSE mount that answers Tally's ioctl; the others are sync(2)'s.
        for mnt in crate::mount::fuse_mounts() {
            // One this process cannot open is not one sync(2) could sync for it either.
            let Ok(file) = File::open(&mnt) else { continue };
            if let Err(e) = sync_tally(&file) {
                eprintln!("tally sync: error: {}: {e}", mnt.display());
                failed = true;
            }
        }
        // SAFETY: sync(2) has no preconditions and cannot fail.
        unsafe { libc::sync() };
    }
    for path in &args.paths {
        let result = File::open(path).map_err(|e| e.to_string()).and_then(|file| {
            if sync_tally(&file)? {
                Ok(())
            } else {
                syncfs(&file)
            }
        });
        if let Err(e) = result {
            eprintln!("tally sync: error: {}: {e}", path.display());
            failed = true;
        }
    }
    if failed {
        ExitCode::from(crate::EXIT_IO_FAILURE)
    } else {
        ExitCode::SUCCESS
    }
}

/// Sync the Tally mount holding `file` through its ioctl; false when it is not on one.
fn sync_tally(file: &File) -> Result<bool, String> {
    match tally_client::sync(file) {
        Ok(()) => Ok(true),
        // Not Tally: other file systems answer an unknown ioctl ENOTTY (most), EINVAL,
        // EOPNOTSUPP or ENOSYS (some FUSE servers).
        Err(tally_client::Error::NotTally | tally_client::Error::NoTransaction) => Ok(false),
        Err(tally_client::Error::Io(e))
            if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EOPNOTSUPP)) =>
        {
            Ok(false)
        }
        Err(e) => Err(e.to_string()),
    }
}

/// syncfs(2) on the file system holding `file`.
fn syncfs(file: &File) -> Result<(), String> {
    // SAFETY: the descriptor is open for the life of `file`.
    if unsafe { libc::syncfs(file.as_raw_fd()) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().to_string())
    }
}

//! `tally barrier FILE…`: order without waiting. After the barrier on a file, a later change to
//! it survives a crash only if every earlier change to it does; the call returns before
//! anything is flushed. A shell script's equivalent of `fsync` when it needs order, not
//! durability.

use std::fs::File;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `tally barrier`.
#[derive(Debug, clap::Args)]
#[command(after_long_help = "\
What it promises: the changes made to FILE before the barrier are ordered before every change \
made to it after: a crash may lose a suffix, never a change from before the barrier while \
keeping one from after. It does not wait for the device (no flush): use `sync FILE` (or fsync) \
when the changes must be on stable media before you go on.

Exit status: 0 when every FILE got its barrier; 1 when one could not be opened or is not on a \
Tally mount (the others still get theirs); 2 for a usage error.

Example: an append-only journal written by a shell script, in order, without one flush per line:
  for i in $(seq 100); do echo \"step $i\" >>/mnt/tally/journal; tally barrier /mnt/tally/journal; done")]
pub struct Args {
    /// Files or directories on a Tally mount.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}

/// Run `tally barrier`.
pub fn run(args: &Args) -> ExitCode {
    let mut failed = false;
    for path in &args.files {
        let result = File::open(path)
            .map_err(|e| e.to_string())
            .and_then(|f| tally_client::barrier(&f).map_err(|e| e.to_string()));
        if let Err(e) = result {
            eprintln!("tally barrier: error: {}: {e}", path.display());
            failed = true;
        }
    }
    if failed {
        ExitCode::from(crate::EXIT_IO_FAILURE)
    } else {
        ExitCode::SUCCESS
    }
}

//! `tally atomic DIR -- CMD ARGS…`: run a command so that every change it, and every process
//! it starts, makes under a Tally mount is one transaction — committed when the command exits
//! with status 0, aborted otherwise.
//!
//! How: this process becomes a child subreaper (so processes orphaned below it are adopted by
//! it, not by init), begins a transaction bound to its own process tree with the
//! `BEGIN_TREE` ioctl on DIR, runs the command, waits for it and then for every process left
//! below it, and commits (durably unless `--no-durable`) or aborts through the same open file.
//! If this process dies first, the kernel closes that file and the mount aborts the transaction.

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, ExitCode, ExitStatus};

/// Exit code when the command succeeded but the commit failed: nothing it changed is kept.
pub const EXIT_COMMIT_FAILED: u8 = 124;
/// Exit code when no transaction could be begun (not a Tally mount, already inside one).
pub const EXIT_NO_TRANSACTION: u8 = 125;
/// Exit code when the command was found but could not be run.
pub const EXIT_CANNOT_RUN: u8 = 126;
/// Exit code when the command was not found.
pub const EXIT_NOT_FOUND: u8 = 127;

/// Arguments of `tally atomic`.
#[derive(Debug, clap::Args)]
#[command(after_long_help = "\
What is inside: every change (write, create, rename, unlink, chmod, xattr, ...) made under the \
mount by the command and by every process it starts, at any depth, through any file \
descriptor, until it and they have all exited. `tally atomic` waits for processes the command \
left running in the background before it decides (stop them to finish sooner).

What other processes see meanwhile: the changes as they happen (as in a page cache; there is \
no isolation of readers). A process outside the command that changes a file or name the \
transaction changed waits up to the mount's txn_wait (100 ms by default, -o txn_wait_ms=N), \
then gets EBUSY; its changes to anything else are its own and are kept whatever happens here.

Durability: the commit waits until the transaction is on stable media (one flush); with \
--no-durable it returns at once, ordered and atomic, durable at the next fsync, sync or the \
mount's periodic flush. fsync calls made by the command do not make its changes durable before \
the commit: they are part of the transaction.

If `tally atomic` is killed, the mount aborts the transaction when its open file closes; \
processes still running keep running, and what they change after that is no longer inside.

Exit status: the command's own when it ran (transaction committed on 0, aborted otherwise), \
128+N when it was killed by signal N (aborted), 124 when the command succeeded but the commit \
failed (nothing kept), 125 when no transaction could be begun (DIR is not on a Tally mount, \
or this process is already inside a transaction), 126 when the command could not be run, 127 \
when it was not found, 2 for a usage error.

Examples:
  tally atomic /mnt/tally -- sh -c 'cp new/*.conf /mnt/tally/etc/ && ./check-config'
  tally atomic /mnt/tally/pkg -- tar -xf package.tar -C /mnt/tally/pkg
  tally atomic --no-durable /mnt/tally -- make install DESTDIR=/mnt/tally")]
pub struct Args {
    /// A directory (or file) on the Tally mount; the transaction covers the whole mount.
    pub dir: PathBuf,
    /// Commit without waiting for the flush (ordered and atomic, durable a little later).
    #[arg(long)]
    pub no_durable: bool,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// Run `tally atomic`.
pub fn run(args: &Args) -> ExitCode {
    let dir = match File::open(&args.dir) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("tally atomic: error: {}: {e}", args.dir.display());
            return ExitCode::from(EXIT_NO_TRANSACTION);
        }
    };
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes an integer flag.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        eprintln!("tally atomic: error: cannot adopt orphans: {}", io::Error::last_os_error());
        return ExitCode::from(EXIT_NO_TRANSACTION);
    }
    let id = match tally_client::begin_tree(&dir) {
        Ok(id) => id,
        Err(e) => {
            let hint = match e {
                tally_client::Error::NotTally => " (is it under a `tally mount`?)",
                tally_client::Error::Busy => " (this process is already inside a transaction)",
                _ => "",
            };
            eprintln!("tally atomic: error: {}: {e}{hint}", args.dir.display());
            return ExitCode::from(EXIT_NO_TRANSACTION);
        }
    };
    let Some((program, rest)) = args.command.split_first() else {
        // clap requires the command; nothing to run means nothing to keep.
        let _ = tally_client::abort(&dir);
        return ExitCode::from(crate::EXIT_BAD_INPUT);
    };
    // The terminal's ^C and ^\ go to the whole foreground group: the command decides what they
    // mean, and this process stays to abort (or commit) after it.
    ignore_terminal_signals(true);
    let mut cmd = Command::new(program);
    cmd.args(rest);
    // SAFETY: only async-signal-safe calls (signal) between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            ignore_terminal_signals(false);
            Ok(())
        });
    }
    let status = match cmd.status() {
        Ok(s) => s,
        Err(e) => {
            let _ = tally_client::abort(&dir);
            let code =
                if e.kind() == io::ErrorKind::NotFound { EXIT_NOT_FOUND } else { EXIT_CANNOT_RUN };
            eprintln!(
                "tally atomic: error: cannot run {}: {e}; transaction {id} aborted",
                program.to_string_lossy()
            );
            return ExitCode::from(code);
        }
    };
    wait_for_leftovers();
    finish(&dir, id, status, !args.no_durable, &program.to_string_lossy())
}

/// Commit or abort after the command's `status`, and the exit code for it.
fn finish(dir: &File, id: u64, status: ExitStatus, durable: bool, program: &str) -> ExitCode {
    if status.success() {
        let r = if durable { tally_client::commit_durable(dir) } else { tally_client::commit(dir) };
        return match r {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!(
                    "tally atomic: error: {program} succeeded but transaction {id} could not \
                     commit: {e}; nothing it changed is kept"
                );
                ExitCode::from(EXIT_COMMIT_FAILED)
            }
        };
    }
    let (how, code) = match (status.code(), status.signal()) {
        (Some(c), _) => (format!("exited with status {c}"), u8::try_from(c).unwrap_or(1)),
        (None, Some(s)) => {
            (format!("was killed by signal {s}"), u8::try_from(128 + s).unwrap_or(255))
        }
        (None, None) => ("ended abnormally".to_owned(), 1),
    };
    match tally_client::abort(dir) {
        Ok(()) => eprintln!(
            "tally atomic: {program} {how}; transaction {id} aborted, nothing it changed is kept"
        ),
        Err(e) => eprintln!("tally atomic: {program} {how}; abort of transaction {id}: {e}"),
    }
    ExitCode::from(code)
}

/// Wait until no process is left below this one (orphans adopted as subreaper included): they
/// are inside the transaction, which must not end under them.
fn wait_for_leftovers() {
    let mut told = false;
    loop {
        // SAFETY: waitpid on any child; a null status pointer is allowed.
        let pid = unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) };
        match pid {
            0 => {
                if !told {
                    eprintln!(
                        "tally atomic: the command exited; waiting for the processes it left \
                         running (they are inside the transaction)"
                    );
                    told = true;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            p if p > 0 => {}
            _ => {
                if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                return; // ECHILD: none left
            }
        }
    }
}

/// Ignore (or restore) SIGINT and SIGQUIT.
fn ignore_terminal_signals(ignore: bool) {
    let how = if ignore { libc::SIG_IGN } else { libc::SIG_DFL };
    // SAFETY: setting a disposition to SIG_IGN or SIG_DFL is async-signal-safe and has no
    // preconditions.
    unsafe {
        libc::signal(libc::SIGINT, how);
        libc::signal(libc::SIGQUIT, how);
    }
}

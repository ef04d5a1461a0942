//! The `tally` command. Each subcommand lives in its own module; this file only parses the
//! command line, sets up logging and maps outcomes to exit codes.

mod atomic;
mod barrier;
mod bench;
mod crash;
mod crash_fs;
mod fsck;
mod image;
mod inspect;
mod mkfs;
mod mount;
mod probe;
mod sync;

use std::error::Error;
use std::fmt::Write as _;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exit code for bad input: unusable arguments or a path the command refuses.
pub const EXIT_BAD_INPUT: u8 = 2;
/// Exit code for an I/O failure while running.
pub const EXIT_IO_FAILURE: u8 = 1;

/// Print `error` as `command: error: …` with its causes, and the exit code for it: bad input
/// (`bad_input`) or an I/O failure.
pub fn fail(command: &str, error: &dyn Error, bad_input: bool) -> ExitCode {
    eprintln!("{command}: error: {}", describe(error));
    ExitCode::from(if bad_input { EXIT_BAD_INPUT } else { EXIT_IO_FAILURE })
}

/// The error with its chain of causes, each once.
fn describe(error: &dyn Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            let _ = write!(text, ": {cause_text}");
        }
        source = cause.source();
    }
    text
}

/// Tally: a crash-consistent storage stack.
#[derive(Debug, Parser)]
#[command(name = "tally", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Measure write, flush and FUA latency of a file or block device.
    Probe(probe::Args),
    /// Explore crash states of a layer and check its invariants (exit 1 on a violation).
    #[command(subcommand)]
    Crash(crash::Command),
    /// Run a benchmark (not part of the test suite).
    #[command(subcommand)]
    Bench(bench::Command),
    /// Make an empty Tally file system on a file (created sparse) or a block device.
    Mkfs(mkfs::Args),
    /// Serve a Tally image on a directory through FUSE (a daemon unless --foreground).
    Mount(mount::MountArgs),
    /// Unmount a Tally mount and wait until its daemon has written its snapshot.
    Umount(mount::UmountArgs),
    /// Run a command so that all it changes under a Tally mount is one transaction.
    Atomic(atomic::Args),
    /// Order later changes to files after earlier ones, without waiting for the device.
    Barrier(barrier::Args),
    /// Make everything committed on a Tally mount durable (plain `sync` does not reach FUSE).
    Sync(sync::Args),
    /// Check a Tally image read-only: every checksum, every cross-reference (exit 4 if corrupt).
    Fsck(fsck::Args),
    /// Show a Tally image read-only: superblocks, streams, segments, what is durable.
    Inspect(inspect::Args),
}

fn main() -> ExitCode {
    // clap exits with code 2 on a usage error, matching EXIT_BAD_INPUT.
    let cli = Cli::parse();
    // The mount daemon forks before any thread starts and sets up its own logging.
    if let Command::Mount(args) = &cli.command {
        return mount::run_mount(args);
    }
    // A reader that goes away (`tally bench ... | head`) ends the program quietly, as it ends
    // other Unix tools, instead of a panic in `println!` on EPIPE (Rust ignores SIGPIPE).
    // SAFETY: restores the default disposition of one signal before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    // Crash exploration injects I/O errors on purpose; the log's reports of them are noise there.
    let default_filter =
        if matches!(cli.command, Command::Crash(_)) { "warn,tally_log=off" } else { "warn" };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match cli.command {
        Command::Probe(args) => probe::run(&args),
        Command::Crash(cmd) => crash::run(&cmd),
        Command::Bench(cmd) => bench::run(&cmd),
        Command::Mkfs(args) => mkfs::run(&args),
        Command::Mount(args) => mount::run_mount(&args),
        Command::Umount(args) => mount::run_umount(&args),
        Command::Atomic(args) => atomic::run(&args),
        Command::Barrier(args) => barrier::run(&args),
        Command::Sync(args) => sync::run(&args),
        Command::Fsck(args) => fsck::run(&args),
        Command::Inspect(args) => inspect::run(&args),
    }
}

//! `tally probe PATH`: what does one durable commit cost on this device?

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use tally_bench::measure::parse_size_like;
use tally_media::probe::{probe, LatencyUs, ProbeOptions, ProbeReport};

use crate::{fail, EXIT_IO_FAILURE};

/// Arguments of `tally probe`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// File or block device to measure. A missing file is created and removed afterwards.
    path: PathBuf,
    /// Size of the file to create, e.g. 64M, 1G, 4096 (K/M/G/T are powers of 1024).
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    size: u64,
    /// Timed iterations of each measurement.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..))]
    iterations: u32,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Keep the file the probe created.
    #[arg(long)]
    keep: bool,
    /// Write into an existing non-empty file or a block device (overwrites its first blocks).
    #[arg(long)]
    force: bool,
}

/// Parse a byte size: digits with an optional K, M, G or T suffix (binary), optionally
/// followed by "iB" or "B".
fn parse_size(text: &str) -> Result<u64, String> {
    parse_size_like(text, "64M")
}

/// Run the probe and print its report; the exit code says how it went.
pub fn run(args: &Args) -> ExitCode {
    let options = ProbeOptions {
        size_bytes: args.size,
        iterations: args.iterations,
        keep: args.keep,
        force: args.force,
    };
    match probe(&args.path, options) {
        Ok(report) => print_report(&report, args.json),
        Err(error) => fail("tally probe", &error, error.is_bad_input()),
    }
}

fn print_report(report: &ProbeReport, json: bool) -> ExitCode {
    if json {
        match serde_json::to_string_pretty(report) {
            Ok(text) => println!("{text}"),
            Err(error) => {
                eprintln!("tally probe: error: cannot encode the report: {error}");
                return ExitCode::from(EXIT_IO_FAILURE);
            }
        }
    } else {
        print!("{}", table(report));
    }
    ExitCode::SUCCESS
}

fn yes_no(works: bool, note: Option<&String>) -> String {
    match (works, note) {
        (true, _) => "yes".to_string(),
        (false, Some(note)) => format!("no: {note}"),
        (false, None) => "no (not requested)".to_string(),
    }
}

/// The human-readable report: a small aligned table.
fn table(report: &ProbeReport) -> String {
    let mut out = String::new();
    let origin = if report.created { "created for the probe" } else { "existing" };
    let _ = writeln!(
        out,
        "{} ({origin}, {} MiB, block {} B, {} iterations)",
        report.path.display(),
        report.size_bytes >> 20,
        report.block_size,
        report.iterations,
    );
    let _ = writeln!(out, "  O_DIRECT   {}", yes_no(report.direct, report.direct_note.as_ref()));
    let _ =
        writeln!(out, "  io_uring   {}", yes_no(report.io_uring, report.io_uring_note.as_ref()));
    let _ = writeln!(out);
    let _ = writeln!(out, "  {:<24} {:>10} {:>10} {:>10}", "latency (µs)", "p50", "p99", "max");
    let row = |out: &mut String, name: &str, l: &LatencyUs| {
        let _ = writeln!(out, "  {name:<24} {:>10.1} {:>10.1} {:>10.1}", l.p50, l.p99, l.max);
    };
    row(&mut out, "4 KiB write", &report.write_4k_us);
    row(&mut out, "fdatasync after 4 KiB", &report.fdatasync_us);
    row(&mut out, "4 KiB FUA write", &report.fua_write_us);
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "  ceiling, one stream, flush per commit: {:>10.0} commits/s",
        report.ceiling_commits_per_sec
    );
    let _ = writeln!(
        out,
        "  ceiling, one stream, FUA per commit:   {:>10.0} commits/s",
        report.ceiling_commits_per_sec_fua
    );
    let _ = writeln!(out, "  machine: {}", report.machine);
    out
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("512KiB"), Ok(512 << 10));
        assert!(parse_size("").is_err());
        assert!(parse_size("0").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999T").is_err());
    }
}

//! `tally probe PATH`: what does one durable commit cost on this device?

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use tally_bench::measure::parse_size_like;
use tally_bench::probe::{
    machine_info, probe, time_device, DeviceTimings, LatencyUs, ProbeOptions, ProbeReport,
};
use tally_media::Device as _;

use crate::{fail, EXIT_IO_FAILURE};

/// Arguments of `tally probe`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// File or block device to measure (a missing file is created and removed afterwards), or
    /// an NBD export (`nbd://host[:port]/export`, `nbd+unix:///export?socket=PATH`), or the
    /// exports of a multi-target image (each is probed in turn).
    #[arg(required = true, num_args = 1..)]
    paths: Vec<PathBuf>,
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
    let bad_input = |text: String| {
        eprintln!("tally probe: error: {text}");
        ExitCode::from(crate::EXIT_BAD_INPUT)
    };
    let mut targets = Vec::new();
    for path in &args.paths {
        match crate::image::nbd_target(path) {
            Ok(Some(target)) => targets.push(target),
            Ok(None) => {}
            Err(text) => return bad_input(text),
        }
    }
    if args.paths.len() > 1 && targets.len() < args.paths.len() {
        return bad_input(
            "several paths are the NBD exports of a multi-target image; probe a file alone".into(),
        );
    }
    if !targets.is_empty() {
        return run_nbd_all(args, &targets);
    }
    let Some(path) = args.paths.first() else {
        return bad_input("nothing to probe".into());
    };
    let options = ProbeOptions {
        size_bytes: args.size,
        iterations: args.iterations,
        keep: args.keep,
        force: args.force,
    };
    match probe(path, options) {
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

/// What `tally probe nbd://...` measured.
#[derive(Debug, serde::Serialize)]
struct NbdProbeReport {
    target: String,
    /// Whether the server takes `NBD_CMD_FLAG_FUA` (else a FUA write is a write and a flush).
    fua_native: bool,
    /// Whether the server declares a volatile cache (`NBD_FLAG_SEND_FLUSH`).
    flush: bool,
    multi_conn: bool,
    iterations: u32,
    timings: DeviceTimings,
    ceiling_commits_per_sec: f64,
    ceiling_commits_per_sec_fua: f64,
    machine: tally_bench::probe::MachineInfo,
}

/// `tally probe URI...`: each export in turn (the targets of a multi-target image are
/// independent devices, each with its own cache: one's flush says nothing of another's). JSON:
/// one object for one export, an array for several.
fn run_nbd_all(args: &Args, targets: &[tally_media::NbdTarget]) -> ExitCode {
    let mut reports = Vec::new();
    for target in targets {
        match run_nbd(args, target) {
            Ok(report) => reports.push(report),
            Err(code) => return code,
        }
    }
    if args.json {
        let text = match &reports[..] {
            [one] => serde_json::to_string_pretty(one),
            all => serde_json::to_string_pretty(all),
        };
        match text {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("tally probe: error: cannot encode the report: {e}");
                return ExitCode::from(EXIT_IO_FAILURE);
            }
        }
        return ExitCode::SUCCESS;
    }
    for (i, report) in reports.iter().enumerate() {
        if i > 0 {
            println!();
        }
        print!("{}", nbd_table(report));
    }
    ExitCode::SUCCESS
}

/// `tally probe nbd://...`: the same three timings over the network. The export's first
/// blocks are overwritten, so anything but zeros there needs --force.
fn run_nbd(args: &Args, target: &tally_media::NbdTarget) -> Result<NbdProbeReport, ExitCode> {
    let fail_with = |text: String, code: u8| {
        eprintln!("tally probe: error: {text}");
        Err(ExitCode::from(code))
    };
    let dev = match tally_media::NbdDevice::open(target, crate::image::nbd_options(None, 1)) {
        Ok(dev) => dev,
        Err(e) => {
            let code = if crate::image::nbd_is_bad_input(&e) {
                crate::EXIT_BAD_INPUT
            } else {
                EXIT_IO_FAILURE
            };
            return fail_with(format!("cannot open {target}: {e}"), code);
        }
    };
    let g = dev.geometry();
    let region = g.block_count.min(1024);
    let mut head = vec![0u8; usize::try_from(region).unwrap_or(0) * g.block_size as usize];
    if let Err(e) = dev.read(0, &mut head) {
        return fail_with(format!("cannot read {target}: {e}"), EXIT_IO_FAILURE);
    }
    if !args.force && head.iter().any(|&b| b != 0) {
        return fail_with(
            format!(
                "refusing to probe {target}: its first {} KiB hold data that probing would \
                 overwrite; pass --force to overwrite it",
                head.len() >> 10
            ),
            crate::EXIT_BAD_INPUT,
        );
    }
    let timings = match time_device(&dev, args.iterations) {
        Ok(t) => t,
        Err(e) => return Err(fail("tally probe", &e, e.is_bad_input())),
    };
    let per_sec = |l: &LatencyUs| 1e6 / l.p50.max(1e-3);
    let export = dev.export();
    let report = NbdProbeReport {
        target: target.to_string(),
        fua_native: export.has_fua(),
        flush: export.has_flush(),
        multi_conn: export.has_multi_conn(),
        iterations: args.iterations,
        ceiling_commits_per_sec: per_sec(&timings.write_flush_us),
        ceiling_commits_per_sec_fua: per_sec(&timings.fua_write_us),
        timings,
        machine: machine_info(),
    };
    Ok(report)
}

/// The table of one export's probe.
fn nbd_table(report: &NbdProbeReport) -> String {
    let mut out = String::new();
    let t = &report.timings;
    let _ = writeln!(
        out,
        "{} (NBD export, {} MiB, block {} B, {} iterations)",
        report.target,
        t.size_bytes >> 20,
        t.block_size,
        report.iterations
    );
    let yes = |b: bool| if b { "yes" } else { "no" };
    let _ = writeln!(out, "  FUA flag    {}", yes(report.fua_native));
    let _ = writeln!(out, "  flush       {}", yes(report.flush));
    let _ = writeln!(out, "  multi-conn  {}", yes(report.multi_conn));
    let _ = writeln!(out);
    let _ = writeln!(out, "  {:<24} {:>10} {:>10} {:>10}", "latency (µs)", "p50", "p99", "max");
    for (name, l) in [
        ("4 KiB write", &t.write_4k_us),
        ("flush after 4 KiB", &t.write_flush_us),
        ("4 KiB FUA write", &t.fua_write_us),
    ] {
        let _ = writeln!(out, "  {name:<24} {:>10.1} {:>10.1} {:>10.1}", l.p50, l.p99, l.max);
    }
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

//! `tally bench peer …`: one timed window of one system for the side-by-side comparison
//! (issue #6). `bench/run.sh` sets up the systems, repeats and interleaves the windows and
//! writes the report; these commands only measure.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use tally_bench::append::{AppendOptions, AppendSystem};
use tally_bench::append_crash::{AppendCrashOptions, AppendCrashReport, CrashVariant};
use tally_bench::multicommit::{CommitOptions, CommitSystem};
use tally_bench::peer::Window;
use tally_bench::varmail::VarmailOptions;

/// Exit code of `append-crash` when the barrier or fsync variant lost order or an acknowledged
/// append (the report is printed first).
const EXIT_GUARANTEE_BROKEN: u8 = 6;

/// Workloads measured against other systems.
#[derive(Debug, clap::Subcommand)]
pub enum PeerCommand {
    /// Filebench's varmail flow (create/delete/append+fsync/read) in a directory on any file
    /// system: `tally bench peer varmail --dir /mnt/ext4`.
    Varmail(VarmailArgs),
    /// An append stream of fixed blocks, each made durable (fsync) or only ordered (Tally's
    /// barrier): `--system posix-fsync --dir D`, `--system tally-barrier --device /dev/loop3`.
    Append(AppendArgs),
    /// What of an ordered append stream survives a crash, on the simulated disk (a volatile
    /// write cache; no device needed): a data file and an index file on different streams,
    /// with a barrier, an fsync or nothing after each append. Seeded crash images are mounted
    /// and checked: is each file a prefix of what was written, does the index refer to data
    /// that survived, how many appends were lost, was any acknowledged-durable append lost.
    /// Exits 6 if the barrier or fsync variant broke its guarantee.
    /// `tally bench peer append-crash --seed 7 --json`.
    AppendCrash(AppendCrashArgs),
    /// One update to each of N files, atomically and durably, per commit: SQLite with ATTACH
    /// (rollback or WAL) in a directory, Tally's transaction ioctls on a mount, or the Tally
    /// library on a device.
    Multicommit(MulticommitArgs),
}

/// Arguments of `tally bench peer varmail`.
#[derive(Debug, clap::Args)]
pub struct VarmailArgs {
    /// Directory to run in (a subdirectory is made and removed).
    #[arg(long)]
    dir: PathBuf,
    /// Name of the system, for the report.
    #[arg(long, default_value = "posix")]
    system: String,
    /// Files in the set (80 % made before the window).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(2..))]
    files: u32,
    /// Threads.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=256))]
    threads: u32,
    /// Seconds of the window.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Seed of sizes and choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// Arguments of `tally bench peer append`.
#[derive(Debug, clap::Args)]
pub struct AppendArgs {
    /// posix-fsync (needs --dir), tally-fsync or tally-barrier (need --device).
    #[arg(long)]
    system: AppendSystem,
    /// Directory for posix-fsync.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Block device or image for the Tally library (a fresh file system is made on it: its
    /// contents are lost).
    #[arg(long)]
    device: Option<PathBuf>,
    /// Bytes per append.
    #[arg(long, default_value_t = 4096)]
    block: usize,
    /// Seconds of the window.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Stop after this many MiB even before the window ends.
    #[arg(long, default_value_t = 256)]
    mib_max: u64,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// Arguments of `tally bench peer append-crash`.
#[derive(Debug, clap::Args)]
pub struct AppendCrashArgs {
    /// Variants, comma-separated: barrier, fsync, none.
    #[arg(long, value_delimiter = ',', default_value = "barrier,fsync,none")]
    variants: Vec<CrashVariant>,
    /// Steps of the stream (each appends one data record and one 16-byte index record).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    steps: u32,
    /// Bytes per data record (at most 64 KiB: one transaction).
    #[arg(long, default_value_t = 4096)]
    block: usize,
    /// Crash points checked per variant (a seeded uniform sample of all of them).
    #[arg(long, default_value_t = 200)]
    points: usize,
    /// Crash images drawn per checked point.
    #[arg(long, default_value_t = 8)]
    images: usize,
    /// Never tear a block write (by default a crash may keep some 512-byte units of one).
    #[arg(long)]
    no_tearing: bool,
    /// Seed of payload, crash points and crash images (printed; rerun with it to reproduce).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// Arguments of `tally bench peer multicommit`.
#[derive(Debug, clap::Args)]
pub struct MulticommitArgs {
    /// sqlite-rollback, sqlite-wal or tally-fuse-ioctl (need --dir; the last on a Tally mount),
    /// tally (the library; needs --device).
    #[arg(long)]
    system: CommitSystem,
    /// Directory for SQLite.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Block device or image for the Tally library (a fresh file system is made on it).
    #[arg(long)]
    device: Option<PathBuf>,
    /// Files updated per commit.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=62))]
    files: u32,
    /// Bytes per file per commit.
    #[arg(long, default_value_t = 4096)]
    value: usize,
    /// Seconds of the window.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// Run one window.
pub fn run(cmd: &PeerCommand) -> ExitCode {
    match cmd {
        PeerCommand::Varmail(a) => {
            let o = VarmailOptions {
                dir: a.dir.clone(),
                system: a.system.clone(),
                files: a.files,
                threads: a.threads,
                mean_file_bytes: 16 << 10,
                append_bytes: 16 << 10,
                seconds: a.seconds,
                seed: a.seed,
            };
            super::finish(tally_bench::varmail::run(&o), a.json, window_text)
        }
        PeerCommand::Append(a) => {
            let o = AppendOptions {
                system: a.system,
                dir: a.dir.clone(),
                device: a.device.clone(),
                block_bytes: a.block,
                seconds: a.seconds,
                bytes_max: a.mib_max << 20,
            };
            super::finish(tally_bench::append::run(&o), a.json, window_text)
        }
        PeerCommand::AppendCrash(a) => {
            let o = AppendCrashOptions {
                variants: a.variants.clone(),
                steps: a.steps,
                record_bytes: a.block,
                points_max: a.points,
                images_per_point: a.images,
                tearing: !a.no_tearing,
                seed: a.seed,
                mutant: None,
            };
            let result = tally_bench::append_crash::run(&o);
            let broken = matches!(&result, Ok(r) if !r.guarantees_held);
            let code = super::finish(result, a.json, crash_text);
            if broken {
                eprintln!(
                    "tally bench peer append-crash: a barrier or fsync guarantee broke (seed {})",
                    a.seed
                );
                return ExitCode::from(EXIT_GUARANTEE_BROKEN);
            }
            code
        }
        PeerCommand::Multicommit(a) => {
            let o = CommitOptions {
                system: a.system,
                dir: a.dir.clone(),
                device: a.device.clone(),
                files: a.files,
                value_bytes: a.value,
                seconds: a.seconds,
            };
            super::finish(tally_bench::multicommit::run(&o), a.json, window_text)
        }
    }
}

fn window_text(w: &Window) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "tally bench peer {} ({}): {} ops in {:.2} s = {:.1} ops/s, {:.1} µs CPU/op (this process)",
        w.workload, w.system, w.ops, w.seconds, w.ops_per_s, w.cpu_us_per_op
    );
    if let (Some(p50), Some(p99)) = (w.latency_p50_us, w.latency_p99_us) {
        let _ = writeln!(out, "  latency p50 {p50:.1} µs, p99 {p99:.1} µs");
    }
    if let Some(d) = &w.tally_device {
        let per = |x: u64| if w.ops == 0 { 0.0 } else { x as f64 / w.ops as f64 };
        let _ = writeln!(
            out,
            "  Tally device: {:.3} flushes/op, {:.1} KiB written/op",
            per(d.flushes),
            per(d.bytes_written) / 1024.0
        );
    }
    if let Some(n) = &w.note {
        let _ = writeln!(out, "  note: {n}");
    }
    out.push_str("  (one window; bench/run.sh repeats windows and reports medians and ratios)\n");
    out
}

fn crash_text(r: &AppendCrashReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "tally bench peer append-crash: {} steps of {} B data + 16 B index record, seed {}, \
         {} images per point, tearing {}",
        r.steps,
        r.record_bytes,
        r.seed,
        r.images_per_point,
        if r.tearing { "on" } else { "off" }
    );
    let _ = writeln!(out, "  {}", r.device);
    let _ = writeln!(
        out,
        "  {:<8} {:>7} {:>7} {:>11} {:>10} {:>10} {:>12} {:>8} {:>9}",
        "variant",
        "points",
        "images",
        "violations",
        "lost mean",
        "lost max",
        "cache gone",
        "ack lost",
        "flush/st"
    );
    for v in &r.variants {
        let _ = writeln!(
            out,
            "  {:<8} {:>7} {:>7} {:>11} {:>10.2} {:>10} {:>12.2} {:>8} {:>9.2}",
            v.variant.name(),
            v.points_checked,
            v.images_checked,
            v.violations,
            v.appends_lost_mean,
            v.appends_lost_max,
            v.appends_lost_cache_gone_mean,
            v.acknowledged_lost,
            v.flushes_per_step
        );
        if v.violations > 0 {
            let _ = writeln!(
                out,
                "           data not a prefix {}, index not a prefix {}, index without its data {}, \
                 unmountable {}",
                v.data_not_prefix, v.index_not_prefix, v.index_without_data, v.unmountable
            );
        }
    }
    let _ = writeln!(
        out,
        "  barrier and fsync: {}",
        if r.guarantees_held {
            "no violation, no acknowledged append lost"
        } else {
            "GUARANTEE BROKEN (see the rows above; rerun with this seed)"
        }
    );
    out
}

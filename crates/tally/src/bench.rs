//! `tally bench …`: benchmarks, run by hand or by the benchmark scripts, never by the tests.
//! The measuring lives in `tally-bench`; this file parses arguments and prints reports.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use tally_bench::crash_mount::{CrashMountOptions, CrashMountReport};
use tally_bench::fs::{FsOptions, FsReport};
use tally_bench::recovery::{RecoveryOptions, RecoveryReport};
use tally_bench::tx::{TxOptions, TxReport};
use tally_bench::{parse_size, BenchError};
use tally_log::CommitMode;

use crate::{fail, EXIT_IO_FAILURE};

mod fs_peers;
mod peer;

/// Benchmarks.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Transactions per second of each commit mode of the log on a file device.
    Tx(TxArgs),
    /// How fast opening a full log scans it (recovery).
    Recovery(RecoveryArgs),
    /// The file system's mount after a crash as the history grows and what is live stays the
    /// same (3 files of 16 MiB, 100,000 of 8 KiB; 0.1, 1 and 4 GiB of overwrites).
    CrashMount(CrashMountArgs),
    /// The file system: create+write+fsync per stream policy, and mount after a clean unmount
    /// (snapshot) against mount after a crash (scan).
    Fs(FsArgs),
    /// The file system against ext4 (append, create) and SQLite (atomic multi-file update) on
    /// same-size block devices in one run; mount of 100,000 files; cleaning's write
    /// amplification. `bench/fs.sh` sets up the devices and writes docs/bench/fs.md.
    FsPeers(fs_peers::FsPeersArgs),
    /// One timed window of a workload measured side by side with other systems (varmail,
    /// append stream, multi-file commit); `bench/run.sh` runs them all and writes the report.
    #[command(subcommand)]
    Peer(peer::PeerCommand),
}

/// Arguments of `tally bench fs`.
#[derive(Debug, clap::Args)]
pub struct FsArgs {
    /// File to run on (O_DIRECT; not tmpfs). A missing file is created and removed afterwards.
    #[arg(long)]
    path: PathBuf,
    /// Size of the image, e.g. 512M.
    #[arg(long, default_value = "512M", value_parser = parse_size)]
    size: u64,
    /// Threads, each in its own directory.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    threads: u32,
    /// Streams of the multi-stream file systems.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=63))]
    streams: u16,
    /// Files (create + write + fsync) per thread.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..))]
    files: u32,
    /// Runs per policy; the report gives the median and the min–max spread.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    runs: u32,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    json: bool,
    /// Keep the file the benchmark created.
    #[arg(long)]
    keep: bool,
    /// Run on an existing non-empty file or block device (overwrites it).
    #[arg(long)]
    force: bool,
}

/// Arguments of `tally bench tx`.
#[derive(Debug, clap::Args)]
pub struct TxArgs {
    /// File to run on (O_DIRECT; not tmpfs; a missing file is created and removed afterwards),
    /// or an NBD export (`nbd://host[:port]/export`, `nbd+unix:///export?socket=PATH`; needs
    /// --force: it is overwritten).
    #[arg(long)]
    path: PathBuf,
    /// NBD connections (an NBD --path only) [default: one per stream, if the server allows
    /// several]: 1 puts every stream's writes on one connection.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    connections: Option<u32>,
    /// Size of the file to create, e.g. 4G (K/M/G/T are powers of 1024).
    #[arg(long, default_value = "4G", value_parser = parse_size)]
    size: u64,
    /// Commit modes to compare, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "classic,count,ordered,orderless")]
    modes: Vec<CommitMode>,
    /// Committing threads; thread i commits on stream i % streams.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    threads: u16,
    /// Streams of the log (default: max(threads, 2), one per thread). Fewer streams than threads
    /// make threads share streams, where queued commits are merged into one write.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=63))]
    streams: Option<u16>,
    /// Data blocks (4 KiB) per transaction, besides one small record.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    blocks: u32,
    /// Seconds per timed run.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Runs per mode (interleaved); the report gives the median and the min–max spread.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    runs: u32,
    /// Blocks per log segment.
    #[arg(long, default_value_t = 256)]
    segment_blocks: u32,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    json: bool,
    /// Keep the file the benchmark created.
    #[arg(long)]
    keep: bool,
    /// Run on an existing non-empty file or block device (overwrites it).
    #[arg(long)]
    force: bool,
}

/// Arguments of `tally bench recovery`.
#[derive(Debug, clap::Args)]
pub struct RecoveryArgs {
    /// File to run on (O_DIRECT; not tmpfs). A missing file is created and removed afterwards.
    #[arg(long)]
    path: PathBuf,
    /// Size of the log to fill and scan, MiB.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..))]
    log_mib: u64,
    /// Streams in the log (recovery scans them in parallel).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
    streams: u16,
    /// Timed opens.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    runs: u32,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Keep the file the benchmark created.
    #[arg(long)]
    keep: bool,
    /// Run on an existing non-empty file or block device (overwrites it).
    #[arg(long)]
    force: bool,
}

/// Arguments of `tally bench crash-mount`.
#[derive(Debug, clap::Args)]
#[command(after_long_help = "\
For each live set a fresh file system is filled with it, then random overwrites of the live \
files are written until the history reaches each size; at each size the file system is \
dropped without unmounting (a crash) and mounted again --runs times, then unmounted cleanly and \
mounted from its snapshot --runs times as the reference. Reported per point: mount time after \
the crash (median [min-max]), blocks it read, transactions it replayed, whether it started from \
a checkpoint snapshot, and crash mount / clean mount. Issue 15's bounds: 0.3 s for a few live \
files, 1 s for 100,000, whatever the history.

Example: tally bench crash-mount --path /mnt/ext4/crash.img --history 100M,1G,4G")]
pub struct CrashMountArgs {
    /// File to run on (O_DIRECT; not tmpfs). A missing file is created and removed afterwards.
    #[arg(long)]
    path: PathBuf,
    /// Size of the image, e.g. 3G.
    #[arg(long, default_value = "3G", value_parser = parse_size)]
    size: u64,
    /// Live sets, in files, comma-separated (under 1,000: files of 16 MiB; else of 8 KiB).
    #[arg(long, value_delimiter = ',', default_values_t = [3u32, 100_000])]
    live: Vec<u32>,
    /// History sizes to crash at, comma-separated (e.g. 100M,1G,4G).
    #[arg(long, value_delimiter = ',', default_value = "100M,1G,4G", value_parser = parse_size)]
    history: Vec<u64>,
    /// Timed mounts of each kind at each point.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    runs: u32,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Keep the file the benchmark created.
    #[arg(long)]
    keep: bool,
    /// Run on an existing non-empty file (overwrites it).
    #[arg(long)]
    force: bool,
}

/// Run a benchmark.
pub fn run(cmd: &Command) -> ExitCode {
    let progress = |line: &str| eprintln!("tally bench: {line}");
    match cmd {
        Command::Tx(a) => {
            let options = TxOptions {
                path: a.path.clone(),
                size_bytes: a.size,
                modes: a.modes.clone(),
                threads: a.threads,
                streams: a.streams,
                blocks: a.blocks,
                seconds: a.seconds,
                runs: a.runs,
                segment_blocks: a.segment_blocks,
                keep: a.keep,
                force: a.force,
                nbd_connections: a.connections,
            };
            finish(tally_bench::tx::run(&options, &progress), a.json, tx_table)
        }
        Command::Recovery(a) => {
            let options = RecoveryOptions {
                path: a.path.clone(),
                log_mib: a.log_mib,
                streams: a.streams,
                runs: a.runs,
                keep: a.keep,
                force: a.force,
                ..RecoveryOptions::default()
            };
            finish(tally_bench::recovery::run(&options, &progress), a.json, recovery_table)
        }
        Command::CrashMount(a) => {
            let options = CrashMountOptions {
                path: a.path.clone(),
                image_mib: a.size >> 20,
                live_files: a.live.clone(),
                history_mib: a.history.iter().map(|b| b >> 20).collect(),
                runs: a.runs,
                keep: a.keep,
                force: a.force,
            };
            finish(tally_bench::crash_mount::run(&options, &progress), a.json, crash_mount_table)
        }
        Command::Fs(a) => {
            let options = FsOptions {
                path: a.path.clone(),
                size_mib: a.size >> 20,
                streams: a.streams,
                threads: a.threads,
                files: a.files,
                runs: a.runs,
                keep: a.keep,
                force: a.force,
                ..FsOptions::default()
            };
            finish(tally_bench::fs::run(&options, &progress), a.json, fs_table)
        }
        Command::Peer(p) => peer::run(p),
        Command::FsPeers(a) => fs_peers::run(a),
    }
}

fn fs_table(r: &FsReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} threads x {} files (create + {} B write + fsync), {} CPUs; median [min-max] of the runs",
        r.threads, r.files, r.write_bytes, r.cpu_count
    );
    let base = r.policies.first().map_or(1.0, |p| p.rounds_per_s.median);
    let _ = writeln!(
        out,
        "{:<14} {:>7} {:>26} {:>9} {:>20} {:>20}",
        "policy", "streams", "rounds/s", "vs first", "flushes/fsync", "CPU us/round"
    );
    for p in &r.policies {
        let s = |x: &tally_bench::Spread, d: usize| {
            format!("{:.d$} [{:.d$}-{:.d$}]", x.median, x.min, x.max)
        };
        let _ = writeln!(
            out,
            "{:<14} {:>7} {:>26} {:>8.2}x {:>20} {:>20}",
            p.policy,
            p.streams,
            s(&p.rounds_per_s, 0),
            p.rounds_per_s.median / base,
            s(&p.flushes_per_fsync, 2),
            s(&p.cpu_us_per_round, 0)
        );
    }
    let m = &r.mount;
    let _ = writeln!(
        out,
        "mount of {} inodes: snapshot {:.2} ms ({} blocks read), scan {:.2} ms ({} blocks read, {} transactions replayed): scan/snapshot {:.1}x",
        m.snapshot.inodes,
        m.snapshot.time.as_secs_f64() * 1e3,
        m.snapshot.blocks_read,
        m.scan.time.as_secs_f64() * 1e3,
        m.scan.blocks_read,
        m.scan.transactions_replayed,
        m.scan_over_snapshot
    );
    out
}

fn finish<R: serde::Serialize>(
    result: Result<R, BenchError>,
    json: bool,
    table: fn(&R) -> String,
) -> ExitCode {
    match result {
        Ok(report) if json => match serde_json::to_string_pretty(&report) {
            Ok(text) => {
                println!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("tally bench: error: cannot encode the report: {e}");
                ExitCode::from(EXIT_IO_FAILURE)
            }
        },
        Ok(report) => {
            print!("{}", table(&report));
            ExitCode::SUCCESS
        }
        Err(error) => fail("tally bench", &error, error.is_bad_input()),
    }
}

fn tx_table(r: &TxReport) -> String {
    let mut out = String::new();
    let c = &r.config;
    let _ = writeln!(
        out,
        "tally bench tx: {} thread(s) x {} block(s) + {} B record, {} streams, {} s x {} runs \
         (median [min–max])",
        c.threads, c.blocks, c.record_bytes, c.streams, c.seconds, c.runs
    );
    let _ = writeln!(
        out,
        "  {:<10} {:>26} {:>9} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>6}",
        "mode",
        "tx/s",
        "flush/tx",
        "sub/tx",
        "sysc/tx",
        "KiB/tx",
        "cpu µs/tx",
        "p50 µs",
        "p99 µs",
        "ckpts"
    );
    for m in &r.modes {
        let range =
            format!("{:.0} [{:.0}–{:.0}]", m.tx_per_sec.median, m.tx_per_sec.min, m.tx_per_sec.max);
        let _ = writeln!(
            out,
            "  {:<10} {:>26} {:>9.3} {:>8.3} {:>8.3} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>6.0}",
            m.mode.name(),
            range,
            m.flushes_per_tx.median,
            m.submissions_per_tx.median,
            m.submit_syscalls_per_tx.median,
            m.bytes_written_per_tx.median / 1024.0,
            m.cpu_us_per_tx.median,
            m.commit_p50_us.median,
            m.commit_p99_us.median,
            m.checkpoints.median,
        );
    }
    if !r.ratios.is_empty() {
        let _ = writeln!(out, "\n  ratios (same run)          of medians   per run [min–max]");
        for ratio in &r.ratios {
            let _ = writeln!(
                out,
                "  {:<26} {:>10.2}x   [{:.2}–{:.2}]",
                ratio.name, ratio.of_medians, ratio.per_run.min, ratio.per_run.max
            );
        }
    }
    let p = &r.probe;
    let _ = writeln!(
        out,
        "\n  probe (same directory): 4 KiB write p50 {:.1} µs, fdatasync p50 {:.1} µs (p99 {:.1}), \
         FUA write p50 {:.1} µs",
        p.write_4k_p50_us, p.fdatasync_p50_us, p.fdatasync_p99_us, p.fua_write_p50_us
    );
    let _ = writeln!(
        out,
        "  ceiling, one stream, flush per commit (1 / fdatasync p50): {:.0} tx/s",
        p.ceiling_tx_per_sec
    );
    let _ = writeln!(
        out,
        "  machine: {}; O_DIRECT {}, engine {}",
        r.machine,
        if c.direct { "yes" } else { "no" },
        c.engine
    );
    for note in &r.notes {
        let _ = writeln!(out, "  note: {note}");
    }
    out
}

fn crash_mount_table(r: &CrashMountReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "tally bench crash-mount: {} MiB image, replay budget {} MiB, {} CPUs, load {:.1} -> {:.1} \
         (seconds: median [min-max])",
        r.image_mib, r.replay_budget_mib, r.cpu_count, r.load.0, r.load.1
    );
    let _ = writeln!(
        out,
        "  {:>7} {:>8} {:>24} {:>10} {:>9} {:>5} {:>24} {:>7} {:>6} {:>4}",
        "live",
        "history",
        "crash mount s",
        "blocks",
        "replayed",
        "ckpt",
        "clean mount s",
        "ratio",
        "bound",
        "met"
    );
    let spread = |s: &tally_bench::Spread| format!("{:.3} [{:.3}-{:.3}]", s.median, s.min, s.max);
    for row in &r.rows {
        let _ = writeln!(
            out,
            "  {:>7} {:>6}Mi {:>24} {:>10} {:>9} {:>5} {:>24} {:>6.1}x {:>5.1}s {:>4}",
            row.live_files,
            row.history_mib,
            spread(&row.crash_mount_s),
            row.crash_blocks_read,
            row.crash_replayed,
            if row.from_checkpoint { "yes" } else { "no" },
            spread(&row.clean_mount_s),
            row.crash_over_clean,
            row.target_s,
            if row.met { "yes" } else { "no" }
        );
    }
    out
}

fn recovery_table(r: &RecoveryReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "tally bench recovery: {} MiB log, {} streams, {} transactions ({} MiB of log written), \
         {} opens (median [min–max])",
        r.log_mib,
        r.streams,
        r.tx_written,
        r.log_bytes >> 20,
        r.runs.len()
    );
    let row = |out: &mut String, name: &str, s: &tally_bench::Spread, digits: usize| {
        let _ = writeln!(
            out,
            "  {name:<28} {:>10.digits$} [{:.digits$}–{:.digits$}]",
            s.median, s.min, s.max
        );
    };
    row(&mut out, "scan time (s)", &r.scan_s, 2);
    row(&mut out, "whole open (s)", &r.open_s, 2);
    row(&mut out, "scan rate, log MB/s", &r.log_mb_per_s, 0);
    row(&mut out, "read rate, MB/s", &r.read_mb_per_s, 0);
    let _ = writeln!(out, "  bytes per read request       {:>10.0}", r.bytes_per_read);
    let _ = writeln!(out, "  CPUs: {} (one scan thread per stream)", r.cpu_count);
    out
}

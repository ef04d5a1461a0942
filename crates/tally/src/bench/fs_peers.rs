//! `tally bench fs-peers`: the arguments and the printed table; the measuring is
//! `tally_bench::fs_peers`.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use tally_bench::fs_peers::{PeersOptions, PeersReport, Section};
use tally_bench::{parse_size, BenchError, Spread};

/// Arguments of `tally bench fs-peers`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Set-up (bench/fs.sh does all of it and cleans up on every exit):
  truncate -s 2G a.img b.img     # same size, same directory
  losetup -f --show --direct-io=on a.img            # -> /dev/loopA for Tally
  losetup -f --show --direct-io=on b.img            # -> /dev/loopB for ext4
  mkfs.ext4 -q -E nodiscard,lazy_itable_init=0,lazy_journal_init=0 /dev/loopB
  mount -o data=ordered /dev/loopB /mnt/ext4
  tally bench fs-peers --tally-dev /dev/loopA --ext4-dir /mnt/ext4 --force

Exit codes: 0 done, 1 a device or file-system failure, 2 bad arguments or paths.")]
pub struct FsPeersArgs {
    /// Block device Tally runs on; everything on it is overwritten (needs --force). A regular
    /// file works too, but then flushes are counted on the disk under it, shared with all else.
    #[arg(long)]
    tally_dev: PathBuf,
    /// A directory on a mounted ext4 on another device of the same size; ext4 and SQLite run
    /// in a fresh subdirectory of it per run, removed afterwards.
    #[arg(long)]
    ext4_dir: PathBuf,
    /// Sections to run, comma-separated: append, create, atomic, mount, clean (issue 4's, the
    /// default), and create-shared, mixed, isolation (issue 16's).
    #[arg(long, value_delimiter = ',', default_value = "append,create,atomic,mount,clean")]
    sections: Vec<SectionArg>,
    /// Seconds per timed run of append, create, create-shared, atomic, mixed and isolation.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Runs per system and workload, alternating systems; the report gives medians and min–max.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    runs: u32,
    /// Thread counts of append and create, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    threads: Vec<u32>,
    /// Files per atomic transaction, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "2,4")]
    files: Vec<u32>,
    /// Files made for the mount section.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u32).range(1..))]
    mount_files: u32,
    /// Size of the cleaning section's file system (the start of the Tally device), e.g. 64M.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    clean_size: u64,
    /// Fills of the cleaning file system (used ÷ free after mkfs, as statfs counts), one
    /// measurement each, comma-separated; the last is the baseline the others are divided by.
    #[arg(long, value_delimiter = ',', default_value = "0.9,0.75,0.25")]
    clean_fills: Vec<f64>,
    /// Log streams of the cleaning file system.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=63))]
    clean_streams: u16,
    /// Size of the mixed section's file system (the start of the Tally device, filled to 90 %
    /// before each run), e.g. 128M.
    #[arg(long, default_value = "128M", value_parser = parse_size)]
    mixed_size: u64,
    /// A smoke run: 0.5 s per run, one run, 10,000 files to mount, 32 MiB to clean.
    #[arg(long)]
    quick: bool,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    json: bool,
    /// Overwrite the Tally device.
    #[arg(long)]
    force: bool,
}

/// A section on the command line.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum SectionArg {
    /// 4 KiB append + fsync against ext4.
    Append,
    /// create + write 4 KiB + fsync + close against ext4.
    Create,
    /// Atomic update of several files against SQLite.
    Atomic,
    /// Mount after a clean unmount and after a crash.
    Mount,
    /// Write amplification of cleaning.
    Clean,
    /// create + write 4 KiB + fsync + close against ext4, every thread in one directory.
    CreateShared,
    /// p99 of 4 appenders' 4 KiB append + fsync on a 90 %-full file system, alone and beside a
    /// thread making and cleaning garbage (random overwrites, maintain every 256).
    Mixed,
    /// p99 of 4 KiB append + fsync on a small file, alone and beside a thread streaming 1 MiB
    /// buffered writes to another file (fsync every 64 MiB); Tally (without and with the log's
    /// write-behind, the mount's default) and ext4.
    Isolation,
}

/// Run `tally bench fs-peers`.
pub fn run(a: &FsPeersArgs) -> ExitCode {
    let progress = |line: &str| eprintln!("tally bench: {line}");
    if !a.force {
        let error = BenchError::BadInput {
            reason: format!(
                "tally bench fs-peers overwrites {}; pass --force to let it",
                a.tally_dev.display()
            ),
        };
        return super::finish::<PeersReport>(Err(error), a.json, table);
    }
    let mut o = PeersOptions {
        tally_dev: a.tally_dev.clone(),
        ext4_dir: a.ext4_dir.clone(),
        sections: a
            .sections
            .iter()
            .map(|s| match s {
                SectionArg::Append => Section::Append,
                SectionArg::Create => Section::Create,
                SectionArg::Atomic => Section::Atomic,
                SectionArg::Mount => Section::Mount,
                SectionArg::Clean => Section::Clean,
                SectionArg::CreateShared => Section::CreateShared,
                SectionArg::Mixed => Section::Mixed,
                SectionArg::Isolation => Section::Isolation,
            })
            .collect(),
        seconds: a.seconds,
        runs: a.runs,
        threads: a.threads.clone(),
        atomic_files: a.files.clone(),
        mount_files: a.mount_files,
        clean_mib: a.clean_size >> 20,
        clean_fills: a.clean_fills.clone(),
        clean_streams: a.clean_streams,
        mixed_mib: a.mixed_size >> 20,
    };
    if a.quick {
        o.seconds = 0.5;
        o.runs = 1;
        o.mount_files = 10_000;
        o.clean_mib = 32;
    }
    super::finish(tally_bench::fs_peers::run(&o, &progress), a.json, table)
}

fn s(x: &Spread, d: usize) -> String {
    format!("{:.d$} [{:.d$}-{:.d$}]", x.median, x.min, x.max)
}

fn table(r: &PeersReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "tally bench fs-peers: {} s x {} runs per system (median [min-max]); Tally on {}, ext4 on \
         {}; SQLite {}; {} CPUs",
        r.seconds, r.runs, r.tally_device.0, r.ext4_device, r.sqlite_version, r.cpu_count
    );
    let _ = writeln!(
        out,
        "{:<13} {:>3} {:>6} {:>22} {:>22} {:>7} {:>7} {:>12} {:>12} {:>8} {:>8}",
        "workload",
        "n",
        "peer",
        "Tally ops/s",
        "peer ops/s",
        "ratio",
        "target",
        "flush/op T",
        "flush/op P",
        "cpu µs T",
        "cpu µs P"
    );
    for row in &r.rows {
        let _ = writeln!(
            out,
            "{:<13} {:>3} {:>6} {:>22} {:>22} {:>6.2}x {:>6.1}x {:>12.2} {:>12.2} {:>8.0} {:>8.0} {}",
            row.workload,
            row.width,
            row.peer,
            s(&row.tally.ops_per_s, 0),
            s(&row.other.ops_per_s, 0),
            row.ratio_of_medians,
            row.target,
            row.tally.flushes_per_op.median,
            row.other.flushes_per_op.median,
            row.tally.cpu_us_per_op.median,
            row.other.cpu_us_per_op.median,
            if row.met { "MET" } else { "MISSED" }
        );
    }
    if let Some(m) = &r.mount {
        let _ = writeln!(
            out,
            "mount of {} files ({} inodes): snapshot {} s ({} blocks read; bound {:.3} s: {}), \
             scan {} s ({} blocks, {} transactions replayed), scan/snapshot {:.1}x",
            m.files,
            m.inodes,
            s(&m.snapshot_s, 3),
            m.snapshot_blocks_read,
            m.snapshot_target_s,
            if m.met { "MET" } else { "MISSED" },
            s(&m.scan_s, 3),
            m.scan_blocks_read,
            m.transactions_replayed,
            m.scan_over_snapshot
        );
    }
    if let Some(c) = &r.clean {
        for f in &c.fills {
            let _ = writeln!(
                out,
                "cleaning, {} MiB, {} streams, at {:.0} % full (reached {:.0} %, live data {:.0} %), {} random \
                 4 KiB overwrites: write amplification {} ({:.2}x the last), {} segments \
                 freed/MiB, {} writes/s{}",
                c.size_mib,
                c.streams,
                f.fill * 100.0,
                f.fill_reached * 100.0,
                f.live_fraction * 100.0,
                f.writes,
                s(&f.write_amplification, 2),
                f.over_baseline,
                s(&f.segments_freed_per_mib, 2),
                s(&f.writes_per_s, 0),
                if f.enospc_runs > 0 {
                    format!(
                        " ({} runs hit ENOSPC, after {} warm-up writes)",
                        f.enospc_runs,
                        s(&f.warmup_writes_before_enospc, 0)
                    )
                } else {
                    String::new()
                }
            );
        }
    }
    if let Some(m) = &r.mixed {
        let _ = writeln!(
            out,
            "mixed, {} MiB at {:.0} % full, {} appenders (4 KiB append+fsync), {} s: alone p99 {} \
             µs (p50 {}, {} ops/s); beside the cleaner p99 {} µs (p50 {}, {} ops/s); p99 ratio {:.2}x \
             [{:.2}-{:.2}], target <= {:.0}x: {}",
            m.size_mib,
            m.fill_reached * 100.0,
            m.appenders,
            m.seconds,
            s(&m.alone.p99_us, 0),
            s(&m.alone.p50_us, 0),
            s(&m.alone.ops_per_s, 0),
            s(&m.with_cleaner.p99_us, 0),
            s(&m.with_cleaner.p50_us, 0),
            s(&m.with_cleaner.ops_per_s, 0),
            m.p99_ratio_of_medians,
            m.p99_ratio_per_run.min,
            m.p99_ratio_per_run.max,
            m.target,
            if m.met { "MET" } else { "MISSED" }
        );
        for (k, c) in m.cleaner.iter().enumerate() {
            let _ = writeln!(
                out,
                "  cleaner run {}: {} overwrites, {} maintain calls, {} segments freed, longest \
                 maintain {:.1} ms",
                k + 1,
                c.overwrites,
                c.maintains,
                c.segments_freed,
                c.longest_maintain_ms
            );
        }
    }
    if let Some(i) = &r.isolation {
        let sides = [
            ("Tally", &i.tally),
            ("Tally, write-behind", &i.tally_write_behind),
            ("ext4", &i.ext4),
        ];
        for (name, side) in sides {
            let mib = tally_bench::Spread::of(side.streamer.iter().map(|x| x.mib_per_s));
            let _ = writeln!(
                out,
                "isolation, {name}: 4 KiB append+fsync p99 alone {} µs (p50 {}), beside the \
                 streamer {} µs (p50 {}): ratio {:.2}x [{:.2}-{:.2}]; streamer {} MiB/s",
                s(&side.alone.p99_us, 0),
                s(&side.alone.p50_us, 0),
                s(&side.streaming.p99_us, 0),
                s(&side.streaming.p50_us, 0),
                side.p99_ratio_of_medians,
                side.p99_ratio_per_run.min,
                side.p99_ratio_per_run.max,
                s(&mib, 0)
            );
        }
        let _ = writeln!(
            out,
            "isolation: Tally's ratio / ext4's {:.2} [{:.2}-{:.2}], target <= {:.1}: {}; with \
             write-behind {:.2} [{:.2}-{:.2}]",
            i.relative,
            i.relative_per_run.min,
            i.relative_per_run.max,
            i.target,
            if i.met { "MET" } else { "MISSED" },
            i.relative_write_behind,
            i.relative_write_behind_per_run.min,
            i.relative_write_behind_per_run.max
        );
    }
    out
}

//! `tally crash fs`: explore the crash states of the file system and check its invariants.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use tally_crash::fsexplore::{
    concurrent, mutants_available, threaded, workload_set, ConcurrentWorkload, FsExploreConfig,
    FsExplorer, FsMutant, FsReport, Medium,
};
use tally_media::pmem::BlockMutant;

/// Options of `tally crash fs`.
#[derive(Debug, clap::Args)]
pub struct FsArgs {
    /// Bounded sequence length: 1 (every seq-1 workload) or 2 (seq-2: every one, or --count
    /// drawn by --seed).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
    seq: u8,
    /// With --seq 2: draw this many workloads by --seed instead of running all (about 69,000).
    /// With --generations: how many multi-generation workloads (default 20).
    #[arg(long, value_name = "N")]
    count: Option<usize>,
    /// Multi-generation workloads of N generations (4 when N is left out) instead of a set:
    /// each runs --ops-per-generation steps drawn by --seed from the tree as it is, then a power
    /// loss (an image chosen by seed, torn ones included) or a process crash (the mount runs on
    /// the same device, its volatile cache kept), one time in three a power loss inside that
    /// mount; every crash point inside every mount is checked. --count workloads, or --index one
    /// of them.
    #[arg(
        long,
        num_args = 0..=1,
        default_missing_value = "4",
        value_name = "N",
        conflicts_with_all = ["set", "seq"],
        value_parser = clap::value_parser!(u32).range(1..=64),
    )]
    generations: Option<u32>,
    /// Steps per generation (with --generations; at most 12).
    #[arg(
        long,
        default_value_t = 3,
        requires = "generations",
        value_parser = clap::value_parser!(u8).range(1..=12)
    )]
    ops_per_generation: u8,
    /// A named workload set instead of --seq: seq-1, seq-2, seq-2:N, longer, large, names, or
    /// the two-thread sets: concurrent (24 interleavings drawn by --seed, one step at a time)
    /// and threaded (48 runs of two OS threads at once) (as a reported violation names it,
    /// with --index).
    #[arg(long, conflicts_with_all = ["seq", "count"])]
    set: Option<String>,
    /// Run only the workload at this index of the set (replays a reported violation).
    #[arg(long)]
    index: Option<usize>,
    /// Streams of the file system (1: every crash must recover a prefix).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=8))]
    streams: u16,
    /// What the file system runs on: `block` (a disk with a volatile cache, blocks torn at
    /// 512-byte sectors) or `pmem` (persistent memory on the cache-line simulator: blocks copied
    /// non-temporally or through flushed lines, torn at any 8-byte word; crash points before
    /// every line flush and fence).
    #[arg(long, default_value = "block", value_parser = parse_medium)]
    medium: Medium,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Run with a deliberately broken protocol (needs a build with the `mutants` feature): a
    /// file-system mutant, a log mutant (e.g. crc-not-checked), or with --medium pmem a
    /// persistent-memory block mutant (pmem-fence-missing, pmem-copy-skips-tail-flush).
    #[arg(long, value_parser = parse_mutant)]
    mutant: Option<AnyMutant>,
    /// List the mutants and exit.
    #[arg(long)]
    list_mutants: bool,
    /// Untorn crash images drawn at a point too large to enumerate.
    #[arg(long, default_value_t = 32)]
    samples: usize,
    /// Torn crash images per point (0: none).
    #[arg(long, default_value_t = 8)]
    torn_samples: usize,
    /// Crash only between operations, not between the device operations inside them.
    #[arg(long)]
    no_inside_ops: bool,
    /// Stop at the first violation.
    #[arg(long)]
    stop_at_first: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// A mutant of any layer the file-system explorer runs.
#[derive(Debug, Clone, Copy)]
pub enum AnyMutant {
    /// A broken file system.
    Fs(FsMutant),
    /// A broken log underneath.
    Log(tally_log::Mutant),
    /// A broken persistent-memory block protocol.
    Pmem(BlockMutant),
}

fn mutant_names() -> Vec<&'static str> {
    let fs = FsMutant::ALL.iter().map(|m| m.name());
    let log = tally_log::Mutant::ALL.iter().map(|m| m.name());
    fs.chain(log).chain(BlockMutant::ALL.iter().map(|m| m.name())).collect()
}

fn parse_mutant(s: &str) -> Result<AnyMutant, String> {
    FsMutant::from_name(s)
        .map(AnyMutant::Fs)
        .or_else(|| tally_log::Mutant::from_name(s).map(AnyMutant::Log))
        .or_else(|| BlockMutant::from_name(s).map(AnyMutant::Pmem))
        .ok_or_else(|| format!("unknown mutant {s:?}; mutants: {}", mutant_names().join(", ")))
}

fn parse_medium(s: &str) -> Result<Medium, String> {
    Medium::from_name(s).ok_or_else(|| format!("unknown medium {s:?}: block or pmem"))
}

/// Run the exploration.
pub fn run(args: &FsArgs) -> ExitCode {
    if args.list_mutants {
        for m in mutant_names() {
            let note = if m.starts_with("pmem-") { "  (with --medium pmem)" } else { "" };
            println!("{m}{note}");
        }
        if !mutants_available() {
            eprintln!(
                "note: this build has no mutants; build with `--features mutants` to run them"
            );
        }
        return ExitCode::SUCCESS;
    }
    if args.mutant.is_some() && !mutants_available() {
        eprintln!("tally crash: this build has no mutants; rebuild with `cargo build --release -p tally --features mutants`");
        return ExitCode::from(crate::EXIT_BAD_INPUT);
    }
    if matches!(args.mutant, Some(AnyMutant::Pmem(_))) && args.medium != Medium::Pmem {
        eprintln!("tally crash: a pmem- mutant needs --medium pmem");
        return ExitCode::from(crate::EXIT_BAD_INPUT);
    }
    let cfg = FsExploreConfig {
        medium: args.medium,
        log_mutant: match args.mutant {
            Some(AnyMutant::Log(m)) => Some(m),
            _ => None,
        },
        pmem_mutant: match args.mutant {
            Some(AnyMutant::Pmem(m)) => Some(m),
            _ => None,
        },
        streams: args.streams,
        samples: args.samples,
        torn_samples: args.torn_samples,
        crash_inside_ops: !args.no_inside_ops,
        mutant: match args.mutant {
            Some(AnyMutant::Fs(m)) => Some(m),
            _ => None,
        },
        seed: args.seed,
        stop_at_first: args.stop_at_first,
        generations: args.generations.unwrap_or(4),
        ops_per_generation: usize::from(args.ops_per_generation),
        ..FsExploreConfig::default()
    };
    if args.generations.is_some() {
        return run_generations(cfg, args);
    }
    let bs = u64::from(cfg.block_size);
    let set = match (&args.set, args.seq, args.count) {
        (Some(s), ..) => s.clone(),
        (None, 1, _) => "seq-1".to_string(),
        (None, _, Some(n)) => format!("seq-2:{n}"),
        (None, _, None) => "seq-2".to_string(),
    };
    let mut explorer = FsExplorer::new(cfg);
    let start = match explorer.start() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("tally crash: cannot build the start image: {e}");
            return ExitCode::from(1);
        }
    };
    if set == "concurrent" || set == "threaded" {
        let workloads = if set == "concurrent" {
            concurrent(CONCURRENT_COUNT, args.streams, args.seed)
        } else {
            threaded(THREADED_COUNT, args.seed)
        };
        return run_concurrent_set(explorer, &set, &workloads, args);
    }
    let workloads = match workload_set(&set, &start.state, args.streams, bs, args.seed) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("tally crash: {e}");
            return ExitCode::from(crate::EXIT_BAD_INPUT);
        }
    };
    run_jobs(&mut explorer, &set, &workloads, args, |ex, i, w| ex.run(&set, i, w))
}

/// Run every workload of `set` with `run`, or the one at `--index`, with a progress line on a
/// terminal; print the report; exit 0 when nothing was violated, 1 when something was.
fn run_jobs<W: std::fmt::Display>(
    explorer: &mut FsExplorer,
    set: &str,
    workloads: &[W],
    args: &FsArgs,
    mut run: impl FnMut(&mut FsExplorer, usize, &W),
) -> ExitCode {
    let jobs: Vec<usize> = match args.index {
        Some(i) if i < workloads.len() => vec![i],
        Some(i) => {
            eprintln!("tally crash: set {set} has {} workloads, no index {i}", workloads.len());
            return ExitCode::from(crate::EXIT_BAD_INPUT);
        }
        None => (0..workloads.len()).collect(),
    };
    let progress = std::io::stderr().is_terminal();
    let mut shown = Instant::now();
    for (k, &i) in jobs.iter().enumerate() {
        run(explorer, i, &workloads[i]);
        if progress && shown.elapsed() > Duration::from_millis(250) {
            let r = explorer.report();
            eprint!(
                "\r{}/{} workloads, {} states, {} violations ",
                k + 1,
                jobs.len(),
                r.states_checked,
                r.violations
            );
            shown = Instant::now();
        }
        if explorer.done() {
            break;
        }
    }
    if progress {
        eprint!("\r\x1b[K");
    }
    let report = explorer.report();
    if args.index.is_some() && !args.json {
        println!("workload               {}", workloads[jobs[0]]);
    }
    print_report(&report, args.json);
    if report.violations == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// Workloads of the `concurrent` set: as many as `tally-crash`'s `fs_explore_concurrent` test
/// draws, so its reported violations replay here.
const CONCURRENT_COUNT: usize = 24;
/// Runs of the `threaded` set (the same test's).
const THREADED_COUNT: usize = 48;

/// `--set concurrent` or `--set threaded`: every workload of the set, or the one at `--index`.
/// A `threaded` run's interleaving is the OS's: a replay runs the same steps, not always the
/// same interleaving.
fn run_concurrent_set(
    mut explorer: FsExplorer,
    set: &str,
    workloads: &[ConcurrentWorkload],
    args: &FsArgs,
) -> ExitCode {
    run_jobs(&mut explorer, set, workloads, args, |ex, i, w| {
        if set == "threaded" {
            ex.run_threads(set, i, w);
        } else {
            ex.run_concurrent(set, i, w);
        }
    })
}

/// `--generations`: `--count` multi-generation workloads, or the one at `--index`.
fn run_generations(cfg: FsExploreConfig, args: &FsArgs) -> ExitCode {
    let jobs: Vec<usize> = match args.index {
        Some(i) => vec![i],
        None => (0..args.count.unwrap_or(20)).collect(),
    };
    let mut explorer = FsExplorer::new(cfg);
    let progress = std::io::stderr().is_terminal();
    let mut shown = Instant::now();
    for (k, &i) in jobs.iter().enumerate() {
        explorer.run_generations(i);
        if progress && shown.elapsed() > Duration::from_millis(250) {
            let r = explorer.report();
            eprint!(
                "\r{}/{} workloads, {} generations, {} states, {} violations ",
                k + 1,
                jobs.len(),
                r.generations,
                r.states_checked,
                r.violations
            );
            shown = Instant::now();
        }
        if explorer.done() {
            break;
        }
    }
    if progress {
        eprint!("\r\x1b[K");
    }
    let report = explorer.report();
    print_report(&report, args.json);
    if report.violations == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn print_report(r: &FsReport, json: bool) {
    if json {
        match serde_json::to_string_pretty(r) {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("tally crash: cannot print the report: {e}"),
        }
        return;
    }
    println!("medium                 {}", r.medium.name());
    println!("workloads              {}", r.workloads);
    println!(
        "crash points           {} ({} inside ops)",
        r.crash_points, r.crash_points_inside_ops
    );
    println!("states checked         {} ({} distinct images)", r.states_checked, r.unique_states);
    println!("recovery crash states  {}", r.recovery_crash_states);
    if r.generations > 0 {
        println!(
            "generations            {} ({} after a process crash, {} power losses inside a mount)",
            r.generations, r.process_crashes, r.crashes_in_recovery
        );
        println!("points inside mounts   {}", r.recovery_points);
    }
    println!(
        "every untorn pass exhaustive {} ({} passes sampled)",
        r.all_exhaustive, r.sampled_passes
    );
    println!("states per second      {:.0}", r.states_per_sec);
    if let Some(m) = r.mutant.as_ref().or(r.pmem_mutant.as_ref()) {
        println!("mutant                 {m}");
    }
    println!("violations             {}", r.violations);
    for (inv, n) in &r.violations_by_invariant {
        println!("  {inv:<28} {n}");
    }
    if let Some(v) = &r.first_violation {
        println!(
            "first violation: {} at {} of workload {} ({} #{}): {}",
            v.invariant.name(),
            v.at,
            v.workload,
            v.set,
            v.index,
            v.message
        );
        println!("replay: {}", v.replay);
    }
}

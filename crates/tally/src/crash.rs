//! `tally crash log`: explore the crash states of the log and check its invariants
//! (`tally crash fs`: `crash_fs.rs`).

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use tally_crash::explore::{ExploreConfig, Explorer, Op, Report, Start, Workload, WriteOuts};
use tally_crash::fsexplore::Medium;
use tally_log::Mutant;
use tally_media::pmem::BlockMutant;

/// Layers whose crash states can be explored.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// The multi-stream log: commits of several shapes on two streams, dependencies, classic
    /// commits, sync, checkpoints and crash-and-recover steps. At every persistence point every
    /// image a power failure could leave is recovered and checked: atomicity (I1), no phantom
    /// (I2), per-stream prefix and dependency closure (I3), durability of acknowledged commits
    /// (I4), recovery succeeds (I5), recovery is idempotent also after a crash inside it (I6),
    /// and new commits after recovery work (I7).
    ///
    /// Ops, one letter each: a = ordered commit on stream 0, A = durable commit on stream 0,
    /// m = commit with 3 units and 2 data blocks, d = commit on stream 1 depending on stream 0's
    /// last, l = classic commit on stream 1, s = sync, k = checkpoint stream 0, c = crash.
    /// Multi-generation workloads (--generations) also use e = commit on stream 0 depending on
    /// stream 1's last, p = process crash (recovery on the same device, its cache kept), r = a
    /// power loss inside the recovery that just ran.
    Log(LogArgs),
    /// The file system: B3/ACE-style seq-1 and seq-2 workloads (create, mkdir, write,
    /// truncate, link, unlink, rename, rmdir, chmod, xattrs, explicit transactions, cleaning,
    /// each followed by fsync, fdatasync, a directory's fsync, barrier, sync or nothing) from a
    /// small durable tree. At every persistence point every image a power failure could leave is
    /// mounted and checked against a model: atomicity (I1), causal order (I2), durability (I3),
    /// mount and fsck (I4), forward progress (I5), idempotent recovery (I6).
    Fs(crate::crash_fs::FsArgs),
}

/// Options of `tally crash log`.
#[derive(Debug, clap::Args)]
#[allow(clippy::struct_excessive_bools)]
pub struct LogArgs {
    /// Every workload of up to N ops, plus those of N+1 ops that contain a crash.
    #[arg(long, value_name = "N", conflicts_with_all = ["random", "workload"])]
    bounded: Option<usize>,
    /// N seeded random workloads (see --ops), each run from every start image.
    #[arg(long, value_name = "N", conflicts_with = "workload")]
    random: Option<usize>,
    /// Ops per random workload.
    #[arg(long, default_value_t = 30)]
    ops: usize,
    /// Multi-generation workloads of N generations (4 when N is left out): each runs
    /// --ops-per-generation ops on the recovered state, then a power loss (an image chosen by
    /// --seed, torn ones included) or a process crash (recovery on the same device, its volatile
    /// cache kept), sometimes a power loss inside that recovery; every recovery's own crash
    /// points are checked too. --random workloads (default 20), each from every start; with
    /// --workload, replays one.
    #[arg(
        long,
        num_args = 0..=1,
        default_missing_value = "4",
        value_name = "N",
        conflicts_with = "bounded",
        value_parser = clap::value_parser!(u32).range(1..=64),
    )]
    generations: Option<u32>,
    /// Ops per generation (with --generations).
    #[arg(long, default_value_t = 5, requires = "generations")]
    ops_per_generation: usize,
    /// One workload, e.g. `amcA` (replays a reported violation with its --seed and --start).
    #[arg(long)]
    workload: Option<String>,
    /// Start image for --bounded and --workload: empty, nearly-full or wrapped.
    #[arg(long, default_value = "empty", value_parser = parse_start)]
    start: Start,
    /// What the log runs on: `block` (a disk with a volatile cache) or `pmem` (the block view of
    /// persistent memory on the cache-line simulator: blocks torn at any 8-byte word, crash
    /// points before every line flush and fence; --samples draws per point, --tearing unused).
    #[arg(long, default_value = "block", value_parser = parse_medium)]
    medium: Medium,
    /// When the log writes committed transactions to the device: `each-op` (write-behind, the
    /// buffers written out at the end of every op, inside it), `across-ops` (write-behind,
    /// written out only at durability requests and past small thresholds, so one write-out
    /// carries several ops' commits) or `through` (no write-behind).
    #[arg(long, default_value = "each-op", value_parser = parse_write_outs)]
    write_outs: WriteOuts,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Run with a deliberately broken protocol (needs a build with the `mutants` feature): a
    /// log mutant, or with --medium pmem a persistent-memory block mutant.
    #[arg(long, value_parser = parse_mutant)]
    mutant: Option<LogMutant>,
    /// List the mutants and exit.
    #[arg(long)]
    list_mutants: bool,
    /// Crash images sampled at a point too large to enumerate.
    #[arg(long, default_value_t = 64)]
    samples: usize,
    /// Enumerate a point exhaustively only if it has at most this many distinct images
    /// (default: 65536 for --bounded and --workload, 1024 for --random, whose long workloads
    /// pile up many uncertain writes).
    #[arg(long, value_name = "N")]
    exhaustive_images_max: Option<u64>,
    /// Let power failures tear blocks at 512-byte sectors.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    tearing: bool,
    /// Stop at the first violation.
    #[arg(long)]
    stop_at_first: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

fn parse_start(s: &str) -> Result<Start, String> {
    match s {
        "empty" => Ok(Start::Empty),
        "nearly-full" => Ok(Start::NearlyFull),
        "wrapped" => Ok(Start::Wrapped),
        _ => Err(format!("unknown start {s:?}: empty, nearly-full or wrapped")),
    }
}

/// A mutant `tally crash log` can run.
#[derive(Debug, Clone, Copy)]
pub enum LogMutant {
    /// A broken log.
    Log(Mutant),
    /// A broken persistent-memory block protocol.
    Pmem(BlockMutant),
}

fn parse_mutant(s: &str) -> Result<LogMutant, String> {
    let names: Vec<&str> = Mutant::ALL
        .iter()
        .map(|m| m.name())
        .chain(BlockMutant::ALL.iter().map(|m| m.name()))
        .collect();
    Mutant::from_name(s)
        .map(LogMutant::Log)
        .or_else(|| BlockMutant::from_name(s).map(LogMutant::Pmem))
        .ok_or_else(|| format!("unknown mutant {s:?}; mutants: {}", names.join(", ")))
}

fn parse_write_outs(s: &str) -> Result<WriteOuts, String> {
    WriteOuts::from_name(s)
        .ok_or_else(|| format!("unknown write-outs {s:?}: each-op, across-ops or through"))
}

fn parse_medium(s: &str) -> Result<Medium, String> {
    Medium::from_name(s).ok_or_else(|| format!("unknown medium {s:?}: block or pmem"))
}

/// Run the exploration.
pub fn run(cmd: &Command) -> ExitCode {
    let args = match cmd {
        Command::Log(args) => args,
        Command::Fs(args) => return crate::crash_fs::run(args),
    };
    if args.list_mutants {
        for m in Mutant::ALL {
            let note = if m.needs_concurrency() {
                "  (a race: run the concurrency test, not the explorer)"
            } else if m.needs_write_behind() {
                "  (with --write-outs across-ops)"
            } else if m.needs_clean_close() {
                "  (needs a clean close: caught by the snapshot and file-system crash tests)"
            } else if m.needs_generations() {
                "  (with --generations)"
            } else if m.needs_damage() {
                "  (damage to durable data, not a crash: caught by tally-log's durable_damage test)"
            } else if m.needs_large_transactions() {
                "  (with large-transaction workloads, letter L: tally-crash's log_explore test runs them)"
            } else if m.needs_relocation_elsewhere() {
                "  (with a workload that cleans onto another stream, letter G, e.g. --workload aMG)"
            } else {
                ""
            };
            println!("{}{note}", m.name());
        }
        for m in BlockMutant::ALL {
            println!("{}  (with --medium pmem)", m.name());
        }
        if !tally_log::mutants_available() {
            eprintln!(
                "note: this build has no mutants; build with `--features mutants` to run them"
            );
        }
        return ExitCode::SUCCESS;
    }
    if args.mutant.is_some() && !tally_log::mutants_available() {
        eprintln!("tally crash: this build has no mutants; rebuild with `cargo build --release -p tally --features mutants`");
        return ExitCode::from(crate::EXIT_BAD_INPUT);
    }
    if matches!(args.mutant, Some(LogMutant::Pmem(_))) && args.medium != Medium::Pmem {
        eprintln!("tally crash: a pmem- mutant needs --medium pmem");
        return ExitCode::from(crate::EXIT_BAD_INPUT);
    }
    let mut cfg = ExploreConfig {
        medium: args.medium,
        mutant: match args.mutant {
            Some(LogMutant::Log(m)) => Some(m),
            Some(LogMutant::Pmem(_)) | None => None,
        },
        pmem_mutant: match args.mutant {
            Some(LogMutant::Pmem(m)) => Some(m),
            _ => None,
        },
        write_outs: args.write_outs,
        seed: args.seed,
        stop_at_first: args.stop_at_first,
        recovery_points: args.generations.is_some(),
        ..ExploreConfig::default()
    };
    cfg.crash.samples = args.samples;
    cfg.crash.tearing = args.tearing;
    let long = args.random.is_some() || args.generations.is_some();
    let default_max = if long { 1024 } else { cfg.crash.exhaustive_images_max };
    cfg.crash.exhaustive_images_max = args.exhaustive_images_max.unwrap_or(default_max);
    let mut jobs: Vec<(Workload, Start, bool)> = Vec::new();
    if let Some(w) = &args.workload {
        match Workload::parse(w) {
            // A multi-generation workload replays its one branch; others try several images
            // at each crash (the first is the one a random run takes).
            Ok(w) => jobs.push((w, args.start, args.generations.is_none())),
            Err(e) => {
                eprintln!("tally crash: {e}");
                return ExitCode::from(crate::EXIT_BAD_INPUT);
            }
        }
    } else if let Some(generations) = args.generations {
        let mut rng = fastrand::Rng::with_seed(args.seed);
        for _ in 0..args.random.unwrap_or(20) {
            let w = Workload::generations(&mut rng, generations as usize, args.ops_per_generation);
            for start in Start::ALL {
                jobs.push((w.clone(), start, false));
            }
        }
    } else if let Some(n) = args.random {
        let mut rng = fastrand::Rng::with_seed(args.seed);
        for _ in 0..n {
            let w = Workload::random(&mut rng, args.ops);
            for start in Start::ALL {
                jobs.push((w.clone(), start, false));
            }
        }
    } else {
        let len = args.bounded.unwrap_or(3);
        jobs.extend(Workload::bounded(len, &Op::ALL).into_iter().map(|w| (w, args.start, true)));
    }
    let mut explorer = Explorer::new(cfg);
    let progress = std::io::stderr().is_terminal();
    let mut shown = Instant::now();
    for (i, (w, start, branch_all)) in jobs.iter().enumerate() {
        explorer.run(w, *start, *branch_all);
        if progress && shown.elapsed() > Duration::from_millis(250) {
            let r = explorer.report();
            eprint!(
                "\r{}/{} workloads, {} states, {} violations ",
                i + 1,
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
    print_report(&report, args.json);
    if report.violations == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn print_report(r: &Report, json: bool) {
    if json {
        match serde_json::to_string_pretty(r) {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("tally crash: cannot print the report: {e}"),
        }
        return;
    }
    println!("medium                 {}", r.medium.name());
    println!("write-outs             {}", r.write_outs.name());
    println!("workloads              {}", r.workloads);
    println!("crash points           {}", r.crash_points);
    println!("states checked         {} ({} distinct images)", r.states_checked, r.unique_states);
    println!("recovery crash states  {}", r.recovery_crash_states);
    if r.generations > 0 {
        println!(
            "generations            {} ({} after a process crash, {} power losses inside recovery)",
            r.generations, r.process_crashes, r.crashes_in_recovery
        );
        println!("points inside recovery {}", r.recovery_points);
    }
    println!(
        "every point exhaustive {} ({} of {} passes sampled)",
        r.all_exhaustive,
        r.sampled_passes,
        // Block points have an untorn and a torn pass; pmem points one of cache-line images.
        if r.medium == Medium::Pmem { r.crash_points } else { 2 * r.crash_points }
    );
    println!("states per second      {:.0}", r.states_per_sec);
    if let Some(m) = &r.mutant {
        println!("mutant                 {m}");
    }
    println!("violations             {}", r.violations);
    for (inv, n) in &r.violations_by_invariant {
        println!("  {inv:<28} {n}");
    }
    if let Some(v) = &r.first_violation {
        println!(
            "first violation: {} after op {} of workload {} ({:?} start): {}",
            v.invariant.name(),
            v.op_index,
            v.workload,
            v.start,
            v.message
        );
        println!("replay: {}", v.replay);
    }
}

//! `tally crash fs`: explore the crash states of the file system and check its invariants.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use tally_crash::fsexplore::{
    mutants_available, workload_set, FsExploreConfig, FsExplorer, FsMutant, FsReport,
};

/// Options of `tally crash fs`.
#[derive(Debug, clap::Args)]
pub struct FsArgs {
    /// Bounded sequence length: 1 (every seq-1 workload) or 2 (seq-2: every one, or --count
    /// drawn by --seed).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
    seq: u8,
    /// With --seq 2: draw this many workloads by --seed instead of running all (about 69,000).
    #[arg(long, value_name = "N")]
    count: Option<usize>,
    /// A named workload set instead of --seq: seq-1, seq-2, seq-2:N, longer (as a reported
    /// violation names it, with --index).
    #[arg(long, conflicts_with_all = ["seq", "count"])]
    set: Option<String>,
    /// Run only the workload at this index of the set (replays a reported violation).
    #[arg(long)]
    index: Option<usize>,
    /// Streams of the file system (1: every crash must recover a prefix).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=8))]
    streams: u16,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Run with a deliberately broken file system (needs a build with the `mutants` feature).
    #[arg(long, value_parser = parse_mutant)]
    mutant: Option<FsMutant>,
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

fn parse_mutant(s: &str) -> Result<FsMutant, String> {
    let names: Vec<&str> = FsMutant::ALL.iter().map(|m| m.name()).collect();
    FsMutant::from_name(s)
        .ok_or_else(|| format!("unknown mutant {s:?}; mutants: {}", names.join(", ")))
}

/// Run the exploration.
pub fn run(args: &FsArgs) -> ExitCode {
    if args.list_mutants {
        for m in FsMutant::ALL {
            println!("{}", m.name());
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
    let cfg = FsExploreConfig {
        streams: args.streams,
        samples: args.samples,
        torn_samples: args.torn_samples,
        crash_inside_ops: !args.no_inside_ops,
        mutant: args.mutant,
        seed: args.seed,
        stop_at_first: args.stop_at_first,
        ..FsExploreConfig::default()
    };
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
    let workloads = match workload_set(&set, &start.state, args.streams, bs, args.seed) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("tally crash: {e}");
            return ExitCode::from(crate::EXIT_BAD_INPUT);
        }
    };
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
        explorer.run(&set, i, &workloads[i]);
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

fn print_report(r: &FsReport, json: bool) {
    if json {
        match serde_json::to_string_pretty(r) {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("tally crash: cannot print the report: {e}"),
        }
        return;
    }
    println!("workloads              {}", r.workloads);
    println!(
        "crash points           {} ({} inside ops)",
        r.crash_points, r.crash_points_inside_ops
    );
    println!("states checked         {} ({} distinct images)", r.states_checked, r.unique_states);
    println!("recovery crash states  {}", r.recovery_crash_states);
    println!(
        "every untorn pass exhaustive {} ({} passes sampled)",
        r.all_exhaustive, r.sampled_passes
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

//! The log explorer's multi-generation workloads (`docs/CRASH-TESTING.md`, "Multi-generation
//! workloads"): a few ops, a power loss or a process crash, recovery (itself crashed into), more
//! ops on what it recovered, and again; the model carries what was acknowledged and what was
//! discarded from one generation to the next. Each test prints its counts (`--nocapture`).

use tally_crash::explore::{ExploreConfig, Explorer, Report, Start, Workload};

/// Generations per workload, and ops per generation.
const GENERATIONS: usize = 4;
const OPS_PER_GENERATION: usize = 4;

/// Multi-generation checks on, and few images per point: the runs are long.
fn config(seed: u64) -> ExploreConfig {
    let mut cfg = ExploreConfig { seed, recovery_points: true, ..ExploreConfig::default() };
    cfg.crash.samples = 8;
    cfg.crash.exhaustive_images_max = 64;
    cfg
}

/// `count` seeded multi-generation workloads, each from every start of `starts`.
fn generations(count: usize, starts: &[Start], cfg: ExploreConfig) -> Report {
    let mut rng = fastrand::Rng::with_seed(cfg.seed);
    let mut ex = Explorer::new(cfg);
    for _ in 0..count {
        let w = Workload::generations(&mut rng, GENERATIONS, OPS_PER_GENERATION);
        for &start in starts {
            ex.run(&w, start, false);
        }
        if ex.done() {
            break;
        }
    }
    ex.report()
}

fn summary(r: &Report) -> String {
    format!(
        "workloads {} generations {} (process crashes {}, crashes in recovery {}) points {} \
         (in recoveries {}) states {} unique {} recovery-crash {} violations {} ({:.1} s)",
        r.workloads,
        r.generations,
        r.process_crashes,
        r.crashes_in_recovery,
        r.crash_points,
        r.recovery_points,
        r.states_checked,
        r.unique_states,
        r.recovery_crash_states,
        r.violations,
        r.elapsed_sec
    )
}

/// Seed 2: on the code before issue 12's recovery rewrite (3e934a9) these workloads find
/// resurrected transactions (I2) and recoveries that change on a second run (I6).
#[test]
fn multi_generation_workloads_find_no_violation() {
    let count = 6;
    let starts = [Start::Empty, Start::Wrapped];
    let r = generations(count, &starts, config(2));
    println!("{count} x {GENERATIONS} generations x {} starts: {}", starts.len(), summary(&r));
    assert_eq!(r.violations, 0, "{:#?}", r.first_violation);
    assert_eq!(r.generations, (count * starts.len() * GENERATIONS) as u64, "a branch stopped");
    assert!(r.process_crashes > 0 && r.crashes_in_recovery > 0 && r.recovery_points > 0);
}

/// Issue 12's two findings as explorer workloads, every image of every crash branched on:
/// `a d e` leaves `e` (stream 0, depending on `d` on stream 1) for a recovery to cut when a power
/// loss keeps it and loses `d`; then
/// - `M s`: a commit that starts the next segment, synced: recovering the recovered image again
///   must keep it (finding 1; I6 on the code before the fix);
/// - `d a p`: a commit on each stream, a process crash, and every image of a power loss inside
///   the recovery that follows: `e` must never come back (finding 2; I2 before the fix).
#[test]
fn the_issue_shapes_find_no_violation() {
    let cfg =
        ExploreConfig { recovery_points: true, branch_max: usize::MAX, ..ExploreConfig::default() };
    let mut ex = Explorer::new(cfg);
    for w in ["adecMs", "adecdap"] {
        let w = Workload::parse(w).expect("a workload");
        ex.run(&w, Start::Empty, true);
    }
    let r = ex.report();
    println!("the issue's shapes: {}", summary(&r));
    assert_eq!(r.violations, 0, "{:#?}", r.first_violation);
    assert!(r.generations > 20 && r.process_crashes > 0);
}

#[test]
fn a_generation_run_is_reproduced_by_its_seed() {
    let run = |seed| {
        let r = generations(2, &[Start::Empty], config(seed));
        (r.generations, r.crash_points, r.states_checked, r.unique_states, r.recovery_points)
    };
    assert_eq!(run(5), run(5));
    assert_ne!(run(5), run(6), "different seeds should explore differently");
}

/// Broken protocols are caught across generations too: a checker that cannot fail proves
/// nothing. `no-tail-seal` (recovery leaves the place after a recovered tail as it was) is a
/// mutant of the multi-generation recovery rule; builds without it skip it.
#[cfg(feature = "mutants")]
#[test]
fn mutants_are_caught_across_generations() {
    use tally_log::Mutant;
    let mut missed = Vec::new();
    for name in ["no-epoch-bump", "stale-units-accepted", "no-dependency-closure", "no-tail-seal"] {
        let Some(m) = Mutant::from_name(name) else {
            println!("{name:<24} not in this build");
            continue;
        };
        let cfg = ExploreConfig { mutant: Some(m), stop_at_first: true, ..config(1) };
        let r = generations(12, &[Start::Empty], cfg);
        match &r.first_violation {
            Some(v) => println!(
                "{name:<24} caught by {:<28} after {:>6} states: {}",
                v.invariant.name(),
                v.states_before,
                v.replay
            ),
            None => missed.push(name),
        }
    }
    assert!(missed.is_empty(), "mutants not caught across generations: {missed:?}");
}

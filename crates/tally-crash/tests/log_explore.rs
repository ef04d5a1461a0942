//! The log explorer finds no violation on the real protocol, and catches every mutant.
//! (Optimised: `scripts/test` runs the suite in the `ci` profile, release with debug assertions.)

use tally_crash::explore::{ExploreConfig, Explorer, Op, Report, Start, Workload, WriteOuts};

fn bounded(len: usize, start: Start, cfg: ExploreConfig) -> Report {
    let mut ex = Explorer::new(cfg);
    for w in Workload::bounded(len, &Op::ALL) {
        ex.run(&w, start, true);
        if ex.done() {
            break;
        }
    }
    ex.report()
}

fn random(count: usize, ops: usize, cfg: ExploreConfig) -> Report {
    let mut rng = fastrand::Rng::with_seed(cfg.seed);
    let mut ex = Explorer::new(cfg);
    'workloads: for _ in 0..count {
        let w = Workload::random(&mut rng, ops);
        for start in Start::ALL {
            ex.run(&w, start, false);
            if ex.done() {
                break 'workloads;
            }
        }
    }
    ex.report()
}

/// Workloads around large transactions (`L`: a run of three parts that each fill a segment,
/// then its close, so its units span four segments): alone (a crash at every persistence point
/// inside it), after and before other commits, across syncs, checkpoints, cleaning (which
/// reads parts and must judge them by their closes) and crashes, and two in a row (the second
/// runs out of segments part-way and is abandoned; cleaning then checkpoints into the middle
/// of the abandoned run, whose later parts must stay uncommitted).
const LARGE_WORKLOADS: [&str; 14] = [
    "L", "aL", "La", "LsL", "LL", "Lsa", "aLck", "Lcg", "dLe", "mLsgk", "LcL", "AkLcLs", "LLgg",
    "LLsgga",
];

/// Explore each of `workloads` from every start image, until done.
fn explore_each(cfg: ExploreConfig, workloads: &[&str]) -> Report {
    let mut ex = Explorer::new(cfg);
    'all: for w in workloads {
        let w = Workload::parse(w).expect("workload letters");
        for start in Start::ALL {
            ex.run(&w, start, true);
            if ex.done() {
                break 'all;
            }
        }
    }
    ex.report()
}

fn large(cfg: ExploreConfig) -> Report {
    explore_each(cfg, &LARGE_WORKLOADS)
}

/// Large transactions spanning 3+ segments keep every invariant: a crash anywhere inside one
/// leaves none of it (its parts keep their places in the chain, without records) or all of it.
#[test]
fn large_transactions_across_segments_find_no_violation() {
    assert_no_violation("large transactions", &large(ExploreConfig::default()));
}

/// Recovery that keeps a large transaction's parts without its close (the units of its last
/// segments missing) is caught by the large-transaction workloads.
#[cfg(feature = "mutants")]
#[test]
fn a_large_transaction_kept_without_its_close_is_caught() {
    use tally_log::Mutant;
    for m in Mutant::ALL.into_iter().filter(|m| m.needs_large_transactions()) {
        let cfg =
            ExploreConfig { mutant: Some(m), stop_at_first: true, ..ExploreConfig::default() };
        let r = large(cfg);
        let v = r.first_violation.unwrap_or_else(|| panic!("{} not caught", m.name()));
        println!(
            "{} caught by {} in workload {}: {}",
            m.name(),
            v.invariant.name(),
            v.workload,
            v.message
        );
    }
}

/// Workloads that clean stream 0 onto stream 1 (`G`, hot/cold separation): the copies must be
/// durable on stream 1 before stream 0's checkpoint frees their originals, whatever stream 0's
/// durability (`s` before `G` leaves nothing of stream 0 to flush), beside stream 1's own
/// transactions (`d` depends on stream 0's last, `e` the other way, `l` is classic), with
/// stream 0 cleaned again on the same stream (`g`), checkpointed (`k`), crashed (`c`, `p`,
/// `r`) and going on, and across a large transaction's segments (`L`).
const ELSEWHERE_WORKLOADS: [&str; 16] = [
    "aMG", "aMsG", "MMsGG", "dMsGa", "aMdsGe", "lMsGd", "aMsGk", "aMsGcG", "aMGgs", "MsGg",
    "aMsGpa", "aMsGcr", "aLsG", "LLsGG", "mMsGcs", "dMGsGe",
];

fn elsewhere(cfg: ExploreConfig) -> Report {
    explore_each(cfg, &ELSEWHERE_WORKLOADS)
}

/// Cleaning that relocates onto another stream keeps every invariant: a crash anywhere in it
/// leaves the originals (checkpoint not moved) or the copies (durable on the target).
#[test]
fn cleaning_onto_another_stream_finds_no_violation() {
    assert_no_violation("cleaning onto another stream", &elsewhere(ExploreConfig::default()));
}

/// Cleaning that makes only the cleaned stream durable before its checkpoint (the copies on
/// the target stream not yet) is caught by the `G` workloads.
#[cfg_attr(not(feature = "mutants"), ignore = "needs the mutants feature")]
#[test]
fn cleaning_onto_another_stream_before_its_copies_are_durable_is_caught() {
    #[cfg(feature = "mutants")]
    {
        use tally_log::Mutant;
        let mutants: Vec<Mutant> =
            Mutant::ALL.into_iter().filter(|m| m.needs_relocation_elsewhere()).collect();
        assert!(!mutants.is_empty());
        for m in mutants {
            let cfg =
                ExploreConfig { mutant: Some(m), stop_at_first: true, ..ExploreConfig::default() };
            let r = elsewhere(cfg);
            print_caught(m, &r);
        }
    }
}

/// Durable waits on transactions with dependencies on another stream (`D`: a durable commit on
/// stream 1 that depends on stream 0's last; `l` after `d`: a classic commit whose stream prefix
/// holds a dependent): nothing asks for stream 0, yet what the acknowledged transaction depends
/// on must be durable with it, transitively (`adeD`: stream 1 → 0 → 1 → 0), beside checkpoints,
/// cleaning and crashes.
const DURABLE_DEPENDENCY_WORKLOADS: [&str; 12] =
    ["aD", "adl", "aDaD", "adeD", "aDc", "maD", "MaD", "aDkD", "aDgD", "adeDc", "aeaD", "aDsaD"];

/// Each-op write-outs first, then the log's own write-outs across ops; the first report with a
/// violation, else the second's.
fn durable_dependencies(cfg: ExploreConfig) -> Report {
    let across = ExploreConfig { write_outs: WriteOuts::AcrossOps, ..cfg.clone() };
    let r = explore_each(cfg, &DURABLE_DEPENDENCY_WORKLOADS);
    if r.first_violation.is_some() {
        return r;
    }
    explore_each(across, &DURABLE_DEPENDENCY_WORKLOADS)
}

/// A durable wait makes its transaction's dependency closure durable, and only that: a crash
/// after it never loses the acknowledged transaction, whatever stream its dependencies are on
/// (each-op write-outs and the log's own write-outs across ops).
#[test]
fn durable_waits_on_dependencies_elsewhere_find_no_violation() {
    assert_no_violation(
        "durable waits on dependencies elsewhere",
        &durable_dependencies(ExploreConfig::default()),
    );
}

/// A flush round that makes only the waited-for streams durable, not the dependencies their
/// transactions record on other streams, is caught: an acknowledged transaction is cut by
/// recovery because its dependency did not reach the media.
#[cfg_attr(not(feature = "mutants"), ignore = "needs the mutants feature")]
#[test]
fn a_durable_wait_that_skips_dependencies_elsewhere_is_caught() {
    #[cfg(feature = "mutants")]
    {
        let m = tally_log::Mutant::DurableClosureSkipped;
        let cfg =
            ExploreConfig { mutant: Some(m), stop_at_first: true, ..ExploreConfig::default() };
        let r = durable_dependencies(cfg);
        print_caught(m, &r);
    }
}

/// `r` found no violation, and explored enough to mean it: crash points inside operations and
/// more than 100 states.
fn assert_no_violation(what: &str, r: &Report) {
    println!("{what}: {}", summary(r));
    assert!(r.crash_points_inside_ops > 0 && r.states_checked > 100, "{}", summary(r));
    assert_eq!(r.violations, 0, "first: {:?}", r.first_violation);
}

/// `m` was caught in `r`: say by what, where.
#[cfg(feature = "mutants")]
fn print_caught(m: tally_log::Mutant, r: &Report) {
    let v = r.first_violation.as_ref().unwrap_or_else(|| panic!("{} not caught", m.name()));
    println!(
        "{} caught by {} after {} states in workload {}: {}",
        m.name(),
        v.invariant.name(),
        v.states_before,
        v.workload,
        v.message
    );
}

fn summary(r: &Report) -> String {
    format!(
        "workloads {} points {} (inside ops {}) states {} unique {} recovery-crash {} violations {} ({:.0} states/s, all exhaustive: {})",
        r.workloads,
        r.crash_points,
        r.crash_points_inside_ops,
        r.states_checked,
        r.unique_states,
        r.recovery_crash_states,
        r.violations,
        r.states_per_sec,
        r.all_exhaustive
    )
}

#[test]
fn bounded_exploration_from_an_empty_log_finds_no_violation() {
    // Every workload of up to 2 ops, and every 5th workload of up to 3 ops (910 of 4,549),
    // each crashed at every point. All 4,549 (3.4 million states, 15 minutes on a loaded 2-core
    // machine: the longest test of the suite) are `tally crash log --bounded 3`; CI runs a slice
    // to stay well under half an hour in all.
    let r2 = bounded(2, Start::Empty, ExploreConfig::default());
    println!("bounded 2, empty: {}", summary(&r2));
    assert_eq!(r2.violations, 0, "{:#?}", r2.first_violation);
    let mut ex = Explorer::new(ExploreConfig::default());
    for w in Workload::bounded(3, &Op::ALL).into_iter().step_by(5) {
        ex.run(&w, Start::Empty, true);
    }
    let r = ex.report();
    println!("bounded 3 (every 5th workload), empty: {}", summary(&r));
    assert_eq!(r.violations, 0, "{:#?}", r.first_violation);
    assert!(r.workloads > 900 && r.states_checked > 300_000 && r.recovery_crash_states > 0);
}

/// Write-behind with the buffers written out only by the log (durability requests, thresholds):
/// write-outs of several ops' commits, in several submissions, crashed inside — every workload of
/// two ops, and seeded random workloads of 30 ops from every start, long enough to carry many ops
/// into one write-out and past the size thresholds; and the log without write-behind, as before
/// it. (Bounded 3 across ops checks 1.9 million states, as long as the rest of this file: run it
/// with `tally crash log --bounded 3 --write-outs across-ops`.)
#[test]
fn exploration_across_write_outs_and_without_write_behind_finds_no_violation() {
    let across = ExploreConfig { write_outs: WriteOuts::AcrossOps, ..ExploreConfig::default() };
    let through = ExploreConfig { write_outs: WriteOuts::Through, ..ExploreConfig::default() };
    let runs = [
        ("bounded 2, empty, across-ops", bounded(2, Start::Empty, across.clone()), 500),
        ("random 12 x 30 ops x 3 starts, across-ops", random(12, 30, across), 500),
        ("bounded 2, empty, through", bounded(2, Start::Empty, through), 100),
    ];
    for (name, r, _) in &runs {
        println!("{name}: {}", summary(r));
    }
    for (name, r, points_inside_min) in runs {
        assert_eq!(r.violations, 0, "{name}: {:#?}", r.first_violation);
        assert!(r.crash_points_inside_ops > points_inside_min, "{name}: {}", summary(&r));
    }
}

#[test]
fn bounded_exploration_from_full_and_wrapped_logs_finds_no_violation() {
    // A nearly full log refuses most commits (cleanly, with NoSpace): few states, by design.
    for (start, states_min) in [(Start::NearlyFull, 500), (Start::Wrapped, 10_000)] {
        let r = bounded(2, start, ExploreConfig::default());
        println!("bounded 2, {start:?}: {}", summary(&r));
        assert_eq!(r.violations, 0, "{:#?}", r.first_violation);
        assert!(r.states_checked > states_min, "{start:?}: only {} states", r.states_checked);
    }
}

#[test]
fn random_workloads_with_several_crashes_find_no_violation() {
    let mut cfg = ExploreConfig { seed: 11, ..ExploreConfig::default() };
    cfg.crash.exhaustive_images_max = 1024;
    let r = random(12, 30, cfg);
    println!("random 12 x 30 ops x 3 starts: {}", summary(&r));
    assert_eq!(r.violations, 0, "{:#?}", r.first_violation);
}

#[test]
fn a_run_is_reproduced_by_its_seed() {
    let run = |seed| {
        let mut cfg = ExploreConfig { seed, ..ExploreConfig::default() };
        cfg.crash.exhaustive_images_max = 256;
        cfg.crash.samples = 16;
        let r = random(2, 20, cfg);
        (r.workloads, r.crash_points, r.states_checked, r.unique_states, r.recovery_crash_states)
    };
    assert_eq!(run(5), run(5));
    assert_ne!(run(5), run(6), "different seeds should explore differently");
}

/// Every mutant must be caught: first by 40 seeded random workloads of 8 ops from every start
/// (cheap, and they reach the longer setups some bugs need: two commits in a segment, one that
/// moves on, then a checkpoint), then, for a mutant they miss, by the bounded exploration
/// (length 3, then 4), each stopping at the first violation. Prints which run and invariant
/// caught it, after how many states. (Bounded 4 alone took most of CI's time.)
#[cfg(feature = "mutants")]
#[test]
fn every_mutant_is_caught() {
    use tally_log::Mutant;
    let mut missed = Vec::new();
    let single_crash = |m: &Mutant| {
        !m.needs_concurrency()
            && !m.needs_clean_close()
            && !m.needs_generations()
            && !m.needs_damage()
            && !m.needs_large_transactions()
            && !m.needs_relocation_elsewhere()
    };
    for m in Mutant::ALL.into_iter().filter(single_crash) {
        let write_outs =
            if m.needs_write_behind() { WriteOuts::AcrossOps } else { WriteOuts::default() };
        let cfg = ExploreConfig {
            mutant: Some(m),
            stop_at_first: true,
            write_outs,
            ..ExploreConfig::default()
        };
        let mut how = "random 40 x 8";
        let mut r = random(40, 8, cfg.clone());
        if r.first_violation.is_none() {
            how = "bounded 3";
            r = bounded(3, Start::Empty, cfg.clone());
        }
        if r.first_violation.is_none() {
            how = "bounded 4";
            r = bounded(4, Start::Empty, cfg);
        }
        match &r.first_violation {
            Some(v) => println!(
                "{:<24} caught ({how}) by {:<28} after {:>6} states: workload {} from {:?} — {}",
                m.name(),
                v.invariant.name(),
                v.states_before,
                v.workload,
                v.start,
                v.message
            ),
            None => missed.push(m.name()),
        }
    }
    assert!(missed.is_empty(), "mutants not caught: {missed:?}");
}

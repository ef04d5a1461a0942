//! The file-system explorer's multi-generation workloads (`docs/FS-CRASH-TESTING.md`,
//! "Multi-generation workloads"): steps drawn from the tree as it is, a power loss or a process
//! crash, a mount (itself crashed into), more steps on the recovered tree, and again. Each test
//! prints its counts (`--nocapture`).

use tally_crash::fsexplore::{FsExploreConfig, FsExplorer, FsReport};

fn run(cfg: FsExploreConfig, count: usize) -> FsReport {
    let mut ex = FsExplorer::new(cfg);
    for index in 0..count {
        ex.run_generations(index);
        if ex.done() {
            break;
        }
    }
    ex.report()
}

fn summary(r: &FsReport) -> String {
    format!(
        "workloads {} generations {} (process crashes {}, crashes in a mount {}) points {} \
         (inside ops {}, inside mounts {}) images {} (distinct {}) recovery-crash images {} \
         violations {} ({:.1} s)",
        r.workloads,
        r.generations,
        r.process_crashes,
        r.crashes_in_recovery,
        r.crash_points,
        r.crash_points_inside_ops,
        r.recovery_points,
        r.states_checked,
        r.unique_states,
        r.recovery_crash_states,
        r.violations,
        r.elapsed_sec
    )
}

#[test]
fn multi_generation_workloads_find_no_violation() {
    let cfg = FsExploreConfig::default();
    let (count, generations) = (8, u64::from(cfg.generations));
    assert!(generations >= 4);
    let r = run(cfg, count);
    println!("{count} workloads x {generations} generations, 2 streams: {}", summary(&r));
    assert_eq!(r.violations, 0, "{:#?}", r.first_violation);
    assert_eq!(r.generations, count as u64 * generations, "a workload stopped early");
    assert!(r.process_crashes > 0 && r.crashes_in_recovery > 0 && r.recovery_points > 0);
}

#[test]
fn a_generation_run_is_reproduced_by_its_seed() {
    let once = |seed| {
        let r = run(FsExploreConfig { seed, ..FsExploreConfig::default() }, 2);
        (r.generations, r.crash_points, r.states_checked, r.unique_states, r.recovery_points)
    };
    assert_eq!(once(3), once(3));
    assert_ne!(once(3), once(4), "different seeds should explore differently");
}

/// Broken file systems and logs are caught across generations too: a checker that cannot fail
/// proves nothing.
#[cfg(feature = "mutants")]
#[test]
fn mutants_are_caught_across_generations() {
    use tally_crash::fsexplore::FsMutant;
    let cases = [
        FsExploreConfig { mutant: Some(FsMutant::FsyncNotDurable), ..FsExploreConfig::default() },
        FsExploreConfig {
            log_mutant: Some(tally_log::Mutant::NoEpochBump),
            ..FsExploreConfig::default()
        },
    ];
    let mut missed = Vec::new();
    for cfg in cases {
        let name = cfg
            .mutant
            .map_or_else(|| cfg.log_mutant.map_or("", tally_log::Mutant::name), FsMutant::name);
        let r = run(FsExploreConfig { stop_at_first: true, ..cfg }, 12);
        match &r.first_violation {
            Some(v) => {
                println!("{name:<24} caught by {:<20}: {}", v.invariant.name(), v.replay)
            }
            None => missed.push(name),
        }
    }
    assert!(missed.is_empty(), "mutants not caught across generations: {missed:?}");
}

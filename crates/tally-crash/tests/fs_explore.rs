//! The file-system crash explorer (`docs/FS-CRASH-TESTING.md`) on the correct file system and
//! on every mutant. Each test prints its counts (`--nocapture` to see them).

use tally_crash::fsexplore::{workload_set, FsExploreConfig, FsExplorer, FsReport};

/// Seq-2 workloads drawn by the seed (of about 69,000).
const SEQ2_COUNT: usize = 1500;

fn show(name: &str, r: &FsReport) {
    println!(
        "{name}: workloads {} crash points {} (inside ops {}) images checked {} (distinct {}) \
         recovery-crash images {} violations {} sampled passes {} in {:.1} s",
        r.workloads,
        r.crash_points,
        r.crash_points_inside_ops,
        r.states_checked,
        r.unique_states,
        r.recovery_crash_states,
        r.violations,
        r.sampled_passes,
        r.elapsed_sec
    );
    if let Some(v) = &r.first_violation {
        println!(
            "  first: {} in {} #{} `{}` at {} (seed {}): {}",
            v.invariant.name(),
            v.set,
            v.index,
            v.workload,
            v.at,
            v.seed,
            v.message
        );
    }
}

fn explore(cfg: FsExploreConfig, sets: &[String], name: &str) -> FsReport {
    let streams = cfg.streams;
    let bs = u64::from(cfg.block_size);
    let seed = cfg.seed;
    let mut ex = FsExplorer::new(cfg);
    let start = ex.start().expect("start image");
    for set in sets {
        let workloads = workload_set(set, &start.state, streams, bs, seed).expect("workload set");
        ex.run_all(set, &workloads);
    }
    let r = ex.report();
    show(name, &r);
    r
}

fn seq2() -> String {
    format!("seq-2:{SEQ2_COUNT}")
}

/// Every seq-1 workload: each catalogue operation × each persistence call, two streams.
#[test]
fn seq1_exhaustive() {
    let r = explore(FsExploreConfig::default(), &["seq-1".into()], "seq-1, 2 streams");
    assert_eq!(r.violations, 0, "{:#?}", r.first_violation);
    assert!(r.workloads > 200, "the catalogue shrank: {}", r.workloads);
    assert!(r.states_checked > 1000);
}

/// Seq-2 workloads drawn by seed, two streams.
#[test]
fn seq2_sampled() {
    let r = explore(FsExploreConfig::default(), &[seq2()], "seq-2 sample, 2 streams");
    assert_eq!(r.violations, 0, "{:#?}", r.first_violation);
    assert_eq!(r.workloads, SEQ2_COUNT as u64);
}

/// One stream: every crash recovers a prefix of the operations (total order).
#[test]
fn one_stream_recovers_a_prefix() {
    let cfg = FsExploreConfig { streams: 1, ..FsExploreConfig::default() };
    let r = explore(
        cfg,
        &["seq-1".into(), format!("seq-2:{}", SEQ2_COUNT / 4)],
        "seq-1 + seq-2 sample, 1 stream",
    );
    assert_eq!(r.violations, 0, "{:#?}", r.first_violation);
}

/// The longer workloads (a tombstone in a segment that cleaning relocates) on the correct file
/// system.
#[test]
fn longer_workloads() {
    let r = explore(FsExploreConfig::default(), &["longer".into()], "longer, 2 streams");
    assert_eq!(r.violations, 0, "{:#?}", r.first_violation);
}

// Every seq-2 workload (about 69,000, some 20 minutes) is `tally crash fs --seq 2`, the same
// explorer: too long for CI, which runs the seed's sample above.

/// Each mutant of `tally-fs` must be caught: seq-1 in full (counts per invariant), else the
/// seq-2 sample and the longer workloads, stopping at the first violation.
#[cfg(feature = "mutants")]
#[test]
fn every_fs_mutant_is_caught() {
    use tally_fs::FsMutant;
    let mut missed = Vec::new();
    for m in FsMutant::ALL {
        let cfg = FsExploreConfig { mutant: Some(m), ..FsExploreConfig::default() };
        let mut r = explore(cfg, &["seq-1".into()], m.name());
        if r.violations == 0 {
            let cfg = FsExploreConfig {
                mutant: Some(m),
                stop_at_first: true,
                ..FsExploreConfig::default()
            };
            r = explore(cfg, &[format!("seq-2:{}", SEQ2_COUNT / 4), "longer".into()], m.name());
        }
        match &r.first_violation {
            Some(v) => println!(
                "  => {} caught by {} (violations by invariant {:?}) in {} `{}`",
                m.name(),
                v.invariant.name(),
                r.violations_by_invariant,
                v.set,
                v.workload
            ),
            None => missed.push(m.name()),
        }
    }
    assert!(missed.is_empty(), "mutants not caught: {missed:?}");
}

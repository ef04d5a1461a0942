//! The file-system crash explorer (`docs/FS-CRASH-TESTING.md`) on the correct file system and
//! on every mutant. Each test prints its counts (`--nocapture` to see them).

use tally_crash::fsexplore::{
    longer, seq1, seq2, seq2_sample, FsExploreConfig, FsExplorer, FsReport, FsWorkload,
};

/// Seq-2 workloads drawn (of about 69,000) and the seed drawing them.
const SEQ2_COUNT: usize = 2000;
const SEQ2_SEED: u64 = 7;

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

/// Which sets to run.
enum Set {
    Seq1,
    Seq2(usize),
    Longer,
}

fn explore(cfg: FsExploreConfig, sets: &[Set], name: &str) -> FsReport {
    let streams = cfg.streams;
    let bs = u64::from(cfg.block_size);
    let seed = cfg.seed;
    let mut ex = FsExplorer::new(cfg);
    let start = ex.start().expect("start image");
    for set in sets {
        let (label, workloads): (&str, Vec<FsWorkload>) = match set {
            Set::Seq1 => ("seq-1", seq1(&start.state, streams, bs)),
            Set::Seq2(n) => ("seq-2", seq2_sample(&start.state, streams, bs, *n, SEQ2_SEED ^ seed)),
            Set::Longer => ("longer", longer()),
        };
        ex.run_all(label, &workloads);
    }
    let r = ex.report();
    show(name, &r);
    r
}

/// Every seq-1 workload: each catalogue operation × each persistence call, two streams.
#[test]
fn seq1_exhaustive() {
    let r = explore(FsExploreConfig::default(), &[Set::Seq1], "seq-1, 2 streams");
    assert_eq!(r.violations, 0, "{:#?}", r.first_violation);
    assert!(r.workloads > 200, "the catalogue shrank: {}", r.workloads);
    assert!(r.states_checked > 1000);
}

/// Seq-2 workloads drawn by seed, two streams.
#[test]
fn seq2_sampled() {
    let cfg = FsExploreConfig { seed: 1, ..FsExploreConfig::default() };
    let r = explore(cfg, &[Set::Seq2(SEQ2_COUNT)], "seq-2 sample, 2 streams");
    assert_eq!(r.violations, 0, "{:#?}", r.first_violation);
    assert_eq!(r.workloads, SEQ2_COUNT as u64);
}

/// One stream: every crash recovers a prefix of the operations (total order).
#[test]
fn one_stream_recovers_a_prefix() {
    let cfg = FsExploreConfig { streams: 1, ..FsExploreConfig::default() };
    let r = explore(cfg, &[Set::Seq1, Set::Seq2(SEQ2_COUNT / 4)], "seq-1 + seq-2 sample, 1 stream");
    assert_eq!(r.violations, 0, "{:#?}", r.first_violation);
}

/// The longer workloads (a tombstone in a segment that cleaning relocates) on the correct file
/// system.
#[test]
fn longer_workloads() {
    let r = explore(FsExploreConfig::default(), &[Set::Longer], "longer, 2 streams");
    assert_eq!(r.violations, 0, "{:#?}", r.first_violation);
}

/// Every seq-2 workload (about 69,000; some 20 minutes): `cargo test --release -- --ignored`.
#[test]
#[ignore = "slow: the full seq-2 set"]
fn seq2_all() {
    let cfg = FsExploreConfig::default();
    let mut ex = FsExplorer::new(cfg);
    let start = ex.start().expect("start image");
    let workloads = seq2(&start.state, 2, 1024);
    ex.run_all("seq-2-all", &workloads);
    let r = ex.report();
    show("seq-2 all, 2 streams", &r);
    assert_eq!(r.violations, 0, "{:#?}", r.first_violation);
}

/// Each mutant of `tally-fs` must be caught: seq-1 in full (counts per invariant), else the
/// seq-2 sample and the longer workloads, stopping at the first violation.
#[cfg(feature = "mutants")]
#[test]
fn every_fs_mutant_is_caught() {
    use tally_fs::FsMutant;
    let mut missed = Vec::new();
    for m in FsMutant::ALL {
        let cfg = FsExploreConfig { mutant: Some(m), ..FsExploreConfig::default() };
        let mut r = explore(cfg, &[Set::Seq1], m.name());
        if r.violations == 0 {
            let cfg = FsExploreConfig {
                mutant: Some(m),
                stop_at_first: true,
                ..FsExploreConfig::default()
            };
            r = explore(cfg, &[Set::Seq2(SEQ2_COUNT / 4), Set::Longer], m.name());
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

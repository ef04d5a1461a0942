//! The file-system crash explorer (`docs/FS-CRASH-TESTING.md`, "On persistent memory") on the
//! cache-line simulator: the same workloads and invariants I1–I6 as on the block simulator,
//! with crash points before every line flush and fence and blocks torn at 8-byte words; and the
//! persistent-memory mutants each caught. Each test prints its counts (`--nocapture`).

use tally_crash::fsexplore::{workload_set, FsExploreConfig, FsExplorer, FsReport, Medium};

fn show(name: &str, r: &FsReport) {
    println!(
        "{name}: workloads {} crash points {} (inside ops {}) images checked {} (distinct {}) \
         recovery-crash images {} violations {} {:?} sampled passes {} in {:.1} s",
        r.workloads,
        r.crash_points,
        r.crash_points_inside_ops,
        r.states_checked,
        r.unique_states,
        r.recovery_crash_states,
        r.violations,
        r.violations_by_invariant,
        r.sampled_passes,
        r.elapsed_sec
    );
    if let Some(v) = &r.first_violation {
        println!(
            "  first: {} in {} #{} `{}` at {} after {} states: {}",
            v.invariant.name(),
            v.set,
            v.index,
            v.workload,
            v.at,
            v.states_before,
            v.message
        );
    }
}

fn pmem() -> FsExploreConfig {
    FsExploreConfig { medium: Medium::Pmem, ..FsExploreConfig::default() }
}

/// Run the workloads of `set` whose index is a multiple of `stride` (1: all).
fn explore(cfg: FsExploreConfig, set: &str, stride: usize, name: &str) -> FsReport {
    let (streams, bs, seed) = (cfg.streams, u64::from(cfg.block_size), cfg.seed);
    let mut ex = FsExplorer::new(cfg);
    let start = ex.start().expect("start image");
    let workloads = workload_set(set, &start.state, streams, bs, seed).expect("workload set");
    for (i, w) in workloads.iter().enumerate().step_by(stride) {
        if ex.done() {
            break;
        }
        ex.run(set, i, w);
    }
    let r = ex.report();
    show(name, &r);
    r
}

/// Every 5th seq-1 workload on persistent memory, two streams (the CI slice; the full set is
/// `tally crash fs --medium pmem`, counts in docs/FS-CRASH-TESTING.md).
#[test]
fn seq1_slice_on_pmem() {
    let r = explore(pmem(), "seq-1", 5, "seq-1 (every 5th) on pmem, 2 streams");
    assert_eq!(r.violations, 0, "{:#?}", r.first_violation);
    assert!(r.workloads > 48, "the catalogue shrank: {}", r.workloads);
    assert!(r.crash_points_inside_ops > r.workloads, "no crash points inside operations");
    assert!(r.states_checked > r.crash_points, "points have images beyond the durable one");
}

// Every seq-1 workload on persistent memory (about 5 minutes on 2 cores) is
// `tally crash fs --medium pmem`, the same explorer: too long for CI, which runs the slices.

/// Every 7th seq-1 workload on one stream: each crash recovers a prefix of the operations.
#[test]
fn seq1_slice_one_stream_on_pmem() {
    let cfg = FsExploreConfig { streams: 1, ..pmem() };
    let r = explore(cfg, "seq-1", 7, "seq-1 (every 7th) on pmem, 1 stream");
    assert_eq!(r.violations, 0, "{:#?}", r.first_violation);
    assert!(r.workloads > 30);
}

/// A persistent-memory mutant, run on seq-1 until the first violation: the first violation
/// (invariant, states before it), which the caller asserts.
#[cfg(feature = "mutants")]
fn caught(cfg: FsExploreConfig, name: &str) -> tally_crash::fsexplore::FsFirstViolation {
    let cfg = FsExploreConfig { stop_at_first: true, ..cfg };
    let r = explore(cfg, "seq-1", 1, name);
    r.first_violation.unwrap_or_else(|| panic!("mutant {name} was not caught"))
}

/// No fence in the block view: fsynced data sits in write-combining buffers.
#[cfg(feature = "mutants")]
#[test]
fn mutant_pmem_fence_missing_is_caught() {
    use tally_media::pmem::BlockMutant;
    let m = BlockMutant::FenceMissing;
    let v = caught(FsExploreConfig { pmem_mutant: Some(m), ..pmem() }, m.name());
    println!("  => {} caught by {}", m.name(), v.invariant.name());
}

/// A cached copy that leaves its last line unflushed.
#[cfg(feature = "mutants")]
#[test]
fn mutant_pmem_copy_skips_tail_flush_is_caught() {
    use tally_media::pmem::BlockMutant;
    let m = BlockMutant::CopySkipsTailFlush;
    let v = caught(FsExploreConfig { pmem_mutant: Some(m), ..pmem() }, m.name());
    println!("  => {} caught by {}", m.name(), v.invariant.name());
}

/// A log unit (a 1 KiB block, 128 failure-atomic words) accepted without its crc: a unit torn
/// at a word is taken whole.
#[cfg(feature = "mutants")]
#[test]
fn mutant_unit_without_crc_is_caught_on_pmem() {
    let m = tally_log::Mutant::CrcNotChecked;
    let v = caught(FsExploreConfig { log_mutant: Some(m), ..pmem() }, m.name());
    println!("  => {} caught by {}", m.name(), v.invariant.name());
}

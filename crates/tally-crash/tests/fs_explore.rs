//! The file-system crash explorer (`docs/FS-CRASH-TESTING.md`) on the correct file system and
//! on every mutant. Each test prints its counts (`--nocapture` to see them).

use tally_crash::fsexplore::{
    large, names, workload_set, FsExploreConfig, FsExplorer, FsFirstViolation, FsReport,
    HUGE_BLOCKS,
};

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

/// A mutant's name and the violation that caught it.
fn show_caught(mutant: &str, v: &FsFirstViolation) {
    println!("  => {mutant} caught by {} in `{}` at {}", v.invariant.name(), v.workload, v.at);
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

/// The segments of each stream's chain a committed [`WriteKind::Huge`] transaction took that
/// the start image's chains did not have (the explorer's geometry, mounted from its start).
fn segments_a_huge_transaction_spans(cfg: &FsExploreConfig) -> usize {
    use std::collections::BTreeSet;
    use std::sync::Arc;
    use tally_fs::{Fs, MountOptions};
    use tally_media::MemDevice;

    let start = FsExplorer::new(cfg.clone()).start().expect("start image");
    let dev = Arc::new(MemDevice::from_image(start.image.clone()));
    let fs = Fs::mount(dev, MountOptions::default()).expect("mount the start image");
    let chains = |fs: &Fs| -> BTreeSet<(u16, u32)> {
        (0..cfg.streams)
            .flat_map(|s| {
                let usage = fs.log().segment_usage(s).expect("segment usage");
                usage.into_iter().map(move |u| (s, u.segment))
            })
            .collect()
    };
    let before = chains(&fs);
    let model_ino = start.state.lookup("/A/foo").expect("/A/foo");
    let ino = start.map[&model_ino];
    let bytes = HUGE_BLOCKS * u64::from(cfg.block_size);
    let data = vec![0x5Cu8; usize::try_from(bytes).expect("size")];
    let tx = fs.begin().expect("begin");
    fs.write(Some(&tx), ino, 0, &data).expect("huge write");
    fs.commit(tx).expect("commit");
    fs.sync().expect("sync");
    assert_eq!(fs.read(ino, 0, data.len()).expect("read"), data);
    chains(&fs).difference(&before).count()
}

/// Large transactions (issue 15 part 1): an explicit transaction whose parts span three or
/// more segments, committed, committed durable or aborted, with and without a rename in it,
/// then cleaned or followed by another stream's fsync; every crash point on the correct file
/// system.
#[test]
fn large_transactions_across_segments() {
    let cfg = FsExploreConfig::default();
    let spanned = segments_a_huge_transaction_spans(&cfg);
    println!("a committed huge transaction took {spanned} new segments");
    assert!(spanned >= 3, "a huge transaction took only {spanned} new segments");
    let r = explore(cfg, &["large".into()], "large, 2 streams");
    assert_eq!(r.violations, 0, "{:#?}", r.first_violation);
    assert_eq!(r.workloads, large().len() as u64);
    assert!(r.crash_points_inside_ops > 100, "too few crash points inside the parts");
}

/// The log mutants only large transactions show (recovery keeping the parts of a run whose
/// close did not survive: a transaction whose last segment's units are missing) are caught by
/// the file-system explorer's `large` workloads, not only by the log explorer.
#[cfg(feature = "mutants")]
#[test]
fn a_large_transaction_without_its_close_is_caught_by_the_fs_explorer() {
    let mutants: Vec<tally_log::Mutant> =
        tally_log::Mutant::ALL.into_iter().filter(|m| m.needs_large_transactions()).collect();
    assert!(!mutants.is_empty());
    for m in mutants {
        let cfg = FsExploreConfig {
            log_mutant: Some(m),
            stop_at_first: true,
            ..FsExploreConfig::default()
        };
        let r = explore(cfg, &["large".into()], m.name());
        let v = r.first_violation.unwrap_or_else(|| panic!("log mutant {} not caught", m.name()));
        show_caught(m.name(), &v);
    }
}

/// The `names` set's first workload is SQLite's DELETE-mode pattern only if the journal's
/// entry (the root's stream) and the database `/bar` are on different streams (per file,
/// inode % 2 with the explorer's two streams).
fn assert_names_cross_streams(cfg: &FsExploreConfig) {
    let start = FsExplorer::new(cfg.clone()).start().expect("start image");
    let bar = start.map[&start.state.lookup("/bar").expect("/bar")];
    assert_eq!(cfg.streams, 2);
    assert_ne!(bar % 2, tally_fs::ROOT % 2, "/bar and the root share a stream");
}

/// Durability of names: namespace changes followed by durable waits on another stream's file
/// (SQLite's journal unlink, then its database's fsync) on the correct file system.
#[test]
fn names_are_durable_with_later_waits() {
    let cfg = FsExploreConfig::default();
    assert_names_cross_streams(&cfg);
    let r = explore(cfg, &["names".into()], "names, 2 streams");
    assert_eq!(r.violations, 0, "{:#?}", r.first_violation);
    assert_eq!(r.workloads, names().len() as u64);
    assert!(r.crash_points_inside_ops > 20, "too few crash points inside the operations");
}

/// Namespace changes not made barriers (`namespace-not-ordered`) are caught on SQLite's
/// pattern: a crash keeps the database's later change without the journal's unlink (I2), also
/// once that change's fsync returned (I3).
#[cfg_attr(not(feature = "mutants"), ignore = "needs the mutants feature")]
#[test]
fn namespace_changes_not_ordered_are_caught_on_sqlites_pattern() {
    #[cfg(feature = "mutants")]
    {
        let m = tally_fs::FsMutant::NamespaceNotOrdered;
        let cfg = FsExploreConfig { mutant: Some(m), ..FsExploreConfig::default() };
        let r = explore(cfg, &["names".into()], m.name());
        let v = r.first_violation.expect("namespace-not-ordered not caught by the names set");
        show_caught(m.name(), &v);
        assert_eq!((v.set.as_str(), v.index), ("names", 0), "not caught on SQLite's pattern");
        // And after the database's fsync returned: the journal back (SQLite's hot journal).
        println!("  violations by invariant: {:?}", r.violations_by_invariant);
        assert!(r.violations_by_invariant.contains_key("I3 durability"), "no lost unlink");
    }
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
            let sets = [format!("seq-2:{}", SEQ2_COUNT / 4), "longer".into(), "names".into()];
            r = explore(cfg, &sets, m.name());
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

//! The multi-target crash explorer (issue 18): a log striped over three targets, each with its
//! own volatile cache, crashed at every persistence point with every target losing its own
//! unflushed writes independently. Recovery keeps exactly the per-stream prefix, also in the
//! states where a target kept a later transaction of a stream and another lost an earlier one;
//! a recovery that does not cut at the gap, and a flush round that flushes one target, are
//! caught. (Optimised: `scripts/test` runs the suite in the `ci` profile.)

use tally_crash::explore::Invariant;
use tally_crash::spanexplore::{explore, SpanExploreConfig, SpanReport};

fn summary(r: &SpanReport) -> String {
    format!(
        "{} workloads, {} crash points, {} states ({} split, {} of them cut by recovery), {} violations",
        r.workloads, r.crash_points, r.states_checked, r.split_states, r.split_states_cut, r.violations
    )
}

/// Every state of three independently crashing targets recovers the per-stream prefix, with
/// dependencies and every acknowledged commit; split states are among them, and in every one
/// recovery ended the stream before the later transaction a target had kept.
#[test]
fn three_targets_crashing_independently_keep_the_prefix() {
    let r = explore(&SpanExploreConfig::default());
    println!("{}", summary(&r));
    assert_eq!(r.violations, 0, "first: {:?}", r.first_violation);
    assert!(r.states_checked > 5_000, "{}", summary(&r));
    assert!(r.split_states > 100, "too few split states: {}", summary(&r));
    assert_eq!(r.split_states_cut, r.split_states, "{}", summary(&r));
}

/// Two targets too (target A keeps a later write of a stream, target B loses an earlier one).
#[test]
fn two_targets_crashing_independently_keep_the_prefix() {
    let cfg = SpanExploreConfig { targets: 2, seed: 2, ..SpanExploreConfig::default() };
    let r = explore(&cfg);
    println!("{}", summary(&r));
    assert_eq!(r.violations, 0, "first: {:?}", r.first_violation);
    assert!(r.split_states > 100, "too few split states: {}", summary(&r));
    assert_eq!(r.split_states_cut, r.split_states, "{}", summary(&r));
}

/// Recovery that skips over a lost transaction and keeps later ones (tally-log's
/// `NoPrefixCut`) is caught, in a split state: the kept later transaction was on another
/// target than the lost earlier one.
#[test]
#[cfg_attr(not(feature = "mutants"), ignore = "needs the mutants feature")]
fn recovery_keeping_a_later_target_s_transaction_past_a_lost_one_is_caught() {
    let cfg = SpanExploreConfig {
        mutant: Some(tally_log::Mutant::NoPrefixCut),
        ..SpanExploreConfig::default()
    };
    let r = explore(&cfg);
    println!("{}", summary(&r));
    let first = r.first_split_violation.expect("NoPrefixCut not caught in a split state");
    println!("caught in a split state: {first:?}");
    assert_eq!(first.violation.invariant, Invariant::I3PrefixAndDependencies, "{first:?}");
}

/// A span flush round that flushes only target 0 (as if one flush covered every target) is
/// caught: a durable commit whose writes went to another target is lost, or recovery finds a
/// transaction lost that a later unit proves durable.
#[test]
#[cfg_attr(not(feature = "mutants"), ignore = "needs the mutants feature")]
fn a_flush_round_that_flushes_only_the_first_target_is_caught() {
    let cfg = SpanExploreConfig {
        span_mutant: Some(tally_media::SpanMutant::FlushFirstOnly),
        stop_at_first: true,
        ..SpanExploreConfig::default()
    };
    let r = explore(&cfg);
    let first = r.first_violation.expect("FlushFirstOnly not caught");
    println!("caught after {} states: {first:?}", r.states_checked);
    assert!(
        matches!(
            first.violation.invariant,
            Invariant::I4Durability | Invariant::I5RecoverySucceeds
        ),
        "{first:?}"
    );
}

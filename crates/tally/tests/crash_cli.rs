//! `tally crash log` and `tally crash fs`: JSON fields, exit status, replay of a mutant's
//! violation, on the block and the persistent-memory medium.

mod common;

/// `tally ARGS`: exit code, standard output, standard error.
fn tally(args: &[&str]) -> (i32, String, String) {
    let out = common::tally(args, &[]);
    (common::code(&out), common::stdout(&out), common::stderr(&out))
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
    assert_eq!(out.lines().count(), tally_log::Mutant::ALL.len() + 2, "{out}");
    assert!(out.contains("pmem-fence-missing  (with --medium pmem)"));
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
    assert!(replay.starts_with("tally crash log --medium block --workload "), "{replay}");
    let args: Vec<&str> = replay.split_whitespace().skip(1).collect();
    let (code, again, _) = tally(&args);
    assert_eq!(code, 1, "the replay must find the violation again");
    let again: serde_json::Value = serde_json::from_str(&again).unwrap();
    assert_eq!(again["first_violation"]["invariant"], first["invariant"]);
    assert_eq!(again["first_violation"]["message"], first["message"]);
}

#[test]
fn the_log_and_the_file_system_on_pmem_report_the_same_fields_and_no_violation() {
    let (code, block, err) = tally(&["crash", "log", "--workload", "amdsc", "--json"]);
    assert_eq!(code, 0, "{err}");
    let (code, pmem, err) =
        tally(&["crash", "log", "--medium", "pmem", "--workload", "amdsc", "--json"]);
    assert_eq!(code, 0, "{err}");
    let block: serde_json::Value = serde_json::from_str(&block).unwrap();
    let pmem: serde_json::Value = serde_json::from_str(&pmem).unwrap();
    let keys =
        |v: &serde_json::Value| -> Vec<String> { v.as_object().unwrap().keys().cloned().collect() };
    assert_eq!(keys(&block), keys(&pmem));
    assert_eq!((block["medium"].as_str(), pmem["medium"].as_str()), (Some("block"), Some("pmem")));
    assert_eq!(pmem["violations"], 0);
    assert!(pmem["states_checked"].as_u64().unwrap() > pmem["crash_points"].as_u64().unwrap());
    let (code, fs, err) =
        tally(&["crash", "fs", "--medium", "pmem", "--set", "seq-1", "--index", "5", "--json"]);
    assert_eq!(code, 0, "{err}");
    let fs: serde_json::Value = serde_json::from_str(&fs).unwrap();
    assert_eq!((fs["medium"].as_str(), fs["violations"].as_u64()), (Some("pmem"), Some(0)));
    assert!(fs["crash_points_inside_ops"].as_u64().unwrap() > 0);
    let (code, _, err) = tally(&["crash", "fs", "--medium", "dram"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown medium"), "{err}");
}

#[cfg(feature = "mutants")]
#[test]
fn pmem_mutants_are_caught_and_need_the_pmem_medium() {
    for (layer, mutant) in [
        ("log", "pmem-fence-missing"),
        ("log", "pmem-copy-skips-tail-flush"),
        ("log", "crc-not-checked"),
        ("fs", "pmem-fence-missing"),
        ("fs", "crc-not-checked"),
    ] {
        let mut args = vec!["crash", layer, "--medium", "pmem", "--mutant", mutant];
        args.extend(["--stop-at-first", "--json"]);
        let (code, out, err) = tally(&args);
        assert_eq!(code, 1, "{layer} {mutant} not caught: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let replay = v["first_violation"]["replay"].as_str().unwrap();
        assert!(replay.contains("--medium pmem") && replay.contains(mutant), "{replay}");
    }
    let (code, _, err) = tally(&["crash", "fs", "--mutant", "pmem-fence-missing"]);
    assert_eq!(code, 2);
    assert!(err.contains("needs --medium pmem"), "{err}");
}

/// The two-thread sets of `tally-crash`'s `fs_explore_concurrent` test run from the CLI, and
/// an index past the set is refused.
#[test]
fn concurrent_sets_run_from_the_cli() {
    for set in ["concurrent", "threaded"] {
        let (code, out, err) = tally(&["crash", "fs", "--set", set, "--index", "2", "--json"]);
        assert_eq!(code, 0, "{set}: {err}");
        let r: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!((r["workloads"].as_u64(), r["violations"].as_u64()), (Some(1), Some(0)));
        assert!(r["crash_points_inside_ops"].as_u64().unwrap() > 0, "{set}: {out}");
    }
    let (code, _, err) = tally(&["crash", "fs", "--set", "threaded", "--index", "48"]);
    assert_eq!(code, 2);
    assert!(err.contains("has 48 workloads"), "{err}");
}

/// A violation the concurrent set finds is replayed, the same one, by the command it prints.
#[cfg(feature = "mutants")]
#[test]
fn a_concurrent_violation_replays_from_its_command() {
    let args = ["crash", "fs", "--set", "concurrent", "--mutant", "no-dependencies"];
    let (code, out, err) = tally(&[&args[..], &["--stop-at-first", "--json"]].concat());
    assert_eq!(code, 1, "no-dependencies not caught by the concurrent set: {err}");
    let first: serde_json::Value = serde_json::from_str(&out).unwrap();
    let first = &first["first_violation"];
    let replay = first["replay"].as_str().unwrap();
    let words: Vec<&str> = replay.split_whitespace().collect();
    assert_eq!(words[0], "tally", "{replay}");
    let (code, out, err) = tally(&[&words[1..], &["--stop-at-first", "--json"]].concat());
    assert_eq!(code, 1, "the replay found nothing: {replay}: {err}");
    let again: serde_json::Value = serde_json::from_str(&out).unwrap();
    let again = &again["first_violation"];
    assert_eq!((&again["workload"], &again["message"]), (&first["workload"], &first["message"]));
}

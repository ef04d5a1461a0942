//! `tally crash log --generations` and `tally crash fs --generations`: multi-generation runs
//! report their generations, and a violation's replay command finds it again.

mod common;

/// `tally ARGS`: exit code, standard output, standard error.
fn tally(args: &[&str]) -> (i32, String, String) {
    let out = common::tally(args, &[]);
    (common::code(&out), common::stdout(&out), common::stderr(&out))
}

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

#[test]
fn multi_generation_runs_report_their_generations() {
    let (code, out, err) = tally(&[
        "crash",
        "log",
        "--generations",
        "2",
        "--ops-per-generation",
        "2",
        "--random",
        "1",
        "--samples",
        "4",
        "--exhaustive-images-max",
        "16",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    assert_eq!(v["workloads"], 3, "one workload from each of three starts: {out}");
    assert_eq!(v["generations"], 6, "{out}");
    assert!(v["recovery_points"].as_u64().unwrap() > 0, "{out}");
    let (code, out, err) = tally(&["crash", "fs", "--generations", "2", "--count", "1", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    assert_eq!(v["generations"], 2, "{out}");
    assert!(v["recovery_points"].as_u64().unwrap() > 0, "{out}");
    let (code, _, err) = tally(&["crash", "log", "--ops-per-generation", "3"]);
    assert_eq!(code, 2, "--ops-per-generation needs --generations: {err}");
}

#[cfg(feature = "mutants")]
#[test]
fn a_mutant_caught_across_generations_is_replayed_by_its_command() {
    for (layer, mutant, size) in [
        ("log", "no-epoch-bump", ["--random", "12", "--samples", "8"]),
        ("fs", "fsync-not-durable", ["--count", "12", "--samples", "8"]),
    ] {
        let mut args = vec!["crash", layer, "--generations", "4", "--mutant", mutant];
        args.extend(size);
        args.extend(["--stop-at-first", "--json"]);
        let (code, out, err) = tally(&args);
        assert_eq!(code, 1, "{layer} {mutant} not caught: {err}");
        let first = &json(&out)["first_violation"];
        let replay = first["replay"].as_str().unwrap();
        assert!(replay.contains("--generations 4") && replay.contains(mutant), "{replay}");
        let mut args: Vec<&str> = replay.split_whitespace().skip(1).collect();
        if !args.contains(&"--json") {
            args.push("--json");
        }
        let (code, again, err) = tally(&args);
        assert_eq!(code, 1, "the replay must find the violation again: {replay}: {err}");
        let again = &json(&again)["first_violation"];
        assert_eq!(again["invariant"], first["invariant"], "{replay}");
        assert_eq!(again["message"], first["message"], "{replay}");
    }
}

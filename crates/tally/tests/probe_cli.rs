//! `tally probe` as a user runs it: the built binary on a temporary path.

mod common;

use std::path::PathBuf;

use common::tally;

fn temp_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("tally-probe-cli-{}-{tag}", std::process::id()))
}

fn positive(value: &serde_json::Value, pointer: &str) -> f64 {
    let number = value
        .pointer(pointer)
        .and_then(serde_json::Value::as_f64)
        .unwrap_or_else(|| panic!("{pointer} missing or not a number in {value}"));
    assert!(number > 0.0, "{pointer} = {number}");
    number
}

#[test]
fn probe_json_reports_positive_latencies() {
    let path = temp_path("json");
    let output = tally(&["probe", "--json", "--iterations", "20", "--size", "8M"], &[&path]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "status {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    assert!(!path.exists(), "the probe removes the file it created");

    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["path"].as_str(), path.to_str());
    assert!(report["direct"].is_boolean());
    assert!(report["io_uring"].is_boolean());
    for what in ["write_4k_us", "fdatasync_us", "fua_write_us"] {
        let p50 = positive(&report, &format!("/{what}/p50"));
        let p99 = positive(&report, &format!("/{what}/p99"));
        assert!(p99 >= p50, "{what}: p99 {p99} < p50 {p50}");
    }
    let ceiling = positive(&report, "/ceiling_commits_per_sec");
    let flush_p50 = positive(&report, "/fdatasync_us/p50");
    assert!((ceiling * flush_p50 / 1e6 - 1.0).abs() < 1e-6, "ceiling = 1 / median flush");
    positive(&report, "/ceiling_commits_per_sec_fua");
    positive(&report, "/machine/cpu_count");
    assert!(!report["machine"]["kernel"].as_str().unwrap().is_empty());
    assert_eq!(report["iterations"].as_u64(), Some(20));
    assert_eq!(positive(&report, "/size_bytes"), 8.0 * 1024.0 * 1024.0);
    // The counters: a write, a write + flush, and a FUA write per iteration (warm-up included).
    let writes = positive(&report, "/stats/writes");
    assert_eq!(positive(&report, "/stats/flushes"), writes / 3.0);
    assert_eq!(positive(&report, "/stats/fua_writes"), writes / 3.0);
}

#[test]
fn probe_bad_path_exits_2_with_a_message() {
    let path = temp_path("no-such-dir").join("file");
    let output = tally(&["probe"], &[&path]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("does not exist"), "stderr: {stderr}");
    assert!(output.stdout.is_empty());
}

#[test]
fn probe_refuses_a_file_with_data() {
    let path = temp_path("data");
    std::fs::write(&path, b"keep me").unwrap();
    let output = tally(&["probe"], &[&path]);
    let contents = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("--force"));
    assert_eq!(contents, b"keep me");
}

//! The command line on NBD exports (issue 18): `mkfs`, `mount`, `umount`, `fsck`, `inspect`,
//! `probe` and `bench tx` take `nbd+unix://` and `nbd://` URIs, against a real `nbdkit` (memory
//! plugin) started by the test; bad URIs and unreachable servers give clear errors and the
//! bad-input or I/O exit codes. Needs nbdkit and, for the mount, FUSE: under CI both must be
//! there.

mod common;
#[path = "../../tally-media/tests/nbd_common/mod.rs"]
mod nbd_common;

use std::fs;
use std::path::Path;

use common::{code, mount_daemon, stderr, stdout, tally, text};
use nbd_common::{have, Nbdkit, Scratch};

/// `tally ARGS` with a URI as the last argument.
fn tally_uri(args: &[&str], uri: &str) -> std::process::Output {
    tally(&[args, &[uri]].concat(), &[])
}

#[test]
fn mkfs_mount_write_umount_fsck_over_nbd() {
    if !have("nbdkit") {
        return;
    }
    common::require_fuse!();
    let dir = Scratch::new("nbd-cli");
    let server = Nbdkit::start(&dir.path("s.sock"), &[], &["memory", "256M"]);
    let uri = server.uri.as_str();

    // The export's size is the server's.
    let out = tally_uri(&["mkfs", "--size", "1G"], uri);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(stderr(&out).contains("drop --size"), "{}", text(&out));
    let out = tally_uri(&["mkfs", "--streams", "4"], uri);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(stdout(&out).contains("made a Tally file system on nbd+unix://"), "{}", text(&out));
    // Made once, refused without --force.
    let out = tally_uri(&["mkfs"], uri);
    assert_eq!(code(&out), 3, "{}", text(&out));
    assert!(stderr(&out).contains("holds a Tally file system"), "{}", text(&out));

    let (mnt, log) = (dir.path("mnt"), dir.path("log"));
    fs::create_dir_all(&mnt).unwrap();
    let files: Vec<(String, Vec<u8>)> = (0..40u32)
        .map(|i| (format!("f{i}"), (0..(i * 997 + 10)).map(|b| (b ^ i) as u8).collect()))
        .collect();
    {
        let (out, _guard) = mount_daemon(Path::new(uri), &mnt, &log);
        assert!(stdout(&out).contains("mounted on"), "{}", text(&out));
        // A second mount of the same export on this machine is refused.
        let mnt2 = dir.path("mnt2");
        fs::create_dir_all(&mnt2).unwrap();
        let out = tally(&["mount", "--log"], &[&log, Path::new(uri), &mnt2]);
        assert_eq!(code(&out), 2, "{}", text(&out));
        assert!(stderr(&out).contains("in use"), "{}", text(&out));
        fs::create_dir(mnt.join("d")).unwrap();
        for (name, data) in &files {
            fs::write(mnt.join("d").join(name), data).unwrap();
        }
        fs::rename(mnt.join("d/f0"), mnt.join("moved")).unwrap();
        // fsck refuses an export a mount serves; inspect warns and shows it.
        let out = tally_uri(&["fsck"], uri);
        assert_eq!(code(&out), 3, "{}", text(&out));
        let out = tally(&["umount"], &[&mnt]);
        assert_eq!(code(&out), 0, "{}", text(&out));
        assert!(stdout(&out).contains("written its snapshot"), "{}", text(&out));
    }
    let out = tally_uri(&["fsck", "--json"], uri);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(report["status"], "clean", "{report}");
    assert_eq!(report["mount"]["from_snapshot"], true, "{report}");
    assert!(report["checked"]["inodes"].as_u64().unwrap() >= 42, "{report}");
    let out = tally_uri(&["inspect", "--json"], uri);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let shown: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(shown["streams"].as_array().unwrap().len(), 4, "{shown}");

    // Everything is there when mounted again.
    {
        let (_out, _guard) = mount_daemon(Path::new(uri), &mnt, &log);
        assert_eq!(fs::read(mnt.join("moved")).unwrap(), files[0].1);
        for (name, data) in &files[1..] {
            assert_eq!(&fs::read(mnt.join("d").join(name)).unwrap(), data, "{name}");
        }
        let out = tally(&["umount"], &[&mnt]);
        assert_eq!(code(&out), 0, "{}", text(&out));
    }
    let out = tally_uri(&["fsck"], uri);
    assert_eq!(code(&out), 0, "{}", text(&out));
}

#[test]
fn probe_and_bench_tx_run_on_an_export() {
    if !have("nbdkit") {
        return;
    }
    let dir = Scratch::new("nbd-cli");
    let server = Nbdkit::start(&dir.path("s.sock"), &[], &["memory", "64M"]);
    let uri = server.uri.as_str();
    let out = tally_uri(&["probe", "--iterations", "20", "--json"], uri);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(report["flush"], true, "nbdkit's memory plugin takes flushes: {report}");
    assert!(report["timings"]["write_flush_us"]["p50"].as_f64().unwrap() > 0.0, "{report}");
    // Now the export holds data: refused without --force.
    let out = tally_uri(&["probe", "--iterations", "5"], uri);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(stderr(&out).contains("--force"), "{}", text(&out));

    let bench = |extra: &[&str]| {
        let path = format!("--path={uri}");
        let mut args = vec!["bench", "tx", path.as_str(), "--seconds", "0.3", "--runs", "1"];
        args.extend_from_slice(&["--modes", "count,ordered", "--threads", "2", "--json"]);
        args.extend_from_slice(extra);
        tally(&args, &[])
    };
    let out = bench(&[]);
    assert_eq!(code(&out), 2, "the export is overwritten only with --force: {}", text(&out));
    for (connections, want) in [("2", "nbd, 2 connection(s)"), ("1", "nbd, 1 connection(s)")] {
        let out = bench(&["--force", "--connections", connections]);
        assert_eq!(code(&out), 0, "{}", text(&out));
        let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
        assert_eq!(report["config"]["engine"], want, "{report}");
        for mode in report["modes"].as_array().unwrap() {
            assert!(mode["tx_per_sec"]["median"].as_f64().unwrap() > 0.0, "{mode}");
        }
    }
}

#[test]
fn bad_uris_and_unreachable_servers_are_clear_errors() {
    let dir = Scratch::new("nbd-cli");
    let gone = format!("nbd+unix:///?socket={}", dir.path("nobody.sock").display());
    let mnt = dir.path("mnt");
    fs::create_dir_all(&mnt).unwrap();
    // (command, URI, exit code, words the message must hold)
    let cases: Vec<(Vec<&str>, String, i32, &str)> = vec![
        (vec!["fsck"], "nbds://example.com/x".into(), 2, "TLS (nbds) is not supported"),
        (vec!["inspect"], "nbd+unix:///x".into(), 2, "needs ?socket=PATH"),
        (vec!["mkfs"], "nbd://host:99999/x".into(), 2, "bad host or port"),
        (vec!["probe"], "nbds+unix:///?socket=/x".into(), 2, "TLS"),
        (vec!["fsck"], gone.clone(), 8, "cannot connect"),
        (vec!["inspect"], gone.clone(), 8, "cannot connect"),
        (vec!["mkfs"], gone.clone(), 1, "cannot connect"),
        (vec!["probe"], gone.clone(), 1, "cannot connect"),
        (vec!["bench", "tx", "--force", "--path"], gone.clone(), 1, "cannot connect"),
    ];
    for (args, uri, want, words) in cases {
        let out = tally_uri(&args, &uri);
        assert_eq!(code(&out), want, "{args:?} {uri}: {}", text(&out));
        assert!(stderr(&out).contains(words), "{args:?} {uri}: {}", text(&out));
    }
    // The daemon connects after it forks; the parent still reports the failure.
    if common::fuse_unavailable().is_none() {
        let out = tally(&["mount", "--log"], &[&dir.path("log"), Path::new(&gone), &mnt]);
        assert_eq!(code(&out), 1, "{}", text(&out));
        assert!(stderr(&out).contains("cannot connect"), "{}", text(&out));
    }
    let out = tally(&["mount", "nbds://x/y"], &[&mnt]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(stderr(&out).contains("TLS"), "{}", text(&out));
}

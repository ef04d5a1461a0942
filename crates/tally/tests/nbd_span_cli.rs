//! Multi-target images on the command line (issue 18): `tally mkfs A B C` over three `nbdkit`
//! exports, `mount`, `umount`, `fsck` and `inspect` given the same list; a missing, swapped,
//! repeated or foreign target, and one target given alone, are refused with the target's place
//! named and exit 2; each target's block 0 holds its target header (checked through
//! `tally_media::TargetHeader`); `probe` probes each target of the list. Needs nbdkit and, for the mount, FUSE: under CI both must be
//! there.

mod common;
#[path = "../../tally-media/tests/nbd_common/mod.rs"]
mod nbd_common;

use std::fs;
use std::path::Path;

use common::{code, mount_daemon, stderr, stdout, tally, text};
use nbd_common::{have, Nbdkit, Scratch};
use tally_media::{Device, NbdDevice, NbdOptions, TargetHeader};

/// `tally ARGS URIS...`.
fn tally_uris(args: &[&str], uris: &[&str]) -> std::process::Output {
    tally(&[args, uris].concat(), &[])
}

fn header_of(uri: &str) -> TargetHeader {
    let dev = NbdDevice::open_uri(uri, NbdOptions::default()).unwrap();
    let mut block = vec![0u8; dev.geometry().block_size as usize];
    dev.read(0, &mut block).unwrap();
    TargetHeader::decode(&block).unwrap()
}

#[test]
fn a_file_system_over_three_exports() {
    if !have("nbdkit") {
        return;
    }
    common::require_fuse!();
    let dir = Scratch::new("nbd-span-cli");
    let servers: Vec<Nbdkit> = (0..4)
        .map(|i| Nbdkit::start(&dir.path(&format!("s{i}.sock")), &[], &["memory", "64M"]))
        .collect();
    let uris: Vec<&str> = servers.iter().map(|s| s.uri.as_str()).collect();
    let (a, b, c, spare) = (uris[0], uris[1], uris[2], uris[3]);

    // Several images are NBD URIs only.
    let out = tally(&["mkfs", a], &[&dir.path("x.img")]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(stderr(&out).contains("is not an NBD URI"), "{}", text(&out));
    let out = tally_uris(&["mkfs", "--streams", "4"], &[a, b, c]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(stdout(&out).contains("over 3 targets"), "{}", text(&out));
    // Every target names the set and its place; the set is the same on all three.
    let headers: Vec<TargetHeader> = [a, b, c].iter().map(|u| header_of(u)).collect();
    for (i, h) in headers.iter().enumerate() {
        assert_eq!(usize::from(h.target_index), i);
        assert_eq!(h.set_uuid, headers[0].set_uuid);
        assert_eq!(h.target_uuids, headers[0].target_uuids);
        assert_eq!(h.stripe_blocks, 1024, "one 4 MiB segment per stripe");
    }
    // Made once, refused without --force.
    let out = tally_uris(&["mkfs"], &[a, b, c]);
    assert_eq!(code(&out), 3, "{}", text(&out));

    let refused = |list: &[&str], want: &str| {
        for command in ["fsck", "inspect"] {
            let out = tally_uris(&[command], list);
            assert_eq!(code(&out), 2, "{command} {list:?}: {}", text(&out));
            assert!(stderr(&out).contains(want), "{command} {list:?}: {}", text(&out));
        }
    };
    refused(&[a, b], "the image has 3 targets, 2 given (missing: target 3)");
    refused(&[b], "the image has 3 targets, 1 given (missing: targets 1, 3)");
    refused(&[a, c, b], "target 2 is the image's target 3");
    refused(&[b, a, c], "target 1 is the image's target 2");
    refused(&[a, b, b], "targets 2 and 3 are the same target");
    refused(&[a, b, c, spare], "target 4 is not part of a multi-target Tally image");
    // A target of another set in the right place.
    let other: Vec<Nbdkit> = (0..2)
        .map(|i| Nbdkit::start(&dir.path(&format!("o{i}.sock")), &[], &["memory", "64M"]))
        .collect();
    let out = tally_uris(&["mkfs"], &[&other[0].uri, &other[1].uri]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    refused(&[a, &other[1].uri, c], "target 2 belongs to another image");

    let (mnt, log) = (dir.path("mnt"), dir.path("log"));
    fs::create_dir_all(&mnt).unwrap();
    let out = tally(&["mount", "--log"], &[&log, Path::new(a), Path::new(c), Path::new(b), &mnt]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(stderr(&out).contains("give the targets in their recorded order"), "{}", text(&out));
    // A missing target, at mount too.
    let out = tally(&["mount", "--log"], &[&log, Path::new(a), Path::new(b), &mnt]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(stderr(&out).contains("(missing: target 3)"), "{}", text(&out));

    // 11 MiB of files over four streams: every target holds some of them.
    let files: Vec<(String, Vec<u8>)> = (0..32u32)
        .map(|i| (format!("f{i}"), (0..(i * 9973 + 200_000)).map(|x| (x ^ i) as u8).collect()))
        .collect();
    let list = [Path::new(a), Path::new(b), Path::new(c)];
    {
        let out =
            tally(&["mount", "--log"], &[&[log.as_path()][..], &list, &[mnt.as_path()]].concat());
        assert_eq!(code(&out), 0, "{}", text(&out));
        let _guard = common::Unmount(mnt.clone());
        for (name, data) in &files {
            fs::write(mnt.join(name), data).unwrap();
        }
        let out = tally_uris(&["fsck"], &[a, b, c]);
        assert_eq!(code(&out), 3, "fsck while mounted: {}", text(&out));
        let out = tally(&["umount"], &[&mnt]);
        assert_eq!(code(&out), 0, "{}", text(&out));
        assert!(stdout(&out).contains("written its snapshot"), "{}", text(&out));
    }
    let out = tally_uris(&["fsck", "--json"], &[a, b, c]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(report["status"], "clean", "{report}");
    assert!(report["checked"]["data_blocks"].as_u64().unwrap() >= 2000, "{report}");
    let out = tally_uris(&["inspect", "--json"], &[a, b, c]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    // Every target took writes (the stripes spread the files): its first rows, after the
    // header and the lead blocks, hold some.
    for uri in [a, b, c] {
        let dev = NbdDevice::open_uri(uri, NbdOptions::default()).unwrap();
        let mut head = vec![0u8; 8 << 20];
        dev.read(3, &mut head).unwrap();
        assert!(head.iter().any(|&x| x != 0), "{uri} holds none of the files");
    }
    // Everything is there when mounted again.
    {
        let (_out, _guard) = mount_daemon(Path::new(&[a, b, c].join(" ")), &mnt, &log);
        for (name, data) in &files {
            assert_eq!(&fs::read(mnt.join(name)).unwrap(), data, "{name}");
        }
        let out = tally(&["umount"], &[&mnt]);
        assert_eq!(code(&out), 0, "{}", text(&out));
    }
}

/// `tally probe` takes the list too: each export is probed in turn (JSON: an array, one
/// object per target, in order); a list mixing a file with exports is refused.
#[test]
fn probe_takes_the_targets_of_a_multi_target_image() {
    if !have("nbdkit") {
        return;
    }
    let dir = Scratch::new("nbd-span-probe");
    let servers: Vec<Nbdkit> = (0..3)
        .map(|i| Nbdkit::start(&dir.path(&format!("p{i}.sock")), &[], &["memory", "64M"]))
        .collect();
    let uris: Vec<&str> = servers.iter().map(|s| s.uri.as_str()).collect();
    let out = tally_uris(&["probe", "--iterations", "5", "--json"], &uris);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let reports: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let list = reports.as_array().unwrap_or_else(|| panic!("not an array: {reports}"));
    assert_eq!(list.len(), 3, "{reports}");
    for (report, uri) in list.iter().zip(&uris) {
        assert_eq!(report["target"], *uri, "{report}");
        assert!(report["timings"]["write_flush_us"]["p50"].as_f64().unwrap() > 0.0, "{report}");
    }
    // The first probe wrote into the exports: the second needs --force.
    let out = tally_uris(&["probe", "--iterations", "5"], &uris);
    assert_eq!(code(&out), 2, "{}", text(&out));
    let out = tally_uris(&["probe", "--iterations", "5", "--force"], &uris);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert_eq!(stdout(&out).matches("(NBD export,").count(), 3, "{}", text(&out));
    let file = dir.path("local.img");
    let out = tally_uris(&["probe"], &[file.to_str().unwrap(), uris[0]]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(stderr(&out).contains("multi-target image"), "{}", text(&out));
}

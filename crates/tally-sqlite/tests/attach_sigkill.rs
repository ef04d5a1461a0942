//! `tally_sqlite::atomic` over two `ATTACH`ed databases in a writer process killed with SIGKILL
//! at random moments, hundreds of times: the split bank (`common::split`) on an image file
//! (`FileDevice`), the writer committing transfers one `atomic` group each and noting every
//! acknowledged one in a file beside the image; after each kill the image is recovered in this
//! process and checked:
//! - `PRAGMA integrity_check` is `ok` in both databases;
//! - the balances over both sum to the opening total and equal the model's after `n`
//!   transfers;
//! - both databases hold exactly transfers `1..=n`, the same `n`, every row the workload's,
//!   with `n` at least the transfers acknowledged and at most one more;
//! - no journal or super-journal file exists (the group commits with none).
//!
//! This is SQLite's guarantee checked from outside on a real process death (the crash
//! simulator, `tests/attach_crash.rs`, checks every device state instead). Mutant it must catch
//! (feature `mutants`): `group-commits-each-file` (each database commits on its own: a kill
//! between the two commits keeps half a transfer).

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::split;
use common::*;
use tally_fs::{Fs, MkfsOptions, MountOptions};
use tally_media::{Device, FileDevice, FileOptions};
use tally_sqlite::{TallyVfs, VfsMutant, VfsOptions};

const SEED: u64 = 0x17A7;
/// Set in the writer's environment: the image it opens.
const IMAGE_ENV: &str = "TALLY_SQLITE_SIGKILL_IMAGE";
/// Set in the writer's environment: the mutant it runs, by name, if any.
const MUTANT_ENV: &str = "TALLY_SQLITE_SIGKILL_MUTANT";

/// The file where the writer notes each acknowledged transfer ("ready" once it is running).
fn acks_of(image: &Path) -> PathBuf {
    image.with_extension("acks")
}

fn mount(image: &Path) -> Result<Fs, String> {
    let dev: Arc<dyn Device> =
        Arc::new(FileDevice::open(image, FileOptions::default()).map_err(|e| e.to_string())?);
    Fs::mount(dev, MountOptions::default()).map_err(|e| e.to_string())
}

/// The writer (this test binary again): transfers until killed.
#[test]
#[ignore = "run by a_writer_killed_at_random_points_leaves_both_databases_whole"]
fn attach_writer_child() {
    let Some(image) = std::env::var_os(IMAGE_ENV) else { return };
    let image = PathBuf::from(image);
    let mutant = std::env::var(MUTANT_ENV)
        .ok()
        .map(|name| *VfsMutant::ALL.iter().find(|m| m.name() == name).expect("a mutant's name"));
    let fs = Arc::new(mount(&image).unwrap());
    let options = VfsOptions { mutant, ..VfsOptions::default() };
    let vfs = TallyVfs::register(&vfs_name("sigkill-writer"), fs, options).unwrap();
    let db = split::open(&vfs);
    let have = split::look(&db, SEED).unwrap().transfers[0].len() as i64;
    let mut acks = OpenOptions::new().append(true).open(acks_of(&image)).unwrap();
    writeln!(acks, "ready").unwrap();
    for k in have + 1.. {
        split::apply(&db, &split::transfer(SEED, k)).unwrap();
        writeln!(acks, "{k}").unwrap();
    }
}

/// The last transfer the writer noted as acknowledged, if any; whether it said it was ready.
fn acked(image: &Path) -> (Option<i64>, bool) {
    let text = fs::read_to_string(acks_of(image)).unwrap_or_default();
    let ready = text.lines().any(|l| l == "ready");
    (text.lines().filter_map(|l| l.parse().ok()).next_back(), ready)
}

/// What is wrong with the recovered image, given `acked` transfers acknowledged; else the
/// number of transfers it holds.
fn judge(image: &Path, acked: i64) -> Result<i64, String> {
    let fs = Arc::new(mount(image).map_err(|e| format!("mount: {e}"))?);
    let mut names = root_names(&fs);
    names.sort();
    if names != ["a.db", "b.db"] {
        return Err(format!("files {names:?}"));
    }
    let vfs = TallyVfs::register(&vfs_name("sigkill-judge"), fs.clone(), VfsOptions::default())
        .map_err(|e| e.to_string())?;
    let db = split::try_open(&vfs).map_err(|e| format!("open: {e}"))?;
    let seen = split::look(&db, SEED).map_err(|e| format!("unreadable: {e}"))?;
    if seen.integrity != ["ok", "ok"] {
        return Err(format!("integrity_check: {:?}", seen.integrity));
    }
    let sum: i64 = seen.balances.iter().sum();
    if sum != TOTAL {
        return Err(format!("balances sum to {sum}, not {TOTAL} (half a transfer kept)"));
    }
    let [a, b] = &seen.transfers;
    if a != b {
        return Err(format!("main has {} transfers, b has {}", a.len(), b.len()));
    }
    let n = a.len() as i64;
    if *a != (1..=n).collect::<Vec<_>>() || !seen.rows_match {
        return Err(format!("the {n} transfers are not the workload's"));
    }
    if n < acked || n > acked + 1 {
        return Err(format!("{n} transfers, {acked} acknowledged"));
    }
    if seen.balances != split::model(SEED, n) {
        return Err(format!("balances are not those after {n} transfers"));
    }
    drop(db);
    drop(vfs);
    let fs = Arc::into_inner(fs).ok_or("the VFS kept the file system")?;
    fs.unmount().map_err(|e| format!("unmount: {e}"))?;
    Ok(n)
}

/// A fresh image holding the empty split bank, in a new directory.
fn fresh_image(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "tally-sqlite-sigkill-{}-{tag}-{}",
        std::process::id(),
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos()
    ));
    fs::create_dir_all(&dir).unwrap();
    let image = dir.join("image");
    File::create(&image).unwrap().set_len(64 << 20).unwrap();
    let dev: Arc<dyn Device> = Arc::new(FileDevice::open(&image, FileOptions::default()).unwrap());
    let fs = mkfs_mount(dev, &MkfsOptions::default());
    let vfs =
        TallyVfs::register(&vfs_name("sigkill-setup"), fs.clone(), VfsOptions::default()).unwrap();
    let db = split::open(&vfs);
    split::create(&db);
    drop(db);
    drop(vfs);
    Arc::into_inner(fs).unwrap().unmount().unwrap();
    image
}

fn spawn_writer(image: &Path, mutant: Option<VfsMutant>) -> Child {
    File::create(acks_of(image)).unwrap();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "attach_writer_child", "--ignored", "--nocapture", "--test-threads=1"])
        .env(IMAGE_ENV, image)
        .stdout(std::process::Stdio::null())
        .stderr(File::create(image.with_extension("log")).unwrap());
    if let Some(m) = mutant {
        cmd.env(MUTANT_ENV, m.name());
    }
    cmd.spawn().unwrap()
}

/// `kills` writers killed at seeded random moments, each image checked after; the kills made
/// and transfers kept, or the first thing found wrong.
fn kill_rounds(image: &Path, mutant: Option<VfsMutant>, kills: u64) -> Result<(u64, i64), String> {
    let mut rng = fastrand::Rng::with_seed(SEED);
    let mut transfers = 0;
    for kill in 1..=kills {
        let mut w = spawn_writer(image, mutant);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !acked(image).1 && w.try_wait().unwrap().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_micros(rng.u64(0..15_000)));
        let exited = w.try_wait().unwrap();
        w.kill().unwrap();
        w.wait().unwrap();
        if let Some(status) = exited {
            let said = fs::read_to_string(image.with_extension("log")).unwrap_or_default();
            return Err(format!("kill {kill}: the writer exited by itself ({status}): {said}"));
        }
        let (last, _) = acked(image);
        let acked = last.unwrap_or(transfers);
        transfers = judge(image, acked).map_err(|e| format!("kill {kill}: {e}"))?;
    }
    Ok((kills, transfers))
}

#[test]
fn a_writer_killed_at_random_points_leaves_both_databases_whole() {
    let image = fresh_image("clean");
    let started = Instant::now();
    let (kills, transfers) = kill_rounds(&image, None, 200).unwrap();
    eprintln!("{kills} writers killed in {:.1?}: {transfers} transfers kept", started.elapsed());
    assert!(transfers >= 100, "too few transfers to mean anything: {transfers}");
    let _ = fs::remove_dir_all(image.parent().unwrap());
}

#[cfg(feature = "mutants")]
#[test]
fn each_file_committing_on_its_own_is_caught_by_kills() {
    let image = fresh_image("mutant");
    let found = kill_rounds(&image, Some(VfsMutant::GroupCommitsEachFile), 200);
    eprintln!("group-commits-each-file: {found:?}");
    assert!(found.as_ref().is_err_and(|e| e.contains("half a transfer")), "{found:?}");
    let _ = fs::remove_dir_all(image.parent().unwrap());
}

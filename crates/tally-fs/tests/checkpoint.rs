//! Checkpoint snapshots (`docs/FS.md`, "Checkpoints and the replay budget"): recovery after a
//! crash reads the last checkpoint snapshot and what was written after it, however long the
//! history behind it.

use std::sync::Arc;

use tally_fs::{Fs, FsError, MkfsOptions, MountOptions, Owner, ROOT};
use tally_media::{Device, MemDevice};

const ME: Owner = Owner { uid: 1000, gid: 1000 };
const BS: u64 = 4096;
const SEGMENT_BLOCKS: u32 = 64;
const STREAMS: u16 = 2;
/// 256 KiB: a checkpoint every 64 blocks of log.
const BUDGET: u64 = 256 << 10;

fn fresh(blocks: u64) -> Arc<dyn Device> {
    let dev: Arc<dyn Device> = Arc::new(MemDevice::new(BS as u32, blocks).unwrap());
    let opts = MkfsOptions { streams: STREAMS, segment_blocks: SEGMENT_BLOCKS, uuid: None };
    Fs::mkfs(dev.clone(), &opts).unwrap();
    dev
}

fn mount_with(dev: &Arc<dyn Device>, budget: u64, mutant: Option<tally_fs::FsMutant>) -> Fs {
    let opts = MountOptions { replay_budget: Some(budget), mutant, ..MountOptions::default() };
    Fs::mount(dev.clone(), opts).unwrap()
}

/// What recovery may read at most: the replay budget, plus the whole segments a scan reads
/// around it (the segment the budget starts and ends in, and those it looks into past the end
/// for units proving damage: its next segment and stale ones those name), on every stream,
/// plus the checkpoint snapshot (a few blocks here). Independent of the history.
fn bound() -> u64 {
    let per_stream = BUDGET / BS + 5 * u64::from(SEGMENT_BLOCKS);
    per_stream * u64::from(STREAMS) + 16
}

/// A write-heavy loop (three files rewritten, one appended and truncated back), its process
/// killed after every round: the blocks read by each recovery stay under the budget's bound
/// at 10, 100 and 1,000 cycles, and what was synced is there.
#[test]
fn recovery_stays_flat_over_a_thousand_crash_cycles() {
    let dev = fresh(8192); // 32 MiB: the loop writes ~70 MiB, so cleaning runs too
    let fs = mount_with(&dev, BUDGET, None);
    let inos: Vec<u64> = (0..3)
        .map(|i| fs.create(None, ROOT, format!("f{i}").as_bytes(), 0o644, ME).unwrap().ino)
        .collect();
    fs.sync().unwrap();
    drop(fs);
    let mut reads = Vec::new();
    for cycle in 1..=1000u64 {
        let fs = mount_with(&dev, BUDGET, None);
        let r = fs.mount_report();
        assert!(
            r.blocks_read <= bound(),
            "cycle {cycle}: recovery read {} blocks, bound {}: {r:?}",
            r.blocks_read,
            bound()
        );
        if cycle > 1 {
            for (i, &ino) in inos.iter().enumerate() {
                let want = pattern(cycle - 1, i);
                assert_eq!(fs.read(ino, 0, want.len()).unwrap(), want, "cycle {cycle} file {i}");
            }
        }
        if [10, 100, 1000].contains(&cycle) {
            reads.push((cycle, r.blocks_read, r.transactions_replayed, r.time));
        }
        for (i, &ino) in inos.iter().enumerate() {
            fs.write(None, ino, 0, &pattern(cycle, i)).unwrap();
        }
        fs.sync().unwrap();
        drop(fs); // the crash: no unmount
    }
    for (cycle, blocks, txs, time) in &reads {
        println!("after {cycle} cycles: {blocks} blocks read, {txs} transactions, {time:?}");
    }
    let fs = mount_with(&dev, BUDGET, None);
    assert!(fs.fsck().is_clean());
}

fn pattern(cycle: u64, file: usize) -> Vec<u8> {
    let len = 5 * BS as usize + 100 * file;
    (0..len).map(|k| (k as u64 ^ cycle.wrapping_mul(31) ^ file as u64) as u8).collect()
}

/// Without checkpoints the same loop's recovery grows with the history (the contrast the
/// budget removes).
#[test]
fn without_a_budget_recovery_grows() {
    let dev = fresh(8192);
    let mut last = 0;
    for cycle in 0..60u64 {
        let fs = mount_with(&dev, 0, None);
        last = fs.mount_report().blocks_read;
        let f = fs.create(None, ROOT, format!("g{cycle}").as_bytes(), 0o644, ME).unwrap();
        fs.write(None, f.ino, 0, &pattern(cycle, 0).repeat(4)).unwrap();
        fs.sync().unwrap();
        drop(fs);
    }
    assert!(last > bound(), "{last} blocks read: the history did not grow the scan");
}

/// A clean unmount, a remount and a crash: the crash's recovery is as short as after a fresh
/// mkfs plus what is live (the mount after the unmount checkpointed the long history).
#[test]
fn a_clean_unmount_leaves_a_short_recovery() {
    let dev = fresh(8192);
    let fs = mount_with(&dev, 0, None); // a long history first, no checkpoints
    let f = fs.create(None, ROOT, b"f", 0o644, ME).unwrap();
    for round in 0..200u64 {
        fs.write(None, f.ino, 0, &pattern(round, 1)).unwrap();
    }
    fs.unmount().unwrap();
    let fs = mount_with(&dev, BUDGET, None);
    assert!(fs.mount_report().from_snapshot);
    fs.write(None, f.ino, 0, &pattern(7, 2)).unwrap();
    fs.sync().unwrap();
    drop(fs);
    let fs = mount_with(&dev, BUDGET, None);
    let r = fs.mount_report();
    assert!(r.from_checkpoint && r.blocks_read <= bound(), "{r:?}");
    assert_eq!(fs.read(f.ino, 0, 6 * BS as usize).unwrap()[..pattern(7, 2).len()], pattern(7, 2));
}

/// An unlink after a checkpoint, then cleaning that takes every older record of the name out
/// of the log: the unlink's tombstone must stay while the checkpoint snapshot (which still
/// holds the name) is in force. The mutant that drops it brings the file back after a crash.
fn unlink_after_checkpoint_then_clean(mutant: Option<tally_fs::FsMutant>) -> bool {
    let dev = fresh(4096);
    let fs = mount_with(&dev, 0, mutant);
    let f = fs.create(None, ROOT, b"victim", 0o644, ME).unwrap();
    fs.write(None, f.ino, 0, b"old").unwrap();
    fs.create(None, ROOT, b"other", 0o644, ME).unwrap();
    assert!(fs.checkpoint().unwrap());
    fs.unlink(None, ROOT, b"victim").unwrap();
    // A file on the root's stream, rewritten to move that stream on past the tombstone, then
    // cleaning of all but its current segment, three times over: the first pass relocates the
    // tombstone (the create is still in the log), later ones judge it alone.
    let stream = |ino: u64| ino % u64::from(STREAMS);
    let filler = (0..8)
        .map(|i| fs.create(None, ROOT, format!("fill{i}").as_bytes(), 0o644, ME).unwrap().ino)
        .find(|&ino| stream(ino) == stream(ROOT))
        .unwrap();
    for round in 0..3u64 {
        for part in 0..3u64 {
            let bytes = pattern(round * 3 + part, 0).repeat(4); // 20 blocks
            fs.write(None, filler, part * bytes.len() as u64, &bytes).unwrap();
        }
        fs.sync().unwrap();
        match fs.clean(stream(ROOT) as u16, usize::MAX) {
            Ok(_) | Err(FsError::NoSpace | FsError::Busy) => {}
            Err(e) => panic!("clean: {e}"),
        }
    }
    fs.sync().unwrap();
    drop(fs);
    let fs = mount_with(&dev, 0, None);
    assert!(fs.mount_report().from_checkpoint);
    let named = fs.readdir(ROOT, 0).unwrap().iter().any(|e| e.name == b"victim");
    named || fs.lookup(ROOT, b"victim").is_ok() || !fs.fsck().is_clean()
}

#[test]
fn a_tombstone_after_a_checkpoint_survives_cleaning() {
    assert!(!unlink_after_checkpoint_then_clean(None), "the unlinked file came back");
}

#[cfg(feature = "mutants")]
#[test]
fn the_checkpoint_tombstone_mutant_brings_the_file_back() {
    let m = Some(tally_fs::FsMutant::CheckpointTombstoneDropped);
    assert!(unlink_after_checkpoint_then_clean(m), "mutant not caught");
}

/// A file written and never synced, then a checkpoint snapshot, then power lost: on a disk
/// that keeps only what was flushed, the mount starts from that checkpoint and the file reads
/// back as written. The checkpoint takes the log's positions under the state lock and makes
/// everything up to them durable afterwards, without it; the snapshot and the superblock that
/// points at it come only after that. Returns what went wrong, if anything.
fn checkpoint_then_power_loss(mutant: Option<tally_log::Mutant>) -> Option<String> {
    use tally_sim::{CrashConfig, CrashDevice};
    let geometry = MemDevice::new(BS as u32, 4096).unwrap().geometry();
    let sim = Arc::new(CrashDevice::new(geometry, CrashConfig::with_seed(5)));
    let dev: Arc<dyn Device> = sim.clone();
    let opts = MkfsOptions { streams: STREAMS, segment_blocks: SEGMENT_BLOCKS, uuid: None };
    Fs::mkfs(dev.clone(), &opts).unwrap();
    let fs = Fs::mount(
        dev,
        MountOptions { replay_budget: Some(0), log_mutant: mutant, ..MountOptions::default() },
    )
    .unwrap();
    let f = fs.create(None, ROOT, b"f", 0o644, ME).unwrap().ino;
    let data = pattern(7, 1).repeat(3);
    fs.write(None, f, 0, &data).unwrap();
    if !fs.checkpoint().unwrap() {
        return Some("no checkpoint written".into());
    }
    // Power lost: only what was flushed is on the media.
    let image = sim.durable_image().clone();
    drop(fs);
    let dev: Arc<dyn Device> = Arc::new(CrashDevice::from_image(image, CrashConfig::with_seed(6)));
    let fs = match Fs::mount(dev, MountOptions::default()) {
        Ok(fs) => fs,
        Err(e) => return Some(format!("the mount after the crash failed: {e}")),
    };
    if !fs.mount_report().from_checkpoint {
        return Some("the mount did not start from the checkpoint".into());
    }
    match fs.read(f, 0, data.len()) {
        Ok(read) if read == data => {}
        Ok(_) => return Some("the file reads back other bytes".into()),
        Err(e) => return Some(format!("the file does not read back: {e}")),
    }
    let report = fs.fsck();
    (!report.is_clean()).then(|| format!("fsck: {:?}", report.problems))
}

#[test]
fn a_checkpoint_names_only_durable_blocks() {
    assert_eq!(checkpoint_then_power_loss(None), None);
}

#[cfg(feature = "mutants")]
#[test]
fn the_checkpoint_before_durable_mutant_is_caught() {
    let caught = checkpoint_then_power_loss(Some(tally_log::Mutant::CheckpointBeforeDurable));
    assert!(caught.is_some(), "mutant not caught");
}

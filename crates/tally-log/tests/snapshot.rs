//! Clean close: the snapshot is used once, checked, and never trusted after a later crash.

use std::sync::Arc;

use tally_log::{Log, LogConfig, Mutant, OpenOptions, Recovery, Transaction};
use tally_media::{Device, MemDevice};

fn fresh(blocks: u64) -> Arc<MemDevice> {
    let dev = Arc::new(MemDevice::new(512, blocks).unwrap());
    Log::format(&*dev, &LogConfig { streams: 2, segment_blocks: 16, uuid: [3; 16] }).unwrap();
    dev
}

fn open(dev: &Arc<MemDevice>, mutant: Option<Mutant>) -> (Log, Recovery) {
    Log::open(dev.clone(), OpenOptions { mutant, ..OpenOptions::default() }).unwrap()
}

fn commit(log: &Log, stream: u16, tag: &str) {
    let mut t = Transaction::new(stream);
    t.record(tag.as_bytes().to_vec());
    log.commit_durable(t).unwrap();
}

fn tags(r: &Recovery) -> Vec<String> {
    r.streams
        .iter()
        .flat_map(|s| &s.txs)
        .flat_map(|t| t.records.iter().map(|r| String::from_utf8_lossy(r).into_owned()))
        .collect()
}

#[test]
fn clean_close_reopens_without_scanning_and_continues() {
    let dev = fresh(400);
    let (log, _) = open(&dev, None);
    for i in 0..30 {
        commit(&log, i % 2, &format!("t{i}"));
    }
    assert!(log.close_clean(b"state of the layer above").unwrap());

    let (log, r) = open(&dev, None);
    assert_eq!(r.snapshot.as_deref(), Some(&b"state of the layer above"[..]));
    assert!(tags(&r).is_empty(), "opened from the snapshot, nothing replayed");
    let snapshot_blocks = r.blocks_scanned;
    commit(&log, 0, "after");
    drop(log); // crash

    // A crash after a snapshot open: the log is scanned and holds everything.
    let (_log, r) = open(&dev, None);
    assert_eq!(r.snapshot, None);
    let t = tags(&r);
    assert_eq!(t.len(), 31);
    assert!(
        snapshot_blocks * 4 < r.blocks_scanned,
        "{snapshot_blocks} vs a scan's {}",
        r.blocks_scanned
    );
    assert!(t.contains(&"t0".to_string()) && t.contains(&"after".to_string()));
}

#[test]
fn a_damaged_snapshot_is_ignored_and_the_log_scanned() {
    let dev = fresh(400);
    let (log, _) = open(&dev, None);
    commit(&log, 0, "a");
    commit(&log, 1, "b");
    assert!(log.close_clean(&[7u8; 3000]).unwrap());
    // Find the snapshot's header by its magic and damage a byte of its payload.
    let bs = 512;
    let blocks = dev.geometry().block_count;
    let mut found = None;
    for b in 2..blocks {
        let mut buf = vec![0u8; bs];
        dev.read(b, &mut buf).unwrap();
        if buf.starts_with(b"TALLYSN1") {
            found = Some(b);
        }
    }
    let at = found.expect("snapshot header on the device") + 2;
    let mut buf = vec![0u8; bs];
    dev.read(at, &mut buf).unwrap();
    buf[10] ^= 1;
    dev.write_sync(
        vec![tally_media::Write::new(at, tally_media::IoBuf::from_slice(&buf))],
        tally_media::WriteFlags::NONE,
    )
    .unwrap();
    let (_log, r) = open(&dev, None);
    assert_eq!(r.snapshot, None);
    assert_eq!(tags(&r), ["a", "b"]);
}

#[test]
fn a_snapshot_that_does_not_fit_is_skipped() {
    let dev = fresh(400);
    let (log, _) = open(&dev, None);
    commit(&log, 0, "a");
    assert!(!log.close_clean(&vec![1u8; 1 << 20]).unwrap());
    let (_log, r) = open(&dev, None);
    assert_eq!((r.snapshot.clone(), tags(&r)), (None, vec!["a".to_string()]));
}

/// The mutant keeps the pointer after a snapshot open: the crash after it brings the stale
/// snapshot back and loses a durable commit. The test proves the check above can fail.
#[cfg(feature = "mutants")]
#[test]
fn snapshot_kept_mutant_loses_a_durable_commit() {
    let dev = fresh(400);
    let (log, _) = open(&dev, None);
    commit(&log, 0, "a");
    assert!(log.close_clean(b"old").unwrap());
    let (log, r) = open(&dev, Some(Mutant::SnapshotKept));
    assert!(r.snapshot.is_some());
    commit(&log, 0, "durable");
    drop(log);
    let (_log, r) = open(&dev, Some(Mutant::SnapshotKept));
    assert_eq!(r.snapshot.as_deref(), Some(&b"old"[..]), "the stale snapshot is trusted again");
    assert!(!tags(&r).contains(&"durable".to_string()));
}

/// A payload larger than a segment, and than one write of the snapshot (1 MiB), comes back
/// byte for byte: the snapshot is written from the header, the streams' state and the payload
/// where they are, in pieces that cross both boundaries, and read back across segments.
#[test]
fn a_snapshot_larger_than_a_segment_and_a_write_comes_back_whole() {
    let dev = Arc::new(MemDevice::new(4096, 8192).unwrap());
    Log::format(&*dev, &LogConfig { streams: 2, segment_blocks: 384, uuid: [5; 16] }).unwrap();
    // 5 MiB and a bit over 1.5 MiB segments: four segments, the last one partly used.
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    let payload: Vec<u8> = (0..5 * 1024 * 1024 + 1234)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let (log, _) = open(&dev, None);
    commit(&log, 0, "a");
    commit(&log, 1, "b");
    assert!(log.close_clean(&payload).unwrap());
    let (log, r) = open(&dev, None);
    assert!(r.snapshot.as_deref() == Some(&payload[..]), "the payload came back changed");
    assert!(tags(&r).is_empty(), "opened from the snapshot, nothing replayed");
    // And as a checkpoint snapshot, kept across a crash (the log dropped, not closed).
    commit(&log, 0, "c");
    assert!(log.checkpoint_snapshot(&payload[1..]).unwrap());
    commit(&log, 1, "d");
    drop(log);
    let (_, r) = open(&dev, None);
    assert!(r.snapshot_is_checkpoint);
    assert!(r.snapshot.as_deref() == Some(&payload[1..]), "the checkpoint's payload changed");
    assert_eq!(tags(&r), ["d"], "only what followed the checkpoint is replayed");
}

/// A checkpoint snapshot handed over in many pieces (`Log::checkpoint_snapshot_parts`, as the
/// file system hands its inodes' encodings) comes back as their concatenation: pieces of
/// every size from empty to larger than a write (1 MiB) and than a segment, cut anywhere
/// across both boundaries.
#[test]
fn a_checkpoint_snapshot_in_pieces_comes_back_as_their_concatenation() {
    let dev = Arc::new(MemDevice::new(4096, 8192).unwrap());
    Log::format(&*dev, &LogConfig { streams: 2, segment_blocks: 384, uuid: [6; 16] }).unwrap();
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let whole: Vec<u8> = (0..5 * 1024 * 1024 + 777).map(|_| next() as u8).collect();
    // Cut points: many small pieces (some empty), then a few large ones.
    let mut cuts = vec![0usize];
    while *cuts.last().unwrap() < whole.len() {
        let last = *cuts.last().unwrap();
        let len = match cuts.len() {
            n if n < 20_000 => (next() % 300) as usize,
            n if n % 2 == 0 => 1_700_000,
            _ => 0,
        };
        cuts.push((last + len).min(whole.len()));
    }
    let parts: Vec<&[u8]> = cuts.windows(2).map(|w| &whole[w[0]..w[1]]).collect();
    assert!(parts.iter().any(|p| p.is_empty()) && parts.iter().any(|p| p.len() > 1 << 20));
    let (log, _) = open(&dev, None);
    commit(&log, 0, "a");
    assert!(log.checkpoint_snapshot_parts(&parts).unwrap());
    commit(&log, 1, "b");
    drop(log);
    let (_, r) = open(&dev, None);
    assert!(r.snapshot_is_checkpoint);
    assert!(r.snapshot.as_deref() == Some(&whole[..]), "the pieces came back changed");
    assert_eq!(tags(&r), ["b"], "only what followed the checkpoint is replayed");
}

/// A checkpoint snapshot in two steps: what is committed between `begin` (which takes the
/// streams' positions) and `finish` (which writes the snapshot with them) follows the
/// snapshot, so after a crash it is replayed on top, with what came after `finish`; what came
/// before `begin` is in the snapshot alone. A stream's positions after `begin` (a commit in a
/// segment of its own) do not confuse it.
#[test]
fn commits_between_a_checkpoints_two_steps_are_replayed_after_it() {
    let dev = fresh(4096);
    let (log, _) = open(&dev, None);
    commit(&log, 0, "before");
    let start = log.checkpoint_snapshot_begin().unwrap().expect("nothing open, all durable");
    // Spans a segment boundary (16 blocks of 512 bytes).
    for i in 0..20 {
        commit(&log, i % 2, &format!("during{i}"));
    }
    assert!(log.checkpoint_snapshot_finish(start, &[b"state".as_slice()]).unwrap());
    assert!(log.blocks_since_checkpoint_snapshot() > 0, "the commits during it were forgotten");
    commit(&log, 1, "after");
    drop(log);
    let (_, r) = open(&dev, None);
    assert!(r.snapshot_is_checkpoint);
    assert_eq!(r.snapshot.as_deref(), Some(&b"state"[..]));
    let mut got = tags(&r);
    got.sort();
    let mut want: Vec<String> = (0..20).map(|i| format!("during{i}")).collect();
    want.push("after".into());
    want.sort();
    assert_eq!(got, want, "replayed after the checkpoint");
}

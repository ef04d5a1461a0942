//! Corruption is not a torn tail: damage to a transaction that later units prove durable fails
//! the open (typed error, nothing written) instead of silently dropping every later commit;
//! salvage keeps the longest safe prefix and says exactly what it dropped.

use std::sync::Arc;

use tally_log::{Log, LogConfig, LogError, Mutant, OpenOptions, Recovery, Transaction};
use tally_media::{Device, IoBuf, MemDevice, Write, WriteFlags};

const BLOCK: u32 = 512;

fn fresh() -> Arc<MemDevice> {
    let dev = Arc::new(MemDevice::new(BLOCK, 600).unwrap());
    Log::format(&*dev, &LogConfig { streams: 2, segment_blocks: 32, uuid: [9; 16] }).unwrap();
    dev
}

fn open(dev: &Arc<MemDevice>, options: OpenOptions) -> Result<(Log, Recovery), LogError> {
    Log::open(dev.clone(), options)
}

fn plain() -> OpenOptions {
    OpenOptions::default()
}

/// Five durable commits of one record and one data block each on stream 0; returns the block of
/// each commit's data (the first commit gets seq 1: the first open after mkfs resumes there).
fn five_durable_appends(log: &Log) -> Vec<u64> {
    (0..5u8)
        .map(|i| {
            let mut t = Transaction::new(0);
            t.record(vec![b'r', i]);
            t.data(vec![i; BLOCK as usize]);
            let info = log.commit_durable(t).unwrap();
            assert_eq!(info.ticket.seq, u64::from(i) + 1);
            info.data_start
        })
        .collect()
}

fn flip_bit(dev: &MemDevice, block: u64, byte: usize) {
    let mut buf = vec![0u8; BLOCK as usize];
    dev.read(block, &mut buf).unwrap();
    buf[byte] ^= 0x10;
    dev.write_sync(vec![Write::new(block, IoBuf::from_slice(&buf))], WriteFlags::NONE).unwrap();
}

fn survivors(r: &Recovery, stream: usize) -> usize {
    r.streams[stream].txs.len()
}

/// What an open of a damaged log does: `Ok(true)` when it reports the damage (error, nothing
/// written), `Ok(false)` when it silently opens a shorter log.
fn reports_damage(dev: &Arc<MemDevice>, options: OpenOptions) -> Result<bool, String> {
    let before = dev.image();
    let writes_before = dev.stats().writes;
    match open(dev, options) {
        Err(LogError::DurableTransactionLost { stream, kept_seq, proven_seq, block }) => {
            if stream != 0 || kept_seq != 1 || proven_seq < 4 {
                return Err(format!("wrong report: stream {stream} kept {kept_seq} proven {proven_seq} block {block}"));
            }
            if dev.stats().writes != writes_before || dev.image() != before {
                return Err("the failed open wrote to the device".into());
            }
            Ok(true)
        }
        Err(e) => Err(format!("unexpected error {e}")),
        Ok((_, r)) => {
            if survivors(&r, 0) == 5 {
                return Err("damage not seen at all".into());
            }
            Ok(false)
        }
    }
}

#[test]
fn a_flipped_bit_in_durable_data_is_reported_not_truncated() {
    let dev = fresh();
    let (log, _) = open(&dev, plain()).unwrap();
    let data = five_durable_appends(&log);
    drop(log);
    flip_bit(&dev, data[1], 7);
    assert_eq!(reports_damage(&dev, plain()), Ok(true));
    // Opening again still fails the same way: nothing was written, no epoch bumped.
    assert_eq!(reports_damage(&dev, plain()), Ok(true));
}

#[test]
fn a_flipped_bit_in_a_durable_unit_header_is_reported() {
    let dev = fresh();
    let (log, _) = open(&dev, plain()).unwrap();
    let data = five_durable_appends(&log);
    drop(log);
    // The unit sits right before its data block.
    flip_bit(&dev, data[1] - 1, 20);
    assert_eq!(reports_damage(&dev, plain()), Ok(true));
}

#[test]
fn salvage_keeps_the_safe_prefix_and_says_what_it_dropped() {
    let dev = fresh();
    let (log, _) = open(&dev, plain()).unwrap();
    let data = five_durable_appends(&log);
    drop(log);
    flip_bit(&dev, data[1], 7);
    let (log, r) = open(&dev, OpenOptions { salvage: true, ..plain() }).unwrap();
    assert_eq!(survivors(&r, 0), 1);
    assert_eq!(r.damage.len(), 1, "{:?}", r.damage);
    let d = &r.damage[0];
    assert_eq!((d.stream, d.kept_seq), (0, 1));
    assert!(d.proven_seq >= 4, "{d:?}");
    assert_eq!(d.dropped_seqs, vec![2, 3, 4, 5], "{d:?}");
    // A crash right after the salvage, before anything new: what it dropped is not taken as
    // proof again.
    drop(log);
    let (log, r) = open(&dev, plain()).unwrap();
    assert_eq!(survivors(&r, 0), 1);
    assert!(r.damage.is_empty());
    // The salvaged log works and keeps working: new commits survive the next open.
    let mut t = Transaction::new(0);
    t.record(b"after salvage".to_vec());
    log.commit_durable(t).unwrap();
    drop(log);
    let (_, r) = open(&dev, plain()).unwrap();
    assert_eq!(survivors(&r, 0), 2);
    assert!(r.damage.is_empty());
}

#[test]
fn a_torn_tail_is_not_damage() {
    // Ordered commits never made durable, the last ones lost: a prefix, no error.
    let dev = fresh();
    let (log, _) = open(&dev, plain()).unwrap();
    let mut starts = Vec::new();
    for i in 0..4u8 {
        let mut t = Transaction::new(0);
        t.record(vec![b'o', i]);
        t.data(vec![i; BLOCK as usize]);
        starts.push(log.commit(t).unwrap().data_start);
    }
    log.sync().unwrap();
    drop(log);
    // The third commit's data "never reached the disk": no later unit proves it durable
    // (ordered commits carry the watermark of when they were placed: nothing durable yet).
    flip_bit(&dev, starts[2], 0);
    let (_, r) = open(&dev, plain()).unwrap();
    assert_eq!(survivors(&r, 0), 2);
    assert!(r.damage.is_empty());
}

#[test]
fn the_watermark_mutant_is_caught() {
    if !tally_log::mutants_available() {
        eprintln!("skipped: build without the `mutants` feature");
        return;
    }
    let dev = fresh();
    let (log, _) = open(&dev, plain()).unwrap();
    let data = five_durable_appends(&log);
    drop(log);
    flip_bit(&dev, data[1], 7);
    let mutant = OpenOptions { mutant: Some(Mutant::WatermarkIgnored), ..plain() };
    // The broken variant silently truncates: the check above would flag it.
    assert_eq!(reports_damage(&dev, mutant), Ok(false), "mutant watermark-ignored not caught");
}

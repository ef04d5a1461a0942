//! A sequence number is never written twice on a stream: recovery resumes above the stream's
//! reservation (`seq_limit`), not just above what its scan happened to see, so a dependency
//! `(stream, seq)` names one transaction for the life of the image.

use std::sync::Arc;

use tally_log::format::superblock::{Superblock, SB_BLOCKS};
use tally_log::{Log, LogConfig, OpenOptions, Transaction};
use tally_media::{Device, IoBuf, MemDevice, Write, WriteFlags};

const BLOCK: u32 = 512;

fn fresh() -> Arc<MemDevice> {
    let dev = Arc::new(MemDevice::new(BLOCK, 400).unwrap());
    Log::format(&*dev, &LogConfig { streams: 1, segment_blocks: 16, uuid: [5; 16] }).unwrap();
    dev
}

fn one_block_tx(log: &Log, tag: u8) -> (u64, u64) {
    let mut t = Transaction::new(0);
    t.record(vec![tag]);
    let info = log.commit(t).unwrap();
    // One unit, no data: the transaction is the block before its (empty) data run.
    (info.ticket.seq, info.data_start - 1)
}

fn superblock(dev: &MemDevice) -> Superblock {
    SB_BLOCKS
        .iter()
        .filter_map(|&b| {
            let mut buf = vec![0u8; BLOCK as usize];
            dev.read(b, &mut buf).unwrap();
            Superblock::decode(&buf, b).ok()
        })
        .max_by_key(|sb| sb.generation)
        .unwrap()
}

#[test]
fn seqs_of_unseen_orphans_are_never_given_again() {
    let dev = fresh();
    let (log, _) = Log::open(dev.clone(), OpenOptions::default()).unwrap();
    let txs: Vec<(u64, u64)> = (1..=4).map(|i| one_block_tx(&log, i)).collect();
    log.sync().unwrap();
    drop(log);
    // The second transaction never reached the disk; the third and fourth did (out of order):
    // orphans the scan does not even see (it stops at the gap).
    dev.write_sync(vec![Write::new(txs[1].1, IoBuf::zeroed(BLOCK as usize))], WriteFlags::NONE)
        .unwrap();
    let (log, r) = Log::open(dev.clone(), OpenOptions::default()).unwrap();
    assert_eq!(r.streams[0].txs.len(), 1);
    let highest_on_disk = txs[3].0;
    let (seq, _) = one_block_tx(&log, 9);
    assert!(seq > highest_on_disk, "seq {seq} given again (an orphan on the device has it)");
}

#[test]
fn the_reservation_is_renewed_durably_before_it_runs_out() {
    let dev = fresh();
    let small = OpenOptions { seq_reserve: 3, ..OpenOptions::default() };
    let (log, _) = Log::open(dev.clone(), small).unwrap();
    let seqs: Vec<u64> = (0..10).map(|i| one_block_tx(&log, i).0).collect();
    // Every number below the durable limit, consecutive within the run.
    let limit = superblock(&dev).streams[0].seq_limit;
    assert!(seqs.iter().all(|&s| s < limit), "{seqs:?} vs limit {limit}");
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    drop(log); // crash: nothing synced
    let (log, r) = Log::open(dev.clone(), small).unwrap();
    let (seq, _) = one_block_tx(&log, 42);
    assert!(seq >= limit && seq > seqs[9], "resumed at {seq}, limit was {limit}");
    assert!(r.streams[0].txs.len() <= 10);
}

//! `Log::segment_of`: device blocks to segments, `None` outside the segments.

use std::sync::Arc;

use tally_log::{Log, LogConfig, OpenOptions, Transaction};
use tally_media::{Device, MemDevice};

#[test]
fn blocks_map_to_their_segments_and_nothing_else() {
    let dev = Arc::new(MemDevice::new(4096, 1024).unwrap());
    let config = LogConfig { streams: 2, segment_blocks: 64, ..LogConfig::default() };
    Log::format(&*dev, &config).unwrap();
    let (log, _) = Log::open(dev.clone() as Arc<dyn Device>, OpenOptions::default()).unwrap();
    assert_eq!(log.segment_of(0), None, "superblock copy 0");
    assert_eq!(log.segment_of(1), None, "superblock copy 1");
    // A committed transaction's data lands in the first segment of its stream's chain.
    let mut tx = Transaction::new(0);
    tx.record(b"r".to_vec());
    tx.data(vec![7u8; 4096]);
    let info = log.commit_durable(tx).unwrap();
    let chain: Vec<u32> = log.segment_usage(0).unwrap().iter().map(|u| u.segment).collect();
    let segment = log.segment_of(info.data_start).expect("a data block is in a segment");
    assert!(chain.contains(&segment), "segment {segment} not in stream 0's chain {chain:?}");
    // Segments are 64 blocks: the block 64 further on is in the next segment.
    assert_eq!(log.segment_of(info.data_start + 64), Some(segment + 1));
    assert_eq!(log.segment_of(u64::MAX), None);
    let last_segment = (0..1024).rev().find_map(|b| log.segment_of(b)).unwrap();
    assert_eq!(log.segment_of(1023 + 64), None, "past the last segment {last_segment}");
}

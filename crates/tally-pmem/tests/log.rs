//! The log's API without crashes: reopen on a real mapping (/dev/shm), the ring wrapping many
//! times, and each refusal as its typed error.

use tally_media::{PmemDevice, PmemOptions};
use tally_pmem::{CommitMode, LogConfig, PmemLog, PmemLogError, Tuning};
use tally_sim::PmemSim;

#[test]
fn commits_survive_reopen_on_dev_shm() {
    let dir = std::path::Path::new("/dev/shm");
    if !dir.is_dir() {
        println!("skipped: no /dev/shm");
        return;
    }
    let path = dir.join(format!("tally-pmem-log-{}", std::process::id()));
    for mode in [CommitMode::Count, CommitMode::Classic] {
        let dev = PmemDevice::create(&path, 1 << 16, PmemOptions::default()).unwrap();
        let config = LogConfig { mode, ..LogConfig::default() };
        let mut log = PmemLog::format(&dev, &config, Tuning::default()).unwrap();
        for n in 1..=20u64 {
            let r = vec![n as u8; (n * 97) as usize];
            assert_eq!(log.commit(&[&r, b"x"]).unwrap(), n);
        }
        let s = log.stats();
        let fences_per_commit = if mode == CommitMode::Count { 1 } else { 2 };
        assert_eq!(
            (s.commits, s.fences),
            (20, 1 + 20 * fences_per_commit),
            "format's open + commits"
        );
        drop(log);
        drop(dev);
        let dev = PmemDevice::open(&path, PmemOptions::default()).unwrap();
        let (_log, txs) = PmemLog::open(&dev, Tuning::default()).unwrap();
        assert_eq!(txs.len(), 20);
        for (i, tx) in txs.iter().enumerate() {
            let n = i as u64 + 1;
            assert_eq!(tx.seq, n);
            assert_eq!(tx.records, vec![vec![n as u8; (n * 97) as usize], b"x".to_vec()]);
        }
    }
    let _ = std::fs::remove_file(&path);
}

#[test]
fn ring_wraps_many_times_and_recovers_from_the_head() {
    let sim = PmemSim::new(256 + 16 * 256);
    let mut log = PmemLog::format(&sim, &LogConfig::default(), Tuning::default()).unwrap();
    for n in 1..=200u64 {
        let r = vec![n as u8; (n as usize * 37) % 700];
        if log.free_units() < log.units_for(&[&r]) {
            log.release_before(log.newest_seq().unwrap()).unwrap();
        }
        assert_eq!(log.commit(&[&r]).unwrap(), n);
    }
    let oldest_live = 201 - {
        let (_l, txs) =
            PmemLog::open(&PmemSim::from_image(sim.durable_image()), Tuning::default()).unwrap();
        txs.len() as u64
    };
    let (_log, txs) = PmemLog::open(&sim, Tuning::default()).unwrap();
    assert_eq!(txs.first().unwrap().seq, oldest_live);
    assert_eq!(txs.last().unwrap().seq, 200);
    assert_eq!(txs.last().unwrap().records[0], vec![200u8; 200 * 37 % 700]);
}

#[test]
fn refusals_are_typed() {
    let sim = PmemSim::new(256 + 4 * 256);
    assert!(matches!(PmemLog::open(&sim, Tuning::default()), Err(PmemLogError::NotFormatted)));
    let bad = LogConfig { unit_size: 100, ..LogConfig::default() };
    assert!(matches!(
        PmemLog::format(&sim, &bad, Tuning::default()),
        Err(PmemLogError::BadConfig(_))
    ));
    let mut log = PmemLog::format(&sim, &LogConfig::default(), Tuning::default()).unwrap();
    assert!(matches!(log.commit(&[&[0u8; 5000]]), Err(PmemLogError::TooLarge { .. })));
    assert_eq!(log.commit(&[&[1u8; 400]]).unwrap(), 1); // 2 units
    assert!(matches!(log.commit(&[&[2u8; 600]]), Err(PmemLogError::Full { needed: 3, free: 2 })));
    assert!(matches!(log.release_before(7), Err(PmemLogError::NotLive { seq: 7 })));
    log.release_before(1).unwrap(); // the newest stays: nothing freed
    assert_eq!(log.free_units(), 2);
    // A damaged head (no transaction where it points) is corruption, not an empty log.
    drop(log);
    sim.store_u64_atomic(64, 3).unwrap();
    assert!(matches!(PmemLog::open(&sim, Tuning::default()), Err(PmemLogError::Corrupted { .. })));
}

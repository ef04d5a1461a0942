//! `tally bench recovery`: how fast [`Log::open`] scans a full log.
//!
//! A log of `log_mib` MiB (segments of 1 MiB by default, `streams` streams) is filled with
//! ordered commits of one data block and one small record each, round-robin over the streams,
//! until no stream can take another segment; then it is synced and closed. The device is
//! reopened and `Log::open` timed, `runs` times (each open bumps the epochs and rescans the
//! same chains). Reported: the log's scan time and blocks read (from [`tally_log::Recovery`]),
//! the log bytes covered per second of scan, the bytes actually read and the read requests made.
//!
//! Every open must recover exactly the transactions written; anything else is an error.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use tally_log::{CommitMode, Log, LogConfig, LogError, OpenOptions, Transaction};
use tally_media::{Device, DirectMode, FileDevice, FileOptions};

use crate::measure::Spread;
use crate::target::Target;
use crate::tx::{DATA_BLOCK_BYTES, RECORD_BYTES};
use crate::BenchError;

/// Blocks before the first segment (the two superblock copies).
const HEADER_BLOCKS: u64 = 2;

/// What `tally bench recovery` runs.
#[derive(Debug, Clone)]
pub struct RecoveryOptions {
    /// File to run on.
    pub path: PathBuf,
    /// Size of the log area, MiB.
    pub log_mib: u64,
    /// Streams in the log (scanned in parallel, one thread each).
    pub streams: u16,
    /// Blocks per segment.
    pub segment_blocks: u32,
    /// Timed opens.
    pub runs: u32,
    /// Keep the file afterwards.
    pub keep: bool,
    /// Use a file that holds data.
    pub force: bool,
}

impl Default for RecoveryOptions {
    fn default() -> Self {
        RecoveryOptions {
            path: PathBuf::new(),
            log_mib: 1024,
            streams: 2,
            segment_blocks: 256,
            runs: 3,
            keep: false,
            force: false,
        }
    }
}

/// One timed `Log::open`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RecoveryRun {
    /// `Recovery::scan_time`, seconds.
    pub scan_s: f64,
    /// Whole `Log::open` (scan + durable epoch bump), seconds.
    pub open_s: f64,
    /// `Recovery::blocks_scanned`.
    pub blocks_scanned: u64,
    /// Read requests the device served during the open.
    pub reads: u64,
    /// Bytes the device read during the open.
    pub bytes_read: u64,
    /// Log bytes covered per second of scan, MB/s (10^6).
    pub log_mb_per_s: f64,
    /// Bytes read per second of scan, MB/s (10^6).
    pub read_mb_per_s: f64,
    /// Transactions recovered.
    pub tx_recovered: u64,
}

/// Everything `tally bench recovery` measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RecoveryReport {
    /// Size of the log area, MiB.
    pub log_mib: u64,
    /// Streams.
    pub streams: u16,
    /// Blocks per segment.
    pub segment_blocks: u32,
    /// Transactions written.
    pub tx_written: u64,
    /// Log bytes written by the fill (units and data blocks).
    pub log_bytes: u64,
    /// Scan time, seconds.
    pub scan_s: Spread,
    /// Whole open, seconds.
    pub open_s: Spread,
    /// Log MB (10^6 bytes) covered per second of scan.
    pub log_mb_per_s: Spread,
    /// MB read per second of scan.
    pub read_mb_per_s: Spread,
    /// Average bytes per read request.
    pub bytes_per_read: f64,
    /// The opens.
    pub runs: Vec<RecoveryRun>,
    /// CPUs available (the scan uses one thread per stream).
    pub cpu_count: u32,
}

/// Fill a log and time its recovery; `progress` receives one line per step.
///
/// # Errors
/// Bad options or a refused path before anything is written; device and log failures; a
/// recovery that does not return every transaction written.
pub fn run(o: &RecoveryOptions, progress: &dyn Fn(&str)) -> Result<RecoveryReport, BenchError> {
    if o.log_mib == 0 || o.runs == 0 || o.streams == 0 || o.segment_blocks < 4 {
        return Err(BenchError::BadInput {
            reason: "log size, runs and streams must be at least 1, segments at least 4 blocks"
                .into(),
        });
    }
    let block_bytes = DATA_BLOCK_BYTES as u64;
    let segment_count = (o.log_mib << 20) / (u64::from(o.segment_blocks) * block_bytes);
    let size_bytes = (HEADER_BLOCKS + segment_count * u64::from(o.segment_blocks)) * block_bytes;
    progress(&format!("preparing {} ({} MiB)", o.path.display(), size_bytes >> 20));
    let target = Target::prepare(&o.path, size_bytes, false, o.keep, o.force)?;
    let file_options = FileOptions { direct: DirectMode::On, ..FileOptions::default() };

    progress(&format!("filling a {} MiB log with ordered commits", o.log_mib));
    let (tx_written, log_bytes) = {
        let device = Arc::new(FileDevice::open(target.path(), file_options)?);
        Log::format(
            &*device,
            &LogConfig {
                streams: o.streams,
                segment_blocks: o.segment_blocks,
                ..LogConfig::default()
            },
        )?;
        let (log, _) = Log::open(device, OpenOptions::default())?;
        let before = log.stats().device;
        let written = fill(&log, o.streams)?;
        log.sync()?;
        (written, (log.stats().device - before).bytes_written)
    };

    let mut runs = Vec::new();
    for r in 1..=o.runs {
        progress(&format!("open {r}/{}", o.runs));
        let device = Arc::new(FileDevice::open(target.path(), file_options)?);
        let before = device.stats();
        let started = Instant::now();
        let (log, recovery) = Log::open(device.clone(), OpenOptions::default())?;
        let open = started.elapsed();
        let read = device.stats() - before;
        drop(log);
        let tx_recovered: u64 = recovery.streams.iter().map(|s| s.txs.len() as u64).sum();
        if tx_recovered != tx_written {
            return Err(BenchError::Mismatch(format!(
                "wrote {tx_written} transactions, recovery returned {tx_recovered}"
            )));
        }
        let scan_s = recovery.scan_time.as_secs_f64();
        let rate = |bytes: u64| if scan_s > 0.0 { bytes as f64 / scan_s / 1e6 } else { 0.0 };
        let one = RecoveryRun {
            scan_s,
            open_s: open.as_secs_f64(),
            blocks_scanned: recovery.blocks_scanned,
            reads: read.reads,
            bytes_read: read.bytes_read,
            log_mb_per_s: rate(log_bytes),
            read_mb_per_s: rate(read.bytes_read),
            tx_recovered,
        };
        progress(&format!("  scan {:.2} s, {:.0} MB/s of log", one.scan_s, one.log_mb_per_s));
        runs.push(one);
    }
    drop(target);
    let spread = |f: fn(&RecoveryRun) -> f64| Spread::of(runs.iter().map(f));
    let (reads, bytes): (u64, u64) =
        runs.iter().fold((0, 0), |acc, r| (acc.0 + r.reads, acc.1 + r.bytes_read));
    Ok(RecoveryReport {
        log_mib: o.log_mib,
        streams: o.streams,
        segment_blocks: o.segment_blocks,
        tx_written,
        log_bytes,
        scan_s: spread(|r| r.scan_s),
        open_s: spread(|r| r.open_s),
        log_mb_per_s: spread(|r| r.log_mb_per_s),
        read_mb_per_s: spread(|r| r.read_mb_per_s),
        bytes_per_read: if reads == 0 { 0.0 } else { bytes as f64 / reads as f64 },
        runs,
        cpu_count: std::thread::available_parallelism()
            .map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX)),
    })
}

/// Commit round-robin over the streams until none can take another segment.
fn fill(log: &Log, streams: u16) -> Result<u64, BenchError> {
    let block = vec![0x5Au8; DATA_BLOCK_BYTES];
    let mut full = vec![false; usize::from(streams)];
    let mut written = 0u64;
    // Bounded by the log's size: every commit takes at least one block.
    while full.iter().any(|f| !f) {
        for s in 0..streams {
            if full[usize::from(s)] {
                continue;
            }
            let mut tx = Transaction::new(s);
            tx.data(block.clone());
            let mut record = [0u8; RECORD_BYTES];
            record[..8].copy_from_slice(&written.to_le_bytes());
            tx.record(record.to_vec());
            match log.commit_with(tx, CommitMode::Ordered) {
                Ok(_) => written += 1,
                Err(LogError::NoSpace { .. }) => full[usize::from(s)] = true,
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(written)
}

//! Transaction latency and throughput of the log on (emulated) persistent memory: count-based
//! commit (one fence) vs classic redo with a commit record (two fences) vs unordered (no flush,
//! no fence: the upper bound). One JSON object per system, size and run on stdout.
//! `bench/pmem.sh` runs it beside PMDK's libpmemobj and writes `docs/bench/pmem.md`.
//!
//! ```text
//! pmem_bench --dir /dev/shm --sizes 64,256,1024,4096 --txs 50000 --run 0
//! ```

use std::path::PathBuf;
use std::time::Instant;

use tally_media::{PmemDevice, PmemOptions};
use tally_pmem::{CommitMode, LogConfig, PmemLog, Tuning};

/// Small enough to stay paged in (every page is touched before timing), big enough that the
/// ring wraps many times per run.
const REGION_LEN: u64 = 8 << 20;

struct Args {
    dir: PathBuf,
    sizes: Vec<usize>,
    txs: usize,
    run: u32,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        dir: PathBuf::from("/dev/shm"),
        sizes: vec![64, 256, 1024, 4096],
        txs: 50_000,
        run: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--dir" => args.dir = PathBuf::from(value),
            "--sizes" => {
                args.sizes = value
                    .split(',')
                    .map(|s| s.parse().map_err(|e| format!("--sizes {s}: {e}")))
                    .collect::<Result<_, _>>()?;
            }
            "--txs" => args.txs = value.parse().map_err(|e| format!("--txs: {e}"))?,
            "--run" => args.run = value.parse().map_err(|e| format!("--run: {e}"))?,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(args)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse()?;
    let path = args.dir.join(format!("tally-pmem-bench-{}.pool", std::process::id()));
    let systems = [
        ("tally-count", CommitMode::Count, false),
        ("classic-redo", CommitMode::Classic, false),
        ("unordered", CommitMode::Count, true),
    ];
    for &size in &args.sizes {
        for (name, mode, unordered) in systems {
            let result = measure(&path, size, args.txs, mode, unordered);
            let _ = std::fs::remove_file(&path);
            let (mut lat, total_ns, stats, pmem_mode, flush_kind) = result?;
            lat.sort_unstable();
            let pct = |p: f64| lat[((lat.len() as f64 - 1.0) * p) as usize];
            let n = args.txs as f64;
            println!(
                "{{\"system\":\"{name}\",\"size\":{size},\"run\":{},\"txs\":{},\"ns_per_tx\":{:.1},\"tx_per_s\":{:.0},\"p50_ns\":{},\"p99_ns\":{},\"fences_per_tx\":{:.3},\"lines_per_tx\":{:.3},\"pmem_mode\":\"{pmem_mode}\",\"flush\":\"{flush_kind}\"}}",
                args.run,
                args.txs,
                total_ns as f64 / n,
                n * 1e9 / total_ns as f64,
                pct(0.5),
                pct(0.99),
                stats.fences as f64 / n,
                stats.lines_flushed as f64 / n,
            );
        }
    }
    Ok(())
}

type Measured = (Vec<u64>, u64, tally_pmem::LogStats, String, String);

fn measure(
    path: &std::path::Path,
    size: usize,
    txs: usize,
    mode: CommitMode,
    unordered: bool,
) -> Result<Measured, Box<dyn std::error::Error>> {
    let dev = PmemDevice::create(path, REGION_LEN, PmemOptions::default())?;
    // Touch every page first, so no timed commit takes a page fault on tmpfs.
    let zeros = vec![0u8; 1 << 20];
    for off in (0..REGION_LEN).step_by(zeros.len()) {
        dev.write(off, &zeros)?;
    }
    let config = LogConfig { mode, ..LogConfig::default() };
    let tuning = Tuning { unordered, ..Tuning::default() };
    let mut log = PmemLog::format(&dev, &config, tuning)?;
    let mut record = vec![0u8; size];
    let mut commit = |log: &mut PmemLog<'_>, i: usize| -> Result<(), tally_pmem::PmemLogError> {
        record[..8.min(size)].copy_from_slice(&(i as u64).to_le_bytes()[..8.min(size)]);
        let refs = [record.as_slice()];
        if log.free_units() < log.units_for(&refs) {
            if let Some(newest) = log.newest_seq() {
                log.release_before(newest)?;
            }
        }
        log.commit(&refs).map(|_| ())
    };
    for i in 0..txs / 10 {
        commit(&mut log, i)?; // warm-up: page the region in, fill the ring once
    }
    let before = log.stats();
    let mut lat = Vec::with_capacity(txs);
    let start = Instant::now();
    for i in 0..txs {
        let t = Instant::now();
        commit(&mut log, i)?;
        lat.push(t.elapsed().as_nanos() as u64);
    }
    let total_ns = start.elapsed().as_nanos() as u64;
    let s = log.stats();
    let stats = tally_pmem::LogStats {
        commits: s.commits - before.commits,
        fences: s.fences - before.fences,
        lines_flushed: s.lines_flushed - before.lines_flushed,
        bytes_cached: s.bytes_cached - before.bytes_cached,
        bytes_nt: s.bytes_nt - before.bytes_nt,
        atomic_stores: s.atomic_stores - before.atomic_stores,
    };
    Ok((lat, total_ns, stats, dev.mode().to_string(), dev.flush_kind().to_string()))
}

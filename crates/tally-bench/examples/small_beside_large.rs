//! How long small operations on one file wait while another thread streams large writes to a
//! second file, through the library (issue 16: operations on different files should not wait
//! for each other). Thread L writes 1 MiB at a time to its own file for `SECONDS`; thread S
//! meanwhile overwrites 4 KiB of another file and reads its attributes, in a loop, and records
//! each call's latency. Prints S's p50, p99 and worst, L's MiB/s, and the same for S alone.
//! No fsync: what is measured is the time an operation waits for the file system, not the
//! device's flush. Compare builds by running both in one session (ratios, not times):
//!
//! ```sh
//! cargo run --release -p tally-bench --example small_beside_large -- [SECONDS] [IMAGE_PATH]
//! ```
//!
//! The image (default: a 4 GiB file in the system's temporary directory) is made fresh and
//! removed at the end; L wraps around in a 512 MiB file so the log's cleaning runs too. A
//! maintenance thread runs beside them, as in `tally mount`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tally_fs::{Fs, Owner, ROOT};

const ME: Owner = Owner { uid: 0, gid: 0 };
const LARGE: usize = 1 << 20;
const LARGE_SPAN: u64 = 512 << 20;
const SMALL: usize = 4096;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Latencies of the small thread's calls, in microseconds, and the large thread's bytes.
struct Run {
    small_us: Vec<u64>,
    large_bytes: u64,
    took: Duration,
}

fn run(fs: &Arc<Fs>, seconds: u64, with_large: bool, round: u32) -> Res<Run> {
    let big = fs.create(None, ROOT, format!("large-{round}").as_bytes(), 0o644, ME)?.ino;
    let small = fs.create(None, ROOT, format!("small-{round}").as_bytes(), 0o644, ME)?.ino;
    fs.write(None, small, 0, &vec![1u8; 64 * SMALL])?;
    let stop = Arc::new(AtomicBool::new(false));
    let large = with_large.then(|| {
        let (fs, stop) = (fs.clone(), stop.clone());
        std::thread::spawn(move || -> Res<u64> {
            let buf: Vec<u8> = (0..LARGE).map(|i| (i % 253) as u8).collect();
            let (mut at, mut bytes) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                fs.write(None, big, at, &buf)?;
                bytes += LARGE as u64;
                at = (at + LARGE as u64) % LARGE_SPAN;
            }
            Ok(bytes)
        })
    });
    let buf = vec![2u8; SMALL];
    let began = Instant::now();
    let mut small_us = Vec::new();
    let mut i = 0u64;
    while began.elapsed() < Duration::from_secs(seconds) {
        let t = Instant::now();
        fs.write(None, small, (i % 64) * SMALL as u64, &buf)?;
        fs.getattr(small)?;
        small_us.push(u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX));
        i += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let took = began.elapsed();
    let large_bytes = match large {
        Some(h) => h.join().map_err(|_| "large writer panicked")??,
        None => 0,
    };
    small_us.sort_unstable();
    Ok(Run { small_us, large_bytes, took })
}

fn pct(v: &[u64], p: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

fn main() -> Res<()> {
    let mut args = std::env::args().skip(1);
    let seconds: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(5);
    let path = args.next().map_or_else(
        || std::env::temp_dir().join(format!("small-beside-large-{}.img", std::process::id())),
        std::path::PathBuf::from,
    );
    let fs = Arc::new(tally_bench::image::fresh_image_fs(&path, 4 << 30)?);
    // As `tally mount` runs it: checkpoints and cleaning off the operations' path.
    let maintenance = tally_fs::Maintenance::spawn(&fs, Duration::from_secs(5));
    for (round, with_large) in [(0, false), (1, true)] {
        let r = run(&fs, seconds, with_large, round)?;
        let mib_s = r.large_bytes as f64 / r.took.as_secs_f64() / f64::from(1 << 20);
        println!(
            "{:<14} small write+getattr: {:>8} calls, p50 {:>6} us, p99 {:>6} us, worst {:>7} us; large writer {:>7.1} MiB/s",
            if with_large { "beside large" } else { "alone" },
            r.small_us.len(),
            pct(&r.small_us, 0.50),
            pct(&r.small_us, 0.99),
            r.small_us.last().copied().unwrap_or(0),
            mib_s,
        );
    }
    drop(maintenance);
    tally_bench::image::unmount_and_remove(fs, &path)
}

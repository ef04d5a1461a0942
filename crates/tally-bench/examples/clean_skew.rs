//! Cleaning's write amplification under LFS's hot-and-cold skew (issue 15 part 3: ≤ 3 at 75 %
//! and ≤ 8 at 90 % full), beside uniform overwrites at the same fills and a 25 % floor, all in
//! one run on a 64 MiB memory device (4 streams, segments of 256 blocks, files of 992 KiB; the
//! workload of `tally bench fs-peers`'s cleaning section, `tally_bench::fs_peers::clean`).
//! Prints each measurement, then the medians and skewed ÷ uniform:
//!
//! ```sh
//! cargo run --release -p tally-bench --example clean_skew -- [RUNS] [FILLS, e.g. 0.75,0.9]
//! ```

use std::sync::Arc;

use tally_bench::fs_peers::clean::{measure, CleanRun, Skew};
use tally_media::{Device, MemDevice};

/// 64 MiB of 4 KiB blocks, as the fs-peers section's default.
const BLOCKS: u64 = 16_384;
const STREAMS: u16 = 4;
/// The fill whose write amplification is the log's own floor (little cleaning).
const FLOOR_FILL: f64 = 0.25;

fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let mid = v.get(v.len() / 2).copied().unwrap_or(f64::NAN);
    (mid, v.first().copied().unwrap_or(f64::NAN), v.last().copied().unwrap_or(f64::NAN))
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let runs: u64 = args.next().map_or(Ok(1), |a| a.parse())?;
    let fills: Vec<f64> = match args.next() {
        Some(a) => a.split(',').map(str::parse).collect::<Result<_, _>>()?,
        None => vec![0.75, 0.9],
    };
    let mut cases: Vec<(f64, &str, Skew)> = Vec::new();
    for &f in &fills {
        cases.push((f, "uniform", Skew::UNIFORM));
        cases.push((f, "hot/cold 90/10", Skew::HOT_COLD));
    }
    cases.push((FLOOR_FILL, "uniform", Skew::UNIFORM));
    println!("load at start {}", load());
    let mut results: Vec<Vec<CleanRun>> = cases.iter().map(|_| Vec::new()).collect();
    for run in 0..runs {
        for (k, (fill, name, skew)) in cases.iter().enumerate() {
            let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, BLOCKS)?);
            let t = std::time::Instant::now();
            let r = measure(&dev, *fill, STREAMS, run + 1, *skew)?;
            println!(
                "run {run} fill {fill} {name}: reached {:.2}, live {:.2}, {} files, {} \
                 overwrites measured, wa {:.2}, segments freed/MiB {:.2}, {:.0} overwrites/s, \
                 enospc {}, {:.1} s, load {}",
                r.reached,
                r.live,
                r.files,
                r.writes,
                r.wa,
                r.freed_per_mib,
                r.writes_per_s,
                r.enospc,
                t.elapsed().as_secs_f64(),
                load()
            );
            results[k].push(r);
        }
    }
    let floor = results.last().map(|r| median(r.iter().map(|x| x.wa).collect()).0);
    println!(
        "\n| fill | overwrites | write amplification, median [min–max] | ÷ uniform | ÷ floor |"
    );
    println!("|--:|--|--:|--:|--:|");
    for (k, (fill, name, _)) in cases.iter().enumerate() {
        let (m, lo, hi) = median(results[k].iter().map(|x| x.wa).collect());
        let uniform = cases
            .iter()
            .position(|c| c.0 == *fill && c.2 == Skew::UNIFORM)
            .map(|u| median(results[u].iter().map(|x| x.wa).collect()).0);
        println!(
            "| {:.0} % | {name} | {m:.2} [{lo:.2}–{hi:.2}] | {:.2}× | {:.2}× |",
            fill * 100.0,
            uniform.map_or(f64::NAN, |u| m / u),
            floor.map_or(f64::NAN, |f| m / f)
        );
    }
    println!("load at end {}", load());
    Ok(())
}

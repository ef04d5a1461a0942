//! How long letting go of data made durable keeps other operations waiting (issue 16: one slow
//! operation must not stall every other). Each of `ROUNDS` rounds writes `MIB` MiB to one file
//! in 1 MiB writes (held in memory until durable; under the 64 MiB cache limit by default, so
//! nothing is let go of before), then calls `sync` while another thread calls `getattr` on
//! another file in a loop. The sync flushes with the state lock given up, then lets go of the
//! bytes it made durable under it. Prints, per round, the sync's wall time and the longest
//! `getattr` call during it. Compare builds in one session (ratios, not times):
//!
//! ```sh
//! cargo run --release -p tally-bench --example prune_hold -- [MIB] [ROUNDS] [IMAGE_PATH]
//! ```
//!
//! The image (default: a 2 GiB file in the system's temporary directory) is made fresh and
//! removed at the end. Online checkpoints are off (replay budget 0) and no maintenance thread
//! runs, so the sync is the only thing that lets go of the data.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tally_fs::{MountOptions, Owner, ROOT};

const ME: Owner = Owner { uid: 0, gid: 0 };
const MIB: usize = 1 << 20;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn arg(args: &mut impl Iterator<Item = String>, default: u64) -> Res<u64> {
    Ok(args.next().map(|s| s.parse()).transpose()?.unwrap_or(default))
}

fn main() -> Res<()> {
    let mut args = std::env::args().skip(1);
    let mib = arg(&mut args, 60)?;
    let rounds = arg(&mut args, 5)?;
    let path = args.next().map_or_else(
        || std::env::temp_dir().join(format!("prune-hold-{}.img", std::process::id())),
        std::path::PathBuf::from,
    );
    let opts = MountOptions {
        write_behind: Some(tally_log::WriteBehind::default()),
        replay_budget: Some(0),
        ..MountOptions::default()
    };
    let fs = Arc::new(tally_bench::image::fresh_image_fs_with(&path, 2 << 30, opts)?);
    let big = fs.create(None, ROOT, b"big", 0o644, ME)?.ino;
    let small = fs.create(None, ROOT, b"small", 0o644, ME)?.ino;
    let buf = vec![7u8; MIB];
    for round in 0..rounds {
        for m in 0..mib {
            fs.write(None, big, m * MIB as u64, &buf)?;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let worst = Arc::new(AtomicU64::new(0));
        let probe = {
            let (fs, stop, worst) = (fs.clone(), stop.clone(), worst.clone());
            std::thread::spawn(move || -> Res<u64> {
                let mut calls = 0;
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    fs.getattr(small)?;
                    let us = u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX);
                    worst.fetch_max(us, Ordering::Relaxed);
                    calls += 1;
                }
                Ok(calls)
            })
        };
        // Let the probe start calling before the sync begins.
        std::thread::sleep(std::time::Duration::from_millis(20));
        worst.store(0, Ordering::Relaxed);
        let t = Instant::now();
        fs.sync()?;
        let took = t.elapsed();
        stop.store(true, Ordering::Relaxed);
        let calls = probe.join().map_err(|_| "probe panicked")??;
        println!(
            "round {round}: {mib} MiB written; sync {:.1} ms; longest getattr during it {:.2} ms ({calls} calls)",
            took.as_secs_f64() * 1e3,
            worst.load(Ordering::Relaxed) as f64 / 1e3,
        );
    }
    tally_bench::image::unmount_and_remove(fs, &path)
}

//! How long a checkpoint snapshot keeps other operations waiting, as the file system holds more
//! files (issue 16: one slow operation must not stall every other; issue 14 item 5: no cost that
//! grows with what is stored). Makes `FILES` empty files (1,000 per directory), takes a first
//! checkpoint (which encodes every inode), then `ROUNDS` times: changes `CHANGED` of the files
//! (a 4 KiB write each) and takes a checkpoint while another thread calls `getattr` on one file
//! in a loop. Prints, per round, the checkpoint's wall time and the longest `getattr` call
//! during it: the time the checkpoint held the state lock, as a user of the mount would see it.
//! Compare builds in one session (ratios, not times):
//!
//! ```sh
//! cargo run --release -p tally-bench --example checkpoint_hold -- [FILES] [CHANGED] [ROUNDS] [IMAGE_PATH]
//! ```
//!
//! The image (default: a 2 GiB file in the system's temporary directory) is made fresh and
//! removed at the end. Online checkpoints are off (replay budget 0) and no maintenance thread
//! runs, so the only checkpoints are the measured ones.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tally_fs::{MountOptions, Owner, ROOT};

const ME: Owner = Owner { uid: 0, gid: 0 };
const PER_DIR: u64 = 1000;
const PER_TXN: u64 = 100;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn arg(args: &mut impl Iterator<Item = String>, default: u64) -> Res<u64> {
    Ok(args.next().map(|s| s.parse()).transpose()?.unwrap_or(default))
}

fn main() -> Res<()> {
    let mut args = std::env::args().skip(1);
    let files = arg(&mut args, 200_000)?;
    let changed = arg(&mut args, 10_000)?.min(files);
    let rounds = arg(&mut args, 3)?;
    let path = args.next().map_or_else(
        || std::env::temp_dir().join(format!("checkpoint-hold-{}.img", std::process::id())),
        std::path::PathBuf::from,
    );
    let opts = MountOptions {
        write_behind: Some(tally_log::WriteBehind::default()),
        replay_budget: Some(0),
        ..MountOptions::default()
    };
    let fs = Arc::new(tally_bench::image::fresh_image_fs_with(&path, 2 << 30, opts)?);

    let began = Instant::now();
    let mut inos = Vec::with_capacity(usize::try_from(files)?);
    let mut dir = ROOT;
    let mut txn = None;
    for i in 0..files {
        if i % PER_DIR == 0 {
            dir = fs.mkdir(None, ROOT, format!("d{}", i / PER_DIR).as_bytes(), 0o755, ME)?.ino;
        }
        if i % PER_TXN == 0 {
            if let Some(t) = txn.take() {
                fs.commit(t)?;
            }
            txn = Some(fs.begin()?);
        }
        inos.push(fs.create(txn.as_ref(), dir, format!("f{i}").as_bytes(), 0o644, ME)?.ino);
    }
    if let Some(t) = txn.take() {
        fs.commit(t)?;
    }
    fs.sync()?;
    let t = Instant::now();
    fs.checkpoint()?;
    println!(
        "{files} files made in {:.1} s; first checkpoint (every inode encoded) {:.1} ms",
        began.elapsed().as_secs_f64(),
        t.elapsed().as_secs_f64() * 1e3
    );

    let block = vec![7u8; 4096];
    let step = (files / changed.max(1)).max(1);
    for round in 0..rounds {
        for k in 0..changed {
            let ino = inos[usize::try_from((k * step + round) % files)?];
            fs.write(None, ino, 0, &block)?;
        }
        fs.sync()?;
        let stop = Arc::new(AtomicBool::new(false));
        let worst = Arc::new(AtomicU64::new(0));
        let probe = {
            let (fs, stop, worst, ino) = (fs.clone(), stop.clone(), worst.clone(), inos[0]);
            std::thread::spawn(move || -> Res<u64> {
                let mut calls = 0;
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    fs.getattr(ino)?;
                    let us = u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX);
                    worst.fetch_max(us, Ordering::Relaxed);
                    calls += 1;
                }
                Ok(calls)
            })
        };
        // Let the probe start calling before the checkpoint begins.
        std::thread::sleep(std::time::Duration::from_millis(20));
        worst.store(0, Ordering::Relaxed);
        let t = Instant::now();
        let written = fs.checkpoint()?;
        let took = t.elapsed();
        stop.store(true, Ordering::Relaxed);
        let calls = probe.join().map_err(|_| "probe panicked")??;
        println!(
            "round {round}: {changed} files changed; checkpoint {:.1} ms (written: {written}); longest getattr during it {:.1} ms ({calls} calls)",
            took.as_secs_f64() * 1e3,
            worst.load(Ordering::Relaxed) as f64 / 1e3,
        );
    }
    tally_bench::image::unmount_and_remove(fs, &path)
}

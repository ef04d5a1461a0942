//! How long a checkpoint snapshot keeps other operations waiting, as the file system holds more
//! files (issue 16: one slow operation must not stall every other; issue 14 item 5: no cost that
//! grows with what is stored). Makes `FILES` empty files (1,000 per directory), takes a first
//! checkpoint (which encodes every inode), then `ROUNDS` times: changes `CHANGED` of the files
//! (a 4 KiB write each) and takes a checkpoint while another thread calls `getattr` on one file
//! in a loop. Prints, per round, the checkpoint's wall time and the longest `getattr` call
//! during it: the time the checkpoint held the state lock, as a user of the mount would see it.
//! Then unmounts, mounts again (printing the mount's time) and runs one more round: the first
//! checkpoint after a mount.
//! Compare builds in one session (ratios, not times):
//!
//! ```sh
//! cargo run --release -p tally-bench --example checkpoint_hold -- [FILES] [CHANGED] [ROUNDS] [IMAGE_PATH]
//! ```
//!
//! The image (default: a 2 GiB file in the system's temporary directory) is made fresh and
//! removed at the end. Online checkpoints are off (replay budget 0) and no maintenance thread
//! runs, so the only checkpoints are the measured ones.

use std::time::Instant;

use tally_bench::image::{quiet_image_fs, Args, GetattrProbe};
use tally_fs::{Owner, ROOT};

const ME: Owner = Owner { uid: 0, gid: 0 };
const PER_DIR: u64 = 1000;
const PER_TXN: u64 = 100;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn main() -> Res<()> {
    let mut args = Args::new();
    let files = args.number(200_000)?;
    let changed = args.number(10_000)?.min(files);
    let rounds = args.number(3)?;
    let path = args.image("checkpoint-hold");
    let fs = quiet_image_fs(&path)?;

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
    let round = |fs: &std::sync::Arc<tally_fs::Fs>, round: u64, what: &str| -> Res<()> {
        for k in 0..changed {
            let ino = inos[usize::try_from((k * step + round) % files)?];
            fs.write(None, ino, 0, &block)?;
        }
        fs.sync()?;
        let (written, took, worst, calls) =
            GetattrProbe::around(fs, inos[0], || Ok(fs.checkpoint()?))?;
        println!(
            "round {round}: {changed} files changed; checkpoint {:.1} ms (written: {written}); longest getattr during it {:.1} ms ({calls} calls){what}",
            took.as_secs_f64() * 1e3,
            worst.as_secs_f64() * 1e3,
        );
        Ok(())
    };
    for r in 0..rounds {
        round(&fs, r, "")?;
    }
    // The first checkpoint after a mount, which until 28 Nov 2026 built the record counts'
    // groups whole under the state lock.
    let (fs, took) = tally_bench::image::remount_quiet(fs, &path)?;
    println!("remounted in {:.1} ms", took.as_secs_f64() * 1e3);
    round(&fs, rounds, " (the first after the mount)")?;
    tally_bench::image::unmount_and_remove(fs, &path)
}

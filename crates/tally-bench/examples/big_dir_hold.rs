//! How long a checkpoint keeps other operations waiting when one name changed in a big
//! directory since the last one (issue 16: one slow operation must not stall every other;
//! issue 14 item 5: no cost that grows with what is stored). Makes `FILES` empty files in one
//! directory and takes a first checkpoint, then `ROUNDS` times: creates one more file there,
//! syncs, and takes a checkpoint while another thread calls `getattr` on a file elsewhere in a
//! loop. Prints the checkpoint's wall time and the longest `getattr` during it. The snapshot
//! keeps a big directory's encoding in pieces of 4,096 entries (by cookie) and encodes again
//! only the pieces a change touched; until 28 Nov 2026 it sorted and encoded every name again
//! under the state lock (docs/bench/fs.md). Compare sizes and builds in one session (ratios,
//! not times):
//!
//! ```sh
//! cargo run --release -p tally-bench --example big_dir_hold -- [FILES] [ROUNDS] [IMAGE_PATH]
//! ```
//!
//! The image (default: a 2 GiB file in the system's temporary directory) is made fresh and
//! removed at the end. Online checkpoints are off and no maintenance thread runs, so the only
//! checkpoints are the measured ones.

use tally_bench::image::{quiet_image_fs, Args, GetattrProbe};
use tally_fs::{Owner, ROOT};

const ME: Owner = Owner { uid: 0, gid: 0 };
/// Creates per explicit transaction while filling the directory (fewer, larger commits).
const PER_TXN: u64 = 1000;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn main() -> Res<()> {
    let mut args = Args::new();
    let files = args.number(100_000)?;
    let rounds = args.number(3)?;
    let path = args.image("big-dir-hold");
    let fs = quiet_image_fs(&path)?;
    let dir = fs.mkdir(None, ROOT, b"big", 0o755, ME)?.ino;
    let small = fs.create(None, ROOT, b"small", 0o644, ME)?.ino;
    for first in (0..files).step_by(PER_TXN as usize) {
        let t = fs.begin()?;
        for i in first..files.min(first + PER_TXN) {
            fs.create(Some(&t), dir, format!("file-{i:08}").as_bytes(), 0o644, ME)?;
        }
        fs.commit(t)?;
    }
    fs.sync()?;
    fs.checkpoint()?;
    for round in 0..rounds {
        fs.create(None, dir, format!("more-{round}").as_bytes(), 0o644, ME)?;
        fs.sync()?;
        let (written, took, worst, calls) =
            GetattrProbe::around(&fs, small, || Ok(fs.checkpoint()?))?;
        println!(
            "round {round}: {files} names in one directory, one more made; checkpoint {:.1} ms (written: {written}); longest getattr during it {:.2} ms ({calls} calls)",
            took.as_secs_f64() * 1e3,
            worst.as_secs_f64() * 1e3,
        );
    }
    tally_bench::image::unmount_and_remove(fs, &path)
}

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

use tally_bench::image::{quiet_image_fs, Args, GetattrProbe};
use tally_fs::{Owner, ROOT};

const ME: Owner = Owner { uid: 0, gid: 0 };
const MIB: usize = 1 << 20;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn main() -> Res<()> {
    let mut args = Args::new();
    let mib = args.number(60)?;
    let rounds = args.number(5)?;
    let path = args.image("prune-hold");
    let fs = quiet_image_fs(&path)?;
    let big = fs.create(None, ROOT, b"big", 0o644, ME)?.ino;
    let small = fs.create(None, ROOT, b"small", 0o644, ME)?.ino;
    let buf = vec![7u8; MIB];
    for round in 0..rounds {
        for m in 0..mib {
            fs.write(None, big, m * MIB as u64, &buf)?;
        }
        let ((), took, worst, calls) = GetattrProbe::around(&fs, small, || Ok(fs.sync()?))?;
        println!(
            "round {round}: {mib} MiB written; sync {:.1} ms; longest getattr during it {:.2} ms ({calls} calls)",
            took.as_secs_f64() * 1e3,
            worst.as_secs_f64() * 1e3,
        );
    }
    tally_bench::image::unmount_and_remove(fs, &path)
}

//! How long a checkpoint keeps other operations waiting when one big file changed since the
//! last one (issue 16: one slow operation must not stall every other; issue 14 item 5: no cost
//! that grows with what is stored). Writes a file of `MIB` MiB in 1 MiB writes and takes a
//! first checkpoint, then `ROUNDS` times: overwrites 4 KiB of it, syncs, and takes a
//! checkpoint while another thread calls `getattr` on another file in a loop. Prints the
//! checkpoint's wall time and the longest `getattr` during it. The snapshot keeps a big file's
//! encoding in pieces of 4,096 blocks and encodes again only the pieces a change touched; until
//! 28 Nov 2026 it re-encoded the whole block map under the state lock, and the longest
//! `getattr` grew with the file (docs/bench/fs.md). Compare sizes and builds
//! in one session (ratios, not times):
//!
//! ```sh
//! cargo run --release -p tally-bench --example big_file_hold -- [MIB] [ROUNDS] [IMAGE_PATH]
//! ```
//!
//! The image (default: a 2 GiB file in the system's temporary directory) is made fresh and
//! removed at the end; `MIB` must leave room in it. Online checkpoints are off and no
//! maintenance thread runs, so the only checkpoints are the measured ones.

use tally_bench::image::{quiet_image_fs, Args, GetattrProbe};
use tally_fs::{Owner, ROOT};

const ME: Owner = Owner { uid: 0, gid: 0 };
const MIB: u64 = 1 << 20;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn main() -> Res<()> {
    let mut args = Args::new();
    let mib = args.number(256)?;
    let rounds = args.number(3)?;
    let path = args.image("big-file-hold");
    let fs = quiet_image_fs(&path)?;
    let big = fs.create(None, ROOT, b"big", 0o644, ME)?.ino;
    let small = fs.create(None, ROOT, b"small", 0o644, ME)?.ino;
    let buf = vec![7u8; 1 << 20];
    for m in 0..mib {
        fs.write(None, big, m * MIB, &buf)?;
    }
    fs.sync()?;
    fs.checkpoint()?;
    for round in 0..rounds {
        fs.write(None, big, round * 4096, &[1u8; 4096])?;
        fs.sync()?;
        let (written, took, worst, calls) =
            GetattrProbe::around(&fs, small, || Ok(fs.checkpoint()?))?;
        println!(
            "round {round}: {mib} MiB file, 4 KiB of it changed; checkpoint {:.1} ms (written: {written}); longest getattr during it {:.2} ms ({calls} calls)",
            took.as_secs_f64() * 1e3,
            worst.as_secs_f64() * 1e3,
        );
    }
    tally_bench::image::unmount_and_remove(fs, &path)
}

//! The daemon's CPU per small transaction without the mount (issue 14): what an untar asks of
//! `tally_fs::Fs` per file — create, a few writes, a setattr (mode and times) — on a file
//! device with write-behind, as `tally mount` runs it. Prints CPU microseconds per file (user
//! + system of this process) and the load average, to compare builds in one run:
//!
//! ```sh
//! cargo run --release -p tally-bench --example small_tx -- [FILES] [IMAGE_PATH]
//! perf record -g target/release/examples/small_tx 20000   # where the time goes
//! ```

use std::time::Instant;

use tally_fs::{Owner, SetAttr, SetTime, Timespec, ROOT};

const ME: Owner = Owner { uid: 0, gid: 0 };
/// Files per directory, as a source tree has them.
const PER_DIR: u32 = 300;
/// Bytes per file and per write (a tar record is 10 KiB).
const FILE_BYTES: usize = 9_000;
const WRITE_BYTES: usize = 4_096;

fn cpu_micros() -> u64 {
    // SAFETY: getrusage writes into the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is always valid.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &raw mut ru) };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    us(ru.ru_utime) + us(ru.ru_stime)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let files: u32 = args.next().map_or(Ok(10_000), |a| a.parse())?;
    let path =
        args.next().map_or_else(|| std::env::temp_dir().join("tally-small-tx.img"), Into::into);
    let fs = tally_bench::image::fresh_image_fs(&path, 1 << 30).map_err(|e| e.to_string())?;
    let payload: Vec<u8> = (0..FILE_BYTES).map(|i| (i * 7 % 251) as u8).collect();
    let (cpu0, t0) = (cpu_micros(), Instant::now());
    let mut dir = ROOT;
    for i in 0..files {
        if i % PER_DIR == 0 {
            dir = fs.mkdir(None, ROOT, format!("d{i}").as_bytes(), 0o755, ME)?.ino;
        }
        let ino = fs.create(None, dir, format!("f{i}").as_bytes(), 0o600, ME)?.ino;
        for (k, chunk) in payload.chunks(WRITE_BYTES).enumerate() {
            fs.write(None, ino, (k * WRITE_BYTES) as u64, chunk)?;
        }
        let when = SetTime::At(Timespec { sec: 1_700_000_000, nsec: 0 });
        let set = SetAttr {
            perm: Some(0o644),
            atime: Some(when),
            mtime: Some(when),
            ..SetAttr::default()
        };
        fs.setattr(None, ino, &set)?;
    }
    fs.sync()?;
    let (cpu, wall) = (cpu_micros() - cpu0, t0.elapsed());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "files {files}  cpu/file {:.1} us  wall/file {:.1} us  load {}",
        cpu as f64 / f64::from(files),
        wall.as_secs_f64() * 1e6 / f64::from(files),
        load.split_whitespace().next().unwrap_or("?")
    );
    fs.unmount()?;
    std::fs::remove_file(&path)?;
    Ok(())
}

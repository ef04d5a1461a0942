//! Operations per second of the small changes an untar and an `rm -rf` ask of the daemon
//! (issue 14), through the library with the log's write-behind as `tally mount` runs it, no
//! FUSE: per file `create`, two writes (tar's 10 KiB records are cut in two 4 KiB-aligned
//! pieces here), three setattrs (times, owner, mode, one call each as the kernel sends them),
//! `release`; a `mkdir` every 300 files; then a `rename` of every file, an `unlink` of every
//! file and an `rmdir` of every directory. Prints per kind ops/s (wall) and the calling
//! thread's CPU per call (robust to a loaded machine), and CPU per untarred file (user +
//! system of the whole process, device threads included). Build it from two trees and run
//! both in one session to compare builds (ratios, not times):
//!
//! ```sh
//! cargo run --release -p tally-bench --example small_ops -- [FILES] [mem|IMAGE_PATH] [ROUNDS] [BUDGET_MIB]
//! perf record -g target/release/examples/small_ops 20000 mem   # where the time goes
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use tally_fs::{
    Fs, MkfsOptions, MountOptions, Owner, RenameFlags, SetAttr, SetTime, Timespec, ROOT,
};
use tally_media::{Device, FileDevice, FileOptions, MemDevice};

const ME: Owner = Owner { uid: 0, gid: 0 };
/// Files per directory, as a source tree has them (`SMALL_OPS_PER_DIR` to change it).
const PER_DIR_DEFAULT: u32 = 300;

fn per_dir() -> u32 {
    std::env::var("SMALL_OPS_PER_DIR").ok().and_then(|v| v.parse().ok()).unwrap_or(PER_DIR_DEFAULT)
}
/// Bytes per file (two writes, as FUSE sends a small tar member).
const FILE_BYTES: usize = 6_000;
const WRITE_BYTES: usize = 4_096;
/// Operation kinds, in the order printed.
const KINDS: [&str; 9] =
    ["mkdir", "create", "write", "setattr", "release", "rename", "unlink", "rmdir", "sync"];

fn cpu_micros() -> u64 {
    // SAFETY: getrusage writes into the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is always valid.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &raw mut ru) };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    us(ru.ru_utime) + us(ru.ru_stime)
}

/// CPU time of the calling thread, in nanoseconds (what an operation costs the thread that
/// runs it, whatever else the machine runs meanwhile).
fn thread_cpu_nanos() -> u64 {
    // SAFETY: clock_gettime writes into the struct we pass.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: as above; CLOCK_THREAD_CPUTIME_ID is always valid.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &raw mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Time spent (wall and the calling thread's CPU) and calls made per operation kind.
#[derive(Default)]
struct Tally {
    time: [Duration; KINDS.len()],
    cpu_nanos: [u64; KINDS.len()],
    calls: [u64; KINDS.len()],
}

impl Tally {
    fn timed<T>(&mut self, kind: usize, f: impl FnOnce() -> T) -> T {
        let (t, c) = (Instant::now(), thread_cpu_nanos());
        let v = f();
        self.cpu_nanos[kind] += thread_cpu_nanos() - c;
        self.time[kind] += t.elapsed();
        self.calls[kind] += 1;
        v
    }
}

/// A device, and the image file behind it to remove (none in memory).
type Made = (Arc<dyn Device>, Option<std::path::PathBuf>);

fn device(where_: &str) -> Result<Made, Box<dyn std::error::Error>> {
    if where_ == "mem" {
        return Ok((Arc::new(MemDevice::new(4096, 262_144)?), None));
    }
    let path = std::path::PathBuf::from(where_);
    let file = std::fs::File::create(&path)?;
    file.set_len(1 << 30)?;
    drop(file);
    Ok((Arc::new(FileDevice::open(&path, FileOptions::default())?), Some(path)))
}

/// One round: untar-like then rm-like on a fresh file system. Returns CPU microseconds of the
/// untar part.
fn round(
    files: u32,
    where_: &str,
    budget: Option<u64>,
    t: &mut Tally,
) -> Result<u64, Box<dyn std::error::Error>> {
    let (dev, path) = device(where_)?;
    Fs::mkfs(dev.clone(), &MkfsOptions::default())?;
    let opts = MountOptions {
        write_behind: Some(tally_log::WriteBehind::default()),
        replay_budget: budget,
        ..MountOptions::default()
    };
    let fs = Fs::mount(dev, opts)?;
    let payload: Vec<u8> = (0..FILE_BYTES).map(|i| (i * 7 % 251) as u8).collect();
    let when = SetTime::At(Timespec { sec: 1_700_000_000, nsec: 0 });
    let times = SetAttr { atime: Some(when), mtime: Some(when), ..SetAttr::default() };
    let owner = SetAttr { uid: Some(0), gid: Some(0), ..SetAttr::default() };
    let mode = SetAttr { perm: Some(0o644), ..SetAttr::default() };
    let cpu0 = cpu_micros();
    let mut dirs = Vec::new();
    let mut made = Vec::new();
    for i in 0..files {
        if i % per_dir() == 0 {
            let name = format!("d{i}");
            dirs.push(t.timed(0, || fs.mkdir(None, ROOT, name.as_bytes(), 0o755, ME))?.ino);
        }
        let dir = *dirs.last().ok_or("no directory")?;
        let name = format!("f{i}");
        let ino = t.timed(1, || fs.create(None, dir, name.as_bytes(), 0o600, ME))?.ino;
        fs.open(ino)?;
        for (k, chunk) in payload.chunks(WRITE_BYTES).enumerate() {
            t.timed(2, || {
                fs.write_dropping_privs(None, ino, (k * WRITE_BYTES) as u64, chunk, false)
            })?;
        }
        for set in [&times, &owner, &mode] {
            t.timed(3, || fs.setattr_dropping_privs(None, ino, set, false))?;
        }
        t.timed(4, || fs.release(ino))?;
        made.push((dir, name));
    }
    t.timed(8, || fs.sync())?;
    let untar_cpu = cpu_micros() - cpu0;
    for (dir, name) in &made {
        let to = format!("{}.r", name);
        t.timed(5, || {
            fs.rename(None, *dir, name.as_bytes(), *dir, to.as_bytes(), RenameFlags::default())
        })?;
    }
    for (dir, name) in &made {
        let to = format!("{}.r", name);
        t.timed(6, || fs.unlink(None, *dir, to.as_bytes()))?;
    }
    for (i, _) in dirs.iter().enumerate() {
        let name = format!("d{}", i as u32 * per_dir());
        t.timed(7, || fs.rmdir(None, ROOT, name.as_bytes()))?;
    }
    t.timed(8, || fs.sync())?;
    fs.unmount()?;
    if let Some(p) = path {
        std::fs::remove_file(p)?;
    }
    Ok(untar_cpu)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let files: u32 = args.next().map_or(Ok(10_000), |a| a.parse())?;
    let where_ = args.next().unwrap_or_else(|| "mem".to_owned());
    let rounds: u32 = args.next().map_or(Ok(3), |a| a.parse())?;
    // The replay budget (MiB; 0: no online checkpoints), the library's default unless given.
    let budget: Option<u64> = args.next().map(|a| a.parse::<u64>().map(|m| m << 20)).transpose()?;
    let mut t = Tally::default();
    let mut untar_cpu = 0;
    for _ in 0..rounds {
        untar_cpu += round(files, &where_, budget, &mut t)?;
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut line = format!(
        "files {files} x{rounds} on {where_}  untar cpu/file {:.2} us  load {}",
        untar_cpu as f64 / f64::from(files * rounds),
        load.split_whitespace().next().unwrap_or("?")
    );
    line.push_str("\n  ops/s (wall):");
    for (k, name) in KINDS.iter().enumerate() {
        if t.calls[k] > 0 && *name != "sync" {
            let rate = t.calls[k] as f64 / t.time[k].as_secs_f64();
            line.push_str(&format!("  {name} {rate:.0}"));
        }
    }
    // Robust to a loaded machine: the calling thread's CPU per call (the log's write-outs run
    // on it too; the device's own threads are in `untar cpu/file` only).
    line.push_str("\n  us CPU/op (thread):");
    for (k, name) in KINDS.iter().enumerate() {
        if t.calls[k] > 0 && *name != "sync" {
            let us = t.cpu_nanos[k] as f64 / 1e3 / t.calls[k] as f64;
            line.push_str(&format!("  {name} {us:.2}"));
        }
    }
    println!("{line}");
    Ok(())
}

//! `tally bench peer varmail`: Filebench's varmail personality, re-implemented because Filebench
//! is in no package registry (issue #6 workload 3; ccNVMe's and MQFS's evaluation).
//!
//! Filebench's `varmail.f`, with the seeds' parameters: a flat directory of `files` files whose
//! sizes follow a gamma distribution (shape 1.5, mean `mean_file_bytes`), 80 % of them made
//! before the window. Each thread loops over the flow below; every step is one operation, so
//! one loop is 13 operations, as Filebench counts them:
//!
//! 1. delete a file;
//! 2. create a file, append, fsync, close;
//! 3. open a file, read it whole, append, fsync, close;
//! 4. open a file, read it whole, close.
//!
//! Appends are a uniform random size in 1..=`append_bytes` (Filebench's `appendfilerand`).
//! One difference: Filebench lets threads pick any file and skips busy ones; here thread `t`
//! owns files `i` with `i % threads == t`, which gives the same mix with no shared lock in the
//! benchmark itself.

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::append::cpu_secs;
use crate::measure::process_cpu_time;
use crate::peer::{io_err, payload, Window};
use crate::BenchError;

/// What one varmail window runs.
#[derive(Debug, Clone)]
pub struct VarmailOptions {
    /// Directory to run in (a fresh subdirectory is made and removed).
    pub dir: PathBuf,
    /// System name for the report.
    pub system: String,
    /// Files in the set.
    pub files: u32,
    /// Threads.
    pub threads: u32,
    /// Mean file size at the start.
    pub mean_file_bytes: u64,
    /// Largest append.
    pub append_bytes: usize,
    /// Length of the window, seconds.
    pub seconds: f64,
    /// Seed of the file sizes and choices.
    pub seed: u64,
}

/// Run one window.
///
/// # Errors
/// Bad options, and any I/O failure in the directory.
pub fn run(o: &VarmailOptions) -> Result<Window, BenchError> {
    if o.threads == 0
        || o.files < 2 * o.threads
        || o.append_bytes == 0
        || o.seconds.is_nan()
        || o.seconds <= 0.0
    {
        return Err(BenchError::BadInput {
            reason: "threads >= 1, files >= 2 x threads, append and seconds > 0".into(),
        });
    }
    let root = o.dir.join(format!("varmail.{}", std::process::id()));
    std::fs::create_dir(&root).map_err(io_err("mkdir", &root))?;
    let mut rng = fastrand::Rng::with_seed(o.seed);
    let data = payload(o.append_bytes.max(1 << 20), o.seed);
    // The fileset: 80 % preallocated (Filebench's prealloc=80), gamma sizes.
    let mut exists = vec![false; o.files as usize];
    for (i, e) in exists.iter_mut().enumerate() {
        if rng.u32(0..100) < 80 {
            let size = gamma(&mut rng, 1.5, o.mean_file_bytes as f64 / 1.5) as usize;
            let path = file_path(&root, i);
            write_new(&path, &data[..size.min(data.len())])?;
            *e = true;
        }
    }
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };

    let deadline = o.seconds;
    let cpu0 = process_cpu_time();
    let start = Instant::now();
    let results: Vec<Result<(u64, u64), BenchError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..o.threads)
            .map(|t| {
                let mine: Vec<usize> = (0..o.files as usize)
                    .filter(|i| i % o.threads as usize == t as usize)
                    .collect();
                let mut own: Vec<bool> = mine.iter().map(|&i| exists[i]).collect();
                let (root, data) = (&root, &data);
                s.spawn(move || {
                    let mut rng = fastrand::Rng::with_seed(o.seed ^ ((u64::from(t) + 1) * 0x9e37));
                    let (mut ops, mut appended) = (0u64, 0u64);
                    let mut buf = vec![0u8; 1 << 20];
                    while start.elapsed().as_secs_f64() < deadline {
                        // 1. delete (keeps at least one file to read).
                        if own.iter().filter(|&&e| e).count() > 1 {
                            let k = pick(&mut rng, &own, true);
                            let p = file_path(root, mine[k]);
                            std::fs::remove_file(&p).map_err(io_err("unlink", &p))?;
                            own[k] = false;
                            ops += 1;
                        }
                        // 2. create, append, fsync, close.
                        if own.iter().any(|&e| !e) {
                            let k = pick(&mut rng, &own, false);
                            let p = file_path(root, mine[k]);
                            let n = rng.usize(1..=o.append_bytes);
                            let mut f = std::fs::File::create(&p).map_err(io_err("create", &p))?;
                            f.write_all(&data[..n]).map_err(io_err("append to", &p))?;
                            f.sync_all().map_err(io_err("fsync", &p))?;
                            drop(f);
                            own[k] = true;
                            ops += 4;
                            appended += n as u64;
                        }
                        // 3. open, read whole, append, fsync, close.
                        let k = pick(&mut rng, &own, true);
                        let p = file_path(root, mine[k]);
                        let mut f = std::fs::OpenOptions::new()
                            .read(true)
                            .append(true)
                            .open(&p)
                            .map_err(io_err("open", &p))?;
                        read_whole(&mut f, &mut buf).map_err(io_err("read", &p))?;
                        let n = rng.usize(1..=o.append_bytes);
                        f.write_all(&data[..n]).map_err(io_err("append to", &p))?;
                        f.sync_all().map_err(io_err("fsync", &p))?;
                        drop(f);
                        ops += 5;
                        appended += n as u64;
                        // 4. open, read whole, close.
                        let k = pick(&mut rng, &own, true);
                        let p = file_path(root, mine[k]);
                        let mut f = std::fs::File::open(&p).map_err(io_err("open", &p))?;
                        read_whole(&mut f, &mut buf).map_err(io_err("read", &p))?;
                        drop(f);
                        ops += 3;
                    }
                    Ok((ops, appended))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or(Err(BenchError::Failed { reason: "varmail thread panicked".into() }))
            })
            .collect()
    });
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu_secs(cpu0);
    let (mut ops, mut appended) = (0, 0);
    for r in results {
        let (o, a) = r?;
        ops += o;
        appended += a;
    }
    std::fs::remove_dir_all(&root).map_err(io_err("remove", &root))?;
    let mut w = Window::new("varmail", &o.system, ops, secs, cpu);
    w.payload_bytes = appended;
    Ok(w)
}

fn file_path(root: &Path, i: usize) -> PathBuf {
    root.join(format!("f{i:05}"))
}

fn write_new(path: &Path, data: &[u8]) -> Result<(), BenchError> {
    let mut f = std::fs::File::create(path).map_err(io_err("create", path))?;
    f.write_all(data).map_err(io_err("write", path))
}

fn read_whole(f: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<()> {
    while f.read(buf)? > 0 {}
    Ok(())
}

/// A random index `k` with `own[k] == want`; the caller checks that one exists.
fn pick(rng: &mut fastrand::Rng, own: &[bool], want: bool) -> usize {
    let candidates: Vec<usize> = (0..own.len()).filter(|&k| own[k] == want).collect();
    candidates.get(rng.usize(0..candidates.len().max(1))).copied().unwrap_or(0)
}

/// A gamma(shape, scale) sample, shape >= 1 (Marsaglia and Tsang, 2000). Hand-written: ten
/// lines, where `rand_distr` would bring `rand` and its own generator beside `fastrand`.
fn gamma(rng: &mut fastrand::Rng, shape: f64, scale: f64) -> f64 {
    let d = shape - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        // Box–Muller normal.
        let (u1, u2) = (rng.f64().max(f64::MIN_POSITIVE), rng.f64());
        let x = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        let v = (1.0 + c * x).powi(3);
        if v <= 0.0 {
            continue;
        }
        let u = rng.f64().max(f64::MIN_POSITIVE);
        if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
            return d * v * scale;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gamma_has_the_asked_mean() {
        let mut rng = fastrand::Rng::with_seed(7);
        let n = 20_000;
        let mean: f64 = (0..n).map(|_| gamma(&mut rng, 1.5, 16384.0 / 1.5)).sum::<f64>() / n as f64;
        assert!((mean - 16384.0).abs() < 16384.0 * 0.03, "mean {mean}");
    }
}

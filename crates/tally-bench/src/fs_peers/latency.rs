//! Issue #16's latency sections: small fsyncs measured one by one while other work runs beside
//! them in the same process.
//!
//! - **mixed** ([`mixed`]): 4 threads append 4 KiB + fsync on a 90 %-full file system, alone and
//!   while one more thread makes cleaning work (random 4 KiB overwrites of the full part,
//!   `maintain` after every 256, as the cleaning section does). Target: the appenders' p99
//!   with the cleaner within 2× of their p99 without it.
//! - **isolation** ([`isolation`]): one thread appends 4 KiB + fsync to a small file, alone and
//!   while another thread streams 1 MiB buffered writes to a second file and fsyncs it every
//!   64 MiB; Tally (library, with and without the log's write-behind, which the mount uses by
//!   default) and ext4 in the same run. Target: Tally's p99 ratio (streaming ÷ alone) at most
//!   half of ext4's.
//!
//! Runs alternate (Tally alone, Tally beside the other work, then ext4 likewise), and every
//! ratio is taken per run and of the medians.

use std::io::Write as _;
use std::os::unix::fs::FileExt as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use tally_fs::{Fs, FsError, MkfsOptions, MountOptions, ROOT};
use tally_media::Device;

use super::clean::{fill_to, Prefix, FILE_BYTES};
use super::workloads::Ext4Run;
use super::{fs_err, io_err, TallySide, ME};
use crate::measure::percentile_us;
use crate::{BenchError, Spread};

/// Bytes of each small append.
const SMALL: usize = 4096;
/// Appenders of the mixed run.
pub const MIXED_APPENDERS: u32 = 4;
/// Each appender's file wraps to offset 0 after this many bytes (an overwrite + fsync from
/// then on), so a run fits in the free tenth of a 90 %-full file system.
const APPEND_WRAP: u64 = 1 << 20;
/// Overwrites of the cleaner between two `maintain` calls.
const WRITES_PER_MAINTAIN: u64 = 256;
/// Blocks per segment of the mixed run's file system (1 MiB).
const SEGMENT_BLOCKS: u32 = 256;
/// Bytes per buffered write of the streaming thread.
pub const STREAM_WRITE: usize = 1 << 20;
/// The streaming thread fsyncs after this many bytes.
pub const STREAM_FSYNC_EVERY: u64 = 64 << 20;
/// The streamed file wraps to offset 0 after this many bytes, so a run fits on the device.
const STREAM_WRAP: u64 = 256 << 20;
/// Streams of the isolation run's file system.
const ISOLATION_STREAMS: u16 = 8;

/// The latencies of the measured operations of one run.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct LatencyRun {
    /// Operations measured (all threads).
    pub ops: u64,
    /// Operations per second (all threads).
    pub ops_per_s: f64,
    /// Median latency, µs.
    pub p50_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// Slowest operation, µs.
    pub max_us: f64,
}

impl LatencyRun {
    fn of(mut ns: Vec<u64>, secs: f64) -> LatencyRun {
        ns.sort_unstable();
        LatencyRun {
            ops: ns.len() as u64,
            ops_per_s: ns.len() as f64 / secs.max(f64::MIN_POSITIVE),
            p50_us: percentile_us(&ns, 0.50),
            p99_us: percentile_us(&ns, 0.99),
            max_us: ns.last().map_or(0.0, |&x| x as f64 / 1000.0),
        }
    }
}

/// [`LatencyRun`]s over the runs.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Latency {
    /// Operations per second.
    pub ops_per_s: Spread,
    /// Median latency, µs.
    pub p50_us: Spread,
    /// 99th percentile, µs.
    pub p99_us: Spread,
    /// Slowest operation, µs.
    pub max_us: Spread,
    /// The runs, in order.
    pub runs: Vec<LatencyRun>,
}

impl Latency {
    fn of(runs: Vec<LatencyRun>) -> Latency {
        Latency {
            ops_per_s: Spread::of(runs.iter().map(|r| r.ops_per_s)),
            p50_us: Spread::of(runs.iter().map(|r| r.p50_us)),
            p99_us: Spread::of(runs.iter().map(|r| r.p99_us)),
            max_us: Spread::of(runs.iter().map(|r| r.max_us)),
            runs,
        }
    }

    /// p99 of `self` ÷ p99 of `base`, run by run.
    fn p99_over(&self, base: &Latency) -> Spread {
        Spread::of(
            self.runs
                .iter()
                .zip(&base.runs)
                .map(|(a, b)| a.p99_us / b.p99_us.max(f64::MIN_POSITIVE)),
        )
    }
}

/// Time `op` on `threads` threads for `seconds` (every call timed on its own), while
/// `beside` runs on one more thread from the same start until the timed threads end (it is
/// told by the flag it is given). Returns the timed calls' latencies and what `beside`
/// returned.
fn timed_beside<B: Send>(
    threads: u32,
    seconds: f64,
    op: impl Fn(u32, u64) -> Result<(), BenchError> + Sync,
    beside: Option<impl FnOnce(&AtomicBool) -> Result<B, BenchError> + Send>,
) -> Result<(LatencyRun, Option<B>), BenchError> {
    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(threads as usize + usize::from(beside.is_some()) + 1);
    let duration = Duration::from_secs_f64(seconds);
    let (lat, other, secs) = std::thread::scope(|s| {
        let (barrier, stop, op) = (&barrier, &stop, &op);
        let side = beside.map(|b| {
            s.spawn(move || {
                barrier.wait();
                b(stop)
            })
        });
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || -> Result<Vec<u64>, BenchError> {
                    barrier.wait();
                    let start = Instant::now();
                    let mut ns = Vec::new();
                    let mut i = 0u64;
                    while start.elapsed() < duration {
                        let t0 = Instant::now();
                        op(t, i)?;
                        ns.push(u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX));
                        i += 1;
                    }
                    Ok(ns)
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        let panicked = || BenchError::Failed { reason: "a benchmark thread panicked".into() };
        let lat: Vec<Result<Vec<u64>, BenchError>> =
            handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(panicked()))).collect();
        let secs = start.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        let other = side.map(|h| h.join().unwrap_or_else(|_| Err(panicked())));
        (lat, other, secs)
    });
    let mut all = Vec::new();
    for l in lat {
        all.extend(l?);
    }
    let other = other.transpose()?;
    Ok((LatencyRun::of(all, secs), other))
}

/// What the cleaner thread did in one run.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct CleanerRun {
    /// Random 4 KiB overwrites of the full part.
    pub overwrites: u64,
    /// `maintain` calls.
    pub maintains: u64,
    /// Segments `maintain` freed.
    pub segments_freed: u64,
    /// The longest `maintain` call, ms.
    pub longest_maintain_ms: f64,
}

/// The mixed run: appenders alone and beside a cleaner.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MixedSection {
    /// Size of the file system, MiB (the start of Tally's device).
    pub size_mib: u64,
    /// Used ÷ free space after mkfs, as `statfs` said after the fill (median).
    pub fill_reached: f64,
    /// Appending threads.
    pub appenders: u32,
    /// Seconds per timed run.
    pub seconds: f64,
    /// The appenders without the cleaner.
    pub alone: Latency,
    /// The appenders beside the cleaner.
    pub with_cleaner: Latency,
    /// The cleaner, run by run.
    pub cleaner: Vec<CleanerRun>,
    /// p99 with the cleaner ÷ p99 alone, run by run.
    pub p99_ratio_per_run: Spread,
    /// Ratio of the medians.
    pub p99_ratio_of_medians: f64,
    /// Issue #16's bound on the ratio.
    pub target: f64,
    /// Whether the ratio of the medians is within it.
    pub met: bool,
}

/// A fresh file system on `dev`, filled to `fill` of its free space with files of 992 KiB;
/// returns it, the files and the fill reached.
fn filled(
    dev: &Arc<dyn Device>,
    fill: f64,
) -> Result<(Arc<Fs>, Vec<tally_fs::Ino>, f64), BenchError> {
    let streams = u16::try_from(MIXED_APPENDERS + 2).unwrap_or(8);
    let mkfs = MkfsOptions { segment_blocks: SEGMENT_BLOCKS, streams, uuid: None };
    Fs::mkfs(dev.clone(), &mkfs).map_err(fs_err)?;
    let fs = Arc::new(Fs::mount(dev.clone(), MountOptions::default()).map_err(fs_err)?);
    let (inos, reached) = fill_to(&fs, fill)?;
    if inos.is_empty() {
        return Err(BenchError::BadInput {
            reason: "the mixed run's file system is too small".into(),
        });
    }
    Ok((fs, inos, reached))
}

/// One mixed run: a fresh 90 %-full file system, the appenders for `seconds`, the cleaner
/// beside them if `cleaner`.
fn mixed_run(
    dev: &Arc<dyn Device>,
    fill: f64,
    seconds: f64,
    cleaner: bool,
    seed: u64,
) -> Result<(LatencyRun, Option<CleanerRun>, f64), BenchError> {
    let (fs, fill_inos, reached) = filled(dev, fill)?;
    let mut files = Vec::new();
    for t in 0..MIXED_APPENDERS {
        files.push(
            fs.create(None, ROOT, format!("a{t}").as_bytes(), 0o644, ME).map_err(fs_err)?.ino,
        );
    }
    fs.sync().map_err(fs_err)?;
    let bs = u64::from(fs.block_size());
    let data = vec![0x5a_u8; SMALL];
    let wrap = APPEND_WRAP / SMALL as u64;
    let append = |t: u32, i: u64| -> Result<(), BenchError> {
        let ino = files[t as usize];
        fs.write(None, ino, (i % wrap) * SMALL as u64, &data).map_err(fs_err)?;
        fs.fsync(ino).map_err(fs_err)
    };
    let clean = |stop: &AtomicBool| -> Result<CleanerRun, BenchError> {
        let mut rng = fastrand::Rng::with_seed(seed);
        let block = vec![0x77_u8; bs as usize];
        let mut r = CleanerRun::default();
        let blocks_per_file = FILE_BYTES / bs;
        while !stop.load(Ordering::Relaxed) {
            let ino = fill_inos[rng.usize(..fill_inos.len())];
            match fs.write(None, ino, rng.u64(..blocks_per_file) * bs, &block) {
                Ok(_) | Err(FsError::NoSpace) => {}
                Err(e) => return Err(fs_err(e)),
            }
            r.overwrites += 1;
            if r.overwrites % WRITES_PER_MAINTAIN == 0 {
                let t0 = Instant::now();
                match fs.maintain() {
                    Ok(m) => r.segments_freed += u64::from(m.segments_freed),
                    Err(FsError::NoSpace) => {}
                    Err(e) => return Err(fs_err(e)),
                }
                r.maintains += 1;
                r.longest_maintain_ms = r.longest_maintain_ms.max(t0.elapsed().as_secs_f64() * 1e3);
            }
        }
        Ok(r)
    };
    let (lat, c) = timed_beside(MIXED_APPENDERS, seconds, append, cleaner.then_some(clean))?;
    drop(fs);
    Ok((lat, c, reached))
}

/// The mixed section: `runs` runs alone and `runs` beside the cleaner, alternating, on the
/// first `size_mib` MiB of Tally's device filled to 90 %.
///
/// # Errors
/// A size outside 64 MiB to the device's; file-system failures other than ENOSPC.
pub(super) fn mixed(
    tally: &TallySide,
    size_mib: u64,
    seconds: f64,
    runs: u32,
    progress: &dyn Fn(&str),
) -> Result<MixedSection, BenchError> {
    const FILL: f64 = 0.9;
    let geometry = tally.dev.geometry();
    let block_count = (size_mib << 20) / u64::from(geometry.block_size);
    if size_mib < 64 || block_count > geometry.block_count {
        return Err(BenchError::BadInput {
            reason: format!(
                "the mixed run needs 64 MiB to the device's size ({} MiB)",
                (geometry.block_count * u64::from(geometry.block_size)) >> 20
            ),
        });
    }
    let dev: Arc<dyn Device> = Arc::new(Prefix { inner: tally.dev.clone(), block_count });
    let (mut alone, mut with, mut cleaner, mut reached) = (vec![], vec![], vec![], vec![]);
    for run in 0..runs {
        progress(&format!("mixed: run {}/{runs}, appenders alone", run + 1));
        let (l, _, r) = mixed_run(&dev, FILL, seconds, false, u64::from(run))?;
        alone.push(l);
        reached.push(r);
        progress(&format!("mixed: run {}/{runs}, appenders beside the cleaner", run + 1));
        let (l, c, r) = mixed_run(&dev, FILL, seconds, true, u64::from(run))?;
        with.push(l);
        cleaner.push(c.unwrap_or_default());
        reached.push(r);
    }
    let (alone, with) = (Latency::of(alone), Latency::of(with));
    let ratio = with.p99_us.median / alone.p99_us.median.max(f64::MIN_POSITIVE);
    Ok(MixedSection {
        size_mib,
        fill_reached: Spread::of(reached).median,
        appenders: MIXED_APPENDERS,
        seconds,
        p99_ratio_per_run: with.p99_over(&alone),
        alone,
        with_cleaner: with,
        cleaner,
        p99_ratio_of_medians: ratio,
        target: 2.0,
        met: ratio <= 2.0,
    })
}

/// What the streaming thread did in one run.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct StreamRun {
    /// MiB written (buffered).
    pub mib: f64,
    /// MiB per second, its fsyncs included.
    pub mib_per_s: f64,
    /// fsyncs of the streamed file.
    pub fsyncs: u64,
    /// The longest of them, ms.
    pub longest_fsync_ms: f64,
}

/// One system in the isolation section.
#[derive(Debug, Clone, serde::Serialize)]
pub struct IsolationSide {
    /// The small appender alone.
    pub alone: Latency,
    /// The small appender beside the streaming thread.
    pub streaming: Latency,
    /// The streaming thread, run by run.
    pub streamer: Vec<StreamRun>,
    /// p99 streaming ÷ p99 alone, run by run.
    pub p99_ratio_per_run: Spread,
    /// Ratio of the medians.
    pub p99_ratio_of_medians: f64,
}

/// fsync isolation: Tally beside ext4.
#[derive(Debug, Clone, serde::Serialize)]
pub struct IsolationSection {
    /// Seconds per timed run.
    pub seconds: f64,
    /// Bytes per streamed write.
    pub stream_write_bytes: u64,
    /// The streamed file is fsynced after this many bytes.
    pub stream_fsync_every_bytes: u64,
    /// Tally through the library, mounted with its defaults (each change written out as it
    /// commits).
    pub tally: IsolationSide,
    /// Tally through the library with the log's write-behind as the mount has it by default
    /// (`WriteBehind::default()`: changes buffered per stream, written out past 1 MiB a stream,
    /// 16 MiB in all, 5 s, or at fsync).
    pub tally_write_behind: IsolationSide,
    /// ext4 (`data=ordered`).
    pub ext4: IsolationSide,
    /// Tally's p99 ratio ÷ ext4's, run by run.
    pub relative_per_run: Spread,
    /// Tally's ratio of the medians ÷ ext4's.
    pub relative: f64,
    /// The same with write-behind, run by run.
    pub relative_write_behind_per_run: Spread,
    /// The same with write-behind, of the medians.
    pub relative_write_behind: f64,
    /// Issue #16's bound on `relative`.
    pub target: f64,
    /// Whether `relative` is within it.
    pub met: bool,
}

fn stream_loop(
    stop: &AtomicBool,
    mut write: impl FnMut(u64, &[u8]) -> Result<(), BenchError>,
    mut fsync: impl FnMut() -> Result<(), BenchError>,
) -> Result<StreamRun, BenchError> {
    let buf = vec![0xc3_u8; STREAM_WRITE];
    let start = Instant::now();
    let (mut written, mut since, mut r) = (0u64, 0u64, StreamRun::default());
    while !stop.load(Ordering::Relaxed) {
        write(written % STREAM_WRAP, &buf)?;
        written += STREAM_WRITE as u64;
        since += STREAM_WRITE as u64;
        if since >= STREAM_FSYNC_EVERY {
            let t0 = Instant::now();
            fsync()?;
            r.fsyncs += 1;
            r.longest_fsync_ms = r.longest_fsync_ms.max(t0.elapsed().as_secs_f64() * 1e3);
            since = 0;
        }
    }
    r.mib = written as f64 / f64::from(1u32 << 20);
    r.mib_per_s = r.mib / start.elapsed().as_secs_f64().max(f64::MIN_POSITIVE);
    Ok(r)
}

fn tally_isolation(
    tally: &TallySide,
    seconds: f64,
    stream: bool,
    write_behind: bool,
) -> Result<(LatencyRun, Option<StreamRun>), BenchError> {
    let mkfs = MkfsOptions { streams: ISOLATION_STREAMS, segment_blocks: 1024, uuid: None };
    Fs::mkfs(tally.dev.clone(), &mkfs).map_err(fs_err)?;
    let opts = MountOptions {
        write_behind: write_behind.then(tally_log::WriteBehind::default),
        ..MountOptions::default()
    };
    let fs = Fs::mount(tally.dev.clone(), opts).map_err(fs_err)?;
    let small = fs.create(None, ROOT, b"small", 0o644, ME).map_err(fs_err)?.ino;
    let big = fs.create(None, ROOT, b"big", 0o644, ME).map_err(fs_err)?.ino;
    fs.sync().map_err(fs_err)?;
    let data = vec![0x5a_u8; SMALL];
    let append = |_: u32, i: u64| -> Result<(), BenchError> {
        fs.write(None, small, i * SMALL as u64, &data).map_err(fs_err)?;
        fs.fsync(small).map_err(fs_err)
    };
    let streamer = |stop: &AtomicBool| {
        stream_loop(
            stop,
            |off, buf| fs.write(None, big, off, buf).map(|_| ()).map_err(fs_err),
            || fs.fsync(big).map_err(fs_err),
        )
    };
    let r = timed_beside(1, seconds, append, stream.then_some(streamer))?;
    drop(fs);
    Ok(r)
}

fn ext4_isolation(
    dir: &std::path::Path,
    seconds: f64,
    stream: bool,
    name: &str,
) -> Result<(LatencyRun, Option<StreamRun>), BenchError> {
    let run = Ext4Run::new(dir, name)?;
    let small = std::sync::Mutex::new(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(run.dir.join("small"))
            .map_err(io_err("creating an ext4 file"))?,
    );
    let big = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(run.dir.join("big"))
        .map_err(io_err("creating an ext4 file"))?;
    run.sync()?;
    let data = vec![0x5a_u8; SMALL];
    let append = |_: u32, _: u64| -> Result<(), BenchError> {
        let mut f = small.lock().map_err(|_| BenchError::Failed { reason: "poisoned".into() })?;
        f.write_all(&data).map_err(io_err("ext4 append"))?;
        f.sync_all().map_err(io_err("ext4 fsync"))
    };
    let streamer = |stop: &AtomicBool| {
        stream_loop(
            stop,
            |off, buf| big.write_all_at(buf, off).map_err(io_err("ext4 streamed write")),
            || big.sync_all().map_err(io_err("ext4 fsync of the streamed file")),
        )
    };
    let r = timed_beside(1, seconds, append, stream.then_some(streamer))?;
    drop(big);
    drop(run);
    Ok(r)
}

/// The isolation section: per run, Tally alone, Tally streaming, the same with write-behind,
/// ext4 alone, ext4 streaming.
///
/// # Errors
/// Device, file-system and ext4 failures.
pub(super) fn isolation(
    tally: &TallySide,
    ext4_dir: &std::path::Path,
    seconds: f64,
    runs: u32,
    progress: &dyn Fn(&str),
) -> Result<IsolationSection, BenchError> {
    let (mut ta, mut ts, mut tstream) = (vec![], vec![], vec![]);
    let (mut wa, mut ws, mut wstream) = (vec![], vec![], vec![]);
    let (mut ea, mut es, mut estream) = (vec![], vec![], vec![]);
    for run in 0..runs {
        progress(&format!("isolation: run {}/{runs}, tally alone", run + 1));
        ta.push(tally_isolation(tally, seconds, false, false)?.0);
        progress(&format!("isolation: run {}/{runs}, tally beside a streaming writer", run + 1));
        let (l, s) = tally_isolation(tally, seconds, true, false)?;
        ts.push(l);
        tstream.push(s.unwrap_or_default());
        progress(&format!("isolation: run {}/{runs}, tally (write-behind) alone", run + 1));
        wa.push(tally_isolation(tally, seconds, false, true)?.0);
        progress(&format!(
            "isolation: run {}/{runs}, tally (write-behind) beside a streaming writer",
            run + 1
        ));
        let (l, s) = tally_isolation(tally, seconds, true, true)?;
        ws.push(l);
        wstream.push(s.unwrap_or_default());
        progress(&format!("isolation: run {}/{runs}, ext4 alone", run + 1));
        ea.push(ext4_isolation(ext4_dir, seconds, false, &format!("iso-alone-{run}"))?.0);
        progress(&format!("isolation: run {}/{runs}, ext4 beside a streaming writer", run + 1));
        let (l, s) = ext4_isolation(ext4_dir, seconds, true, &format!("iso-stream-{run}"))?;
        es.push(l);
        estream.push(s.unwrap_or_default());
    }
    let side = |alone: Vec<LatencyRun>, streaming: Vec<LatencyRun>, streamer| {
        let (alone, streaming) = (Latency::of(alone), Latency::of(streaming));
        IsolationSide {
            p99_ratio_per_run: streaming.p99_over(&alone),
            p99_ratio_of_medians: streaming.p99_us.median
                / alone.p99_us.median.max(f64::MIN_POSITIVE),
            alone,
            streaming,
            streamer,
        }
    };
    let (t, w, e) = (side(ta, ts, tstream), side(wa, ws, wstream), side(ea, es, estream));
    let per_run = |t: &IsolationSide| {
        let ratio = |s: &LatencyRun, a: &LatencyRun| s.p99_us / a.p99_us.max(f64::MIN_POSITIVE);
        Spread::of(
            t.streaming
                .runs
                .iter()
                .zip(&t.alone.runs)
                .zip(e.streaming.runs.iter().zip(&e.alone.runs))
                .map(|((ts, ta), (es, ea))| ratio(ts, ta) / ratio(es, ea).max(f64::MIN_POSITIVE)),
        )
    };
    let (relative_per_run, relative_write_behind_per_run) = (per_run(&t), per_run(&w));
    let relative = t.p99_ratio_of_medians / e.p99_ratio_of_medians.max(f64::MIN_POSITIVE);
    let relative_write_behind =
        w.p99_ratio_of_medians / e.p99_ratio_of_medians.max(f64::MIN_POSITIVE);
    Ok(IsolationSection {
        seconds,
        stream_write_bytes: STREAM_WRITE as u64,
        stream_fsync_every_bytes: STREAM_FSYNC_EVERY,
        tally: t,
        tally_write_behind: w,
        ext4: e,
        relative_per_run,
        relative,
        relative_write_behind_per_run,
        relative_write_behind,
        target: 0.5,
        met: relative <= 0.5,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn latencies_and_ratios_are_taken_per_run() {
        let a = LatencyRun::of((1..=100).map(|x| x * 1000).collect(), 2.0);
        assert_eq!((a.ops, a.p50_us, a.p99_us, a.max_us), (100, 50.0, 99.0, 100.0));
        assert_eq!(a.ops_per_s, 50.0);
        let b = LatencyRun::of((1..=100).map(|x| x * 3000).collect(), 1.0);
        let (alone, with) = (Latency::of(vec![a, a]), Latency::of(vec![b, a]));
        let r = with.p99_over(&alone);
        assert_eq!((r.min, r.max), (1.0, 3.0));
        assert_eq!(with.p99_us.median, 198.0);
    }

    #[test]
    fn the_other_thread_runs_until_the_timed_ones_end() {
        let calls = AtomicU64::new(0);
        let (lat, other) = timed_beside(
            2,
            0.05,
            |_, _| {
                calls.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(1));
                Ok(())
            },
            Some(|stop: &AtomicBool| {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    std::thread::yield_now();
                }
                Ok(n)
            }),
        )
        .unwrap();
        assert_eq!(lat.ops, calls.load(Ordering::Relaxed));
        assert!(lat.ops >= 2 && lat.p50_us >= 1000.0, "{lat:?}");
        assert!(other.unwrap() > 0);
    }
}

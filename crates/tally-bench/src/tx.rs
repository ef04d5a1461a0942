//! `tally bench tx`: the seeds' transaction experiment on Tally's log.
//!
//! For each commit mode, a fresh log is formatted on a preallocated, pre-written file opened
//! with `O_DIRECT`; `threads` threads then commit for `seconds` seconds, each on its own stream,
//! transactions of `blocks` data blocks (one block each) plus one small record.
//!
//! What the clock covers, so the modes compare honestly:
//! - `classic` and `count` wait for durability in every commit;
//! - `ordered` and `orderless` return before anything is durable, so their timed window ends
//!   with [`Log::sync`] *inside* it: every transaction counted is durable when the clock stops;
//! - the log is append-only until checkpointed, so when fewer than a quarter of its free
//!   segments remain, a thread checkpoints its stream up to its last commit (which waits for
//!   durability: one flush round plus a superblock write and flush). Those flushes are counted
//!   in every figure; for `ordered` and `orderless` they are most of the flushes.
//!
//! Runs are interleaved (every mode once, then again) so slow drift of the device is spread
//! over all modes rather than charged to one.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tally_log::{CommitMode, Log, LogConfig, OpenOptions, Transaction};
use tally_media::{
    Device, DeviceStats, DirectMode, FileDevice, FileOptions, NbdDevice, NbdOptions, NbdTarget,
    SpanDevice, SpanLayout,
};

use crate::measure::{percentile_us, process_cpu_time, Spread};
use crate::probe::{machine_info, probe, time_device, MachineInfo, ProbeOptions, ProbeReport};
use crate::target::Target;
use crate::BenchError;

/// Bytes of the record each transaction carries.
pub const RECORD_BYTES: usize = 32;
/// Bytes of a data block.
pub const DATA_BLOCK_BYTES: usize = 4096;
/// Checkpoint when free segments fall below this fraction of those free after open.
const CHECKPOINT_FREE_FRACTION: u32 = 4;
/// Size of the sibling file the flush probe runs on.
const PROBE_SIZE_BYTES: u64 = 64 << 20;
/// Timed iterations of each probe measurement.
const PROBE_ITERATIONS: u32 = 500;

/// What `tally bench tx` runs.
#[derive(Debug, Clone)]
pub struct TxOptions {
    /// File to run on (created if missing; see [`crate::target`] for what is refused).
    pub path: PathBuf,
    /// Size of the file to create.
    pub size_bytes: u64,
    /// Modes to compare.
    pub modes: Vec<CommitMode>,
    /// Committing threads; thread `i` uses stream `i % streams`.
    pub threads: u16,
    /// Streams of the log; `None`: max(threads, 2), one per thread. Fewer streams than threads
    /// make threads share a stream, which is where consecutive commits get merged (RIO).
    pub streams: Option<u16>,
    /// Data blocks per transaction.
    pub blocks: u32,
    /// Length of each timed run.
    pub seconds: f64,
    /// Runs of each mode.
    pub runs: u32,
    /// Blocks per log segment.
    pub segment_blocks: u32,
    /// Keep the file afterwards.
    pub keep: bool,
    /// Use a file that holds data.
    pub force: bool,
    /// NBD connections when `path` is an NBD URI; `None`: one per stream (each stream's
    /// writes on its own connection), when the server allows several.
    pub nbd_connections: Option<u32>,
}

impl Default for TxOptions {
    fn default() -> Self {
        TxOptions {
            path: PathBuf::new(),
            size_bytes: 4 << 30,
            modes: CommitMode::ALL.to_vec(),
            threads: 1,
            streams: None,
            blocks: 1,
            seconds: 5.0,
            runs: 3,
            segment_blocks: 256,
            keep: false,
            force: false,
            nbd_connections: None,
        }
    }
}

/// One timed run of one mode.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TxRun {
    /// Mode.
    pub mode: CommitMode,
    /// Which repetition (from 1).
    pub run: u32,
    /// Transactions committed (and durable when the clock stopped).
    pub tx: u64,
    /// Length of the timed window, seconds (includes the final sync).
    pub elapsed_s: f64,
    /// Transactions per second.
    pub tx_per_sec: f64,
    /// Device flushes (fdatasync) per transaction.
    pub flushes_per_tx: f64,
    /// FUA writes per transaction.
    pub fua_writes_per_tx: f64,
    /// `Device::submit` calls per transaction.
    pub submissions_per_tx: f64,
    /// Submission system calls (io_uring_enter / pwritev2) per transaction.
    pub submit_syscalls_per_tx: f64,
    /// Bytes written to the device per transaction.
    pub bytes_written_per_tx: f64,
    /// Process CPU time (user + system, all threads) per transaction, µs.
    pub cpu_us_per_tx: f64,
    /// Median latency of `commit_with`, µs (durable for classic and count, not for the others).
    pub commit_p50_us: f64,
    /// 99th percentile latency of `commit_with`, µs.
    pub commit_p99_us: f64,
    /// Checkpoints taken to free log space inside the window.
    pub checkpoints: u64,
    /// Time of the final `sync` inside the window, µs.
    pub final_sync_us: f64,
}

/// Every run of one mode, and the spread of its figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ModeSummary {
    /// Mode.
    pub mode: CommitMode,
    /// Whether each commit waits for durability.
    pub durable_per_commit: bool,
    /// Transactions per second.
    pub tx_per_sec: Spread,
    /// Flushes per transaction.
    pub flushes_per_tx: Spread,
    /// FUA writes per transaction.
    pub fua_writes_per_tx: Spread,
    /// Submissions per transaction.
    pub submissions_per_tx: Spread,
    /// Submission syscalls per transaction.
    pub submit_syscalls_per_tx: Spread,
    /// Bytes written per transaction.
    pub bytes_written_per_tx: Spread,
    /// CPU µs per transaction.
    pub cpu_us_per_tx: Spread,
    /// Median commit latency, µs.
    pub commit_p50_us: Spread,
    /// 99th percentile commit latency, µs.
    pub commit_p99_us: Spread,
    /// Checkpoints per run.
    pub checkpoints: Spread,
    /// The runs.
    pub runs: Vec<TxRun>,
}

/// A ratio between two modes, from the same invocation.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Ratio {
    /// Short name, e.g. `count/classic tx/s`.
    pub name: String,
    /// Ratio of the two medians.
    pub of_medians: f64,
    /// The ratio within each run index (runs are interleaved), median and range.
    pub per_run: Spread,
}

/// What the flush probe found on the same file system, in µs.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FlushProbe {
    /// Median 4 KiB `O_DIRECT` write (not durable).
    pub write_4k_p50_us: f64,
    /// Median `fdatasync` after a 4 KiB write.
    pub fdatasync_p50_us: f64,
    /// 99th percentile `fdatasync`.
    pub fdatasync_p99_us: f64,
    /// Median 4 KiB FUA write.
    pub fua_write_p50_us: f64,
    /// One flush per commit on one stream can go no faster: 1 / median fdatasync.
    pub ceiling_tx_per_sec: f64,
}

impl FlushProbe {
    fn from_report(r: &ProbeReport) -> Self {
        FlushProbe {
            write_4k_p50_us: r.write_4k_us.p50,
            fdatasync_p50_us: r.fdatasync_us.p50,
            fdatasync_p99_us: r.fdatasync_us.p99,
            fua_write_p50_us: r.fua_write_us.p50,
            ceiling_tx_per_sec: r.ceiling_commits_per_sec,
        }
    }
}

/// The configuration a report was measured with.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TxConfig {
    /// Committing threads.
    pub threads: u16,
    /// Streams in the log.
    pub streams: u16,
    /// Data blocks per transaction.
    pub blocks: u32,
    /// Record bytes per transaction.
    pub record_bytes: usize,
    /// Seconds per run.
    pub seconds: f64,
    /// Runs per mode.
    pub runs: u32,
    /// Blocks per segment.
    pub segment_blocks: u32,
    /// Size of the file, bytes.
    pub size_bytes: u64,
    /// Whether `O_DIRECT` was in use.
    pub direct: bool,
    /// The write engine (io_uring or threads).
    pub engine: String,
}

/// Everything `tally bench tx` measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TxReport {
    /// What was run.
    pub config: TxConfig,
    /// Where.
    pub machine: MachineInfo,
    /// Flush cost of the file system the file is on.
    pub probe: FlushProbe,
    /// Per mode, in the order asked.
    pub modes: Vec<ModeSummary>,
    /// Ratios between modes, when both were run.
    pub ratios: Vec<Ratio>,
    /// How to read the figures.
    pub notes: Vec<String>,
}

impl TxReport {
    /// The summary of `mode`, if it was run.
    #[must_use]
    pub fn mode(&self, mode: CommitMode) -> Option<&ModeSummary> {
        self.modes.iter().find(|m| m.mode == mode)
    }
}

fn validate(o: &TxOptions) -> Result<(), BenchError> {
    let bad = |reason: String| Err(BenchError::BadInput { reason });
    if o.modes.is_empty() {
        return bad("no modes given".into());
    }
    if o.threads == 0 || o.blocks == 0 || o.runs == 0 {
        return bad("threads, blocks and runs must be at least 1".into());
    }
    if !(o.seconds.is_finite() && o.seconds > 0.0 && o.seconds <= 3600.0) {
        return bad(format!("seconds must be in (0, 3600], not {}", o.seconds));
    }
    // The classic commit block and the unit(s) must fit one segment with room to spare.
    if u64::from(o.blocks) + 2 > u64::from(o.segment_blocks) / 2 {
        return bad(format!(
            "{} blocks per transaction do not fit well in segments of {} blocks",
            o.blocks, o.segment_blocks
        ));
    }
    Ok(())
}

/// Run the benchmark; `progress` receives one line per step (for stderr).
///
/// # Errors
/// Bad options or a refused path before anything is written; device, log and probe failures.
pub fn run(options: &TxOptions, progress: &dyn Fn(&str)) -> Result<TxReport, BenchError> {
    validate(options)?;
    let streams = options.streams.unwrap_or(options.threads.max(2)).max(1);
    let nbd = nbd_target(&options.path)?;
    let (target, flush_probe, machine) = match &nbd {
        None => {
            progress(&format!(
                "preparing {} ({} MiB)",
                options.path.display(),
                options.size_bytes >> 20
            ));
            let target = Target::prepare(
                &options.path,
                options.size_bytes,
                true,
                options.keep,
                options.force,
            )?;
            if target.filled() {
                progress("wrote every byte of the file once, so every run overwrites in place");
            }
            let probe_path = sibling(target.path(), "probe");
            progress(&format!("probing flush latency on {}", probe_path.display()));
            let probe_report = probe(
                &probe_path,
                ProbeOptions {
                    size_bytes: PROBE_SIZE_BYTES,
                    iterations: PROBE_ITERATIONS,
                    keep: false,
                    force: false,
                },
            )?;
            let flush_probe = FlushProbe::from_report(&probe_report);
            (Some(target), flush_probe, probe_report.machine)
        }
        Some(nbd) => {
            if !options.force {
                return Err(BenchError::BadInput {
                    reason: format!(
                        "{}: the benchmark overwrites the export; give --force",
                        options.path.display()
                    ),
                });
            }
            let nbd =
                nbd.first().ok_or_else(|| BenchError::BadInput { reason: "no export".into() })?;
            progress(&format!("probing flush latency on {nbd}"));
            let dev = NbdDevice::open(nbd, NbdOptions::default())?;
            let t = time_device(&dev, PROBE_ITERATIONS)?;
            let flush_probe = FlushProbe {
                write_4k_p50_us: t.write_4k_us.p50,
                fdatasync_p50_us: t.write_flush_us.p50,
                fdatasync_p99_us: t.write_flush_us.p99,
                fua_write_p50_us: t.fua_write_us.p50,
                ceiling_tx_per_sec: 1e6 / t.write_flush_us.p50.max(1e-3),
            };
            (None, flush_probe, machine_info())
        }
    };
    let run_path = target.as_ref().map_or(options.path.as_path(), |t| t.path());
    let mut runs: Vec<Vec<TxRun>> = vec![Vec::new(); options.modes.len()];
    let mut device_shape = (false, String::new());
    for r in 1..=options.runs {
        for (i, &mode) in options.modes.iter().enumerate() {
            progress(&format!(
                "run {r}/{} mode {} ({} thread(s) x {} block(s), {} s)",
                options.runs,
                mode.name(),
                options.threads,
                options.blocks,
                options.seconds
            ));
            let (one, shape) = run_once(run_path, nbd.as_deref(), options, streams, mode, r)?;
            progress(&format!(
                "  {:.0} tx/s, {:.3} flushes/tx, {:.1} cpu µs/tx",
                one.tx_per_sec, one.flushes_per_tx, one.cpu_us_per_tx
            ));
            device_shape = shape;
            runs[i].push(one);
        }
    }
    let modes: Vec<ModeSummary> =
        options.modes.iter().zip(runs).map(|(&mode, runs)| summarize(mode, runs)).collect();
    let ratios = ratios(&modes);
    let mut notes = vec![
        "ordered and orderless end each timed window with log.sync() inside it: every \
         transaction counted is durable when the clock stops"
            .to_string(),
        "ordered and orderless include periodic checkpoint flushes (a checkpoint runs when \
         fewer than 1/4 of the log's segments are free); those are most of their flushes"
            .to_string(),
        "commit latency is durable latency for classic and count, submit latency for ordered \
         and orderless"
            .to_string(),
        "cpu is getrusage(RUSAGE_SELF) user+sys over the window, every thread of the process \
         (the io_uring reaper included)"
            .to_string(),
    ];
    if flush_probe.fdatasync_p50_us < flush_probe.write_4k_p50_us {
        notes.push(format!(
            "a flush ({:.0} µs) is cheaper than a 4 KiB write ({:.0} µs) here: the \
             device barely honours flushes, so ratios that depend on flush cost will differ on a \
             real SSD",
            flush_probe.fdatasync_p50_us, flush_probe.write_4k_p50_us
        ));
    }
    drop(target);
    Ok(TxReport {
        config: TxConfig {
            threads: options.threads,
            streams,
            blocks: options.blocks,
            record_bytes: RECORD_BYTES,
            seconds: options.seconds,
            runs: options.runs,
            segment_blocks: options.segment_blocks,
            size_bytes: options.size_bytes,
            direct: device_shape.0,
            engine: device_shape.1,
        },
        machine,
        probe: flush_probe,
        modes,
        ratios,
        notes,
    })
}

/// `path` with `.suffix` appended to its file name.
pub(crate) fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".");
    name.push(suffix);
    PathBuf::from(name)
}

/// What one thread did.
struct ThreadOutcome {
    tx: u64,
    latencies_ns: Vec<u64>,
    checkpoints: u64,
}

/// The exports `path` names, if it is an `nbd://` or `nbd+unix://` URI, or several separated
/// by spaces (a multi-target image, striped a segment per target).
fn nbd_target(path: &Path) -> Result<Option<Vec<NbdTarget>>, BenchError> {
    let Some(text) = path.to_str().filter(|t| NbdTarget::is_uri(t)) else { return Ok(None) };
    let bad = |e: tally_media::NbdError| BenchError::BadInput { reason: e.to_string() };
    text.split(' ').map(|t| NbdTarget::parse(t).map_err(bad)).collect::<Result<_, _>>().map(Some)
}

/// Format a fresh log on `path` (or the NBD export `nbd`), open it, and time one run of `mode`.
fn run_once(
    path: &Path,
    nbd: Option<&[NbdTarget]>,
    o: &TxOptions,
    streams: u16,
    mode: CommitMode,
    run: u32,
) -> Result<(TxRun, (bool, String)), BenchError> {
    let (device, shape): (Arc<dyn Device>, _) = if let Some(nbd) = nbd {
        let connection_count = o.nbd_connections.unwrap_or(u32::from(streams)).max(1);
        let options = NbdOptions { connection_count, ..NbdOptions::default() };
        if let [one] = nbd {
            let dev = NbdDevice::open(one, options)?;
            let shape = format!("nbd, {} connection(s)", dev.connection_count());
            (Arc::new(dev), (false, shape))
        } else {
            let mut targets: Vec<Arc<dyn Device>> = Vec::with_capacity(nbd.len());
            let mut connections = 0;
            for target in nbd {
                let dev = NbdDevice::open(target, options)?;
                connections = dev.connection_count();
                targets.push(Arc::new(dev));
            }
            let layout = SpanLayout { stripe_blocks: o.segment_blocks, lead_blocks: 2 };
            let span = SpanDevice::format(targets, layout)?;
            let shape = format!("nbd, {} targets x {connections} connection(s)", nbd.len());
            (Arc::new(span), (false, shape))
        }
    } else {
        let file_options = FileOptions { direct: DirectMode::On, ..FileOptions::default() };
        let dev = FileDevice::open(path, file_options)?;
        let shape = (dev.direct(), dev.engine().to_string());
        (Arc::new(dev), shape)
    };
    Log::format(
        &*device,
        &LogConfig { streams, segment_blocks: o.segment_blocks, ..LogConfig::default() },
    )?;
    let (log, _) = Log::open(device, OpenOptions::default())?;
    let low_water = (log.free_segments() / CHECKPOINT_FREE_FRACTION).max(1);
    let window = Duration::from_secs_f64(o.seconds);

    let stats_before = log.stats();
    let cpu_before = process_cpu_time();
    let started = Instant::now();
    let deadline = started + window;
    let outcomes: Vec<Result<ThreadOutcome, BenchError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..o.threads)
            .map(|t| {
                let log = &log;
                let stream = t % streams;
                scope.spawn(move || worker(log, mode, stream, t, o.blocks, deadline, low_water))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(BenchError::Mismatch("a benchmark thread panicked".into()))
                })
            })
            .collect()
    });
    let sync_started = Instant::now();
    log.sync()?;
    let final_sync = sync_started.elapsed();
    let elapsed = started.elapsed();
    let cpu = process_cpu_time().saturating_sub(cpu_before);
    let stats = log.stats();
    let device: DeviceStats = stats.device - stats_before.device;

    let mut tx = 0u64;
    let mut checkpoints = 0u64;
    let mut latencies = Vec::new();
    for outcome in outcomes {
        let outcome = outcome?;
        tx += outcome.tx;
        checkpoints += outcome.checkpoints;
        latencies.extend(outcome.latencies_ns);
    }
    latencies.sort_unstable();
    let per_tx = |n: u64| if tx == 0 { 0.0 } else { n as f64 / tx as f64 };
    let secs = elapsed.as_secs_f64();
    Ok((
        TxRun {
            mode,
            run,
            tx,
            elapsed_s: secs,
            tx_per_sec: if secs > 0.0 { tx as f64 / secs } else { 0.0 },
            flushes_per_tx: per_tx(device.flushes),
            fua_writes_per_tx: per_tx(device.fua_writes),
            submissions_per_tx: per_tx(device.submissions),
            submit_syscalls_per_tx: per_tx(device.submit_syscalls),
            bytes_written_per_tx: per_tx(device.bytes_written),
            cpu_us_per_tx: per_tx(u64::try_from(cpu.as_nanos()).unwrap_or(u64::MAX)) / 1000.0,
            commit_p50_us: percentile_us(&latencies, 0.50),
            commit_p99_us: percentile_us(&latencies, 0.99),
            checkpoints,
            final_sync_us: final_sync.as_secs_f64() * 1e6,
        },
        shape,
    ))
}

/// One committing thread: commit until `deadline`, checkpointing its stream when space runs low.
fn worker(
    log: &Log,
    mode: CommitMode,
    stream: u16,
    thread: u16,
    blocks: u32,
    deadline: Instant,
    low_water: u32,
) -> Result<ThreadOutcome, BenchError> {
    let block = vec![(thread as u8).wrapping_add(0xA5); DATA_BLOCK_BYTES];
    let mut outcome = ThreadOutcome { tx: 0, latencies_ns: Vec::new(), checkpoints: 0 };
    let mut record = [0u8; RECORD_BYTES];
    record[..2].copy_from_slice(&thread.to_le_bytes());
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Ok(outcome);
        }
        let mut tx = Transaction::new(stream);
        for _ in 0..blocks {
            tx.data(block.clone());
        }
        record[8..16].copy_from_slice(&outcome.tx.to_le_bytes());
        tx.record(record.to_vec());
        let info = log.commit_with(tx, mode)?;
        outcome.latencies_ns.push(u64::try_from(now.elapsed().as_nanos()).unwrap_or(u64::MAX));
        outcome.tx += 1;
        if log.free_segments() < low_water {
            log.checkpoint(stream, info.ticket.seq)?;
            outcome.checkpoints += 1;
        }
    }
}

fn summarize(mode: CommitMode, runs: Vec<TxRun>) -> ModeSummary {
    let spread = |f: fn(&TxRun) -> f64| Spread::of(runs.iter().map(f));
    ModeSummary {
        mode,
        durable_per_commit: matches!(mode, CommitMode::Classic | CommitMode::Count),
        tx_per_sec: spread(|r| r.tx_per_sec),
        flushes_per_tx: spread(|r| r.flushes_per_tx),
        fua_writes_per_tx: spread(|r| r.fua_writes_per_tx),
        submissions_per_tx: spread(|r| r.submissions_per_tx),
        submit_syscalls_per_tx: spread(|r| r.submit_syscalls_per_tx),
        bytes_written_per_tx: spread(|r| r.bytes_written_per_tx),
        cpu_us_per_tx: spread(|r| r.cpu_us_per_tx),
        commit_p50_us: spread(|r| r.commit_p50_us),
        commit_p99_us: spread(|r| r.commit_p99_us),
        checkpoints: spread(|r| r.checkpoints as f64),
        runs,
    }
}

/// Numerator mode, denominator mode, what is compared, and how to read it off a run.
type RatioSpec = (CommitMode, CommitMode, &'static str, fn(&TxRun) -> f64);

/// The ratios the issue asks for, among the modes that were run.
fn ratios(modes: &[ModeSummary]) -> Vec<Ratio> {
    use CommitMode::{Classic, Count, Ordered, Orderless};
    let find = |m: CommitMode| modes.iter().find(|s| s.mode == m);
    let tx = |r: &TxRun| r.tx_per_sec;
    let cpu = |r: &TxRun| r.cpu_us_per_tx;
    let wanted: [RatioSpec; 4] = [
        (Count, Classic, "tx/s", tx),
        (Ordered, Classic, "tx/s", tx),
        (Ordered, Orderless, "tx/s", tx),
        (Ordered, Orderless, "cpu µs/tx", cpu),
    ];
    wanted
        .into_iter()
        .filter_map(|(a, b, what, f)| {
            let (sa, sb) = (find(a)?, find(b)?);
            let median = |s: &ModeSummary| Spread::of(s.runs.iter().map(f)).median;
            let per_run = sa.runs.iter().zip(&sb.runs).map(|(x, y)| f(x) / f(y));
            Some(Ratio {
                name: format!("{}/{} {what}", a.name(), b.name()),
                of_medians: median(sa) / median(sb),
                per_run: Spread::of(per_run),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_bad_options() {
        let o = TxOptions { modes: Vec::new(), ..TxOptions::default() };
        assert!(validate(&o).is_err());
        let o = TxOptions { blocks: 200, ..TxOptions::default() };
        assert!(validate(&o).is_err());
        let o = TxOptions { seconds: f64::NAN, ..TxOptions::default() };
        assert!(validate(&o).is_err());
        assert!(validate(&TxOptions::default()).is_ok());
    }

    #[test]
    fn sibling_appends() {
        assert_eq!(sibling(Path::new("/x/y.img"), "probe"), PathBuf::from("/x/y.img.probe"));
    }
}

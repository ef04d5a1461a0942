//! Write amplification of cleaning: a file system filled (as `statfs` counts it) to a fraction
//! of its free space with files of 992 KiB, then 4 KiB overwrites at uniformly random places,
//! `maintain` (commit every change durably, then clean) after every 1 MiB of them, as the
//! mount's maintenance thread would. A warm-up of as many overwrites as there are live blocks
//! brings the log to its steady state; the next half as many are measured: bytes the device
//! wrote ÷ bytes the workload wrote, from the device's counters. The same workload at a low fill, in the same run, is the floor the
//! log's own overhead sets (a unit of metadata per write, the snapshot of nothing): the excess
//! over it is what cleaning costs.
//!
//! [`measure`] takes a [`Skew`]: the section overwrites uniformly; `examples/clean_skew.rs`
//! measures LFS's hot-and-cold skew beside it on a memory device.
//!
//! The file system lives on the first `size_mib` MiB of Tally's device ([`Prefix`]), so the
//! section stays short whatever the device's size.

use std::sync::Arc;

use tally_fs::{Fs, FsError, MkfsOptions, MountOptions, ROOT};
use tally_media::{check_read, check_write, Device, DeviceStats, Geometry, Ticket, Write};

use super::{fs_err, TallySide, ME};
use crate::{BenchError, Spread};

/// Bytes per fill write: 31 data blocks and the unit that describes them are 32 blocks, so a
/// segment holds a whole number of them (a transaction must fit in half a segment).
const FILL_WRITE_BYTES: usize = 31 << 12;
/// Bytes per file: eight fill writes (a little under 1 MiB).
pub(super) const FILE_BYTES: u64 = 8 * FILL_WRITE_BYTES as u64;
/// Overwrites between two calls of `maintain`.
const WRITES_PER_MAINTAIN: u64 = 256;
/// Blocks per segment: a 1 MiB segment, so even a small file system has a hundred of them.
const SEGMENT_BLOCKS: u32 = 256;

/// The first blocks of a device, seen as a smaller device (this section's file system, and
/// the mixed run's in `latency.rs`).
pub(super) struct Prefix {
    pub(super) inner: Arc<dyn Device>,
    pub(super) block_count: u64,
}

impl Device for Prefix {
    fn geometry(&self) -> Geometry {
        Geometry { block_count: self.block_count, ..self.inner.geometry() }
    }
    fn read(&self, block: u64, buf: &mut [u8]) -> tally_media::Result<()> {
        check_read(&self.geometry(), block, buf)?;
        self.inner.read(block, buf)
    }
    fn submit(
        &self,
        writes: Vec<Write>,
        flags: tally_media::WriteFlags,
    ) -> tally_media::Result<Ticket> {
        check_write(&self.geometry(), &writes)?;
        self.inner.submit(writes, flags)
    }
    fn wait(&self, ticket: Ticket) -> tally_media::Result<()> {
        self.inner.wait(ticket)
    }
    fn flush(&self) -> tally_media::Result<()> {
        self.inner.flush()
    }
    fn stats(&self) -> DeviceStats {
        self.inner.stats()
    }
}

/// One fill's figures over the runs.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FillRow {
    /// Live data ÷ free space after mkfs.
    pub fill: f64,
    /// Used ÷ free space after mkfs, as `statfs` said after the fill (median).
    pub fill_reached: f64,
    /// Bytes of file data ÷ free space after mkfs (median): the rest of the used space is
    /// records and the unused ends of segments.
    pub live_fraction: f64,
    /// Files of 992 KiB made.
    pub files: u64,
    /// Overwrites measured per run (after twice as many unmeasured).
    pub writes: u64,
    /// Device bytes written ÷ workload bytes written.
    pub write_amplification: Spread,
    /// Device flushes per MiB the workload wrote.
    pub flushes_per_mib: Spread,
    /// Segments freed by cleaning, per MiB the workload wrote.
    pub segments_freed_per_mib: Spread,
    /// Overwrites per second (with the maintenance calls).
    pub writes_per_s: Spread,
    /// Runs that stopped with ENOSPC (in the warm-up: nothing measured; in the measured part:
    /// the figures cover the writes done).
    pub enospc_runs: u32,
    /// Overwrites of the warm-up done before it ended (all of them unless ENOSPC).
    pub warmup_writes_before_enospc: Spread,
    /// Write amplification ÷ the baseline's (medians).
    pub over_baseline: f64,
}

/// What the cleaning section measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CleanSection {
    /// Size of the file system, MiB.
    pub size_mib: u64,
    /// Blocks per segment.
    pub segment_blocks: u32,
    /// Log streams of the file system.
    pub streams: u16,
    /// One row per fill asked for; the last is the baseline of `over_baseline`.
    pub fills: Vec<FillRow>,
}

/// How the overwrites choose their files.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Skew {
    /// Fraction of the files that are hot: the first ones made (at least one).
    pub hot_files: f64,
    /// Fraction of the overwrites that go to the hot files; the rest go uniformly to the cold
    /// ones.
    pub hot_writes: f64,
}

impl Skew {
    /// Every file alike: uniformly random places.
    pub const UNIFORM: Skew = Skew { hot_files: 1.0, hot_writes: 1.0 };
    /// LFS's hot-and-cold: 10 % of the files take 90 % of the overwrites.
    pub const HOT_COLD: Skew = Skew { hot_files: 0.1, hot_writes: 0.9 };

    /// The file of an overwrite among `files`.
    fn pick(self, rng: &mut fastrand::Rng, files: usize) -> usize {
        let hot = ((files as f64 * self.hot_files).round() as usize).clamp(1, files.max(1));
        if hot >= files || rng.f64() < self.hot_writes {
            rng.usize(..hot.min(files).max(1))
        } else {
            rng.usize(hot..files)
        }
    }
}

/// One measurement: a fill, a warm-up and the measured overwrites.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CleanRun {
    /// Device bytes written ÷ workload bytes written, over the measured overwrites.
    pub wa: f64,
    /// Device flushes per MiB the workload wrote.
    pub flushes_per_mib: f64,
    /// Segments freed by cleaning per MiB the workload wrote.
    pub freed_per_mib: f64,
    /// Overwrites per second (with the maintenance calls).
    pub writes_per_s: f64,
    /// The run stopped with ENOSPC.
    pub enospc: bool,
    /// Used ÷ free space after mkfs, as `statfs` said after the fill.
    pub reached: f64,
    /// Bytes of file data ÷ free space after mkfs.
    pub live: f64,
    /// Overwrites of the warm-up done.
    pub warmup_done: u64,
    /// Files made.
    pub files: u64,
    /// Overwrites measured (asked).
    pub writes: u64,
}

/// Measure `fill` and the baseline, `runs` times each, alternating.
///
/// # Errors
/// Bad sizes; file-system failures other than ENOSPC during the overwrites.
pub(crate) fn run(
    tally: &TallySide,
    size_mib: u64,
    fills: &[f64],
    streams: u16,
    runs: u32,
    progress: &dyn Fn(&str),
) -> Result<CleanSection, BenchError> {
    let geometry = tally.dev.geometry();
    let block_count = (size_mib << 20) / u64::from(geometry.block_size);
    let fills_ok = !fills.is_empty() && fills.iter().all(|f| (0.01..0.99).contains(f));
    if !fills_ok || streams == 0 || size_mib < 32 || block_count > geometry.block_count {
        return Err(BenchError::BadInput {
            reason: format!(
                "cleaning needs 32 MiB to the device's size ({} MiB), fills between 0.01 and \
                 0.99, and at least one stream",
                (geometry.block_count * u64::from(geometry.block_size)) >> 20
            ),
        });
    }
    let dev: Arc<dyn Device> = Arc::new(Prefix { inner: tally.dev.clone(), block_count });
    let mut results: Vec<Vec<CleanRun>> = fills.iter().map(|_| Vec::new()).collect();
    let mut shape = vec![(0u64, 0u64); fills.len()];
    for run in 0..runs {
        for (k, &f) in fills.iter().enumerate() {
            progress(&format!("clean: {:.0} % full, run {}/{runs}", f * 100.0, run + 1));
            let figures = measure(&dev, f, streams, u64::from(run), Skew::UNIFORM)?;
            shape[k] = (figures.files, figures.writes);
            results[k].push(figures);
        }
    }
    let rows: Vec<FillRow> = fills
        .iter()
        .zip(results)
        .zip(shape)
        .map(|((&fill, r), (files, writes))| FillRow {
            fill,
            fill_reached: Spread::of(r.iter().map(|x| x.reached)).median,
            live_fraction: Spread::of(r.iter().map(|x| x.live)).median,
            files,
            writes,
            write_amplification: Spread::of(r.iter().map(|x| x.wa)),
            flushes_per_mib: Spread::of(r.iter().map(|x| x.flushes_per_mib)),
            segments_freed_per_mib: Spread::of(r.iter().map(|x| x.freed_per_mib)),
            writes_per_s: Spread::of(r.iter().map(|x| x.writes_per_s)),
            enospc_runs: r.iter().filter(|x| x.enospc).count() as u32,
            warmup_writes_before_enospc: Spread::of(r.iter().map(|x| x.warmup_done as f64)),
            over_baseline: 0.0,
        })
        .collect();
    let mut rows = rows;
    let base = rows.last().map_or(0.0, |b| b.write_amplification.median);
    for row in &mut rows {
        row.over_baseline = row.write_amplification.median / base.max(f64::MIN_POSITIVE);
    }
    Ok(CleanSection { size_mib, segment_blocks: SEGMENT_BLOCKS, streams, fills: rows })
}

/// Make a file system on `dev` (4 KiB blocks, segments of 256), fill it to `fill` of its free
/// space with files of 992 KiB, then overwrite 4 KiB blocks chosen by `skew` (`maintain` every
/// 256): a warm-up of as many overwrites as the files have blocks, then half as many measured.
///
/// # Errors
/// A device too small for one file; file-system failures other than ENOSPC.
pub fn measure(
    dev: &Arc<dyn Device>,
    fill: f64,
    streams: u16,
    seed: u64,
    skew: Skew,
) -> Result<CleanRun, BenchError> {
    let mkfs = MkfsOptions { segment_blocks: SEGMENT_BLOCKS, streams, uuid: None };
    Fs::mkfs(dev.clone(), &mkfs).map_err(fs_err)?;
    let fs = Fs::mount(dev.clone(), MountOptions::default()).map_err(fs_err)?;
    let bs = u64::from(fs.block_size());
    let free_at_start = fs.statfs().blocks_free;
    let (inos, reached) = fill_to(&fs, fill)?;
    let live = (inos.len() as u64 * FILE_BYTES) as f64 / (free_at_start * bs).max(1) as f64;
    if inos.is_empty() {
        return Err(BenchError::BadInput {
            reason: "the cleaning file system is too small".into(),
        });
    }
    let blocks_per_file = FILE_BYTES / bs;
    let writes = inos.len() as u64 * blocks_per_file;
    let mut rng = fastrand::Rng::with_seed(seed);
    let data = vec![0x77_u8; bs as usize];
    let mut overwrite = |count: u64| -> Result<(u64, u64, bool), BenchError> {
        let mut freed = 0;
        for n in 0..count {
            let ino = inos[skew.pick(&mut rng, inos.len())];
            let off = rng.u64(..blocks_per_file) * bs;
            match fs.write(None, ino, off, &data) {
                Ok(_) => {}
                Err(FsError::NoSpace) => return Ok((n, freed, true)),
                Err(e) => return Err(fs_err(e)),
            }
            if (n + 1) % WRITES_PER_MAINTAIN == 0 {
                match fs.maintain() {
                    Ok(r) => freed += u64::from(r.segments_freed),
                    Err(FsError::NoSpace) => return Ok((n + 1, freed, true)),
                    Err(e) => return Err(fs_err(e)),
                }
            }
        }
        fs.sync().map_err(fs_err)?;
        Ok((count, freed, false))
    };
    let (warmup_done, _, full) = overwrite(writes)?;
    let before = dev.stats();
    let start = std::time::Instant::now();
    let (done, freed, enospc) = if full { (0, 0, true) } else { overwrite(writes / 2)? };
    let secs = start.elapsed().as_secs_f64();
    let d = dev.stats() - before;
    drop(fs);
    let mib = (done * bs) as f64 / f64::from(1u32 << 20);
    Ok(CleanRun {
        wa: d.bytes_written as f64 / (done * bs).max(1) as f64,
        flushes_per_mib: d.flushes as f64 / mib.max(f64::MIN_POSITIVE),
        freed_per_mib: freed as f64 / mib.max(f64::MIN_POSITIVE),
        writes_per_s: done as f64 / secs,
        enospc,
        reached,
        live,
        warmup_done,
        files: inos.len() as u64,
        writes: writes / 2,
    })
}

/// Fill a fresh `fs` with files of [`FILE_BYTES`] while more than `1 - fill` of the free space
/// it had is left (full as `df` would say it); an ENOSPC before that ends the fill where it
/// is. Returns the files and the fill reached. Shared with the mixed run (`latency.rs`).
pub(super) fn fill_to(fs: &Fs, fill: f64) -> Result<(Vec<tally_fs::Ino>, f64), BenchError> {
    let free_at_start = fs.statfs().blocks_free;
    let chunk = vec![0x33_u8; FILL_WRITE_BYTES];
    let mut inos = Vec::new();
    'fill: while (fs.statfs().blocks_free as f64) > (1.0 - fill) * free_at_start as f64 {
        let name = format!("f{}", inos.len());
        let a = match fs.create(None, ROOT, name.as_bytes(), 0o644, ME) {
            Ok(a) => a,
            Err(FsError::NoSpace) => break,
            Err(e) => return Err(fs_err(e)),
        };
        for off in (0..FILE_BYTES).step_by(FILL_WRITE_BYTES) {
            match fs.write(None, a.ino, off, &chunk) {
                Ok(_) => {}
                Err(FsError::NoSpace) => {
                    fs.unlink(None, ROOT, name.as_bytes()).map_err(fs_err)?;
                    break 'fill;
                }
                Err(e) => return Err(fs_err(e)),
            }
        }
        fs.sync().map_err(fs_err)?;
        inos.push(a.ino);
    }
    fs.sync().map_err(fs_err)?;
    let reached = 1.0 - fs.statfs().blocks_free as f64 / free_at_start.max(1) as f64;
    Ok((inos, reached))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_media::{IoBuf, MemDevice, WriteFlags};

    #[test]
    fn a_hot_cold_skew_sends_its_share_to_the_hot_files() {
        let mut rng = fastrand::Rng::with_seed(7);
        let picks: Vec<usize> = (0..10_000).map(|_| Skew::HOT_COLD.pick(&mut rng, 50)).collect();
        let hot = picks.iter().filter(|&&f| f < 5).count();
        assert!((8_700..9_300).contains(&hot), "{hot} of 10,000 to the 5 hot files");
        assert!(picks.iter().all(|&f| f < 50));
        assert!(picks.iter().any(|&f| f >= 45), "the cold files are written too");
        let mut rng = fastrand::Rng::with_seed(7);
        let uniform: Vec<usize> = (0..10_000).map(|_| Skew::UNIFORM.pick(&mut rng, 50)).collect();
        assert!(uniform.iter().filter(|&&f| f < 5).count() < 1_300);
        assert_eq!(Skew::HOT_COLD.pick(&mut rng, 1), 0, "one file is always hot");
    }

    #[test]
    fn prefix_shows_its_blocks_and_refuses_the_rest() {
        let inner: Arc<dyn Device> = Arc::new(MemDevice::new(4096, 64).unwrap());
        let p = Prefix { inner: inner.clone(), block_count: 16 };
        assert_eq!(p.geometry().block_count, 16);
        p.write_sync(vec![Write::new(15, IoBuf::zeroed(4096))], WriteFlags::default()).unwrap();
        assert!(p
            .submit(vec![Write::new(16, IoBuf::zeroed(4096))], WriteFlags::default())
            .is_err());
        assert!(p
            .submit(vec![Write::new(15, IoBuf::zeroed(8192))], WriteFlags::default())
            .is_err());
        let mut buf = vec![0u8; 4096];
        p.read(15, &mut buf).unwrap();
        assert!(p.read(16, &mut buf).is_err());
        assert_eq!(p.stats().bytes_written, inner.stats().bytes_written);
    }
}

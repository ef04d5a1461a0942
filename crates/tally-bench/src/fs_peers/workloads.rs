//! The workloads measured against a peer: each run prepares its files outside the clock, makes
//! them durable, then times the operations on both sides alike.

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use tally_fs::ROOT;

use super::blockdev::BlockDev;
use super::{fs_err, io_err, row, sqlite, timed, PeerRow, PeersOptions, Sample, Section, ME};
use crate::BenchError;

/// Bytes per write in every workload here.
const WRITE_BYTES: usize = 4096;
/// Streams of the file systems made here: one per thread of the widest run.
const STREAMS: u16 = 8;

/// Targets of issue #4 (Tally ops/s ÷ the peer's).
fn target(section: Section, threads: u32) -> f64 {
    match (section, threads) {
        (Section::Append, 1) => 1.8,
        (Section::Append, _) => 2.5,
        (Section::Atomic, _) => 10.0,
        _ => 2.0,
    }
}

/// What every workload needs.
pub(super) struct Cx<'a> {
    pub(super) o: &'a PeersOptions,
    pub(super) tally: &'a super::TallySide,
    pub(super) ext4: &'a BlockDev,
    pub(super) progress: &'a dyn Fn(&str),
}

/// A fresh directory for one run on ext4; removed (and the removal synced) when dropped.
pub(super) struct Ext4Run {
    pub(super) dir: PathBuf,
}

impl Ext4Run {
    pub(super) fn new(root: &Path, name: &str) -> Result<Ext4Run, BenchError> {
        let dir = root.join(format!("tally-fs-peers.{}.{name}", std::process::id()));
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(io_err("removing an old run directory"))?;
        }
        std::fs::create_dir(&dir).map_err(io_err("creating the run directory on ext4"))?;
        Ok(Ext4Run { dir })
    }

    /// Make everything written so far durable (the whole file system: `syncfs`).
    pub(super) fn sync(&self) -> Result<(), BenchError> {
        let f = File::open(&self.dir).map_err(io_err("opening the run directory"))?;
        // SAFETY: `f` is an open descriptor for the duration of the call.
        if unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&f)) } != 0 {
            return Err(io_err("syncfs")(std::io::Error::last_os_error()));
        }
        Ok(())
    }
}

impl Drop for Ext4Run {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            eprintln!("warning: could not remove {}: {e}", self.dir.display());
        }
        let _ = self.sync_parent();
    }
}

impl Ext4Run {
    fn sync_parent(&self) -> Result<(), BenchError> {
        let parent = self.dir.parent().unwrap_or(&self.dir);
        let f = File::open(parent).map_err(io_err("opening the ext4 directory"))?;
        // SAFETY: as in `sync`.
        unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&f)) };
        Ok(())
    }
}

/// Append + fsync or create + write + fsync + close (each thread in its own directory, or all in
/// one for create-shared), `threads` threads, Tally against ext4.
pub(super) fn threads(cx: &Cx<'_>, section: Section, threads: u32) -> Result<PeerRow, BenchError> {
    let name = match section {
        Section::Append => "append",
        Section::CreateShared => "create-shared",
        _ => "create",
    };
    let (mut tally, mut ext4) = (Vec::new(), Vec::new());
    for run in 0..cx.o.runs {
        (cx.progress)(&format!("{name} x{threads}: run {}/{} tally", run + 1, cx.o.runs));
        tally.push(tally_threads(cx, section, threads)?);
        (cx.progress)(&format!("{name} x{threads}: run {}/{} ext4", run + 1, cx.o.runs));
        ext4.push(ext4_threads(cx, section, threads, run)?);
    }
    Ok(row(name, threads, "ext4", target(section, threads), &tally, &ext4))
}

fn tally_threads(cx: &Cx<'_>, section: Section, threads: u32) -> Result<Sample, BenchError> {
    let fs = cx.tally.fresh(STREAMS)?;
    let data = vec![0x5a_u8; WRITE_BYTES];
    // Per thread: the file appended to, or the directory files are created in (one for all
    // threads in create-shared), and the thread's number (in its files' names).
    let shared = if section == Section::CreateShared {
        Some(fs.mkdir(None, ROOT, b"shared", 0o755, ME).map_err(fs_err)?.ino)
    } else {
        None
    };
    let mut states = Vec::new();
    for t in 0..threads {
        let name = format!("t{t}");
        let ino = match (section, shared) {
            (_, Some(dir)) => dir,
            (Section::Append, None) => {
                fs.create(None, ROOT, name.as_bytes(), 0o644, ME).map_err(fs_err)?.ino
            }
            _ => fs.mkdir(None, ROOT, name.as_bytes(), 0o755, ME).map_err(fs_err)?.ino,
        };
        states.push((ino, t));
    }
    fs.sync().map_err(fs_err)?;
    let sample = timed(states, cx.o.seconds, &cx.tally.block, |&mut (ino, t), i| {
        if section == Section::Append {
            fs.write(None, ino, i * WRITE_BYTES as u64, &data).map_err(fs_err)?;
            fs.fsync(ino).map_err(fs_err)
        } else {
            let name = format!("t{t}-f{i}");
            let f = fs.create(None, ino, name.as_bytes(), 0o644, ME).map_err(fs_err)?;
            fs.open(f.ino).map_err(fs_err)?;
            fs.write(None, f.ino, 0, &data).map_err(fs_err)?;
            fs.fsync(f.ino).map_err(fs_err)?;
            fs.release(f.ino).map_err(fs_err)
        }
    })?;
    drop(fs);
    Ok(sample)
}

fn ext4_threads(
    cx: &Cx<'_>,
    section: Section,
    threads: u32,
    run: u32,
) -> Result<Sample, BenchError> {
    let dir = Ext4Run::new(&cx.o.ext4_dir, &format!("{section:?}-{threads}-{run}"))?;
    let data = vec![0x5a_u8; WRITE_BYTES];
    let sample = if section == Section::Append {
        let mut files = Vec::new();
        for t in 0..threads {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.dir.join(format!("t{t}")))
                .map_err(io_err("creating an ext4 file"))?;
            files.push(f);
        }
        dir.sync()?;
        timed(files, cx.o.seconds, cx.ext4, |f, _| {
            f.write_all(&data).map_err(io_err("ext4 append"))?;
            f.sync_all().map_err(io_err("ext4 fsync"))
        })?
    } else {
        let mut dirs = Vec::new();
        for t in 0..threads {
            let d = if section == Section::CreateShared {
                dir.dir.join("shared")
            } else {
                dir.dir.join(format!("t{t}"))
            };
            if !d.exists() {
                std::fs::create_dir(&d).map_err(io_err("ext4 mkdir"))?;
            }
            dirs.push((d, t));
        }
        dir.sync()?;
        timed(dirs, cx.o.seconds, cx.ext4, |(d, t), i| {
            let name = format!("t{t}-f{i}");
            let mut f = File::create(d.join(name)).map_err(io_err("ext4 create"))?;
            f.write_all(&data).map_err(io_err("ext4 write"))?;
            f.sync_all().map_err(io_err("ext4 fsync"))
            // closed when dropped
        })?
    };
    drop(dir);
    Ok(sample)
}

/// One transaction writing 4 KiB to each of `files` files: Tally's `commit_durable` against
/// SQLite with `files` databases (one main, the others ATTACHed) in rollback-journal mode.
pub(super) fn atomic(cx: &Cx<'_>, files: u32) -> Result<PeerRow, BenchError> {
    let (mut tally, mut lite) = (Vec::new(), Vec::new());
    let mut device_flushes = Vec::new();
    for run in 0..cx.o.runs {
        (cx.progress)(&format!("atomic x{files}: run {}/{} tally", run + 1, cx.o.runs));
        let (sample, device) = tally_atomic(cx, files)?;
        device_flushes.push(device);
        tally.push(sample);
        (cx.progress)(&format!("atomic x{files}: run {}/{} sqlite", run + 1, cx.o.runs));
        let dir = Ext4Run::new(&cx.o.ext4_dir, &format!("sqlite-{files}-{run}"))?;
        let conn = sqlite::Attached::open(&dir.dir, files, WRITE_BYTES)?;
        dir.sync()?;
        lite.push(timed(vec![conn], cx.o.seconds, cx.ext4, |c, i| c.update(i))?);
        drop(dir);
    }
    let mut r = row("atomic", files, "sqlite", target(Section::Atomic, files), &tally, &lite);
    r.tally_device_flushes_per_op = Some(crate::Spread::of(device_flushes));
    Ok(r)
}

/// A Tally run of the atomic workload, and the flushes per commit its own device counted.
fn tally_atomic(cx: &Cx<'_>, files: u32) -> Result<(Sample, f64), BenchError> {
    let fs = cx.tally.fresh(STREAMS)?;
    let mut inos = Vec::new();
    for f in 0..files {
        let a = fs.create(None, ROOT, format!("f{f}").as_bytes(), 0o644, ME).map_err(fs_err)?;
        fs.write(None, a.ino, 0, &[0u8; WRITE_BYTES]).map_err(fs_err)?;
        inos.push(a.ino);
    }
    fs.sync().map_err(fs_err)?;
    let before = cx.tally.dev.stats();
    let sample = timed(vec![()], cx.o.seconds, &cx.tally.block, |(), i| {
        let mut data = vec![0u8; WRITE_BYTES];
        data[..8].copy_from_slice(&i.to_le_bytes());
        let tx = fs.begin().map_err(fs_err)?;
        for &ino in &inos {
            if let Err(e) = fs.write(Some(&tx), ino, 0, &data) {
                let _ = fs.abort(tx);
                return Err(fs_err(e));
            }
        }
        fs.commit_durable(tx).map_err(fs_err)
    })?;
    let flushes = (cx.tally.dev.stats() - before).flushes as f64 / sample.ops.max(1) as f64;
    drop(fs);
    Ok((sample, flushes))
}

//! `tally bench peer multicommit`: commit one 4 KiB update to each of N files atomically, as
//! fast as each system can make it durable (issue #6 workload 5; CFS's multi-file transaction).
//!
//! Systems (what "atomic" means for each is in the report):
//! - `sqlite-rollback`: N database files, the first one main and the others `ATTACH`ed,
//!   `journal_mode=DELETE`, `synchronous=FULL`: SQLite's super-journal makes the commit atomic
//!   across the files, at the price of about 4N+3 syncs;
//! - `sqlite-wal`: the same with `journal_mode=WAL`: **not atomic across files** (SQLite says
//!   so: each WAL commits on its own), listed because it is what people pick;
//! - `tally`: the Tally library on a device, one explicit transaction writing each file, then
//!   `commit_durable` (one flush);
//! - `tally-fuse-ioctl`: N files on a Tally mount, `pwrite` to each between the transaction
//!   ioctls begin and commit-durable (`tally-client`);
//! - the RocksDB and LMDB rows come from `db_bench` and a small C driver run by the runner.
//!
//! Every commit writes fresh bytes (the commit number is stamped in), so no layer can skip it.

use std::path::PathBuf;
use std::time::Instant;

use tally_fs::{Owner, ROOT};

use crate::append::cpu_secs;
use crate::measure::{percentile_us, process_cpu_time};
use crate::peer::{fresh_tally, fs_err, io_err, payload, Window};
use crate::BenchError;

/// Which system commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitSystem {
    /// SQLite, rollback journal, N attached databases.
    SqliteRollback,
    /// SQLite, WAL, N attached databases (not atomic across them).
    SqliteWal,
    /// Tally library, `commit_durable`.
    Tally,
    /// Files in a directory of a Tally FUSE mount, under the transaction ioctls
    /// (`tally_client::begin` … `commit_durable`).
    TallyFuse,
}

impl CommitSystem {
    /// The name used on the command line and in reports.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            CommitSystem::SqliteRollback => "sqlite-rollback",
            CommitSystem::SqliteWal => "sqlite-wal",
            CommitSystem::Tally => "tally",
            CommitSystem::TallyFuse => "tally-fuse-ioctl",
        }
    }
}

impl std::str::FromStr for CommitSystem {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        [
            CommitSystem::SqliteRollback,
            CommitSystem::SqliteWal,
            CommitSystem::Tally,
            CommitSystem::TallyFuse,
        ]
        .into_iter()
        .find(|m| m.name() == s)
        .ok_or_else(|| {
            format!("unknown system {s:?}: sqlite-rollback, sqlite-wal, tally, tally-fuse-ioctl")
        })
    }
}

/// What one multi-file commit window runs.
#[derive(Debug, Clone)]
pub struct CommitOptions {
    /// System.
    pub system: CommitSystem,
    /// Directory for the SQLite systems (a fresh subdirectory is made and removed).
    pub dir: Option<PathBuf>,
    /// Block device or image for `tally` (a fresh file system is made on it).
    pub device: Option<PathBuf>,
    /// Files per commit.
    pub files: u32,
    /// Bytes written to each file per commit.
    pub value_bytes: usize,
    /// Length of the window, seconds.
    pub seconds: f64,
}

/// Rows per table the updates cycle over (so the databases stay small).
const KEYS: u64 = 256;

/// Run one window.
///
/// # Errors
/// Bad options, and any SQLite, I/O or file-system failure.
pub fn run(o: &CommitOptions) -> Result<Window, BenchError> {
    if o.files == 0 || o.files > 62 || o.value_bytes < 8 || o.seconds.is_nan() || o.seconds <= 0.0 {
        return Err(BenchError::BadInput {
            reason: "files 1..=62 (SQLite attaches at most 125), value >= 8 bytes, seconds > 0"
                .into(),
        });
    }
    let mut value = payload(o.value_bytes, 3);
    let mut lat_ns = Vec::new();
    let mut window = match o.system {
        CommitSystem::SqliteRollback | CommitSystem::SqliteWal => {
            let dir = o.dir.as_ref().ok_or_else(|| BenchError::BadInput {
                reason: "the SQLite systems need --dir".into(),
            })?;
            let root = dir.join(format!("multicommit.{}", std::process::id()));
            std::fs::create_dir(&root).map_err(io_err("mkdir", &root))?;
            let wal = o.system == CommitSystem::SqliteWal;
            let w = sqlite_window(o, &root, wal, &mut value, &mut lat_ns);
            std::fs::remove_dir_all(&root).map_err(io_err("remove", &root))?;
            let mut w = w?;
            if wal {
                w.note = Some("not atomic across files (each WAL commits on its own)".into());
            }
            w
        }
        CommitSystem::TallyFuse => {
            let dir = o.dir.as_ref().ok_or_else(|| BenchError::BadInput {
                reason: "tally-fuse-ioctl needs --dir (on a Tally mount)".into(),
            })?;
            let root = dir.join(format!("multicommit.{}", std::process::id()));
            std::fs::create_dir(&root).map_err(io_err("mkdir", &root))?;
            let w = fuse_window(o, &root, &mut value, &mut lat_ns);
            std::fs::remove_dir_all(&root).map_err(io_err("remove", &root))?;
            w?
        }
        CommitSystem::Tally => {
            let device = o
                .device
                .as_ref()
                .ok_or_else(|| BenchError::BadInput { reason: "tally needs --device".into() })?;
            let (dev, fs) = fresh_tally(device)?;
            let me = Owner { uid: 0, gid: 0 };
            let mut inos = Vec::new();
            for i in 0..o.files {
                let a = fs.create(None, ROOT, format!("db{i}").as_bytes(), 0o644, me);
                let ino = a.map_err(fs_err)?.ino;
                fs.write(None, ino, 0, &vec![0u8; o.value_bytes * KEYS as usize])
                    .map_err(fs_err)?;
                inos.push(ino);
            }
            fs.sync().map_err(fs_err)?;
            let before = dev.stats();
            let cpu0 = process_cpu_time();
            let start = Instant::now();
            let mut n = 0u64;
            while start.elapsed().as_secs_f64() < o.seconds {
                let t = Instant::now();
                value[..8].copy_from_slice(&n.to_le_bytes());
                let tx = fs.begin().map_err(fs_err)?;
                let offset = (n % KEYS) * o.value_bytes as u64;
                for &ino in &inos {
                    fs.write(Some(&tx), ino, offset, &value).map_err(fs_err)?;
                }
                fs.commit_durable(tx).map_err(fs_err)?;
                lat_ns.push(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX));
                n += 1;
            }
            let secs = start.elapsed().as_secs_f64();
            let mut w = Window::new("multicommit", "tally", n, secs, cpu_secs(cpu0));
            w.tally_device = Some(dev.stats() - before);
            fs.unmount().map_err(fs_err)?;
            w
        }
    };
    lat_ns.sort_unstable();
    window.payload_bytes = window.ops * u64::from(o.files) * o.value_bytes as u64;
    window.latency_p50_us = Some(percentile_us(&lat_ns, 0.50));
    window.latency_p99_us = Some(percentile_us(&lat_ns, 0.99));
    Ok(window)
}

/// N files on a Tally mount, each commit one transaction begun and committed through ioctls on
/// the directory; the writes are plain `pwrite`s, routed into the transaction by the mount.
fn fuse_window(
    o: &CommitOptions,
    root: &std::path::Path,
    value: &mut [u8],
    lat_ns: &mut Vec<u64>,
) -> Result<Window, BenchError> {
    use std::os::unix::fs::FileExt as _;
    let client = |e: tally_client::Error| BenchError::Failed { reason: format!("ioctl: {e}") };
    let dir = std::fs::File::open(root).map_err(io_err("open", root))?;
    let mut files = Vec::new();
    for i in 0..o.files {
        let p = root.join(format!("db{i}"));
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&p)
            .map_err(io_err("create", &p))?;
        f.write_all_at(&vec![0u8; o.value_bytes * KEYS as usize], 0)
            .map_err(io_err("write", &p))?;
        f.sync_all().map_err(io_err("fsync", &p))?;
        files.push((p, f));
    }
    let cpu0 = process_cpu_time();
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed().as_secs_f64() < o.seconds {
        let t = Instant::now();
        value[..8].copy_from_slice(&n.to_le_bytes());
        tally_client::begin(&dir).map_err(client)?;
        let offset = (n % KEYS) * o.value_bytes as u64;
        for (p, f) in &files {
            f.write_all_at(value, offset).map_err(io_err("write", p))?;
        }
        tally_client::commit_durable(&dir).map_err(client)?;
        lat_ns.push(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX));
        n += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    Ok(Window::new("multicommit", "tally-fuse-ioctl", n, secs, cpu_secs(cpu0)))
}

fn sqlite_window(
    o: &CommitOptions,
    root: &std::path::Path,
    wal: bool,
    value: &mut [u8],
    lat_ns: &mut Vec<u64>,
) -> Result<Window, BenchError> {
    let sq = |e: rusqlite::Error| BenchError::Failed { reason: format!("sqlite: {e}") };
    let db = rusqlite::Connection::open(root.join("db0.sqlite")).map_err(sq)?;
    let mode = if wal { "WAL" } else { "DELETE" };
    let mut setup = format!("PRAGMA journal_mode={mode}; PRAGMA synchronous=FULL;");
    for i in 1..o.files {
        // Attached databases take the journal mode set after attaching.
        setup.push_str(&format!(
            "ATTACH DATABASE '{}' AS db{i};",
            root.join(format!("db{i}.sqlite")).display()
        ));
        setup
            .push_str(&format!("PRAGMA db{i}.journal_mode={mode}; PRAGMA db{i}.synchronous=FULL;"));
    }
    db.execute_batch(&setup).map_err(sq)?;
    let schema = |i: u32| if i == 0 { "main".to_string() } else { format!("db{i}") };
    for i in 0..o.files {
        db.execute_batch(&format!(
            "CREATE TABLE {}.t (k INTEGER PRIMARY KEY, v BLOB NOT NULL);",
            schema(i)
        ))
        .map_err(sq)?;
    }
    let cpu0 = process_cpu_time();
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed().as_secs_f64() < o.seconds {
        let t = Instant::now();
        value[..8].copy_from_slice(&n.to_le_bytes());
        let tx = db.unchecked_transaction().map_err(sq)?;
        for i in 0..o.files {
            let sql = format!("INSERT OR REPLACE INTO {}.t (k, v) VALUES (?1, ?2)", schema(i));
            let key = i64::try_from(n % KEYS).unwrap_or(0);
            tx.prepare_cached(&sql)
                .map_err(sq)?
                .execute(rusqlite::params![key, &*value])
                .map_err(sq)?;
        }
        tx.commit().map_err(sq)?;
        lat_ns.push(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX));
        n += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    let name = if wal { "sqlite-wal" } else { "sqlite-rollback" };
    Ok(Window::new("multicommit", name, n, secs, cpu_secs(cpu0)))
}

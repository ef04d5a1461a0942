//! Small SQLite transactions (1–4 rows inserted or updated, `synchronous=FULL`), commits per
//! second, in one run: SQLite on the Tally library VFS (batch-atomic, over a file device on
//! the host's file system, `O_DIRECT`) against SQLite's own unix VFS in WAL and in rollback
//! (`journal_mode=DELETE`) mode on a file in a directory of the host's file system. Prints a
//! Markdown table with the machine and the file system named, and the ratios.
//!
//! `cargo run --release -p tally-bench --example sqlite_vfs -- DIR [SECONDS]`
//! (DIR: a directory on the file system to compare with; files are made there and removed.)

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags};
use tally_fs::{Fs, MkfsOptions, MountOptions};
use tally_media::{Device, DirectMode, FileDevice, FileOptions};
use tally_sqlite::{TallyVfs, VfsOptions};

type Error = Box<dyn std::error::Error>;

/// Size of the Tally image file.
const IMAGE_BYTES: u64 = 256 << 20;
/// Transactions before the timed window.
const WARMUP: u32 = 50;

struct Outcome {
    name: String,
    commits: u32,
    secs: f64,
    flushes: Option<u64>,
    bytes: Option<u64>,
}

impl Outcome {
    fn per_sec(&self) -> f64 {
        f64::from(self.commits) / self.secs
    }
}

fn schema(db: &Connection, journal: &str) -> Result<(), Error> {
    let mode: String = db.query_row(&format!("PRAGMA journal_mode={journal}"), [], |r| r.get(0))?;
    assert!(mode.eq_ignore_ascii_case(journal), "SQLite kept journal mode {mode}");
    db.execute_batch(
        "PRAGMA synchronous=FULL;
         CREATE TABLE IF NOT EXISTS kv(k INTEGER PRIMARY KEY, v TEXT NOT NULL);",
    )?;
    Ok(())
}

/// One small transaction: 1–4 rows, inserted or updated.
fn transaction(db: &Connection, rng: &mut fastrand::Rng, next: &mut i64) -> Result<(), Error> {
    let tx = db.unchecked_transaction()?;
    for _ in 0..rng.u32(1..=4) {
        let value = format!("{:0>100}", rng.u64(..));
        if *next > 100 && rng.bool() {
            tx.execute("UPDATE kv SET v = ?2 WHERE k = ?1", (rng.i64(1..*next), value))?;
        } else {
            tx.execute("INSERT INTO kv VALUES (?1, ?2)", (*next, value))?;
            *next += 1;
        }
    }
    tx.commit()?;
    Ok(())
}

/// Run the workload on `db` for `window`; the commits and the time taken.
fn drive(db: &Connection, window: Duration, before: impl FnOnce()) -> Result<(u32, f64), Error> {
    let mut rng = fastrand::Rng::with_seed(17);
    let mut next = 1;
    for _ in 0..WARMUP {
        transaction(db, &mut rng, &mut next)?;
    }
    before();
    let start = Instant::now();
    let mut commits = 0;
    while start.elapsed() < window {
        transaction(db, &mut rng, &mut next)?;
        commits += 1;
    }
    Ok((commits, start.elapsed().as_secs_f64()))
}

fn host(dir: &Path, journal: &str, window: Duration) -> Result<Outcome, Error> {
    let path = dir.join(format!("bench-{journal}.db"));
    let _ = std::fs::remove_file(&path);
    let db = Connection::open(&path)?;
    schema(&db, journal)?;
    let (commits, secs) = drive(&db, window, || {})?;
    drop(db);
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    Ok(Outcome {
        name: format!("SQLite {journal} on the host"),
        commits,
        secs,
        flushes: None,
        bytes: None,
    })
}

fn tally(dir: &Path, window: Duration) -> Result<Outcome, Error> {
    let path: PathBuf = dir.join("bench-tally.img");
    // Written through with zeros and synced first, as a block device would be: on a sparse
    // (or fallocated) file every first write to a block changes the host's extent metadata,
    // and each fdatasync then pays a host journal commit that a real device does not.
    let mut file = std::fs::File::create(&path)?;
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..IMAGE_BYTES / zeros.len() as u64 {
        std::io::Write::write_all(&mut file, &zeros)?;
    }
    file.sync_all()?;
    drop(file);
    let options = FileOptions { direct: DirectMode::On, ..FileOptions::default() };
    let dev: Arc<dyn Device> = Arc::new(FileDevice::open(&path, options)?);
    Fs::mkfs(dev.clone(), &MkfsOptions::default())?;
    let fs = Arc::new(Fs::mount(dev.clone(), MountOptions::default())?);
    let vfs = TallyVfs::register("tally-bench", fs.clone(), VfsOptions::default())?;
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE;
    let db = Connection::open_with_flags_and_vfs("/bench.db", flags, vfs.name())?;
    schema(&db, "delete")?;
    let mut at_start = None;
    let (commits, secs) = drive(&db, window, || at_start = Some((dev.stats(), vfs.stats())))?;
    let (d0, v0) = at_start.ok_or("no start")?;
    let (d1, v1) = (dev.stats(), vfs.stats());
    assert_eq!(v1.journal_opens, v0.journal_opens, "a journal on the batch path");
    drop(db);
    drop(vfs);
    if let Some(fs) = Arc::into_inner(fs) {
        fs.unmount()?;
    }
    std::fs::remove_file(&path)?;
    Ok(Outcome {
        name: "SQLite on the Tally library VFS (batch-atomic)".into(),
        commits,
        secs,
        flushes: Some(d1.flushes - d0.flushes),
        bytes: Some(d1.bytes_written - d0.bytes_written),
    })
}

/// The file system holding `dir`, by statfs magic.
fn fs_type(dir: &Path) -> String {
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return "unknown".into();
    };
    // SAFETY: a valid NUL-terminated path and a zeroed statfs buffer the call fills.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return "unknown".into();
    }
    match st.f_type {
        0xEF53 => "ext4 (ext2/3/4 magic)".into(),
        0x5846_5342 => "xfs".into(),
        0x9123_683E => "btrfs".into(),
        0x0102_1994 => "tmpfs".into(),
        0x794C_7630 => "overlayfs".into(),
        other => format!("statfs magic {other:#x}"),
    }
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    format!("{cpu}, {cores} cores")
}

fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().ok_or("usage: sqlite_vfs DIR [SECONDS]")?);
    let seconds: f64 = args.next().map_or(Ok(5.0), |s| s.parse())?;
    let window = Duration::from_secs_f64(seconds);
    let outcomes =
        [tally(&dir, window)?, host(&dir, "wal", window)?, host(&dir, "delete", window)?];
    let wal = outcomes[1].per_sec();
    let rollback = outcomes[2].per_sec();
    println!("Machine: {}; host file system of the directory: {}", machine(), fs_type(&dir));
    println!(
        "Window {seconds} s per configuration, after {WARMUP} warm-up transactions, one run.\n"
    );
    println!(
        "| configuration | commits/s | × WAL | × rollback | flushes/commit | device KiB/commit |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for o in &outcomes {
        let per = |x: Option<u64>, scale: f64| {
            x.map_or("—".to_string(), |x| {
                format!("{:.2}", x as f64 / scale / f64::from(o.commits))
            })
        };
        println!(
            "| {} | {:.0} | {:.2} | {:.2} | {} | {} |",
            o.name,
            o.per_sec(),
            o.per_sec() / wal,
            o.per_sec() / rollback,
            per(o.flushes, 1.0),
            per(o.bytes, 1024.0),
        );
    }
    Ok(())
}

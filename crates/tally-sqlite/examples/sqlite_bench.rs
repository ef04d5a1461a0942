//! SQLite commit workloads for `bench/sqlite_mount.sh` (issue 17's benchmarks), on a directory
//! (SQLite's own unix VFS: ext4, a Tally mount) or on Tally in the library (this crate's VFS).
//!
//! ```text
//! sqlite_bench WORKLOAD MODE TARGET SECONDS
//!   WORKLOAD  small   1-4 rows of ~100 bytes inserted or updated per commit
//!             mix     a phone app's mix over four tables: a message received (insert + thread
//!                     update), a thread read (updates), old messages deleted, a contact
//!                     upserted, a setting changed
//!             attach  two databases (main + ATTACHed): each commit moves an amount between
//!                     them and logs it in both
//!   MODE      delete  rollback journal (batch-atomic where the file system offers it); for
//!                     attach: SQLite's super-journal commit
//!             wal     write-ahead log (attach: not atomic across the two files)
//!             atomic  attach on lib: only: tally_sqlite::atomic, one Tally transaction
//!             MODE+excl  the same with `PRAGMA locking_mode=EXCLUSIVE` (one connection owns
//!                     the file: SQLite bumps the change counter on page 1 once, not per
//!                     commit, and skips the per-transaction lock, page-1 and hot-journal
//!                     checks)
//!   TARGET    DIR     databases in DIR through SQLite's unix VFS
//!             lib:DEV Tally in this process on DEV (image file or block device, made anew,
//!                     O_DIRECT), databases through the Tally VFS
//!   SECONDS   measuring window, after 50 warm-up commits
//! ```
//!
//! Prints one line: `commits N seconds S`; for `lib:` targets `flushes F bytes B submissions U
//! dev_writes W vfs_writes X vfs_bytes Y` (the Tally device's own counters during the window:
//! flushes, bytes written, `submit` calls, write requests; and what SQLite handed the VFS's
//! `xWrite`); and, when
//! `SQLITE_BENCH_STAT` names a block device's `/sys/dev/block/MAJ:MIN/stat`, `blk_flushes F
//! blk_bytes B` read from it at the window's start and end (any target on a loop device). Every commit is `synchronous=FULL`.
//! The SQLite is this workspace's (bundled, `SQLITE_ENABLE_BATCH_ATOMIC_WRITE`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags};
use tally_fs::{Fs, MkfsOptions, MountOptions};
use tally_media::{Device, DirectMode, FileDevice, FileOptions};
use tally_sqlite::{TallyVfs, VfsOptions};

type Error = Box<dyn std::error::Error>;

const WARMUP: u32 = 50;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Workload {
    Small,
    Mix,
    Attach,
}

struct Bench {
    workload: Workload,
    mode: String,
    exclusive: bool,
    rng: fastrand::Rng,
    next: i64,
}

impl Bench {
    fn setup(&self, db: &Connection, b_path: &str) -> Result<(), Error> {
        let journal = if self.mode == "atomic" { "delete" } else { self.mode.as_str() };
        if self.workload == Workload::Attach {
            db.execute("ATTACH ?1 AS b", [b_path])?;
        }
        let schemas: &[&str] =
            if self.workload == Workload::Attach { &["main", "b"] } else { &["main"] };
        for s in schemas {
            let set: String =
                db.pragma_update_and_check(Some(s), "journal_mode", journal, |r| r.get(0))?;
            if !set.eq_ignore_ascii_case(journal) {
                return Err(format!("SQLite kept journal mode {set} for {s}").into());
            }
            db.pragma_update(Some(s), "synchronous", "FULL")?;
        }
        match self.workload {
            Workload::Small => {
                db.execute_batch("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")?;
            }
            Workload::Mix => db.execute_batch(
                "CREATE TABLE threads(id INTEGER PRIMARY KEY, last INTEGER, unread INTEGER);
                 CREATE TABLE messages(id INTEGER PRIMARY KEY, thread INTEGER, ts INTEGER,
                                       body TEXT, read INTEGER);
                 CREATE INDEX messages_thread ON messages(thread, ts);
                 CREATE TABLE contacts(id INTEGER PRIMARY KEY, name TEXT, data BLOB);
                 CREATE TABLE settings(k TEXT PRIMARY KEY, v TEXT);
                 BEGIN;
                 WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 50)
                   INSERT INTO threads SELECT i, 0, 0 FROM n;
                 WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200)
                   INSERT INTO contacts SELECT i, 'contact ' || i, randomblob(100) FROM n;
                 WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20)
                   INSERT INTO settings SELECT 'key' || i, 'value' FROM n;
                 COMMIT;",
            )?,
            Workload::Attach => db.execute_batch(
                "CREATE TABLE main.acct(id INTEGER PRIMARY KEY, balance INTEGER);
                 CREATE TABLE main.log(id INTEGER PRIMARY KEY, amount INTEGER, note BLOB);
                 CREATE TABLE b.acct(id INTEGER PRIMARY KEY, balance INTEGER);
                 CREATE TABLE b.log(id INTEGER PRIMARY KEY, amount INTEGER, note BLOB);
                 BEGIN;
                 WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100)
                   INSERT INTO main.acct SELECT i, 1000 FROM n;
                 WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100)
                   INSERT INTO b.acct SELECT i, 1000 FROM n;
                 COMMIT;",
            )?,
        }
        if self.exclusive {
            // After the first commit: in exclusive mode SQLite keeps a journal file it opened
            // open for good, and a journal that is a file turns the batch-atomic path off (it
            // needs the in-memory one). The first commit on an empty database journals to a
            // file, so setting the mode before it would turn batches off for the connection.
            for s in schemas {
                db.pragma_update(Some(s), "locking_mode", "EXCLUSIVE")?;
            }
        }
        Ok(())
    }

    /// The statements of one commit, inside transaction `tx`.
    fn statements(&mut self, tx: &Connection) -> rusqlite::Result<()> {
        let rng = &mut self.rng;
        self.next += 1;
        let n = self.next;
        match self.workload {
            Workload::Small => {
                for _ in 0..rng.usize(1..=4) {
                    if n > 100 && rng.bool() {
                        tx.execute(
                            "UPDATE t SET v = randomblob(100) WHERE id = ?1",
                            [rng.i64(1..n * 2)],
                        )?;
                    } else {
                        tx.execute("INSERT INTO t(v) VALUES (randomblob(100))", [])?;
                    }
                }
            }
            Workload::Mix => {
                let thread = rng.i64(1..=50);
                match rng.u32(0..100) {
                    0..50 => {
                        tx.execute(
                            "INSERT INTO messages(thread, ts, body, read)
                             VALUES (?1, ?2, hex(randomblob(?3)), 0)",
                            (thread, n, rng.i64(20..150)),
                        )?;
                        tx.execute(
                            "UPDATE threads SET last = ?2, unread = unread + 1 WHERE id = ?1",
                            (thread, n),
                        )?;
                    }
                    50..75 => {
                        tx.execute(
                            "UPDATE messages SET read = 1 WHERE thread = ?1 AND read = 0",
                            [thread],
                        )?;
                        tx.execute("UPDATE threads SET unread = 0 WHERE id = ?1", [thread])?;
                    }
                    75..90 => {
                        tx.execute(
                            "DELETE FROM messages WHERE id IN (SELECT id FROM messages
                             WHERE thread = ?1 ORDER BY ts LIMIT ?2)",
                            (thread, rng.i64(1..=3)),
                        )?;
                    }
                    90..97 => {
                        tx.execute(
                            "INSERT OR REPLACE INTO contacts VALUES (?1, 'contact ' || ?1,
                             randomblob(100))",
                            [rng.i64(1..=300)],
                        )?;
                    }
                    _ => {
                        tx.execute(
                            "UPDATE settings SET v = ?2 WHERE k = ?1",
                            (format!("key{}", rng.u32(1..=20)), n.to_string()),
                        )?;
                    }
                }
            }
            Workload::Attach => {
                let (a, b, amount) = (rng.i64(1..=100), rng.i64(1..=100), rng.i64(1..50));
                tx.execute(
                    "UPDATE main.acct SET balance = balance - ?2 WHERE id = ?1",
                    (a, amount),
                )?;
                tx.execute("UPDATE b.acct SET balance = balance + ?2 WHERE id = ?1", (b, amount))?;
                tx.execute("INSERT INTO main.log VALUES (?1, ?2, randomblob(100))", (n, amount))?;
                tx.execute("INSERT INTO b.log VALUES (?1, ?2, randomblob(100))", (n, amount))?;
            }
        }
        Ok(())
    }

    fn commit(&mut self, db: &Connection) -> Result<(), Error> {
        if self.mode == "atomic" {
            tally_sqlite::atomic(db, |tx| self.statements(tx))?;
        } else {
            let tx = db.unchecked_transaction()?;
            self.statements(&tx)?;
            tx.commit()?;
        }
        Ok(())
    }

    /// Warm up, then commit for `window`: (commits, seconds), calling `start` before measuring.
    fn drive(
        &mut self,
        db: &Connection,
        window: Duration,
        start: impl FnOnce(),
    ) -> Result<(u64, f64), Error> {
        for _ in 0..WARMUP {
            self.commit(db)?;
        }
        start();
        let t0 = Instant::now();
        let mut commits = 0;
        while t0.elapsed() < window {
            self.commit(db)?;
            commits += 1;
        }
        Ok((commits, t0.elapsed().as_secs_f64()))
    }
}

/// Flush requests and bytes written so far by the block device whose `stat` file
/// `SQLITE_BENCH_STAT` names (fields 16 and 7, in 512-byte sectors; Documentation/block/stat.rst).
fn block_stat() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(std::env::var_os("SQLITE_BENCH_STAT")?).ok()?;
    let f: Vec<u64> = text.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    Some((*f.get(15)?, f.get(6)?.checked_mul(512)?))
}

/// ` blk_flushes F blk_bytes B` over the window, or nothing.
fn block_delta(start: Option<(u64, u64)>) -> String {
    match (start, block_stat()) {
        (Some((f0, b0)), Some((f1, b1))) => {
            format!(" blk_flushes {} blk_bytes {}", f1.saturating_sub(f0), b1.saturating_sub(b0))
        }
        _ => String::new(),
    }
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [workload, mode, target, seconds] = args.as_slice() else {
        return Err(
            "usage: sqlite_bench small|mix|attach delete|wal|atomic DIR|lib:DEV SECONDS".into()
        );
    };
    let workload = match workload.as_str() {
        "small" => Workload::Small,
        "mix" => Workload::Mix,
        "attach" => Workload::Attach,
        w => return Err(format!("unknown workload {w}").into()),
    };
    let (mode, exclusive) = match mode.strip_suffix("+excl") {
        Some(m) => (m.to_owned(), true),
        None => (mode.clone(), false),
    };
    if !["delete", "wal", "atomic"].contains(&mode.as_str()) {
        return Err(format!("unknown mode {mode}").into());
    }
    if mode == "atomic" && (workload != Workload::Attach || !target.starts_with("lib:")) {
        return Err("mode atomic is for the attach workload on a lib: target".into());
    }
    let window = Duration::from_secs_f64(seconds.parse()?);
    let mut bench = Bench {
        workload,
        mode: mode.clone(),
        exclusive,
        rng: fastrand::Rng::with_seed(17),
        next: 0,
    };

    if let Some(dev_path) = target.strip_prefix("lib:") {
        let options = FileOptions { direct: DirectMode::On, ..FileOptions::default() };
        let dev: Arc<dyn Device> = Arc::new(FileDevice::open(dev_path, options)?);
        Fs::mkfs(dev.clone(), &MkfsOptions::default())?;
        let fs = Arc::new(Fs::mount(dev.clone(), MountOptions::default())?);
        let vfs = TallyVfs::register("tally-bench", fs.clone(), VfsOptions::default())?;
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE;
        let db = Connection::open_with_flags_and_vfs("/bench.db", flags, vfs.name())?;
        if mode == "wal" {
            // No shared memory in the Tally VFS: WAL needs exclusive locking.
            db.pragma_update(None, "locking_mode", "EXCLUSIVE")?;
        }
        bench.setup(&db, "/bench-b.db")?;
        let mut at_start = None;
        let (commits, secs) = bench
            .drive(&db, window, || at_start = Some((dev.stats(), vfs.stats(), block_stat())))?;
        let (d0, v0, blk0) = at_start.ok_or("no start")?;
        let d1 = dev.stats();
        let v = vfs.stats();
        println!(
            "commits {commits} seconds {secs:.3} flushes {} bytes {} submissions {} \
             dev_writes {} vfs_writes {} vfs_bytes {} journals {} groups {}{}",
            d1.flushes - d0.flushes,
            d1.bytes_written - d0.bytes_written,
            d1.submissions - d0.submissions,
            d1.writes - d0.writes,
            v.file_writes - v0.file_writes,
            v.file_bytes - v0.file_bytes,
            v.journal_opens,
            v.group_commits,
            block_delta(blk0),
        );
        drop(db);
        drop(vfs);
        if let Some(fs) = Arc::into_inner(fs) {
            fs.unmount()?;
        }
    } else {
        let path = format!("{target}/bench.db");
        let db = Connection::open(&path)?;
        bench.setup(&db, &format!("{target}/bench-b.db"))?;
        let mut blk0 = None;
        let (commits, secs) = bench.drive(&db, window, || blk0 = block_stat())?;
        println!("commits {commits} seconds {secs:.3}{}", block_delta(blk0));
    }
    Ok(())
}

//! A bank on SQLite on Tally: accounts whose balances always sum to the same total, and a
//! numbered list of transfers, each one SQL transaction. The workload is a function of a seed,
//! so a model can replay it.

#![allow(dead_code, reason = "each test file uses part of this module")]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rusqlite::{Connection, OpenFlags};
use tally_fs::{Fs, MkfsOptions, MountOptions, ROOT};
use tally_media::Device;
use tally_sqlite::TallyVfs;

pub const ACCOUNTS: i64 = 16;
pub const OPENING: i64 = 1000;
pub const TOTAL: i64 = ACCOUNTS * OPENING;
pub const DB: &str = "/bank.db";

/// A VFS name no other test of this process uses.
pub fn vfs_name(what: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("tally-test-{what}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A fresh file system on `dev`, mounted.
pub fn mkfs_mount(dev: Arc<dyn Device>, mkfs: &MkfsOptions) -> Arc<Fs> {
    Fs::mkfs(dev.clone(), mkfs).unwrap();
    Arc::new(Fs::mount(dev, MountOptions::default()).unwrap())
}

/// Open the bank through `vfs`, rollback journal, `synchronous=FULL`.
pub fn open(vfs: &TallyVfs) -> Connection {
    try_open(vfs).unwrap()
}

/// [`open`], failing with SQLite's error.
pub fn try_open(vfs: &TallyVfs) -> rusqlite::Result<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let db = Connection::open_with_flags_and_vfs(DB, flags, vfs.name())?;
    db.execute_batch("PRAGMA journal_mode=DELETE; PRAGMA synchronous=FULL;")?;
    Ok(db)
}

/// Create the tables and the accounts (transfer 0).
pub fn create(db: &Connection) {
    db.execute_batch(
        "BEGIN;
         CREATE TABLE accounts(id INTEGER PRIMARY KEY, balance INTEGER NOT NULL);
         CREATE TABLE transfers(id INTEGER PRIMARY KEY, src INTEGER, dst INTEGER,
                                amount INTEGER, note BLOB);
         COMMIT;",
    )
    .unwrap();
    let tx = db.unchecked_transaction().unwrap();
    for id in 0..ACCOUNTS {
        tx.execute("INSERT INTO accounts VALUES (?1, ?2)", (id, OPENING)).unwrap();
    }
    tx.commit().unwrap();
}

/// Transfer `k` (from 1): which accounts, how much, and a note of some size (a few are
/// several pages long, so that a commit writes many pages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfer {
    pub id: i64,
    pub src: i64,
    pub dst: i64,
    pub amount: i64,
    pub note: Vec<u8>,
}

pub fn transfer(seed: u64, k: i64) -> Transfer {
    let mut rng = fastrand::Rng::with_seed(seed ^ (k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let src = rng.i64(0..ACCOUNTS);
    let dst = (src + rng.i64(1..ACCOUNTS)) % ACCOUNTS;
    let note_len = if rng.u8(0..8) == 0 { rng.usize(9000..20000) } else { rng.usize(0..200) };
    let fill = rng.u8(..);
    Transfer { id: k, src, dst, amount: rng.i64(1..50), note: vec![fill; note_len] }
}

/// Apply transfer `t` in one transaction and commit it (returns when SQLite acknowledged).
pub fn apply(db: &Connection, t: &Transfer) {
    let tx = db.unchecked_transaction().unwrap();
    tx.execute("UPDATE accounts SET balance = balance - ?2 WHERE id = ?1", (t.src, t.amount))
        .unwrap();
    tx.execute("UPDATE accounts SET balance = balance + ?2 WHERE id = ?1", (t.dst, t.amount))
        .unwrap();
    tx.execute(
        "INSERT INTO transfers VALUES (?1, ?2, ?3, ?4, ?5)",
        (t.id, t.src, t.dst, t.amount, &t.note),
    )
    .unwrap();
    tx.commit().unwrap();
}

/// Balances after transfers 1..=n.
pub fn model(seed: u64, n: i64) -> Vec<i64> {
    let mut b = vec![OPENING; ACCOUNTS as usize];
    for k in 1..=n {
        let t = transfer(seed, k);
        b[t.src as usize] -= t.amount;
        b[t.dst as usize] += t.amount;
    }
    b
}

/// What a database holds: integrity_check's answer, balances, transfer ids (in order), and
/// whether each transfer row equals the workload's.
#[derive(Debug)]
pub struct Seen {
    pub integrity: String,
    pub balances: Vec<i64>,
    pub transfers: Vec<i64>,
    pub rows_match: bool,
}

pub fn look(db: &Connection, seed: u64) -> rusqlite::Result<Seen> {
    let integrity: String = db.query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
    let mut stmt = db.prepare("SELECT balance FROM accounts ORDER BY id")?;
    let balances = stmt.query_map([], |r| r.get(0))?.collect::<rusqlite::Result<Vec<i64>>>()?;
    let mut stmt = db.prepare("SELECT id, src, dst, amount, note FROM transfers ORDER BY id")?;
    let rows = stmt
        .query_map([], |r| {
            Ok(Transfer {
                id: r.get(0)?,
                src: r.get(1)?,
                dst: r.get(2)?,
                amount: r.get(3)?,
                note: r.get(4)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<Transfer>>>()?;
    let rows_match = rows.iter().all(|t| *t == transfer(seed, t.id));
    Ok(Seen { integrity, balances, transfers: rows.iter().map(|t| t.id).collect(), rows_match })
}

/// Names in the root directory of `fs`.
pub fn root_names(fs: &Fs) -> Vec<String> {
    fs.readdir(ROOT, 0)
        .unwrap()
        .into_iter()
        .map(|e| String::from_utf8_lossy(&e.name).into_owned())
        .filter(|n| n != "." && n != "..")
        .collect()
}

/// The bank split over two databases: accounts `0..ACCOUNTS/2` in the main database `DB_A`,
/// the rest in `DB_B`, attached as `b`; each transfer moves money from one database to the
/// other and is recorded in both (`main.transfers`, `b.ledger`), in one [`tally_sqlite::atomic`]
/// transaction.
pub mod split {
    use super::*;

    pub const DB_A: &str = "/a.db";
    pub const DB_B: &str = "/b.db";
    pub const HALF: i64 = ACCOUNTS / 2;

    /// Open `DB_A` and attach `DB_B`, rollback journal, `synchronous=FULL` on both.
    pub fn try_open(vfs: &TallyVfs) -> rusqlite::Result<Connection> {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let db = Connection::open_with_flags_and_vfs(DB_A, flags, vfs.name())?;
        db.execute("ATTACH ?1 AS b", [DB_B])?;
        db.execute_batch(
            "PRAGMA main.journal_mode=DELETE; PRAGMA b.journal_mode=DELETE;
             PRAGMA main.synchronous=FULL; PRAGMA b.synchronous=FULL;",
        )?;
        Ok(db)
    }

    pub fn open(vfs: &TallyVfs) -> Connection {
        try_open(vfs).unwrap()
    }

    /// Create both halves (each in its own ordinary transaction).
    pub fn create(db: &Connection) {
        db.execute_batch(
            "CREATE TABLE main.accounts(id INTEGER PRIMARY KEY, balance INTEGER NOT NULL);
             CREATE TABLE main.transfers(id INTEGER PRIMARY KEY, src INTEGER, dst INTEGER,
                                         amount INTEGER, note BLOB);
             CREATE TABLE b.accounts(id INTEGER PRIMARY KEY, balance INTEGER NOT NULL);
             CREATE TABLE b.ledger(id INTEGER PRIMARY KEY, src INTEGER, dst INTEGER,
                                   amount INTEGER, note BLOB);",
        )
        .unwrap();
        for id in 0..ACCOUNTS {
            let table = if id < HALF { "main.accounts" } else { "b.accounts" };
            db.execute(&format!("INSERT INTO {table} VALUES (?1, ?2)"), (id, OPENING)).unwrap();
        }
    }

    /// Transfer `k`: as [`transfer`], with the destination moved into the other database.
    pub fn transfer(seed: u64, k: i64) -> Transfer {
        let mut t = super::transfer(seed, k);
        let other = (t.dst % HALF) + if t.src < HALF { HALF } else { 0 };
        t.dst = other;
        t
    }

    /// Apply transfer `t` in one atomic group; the closure's SQL error is returned.
    pub fn apply(db: &Connection, t: &Transfer) -> Result<(), tally_sqlite::AtomicError> {
        tally_sqlite::atomic(db, |tx| transfer_in(tx, t))
    }

    /// Transfer `t`'s statements, in a transaction over both databases.
    fn transfer_in(tx: &rusqlite::Transaction<'_>, t: &Transfer) -> rusqlite::Result<()> {
        let table = |id: i64| if id < HALF { "main.accounts" } else { "b.accounts" };
        tx.execute(
            &format!("UPDATE {} SET balance = balance - ?2 WHERE id = ?1", table(t.src)),
            (t.src, t.amount),
        )?;
        tx.execute(
            &format!("UPDATE {} SET balance = balance + ?2 WHERE id = ?1", table(t.dst)),
            (t.dst, t.amount),
        )?;
        let half = t.note.len() / 2;
        tx.execute(
            "INSERT INTO main.transfers VALUES (?1, ?2, ?3, ?4, ?5)",
            (t.id, t.src, t.dst, t.amount, &t.note[..half]),
        )?;
        tx.execute(
            "INSERT INTO b.ledger VALUES (?1, ?2, ?3, ?4, ?5)",
            (t.id, t.src, t.dst, t.amount, &t.note[half..]),
        )?;
        Ok(())
    }

    /// Rows of ~3,000 bytes (a page each) that every odd transfer of the shrinking workload
    /// adds to each database's `junk` table and every even one deletes: with `auto_vacuum=FULL`
    /// each even commit shrinks both files, and SQLite truncates them in its phase two.
    pub const JUNK_ROWS: i64 = 4;

    /// [`create`], both databases in `auto_vacuum=FULL` (set while they are empty) and with a
    /// `junk` table.
    pub fn create_vacuuming(db: &Connection) {
        db.execute_batch("PRAGMA main.auto_vacuum=FULL; PRAGMA b.auto_vacuum=FULL;").unwrap();
        create(db);
        db.execute_batch("CREATE TABLE main.junk(x BLOB); CREATE TABLE b.junk(x BLOB);").unwrap();
    }

    /// Transfer `t` and, in the same atomic group, junk added to both databases (odd `t.id`)
    /// or deleted from both (even).
    pub fn apply_shrinking(db: &Connection, t: &Transfer) -> Result<(), tally_sqlite::AtomicError> {
        tally_sqlite::atomic(db, |tx| {
            transfer_in(tx, t)?;
            if t.id % 2 == 1 {
                for schema in ["main", "b"] {
                    let sql = format!("INSERT INTO {schema}.junk VALUES (zeroblob(3000))");
                    for _ in 0..JUNK_ROWS {
                        tx.execute(&sql, [])?;
                    }
                }
            } else {
                tx.execute_batch("DELETE FROM main.junk; DELETE FROM b.junk;")?;
            }
            Ok(())
        })
    }

    /// Junk rows each database holds after transfers 1..=n of the shrinking workload.
    pub fn junk_after(n: i64) -> i64 {
        if n % 2 == 1 {
            JUNK_ROWS
        } else {
            0
        }
    }

    /// Junk rows in main and in b.
    pub fn junk(db: &Connection) -> rusqlite::Result<[i64; 2]> {
        let count =
            |s: &str| db.query_row(&format!("SELECT COUNT(*) FROM {s}.junk"), [], |r| r.get(0));
        Ok([count("main")?, count("b")?])
    }

    /// Balances after transfers 1..=n.
    pub fn model(seed: u64, n: i64) -> Vec<i64> {
        let mut b = vec![OPENING; ACCOUNTS as usize];
        for k in 1..=n {
            let t = transfer(seed, k);
            b[t.src as usize] -= t.amount;
            b[t.dst as usize] += t.amount;
        }
        b
    }

    /// A transfer row: id, src, dst, amount, this database's half of the note.
    type Row = (i64, i64, i64, i64, Vec<u8>);

    /// What the two databases hold.
    #[derive(Debug)]
    pub struct Seen {
        /// integrity_check of main and of b.
        pub integrity: [String; 2],
        /// Every balance, by account id (main's then b's).
        pub balances: Vec<i64>,
        /// Transfer ids in main.transfers and in b.ledger.
        pub transfers: [Vec<i64>; 2],
        /// Every row (both halves of the note joined) is the workload's.
        pub rows_match: bool,
    }

    pub fn look(db: &Connection, seed: u64) -> rusqlite::Result<Seen> {
        let ia: String = db.query_row("PRAGMA main.integrity_check", [], |r| r.get(0))?;
        let ib: String = db.query_row("PRAGMA b.integrity_check", [], |r| r.get(0))?;
        let mut stmt = db.prepare(
            "SELECT balance FROM main.accounts UNION ALL SELECT balance FROM b.accounts",
        )?;
        let balances = stmt.query_map([], |r| r.get(0))?.collect::<rusqlite::Result<Vec<i64>>>()?;
        let rows = |table: &str| -> rusqlite::Result<Vec<Row>> {
            let mut stmt =
                db.prepare(&format!("SELECT id, src, dst, amount, note FROM {table} ORDER BY id"))?;
            let v = stmt
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))?
                .collect();
            v
        };
        let a = rows("main.transfers")?;
        let b = rows("b.ledger")?;
        let rows_match = a.len() == b.len()
            && a.iter().zip(&b).all(|(x, y)| {
                let t = transfer(seed, x.0);
                let note = [x.4.as_slice(), y.4.as_slice()].concat();
                x.0 == y.0
                    && (x.1, x.2, x.3) == (t.src, t.dst, t.amount)
                    && (y.1, y.2, y.3) == (t.src, t.dst, t.amount)
                    && note == t.note
            });
        Ok(Seen {
            integrity: [ia, ib],
            balances,
            transfers: [a.iter().map(|r| r.0).collect(), b.iter().map(|r| r.0).collect()],
            rows_match,
        })
    }
}

//! Two SQLite databases committed as one Tally transaction: a checking and a savings database
//! (the second `ATTACH`ed), money moved between them by `tally_sqlite::atomic`, each transfer
//! one device flush; a transfer the closure gives up changes neither database.
//!
//! `cargo run --release -p tally-sqlite --example attach`

use std::sync::Arc;

use rusqlite::{Connection, OpenFlags};
use tally_fs::{Fs, MkfsOptions, MountOptions};
use tally_media::{Device, MemDevice};
use tally_sqlite::{atomic, TallyVfs, VfsOptions};

fn balances(db: &Connection) -> rusqlite::Result<(i64, i64)> {
    db.query_row(
        "SELECT (SELECT sum(balance) FROM main.acct), (SELECT sum(balance) FROM savings.acct)",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, 16384)?);
    Fs::mkfs(dev.clone(), &MkfsOptions::default())?;
    let fs = Arc::new(Fs::mount(dev.clone(), MountOptions::default())?);
    let vfs = TallyVfs::register("tally", fs, VfsOptions::default())?;

    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE;
    let db = Connection::open_with_flags_and_vfs("/checking.db", flags, vfs.name())?;
    db.execute_batch(
        "PRAGMA synchronous=FULL;
         ATTACH '/savings.db' AS savings;
         CREATE TABLE main.acct(id INTEGER PRIMARY KEY, balance INTEGER CHECK (balance >= 0));
         CREATE TABLE savings.acct(id INTEGER PRIMARY KEY, balance INTEGER CHECK (balance >= 0));
         INSERT INTO main.acct VALUES (1, 1000);
         INSERT INTO savings.acct VALUES (1, 0);",
    )?;

    let before = (dev.stats().flushes, vfs.stats());
    for _ in 0..100 {
        atomic(&db, |tx| {
            tx.execute("UPDATE main.acct SET balance = balance - 10 WHERE id = 1", [])?;
            tx.execute("UPDATE savings.acct SET balance = balance + 10 WHERE id = 1", [])?;
            Ok(())
        })?;
    }
    let (flushes, stats) = (dev.stats().flushes - before.0, vfs.stats());
    println!(
        "100 transfers across two databases: {} Tally transactions, {flushes} device flushes, \
         {} journals opened",
        stats.group_commits - before.1.group_commits,
        stats.journal_opens - before.1.journal_opens,
    );
    println!("balances (checking, savings): {:?}", balances(&db)?);

    // A transfer that fails half-way (the credit went in, the debit breaks the CHECK):
    // neither database changes.
    let refused = atomic(&db, |tx| {
        tx.execute("UPDATE savings.acct SET balance = balance + 5000 WHERE id = 1", [])?;
        tx.execute("UPDATE main.acct SET balance = balance - 5000 WHERE id = 1", [])?;
        Ok(())
    });
    println!("overdraft refused: {}", refused.err().map_or("no".into(), |e| e.to_string()));
    println!("balances (checking, savings): {:?}", balances(&db)?);
    Ok(())
}

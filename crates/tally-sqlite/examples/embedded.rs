//! SQLite on Tally inside one program, no FUSE: make a file system on a memory device, open a
//! database through the Tally VFS, commit a few small transactions, and show what they cost
//! (journal files opened, batches committed, device flushes).
//!
//! `cargo run --release -p tally-sqlite --example embedded`

use std::sync::Arc;

use rusqlite::{Connection, OpenFlags};
use tally_fs::{Fs, MkfsOptions, MountOptions};
use tally_media::{Device, MemDevice};
use tally_sqlite::{TallyVfs, VfsOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, 16384)?);
    Fs::mkfs(dev.clone(), &MkfsOptions::default())?;
    let fs = Arc::new(Fs::mount(dev.clone(), MountOptions::default())?);
    let vfs = TallyVfs::register("tally", fs.clone(), VfsOptions::default())?;

    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE;
    let db = Connection::open_with_flags_and_vfs("/notes.db", flags, vfs.name())?;
    // Rollback-journal mode and full sync, as an application that wants durable commits sets
    // them; on this VFS these commits write no journal.
    db.execute_batch(
        "PRAGMA journal_mode=DELETE; PRAGMA synchronous=FULL;
         CREATE TABLE notes(id INTEGER PRIMARY KEY, body TEXT NOT NULL);",
    )?;

    let before = (vfs.stats(), dev.stats().flushes);
    for i in 0..100 {
        db.execute("INSERT INTO notes(body) VALUES (?1)", [format!("note {i}")])?;
    }
    let (stats, flushes) = (vfs.stats(), dev.stats().flushes);
    let count: i64 = db.query_row("SELECT count(*) FROM notes", [], |r| r.get(0))?;
    let ok: String = db.query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
    println!("{count} notes, integrity_check {ok}");
    println!(
        "100 commits: {} batch-atomic, {} journals opened, {} device flushes, {} xSync skipped",
        stats.batch_commits - before.0.batch_commits,
        stats.journal_opens - before.0.journal_opens,
        flushes - before.1,
        stats.syncs_skipped - before.0.syncs_skipped,
    );
    Ok(())
}

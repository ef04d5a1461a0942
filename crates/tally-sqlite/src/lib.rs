//! SQLite on Tally, in the library: an SQLite VFS over a [`tally_fs::Fs`], so an embedded
//! program gets SQLite on Tally with no kernel round trip, and SQLite's rollback-mode commits
//! become Tally transactions: **no journal, one flush**.
//!
//! SQLite built with `SQLITE_ENABLE_BATCH_ATOMIC_WRITE` (this workspace builds rusqlite's
//! bundled SQLite so, through `LIBSQLITE3_FLAGS` in `.cargo/config.toml`) asks each database
//! file for `SQLITE_IOCAP_BATCH_ATOMIC`. This VFS reports it, and SQLite then commits a
//! rollback-mode transaction as:
//! `SQLITE_FCNTL_BEGIN_ATOMIC_WRITE` → the page writes → `SQLITE_FCNTL_COMMIT_ATOMIC_WRITE`,
//! keeping its journal in memory. Here the first is [`Fs::begin`](tally_fs::Fs::begin), the
//! writes go into that transaction, and the commit is
//! [`Fs::commit_durable`](tally_fs::Fs::commit_durable): all the pages or none survive a
//! crash, and the commit costs one device flush. `SQLITE_FCNTL_ROLLBACK_ATOMIC_WRITE` is
//! [`Fs::abort`](tally_fs::Fs::abort). The `xSync` SQLite sends after the commit finds
//! nothing left to make durable and returns at once.
//!
//! A batch larger than one `Fs` transaction can hold ([`VfsOptions::batch_bytes_max`]) is
//! refused with an I/O error at the write that overflows it; SQLite then aborts the batch and
//! commits through an ordinary rollback journal (`-journal` file, journal and database synced,
//! journal deleted durably). The journal's appends (three `xWrite`s per page: its number, the
//! page, a checksum) are kept in memory and handed to the `Fs` as one write before anything
//! else touches a file (its sync, or a database write): one `Fs` transaction instead of three
//! per page (`speedtest1` wrote 30 MB to the device for SQLite's 11 MB before, 14 MB after). WAL mode works only with `PRAGMA locking_mode=EXCLUSIVE` (the
//! VFS has no shared memory), and gains nothing here: the batch path is the fast one.
//!
//! **Several databases in one commit**: [`atomic`] runs a transaction over a connection's main
//! and `ATTACH`ed databases (all on this VFS) and commits it as one Tally transaction with one
//! flush, where SQLite alone needs a super-journal and 4n+3 flushes (rollback mode) or is not
//! atomic across the files at all (WAL). The databases are put in `journal_mode=MEMORY` for the
//! call, every write SQLite makes to their files joins one `Fs` transaction, and SQLite's
//! `SQLITE_FCNTL_COMMIT_PHASETWO` (after every database's phase one, before any unlock)
//! commits it; see [`atomic`] and `examples/attach.rs`.
//!
//! **Locking** is in memory, per inode: a `tally_fs::Fs` is mounted by one process, so every
//! connection that can open its files is in this process. Two connections on one database
//! exclude each other as two processes do on unix (SHARED, RESERVED, PENDING, EXCLUSIVE).
//!
//! **Why raw FFI** (rusqlite re-exports `libsqlite3-sys` as `rusqlite::ffi`) and not a VFS
//! crate such as `sqlite-vfs`: the whole point is `xFileControl` (the three atomic-write
//! opcodes) and `xDeviceCharacteristics`, which those crates' file traits do not expose, and
//! the VFS must register with the very SQLite that rusqlite links, which `rusqlite::ffi` is.
//! The unsafe code is two files (`vfs.rs`, `file.rs`), each block with its `SAFETY:` reason,
//! and every callback runs under `catch_unwind` so that a bug is an I/O error, not an unwind
//! into C.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use rusqlite::{Connection, OpenFlags};
//! use tally_fs::{Fs, MkfsOptions, MountOptions};
//! use tally_sqlite::{TallyVfs, VfsOptions};
//!
//! let dev: Arc<dyn tally_media::Device> = Arc::new(tally_media::MemDevice::new(4096, 16384)?);
//! Fs::mkfs(dev.clone(), &MkfsOptions::default())?;
//! let fs = Arc::new(Fs::mount(dev, MountOptions::default())?);
//! let vfs = TallyVfs::register("tally-doc", fs.clone(), VfsOptions::default())?;
//!
//! let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE;
//! let db = Connection::open_with_flags_and_vfs("/app.db", flags, vfs.name())?;
//! db.execute_batch("PRAGMA synchronous=FULL; CREATE TABLE t(x); INSERT INTO t VALUES (1);")?;
//! db.execute("INSERT INTO t VALUES (2)", [])?; // one Tally transaction, one flush
//! assert_eq!(vfs.stats().journal_opens, 1); // only the first commit, on an empty file
//! drop(db);
//! # Ok(())
//! # }
//! ```
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod atomic;
mod file;
mod lock;
mod mutant;
mod path;
mod vfs;

pub use atomic::{atomic, AtomicError};
pub use mutant::{available as mutants_available, VfsMutant};
pub use vfs::{TallyVfs, VfsError, VfsOptions, VfsStats};

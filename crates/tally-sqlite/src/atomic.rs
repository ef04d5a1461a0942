//! Several databases in one atomic commit: [`atomic`] runs an SQLite transaction over a
//! connection's main and `ATTACH`ed databases and commits it as **one** Tally transaction with
//! **one** flush.
//!
//! SQLite alone cannot: in WAL mode a multi-database commit is atomic per file only, and in
//! rollback mode it writes a super-journal and each database's journal and syncs them all
//! (4n+3 flushes for n databases, `vdbeCommit` in `vdbeaux.c`). What [`atomic`] does instead,
//! and why it holds (SQLite 3.50's pager; the reasoning is in `docs/TRANSACTIONS.md`):
//!
//! 1. Every database of the connection (but `temp` and in-memory ones) must be a file of one
//!    [`TallyVfs`](crate::TallyVfs); each is switched to `journal_mode=MEMORY` for the call (its
//!    earlier mode is restored afterwards). With no database needing a super-journal, SQLite
//!    takes its simple commit path: phase one (write the pages) of every database, then phase
//!    two (end the transaction, unlock) of every database. Its own rollback stays possible: the
//!    journal is in memory.
//! 2. One `Fs` transaction (a *group*) is begun and every database file of the connection
//!    joins it: from then on every write and truncate SQLite makes to those files, batch or
//!    not, cache spill included, goes into that transaction, and `xSync` waits for nothing.
//! 3. SQLite sends `SQLITE_FCNTL_COMMIT_PHASETWO` to a database "after a transaction has been
//!    committed but before the database is unlocked", and only once every database's phase
//!    one has succeeded. The first one commits the group with
//!    [`Fs::commit_durable`](tally_fs::Fs::commit_durable): every page of every database or
//!    none, one flush, before any database is unlocked. If that commit fails, the error is
//!    returned to SQLite, which rolls the whole transaction back and reports it. A failed
//!    *write* changes neither database, in memory or on the device; a failed *flush* leaves the
//!    outcome unknown, as a failed `fsync` does: the writes had completed, the file system
//!    keeps showing them and the device may have stored them, so after the error both
//!    databases show the transaction or neither does, never one of them
//!    (`tests/attach_fail.rs` fails the device at each step of the commit).
//! 4. A transaction SQLite ends without committing (`ROLLBACK`, an error, `SQLITE_BUSY` at
//!    `COMMIT`) rewrites the old pages from its memory journal into the group and then unlocks
//!    the first database: that unlock aborts the group, and nothing ever reached the log.
//!
//! Limits: a group must fit in one `Fs` transaction (`VfsOptions::batch_bytes_max`, summed
//! over the databases); a larger transaction fails with `SQLITE_IOERR` in SQLite's phase one and
//! is rolled back, changing nothing. WAL databases cannot join (`AtomicError::Wal`). A
//! database shrinking at commit (auto-vacuum) is truncated after the commit, outside the
//! group, on every database but the first: harmless (the header's page count is what SQLite
//! trusts), but not part of the transaction (`tests/attach_crash.rs` crashes a workload whose
//! every second commit shrinks both databases).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rusqlite::{ffi, Connection, Transaction, TransactionBehavior};
use tally_fs::{FsError, Ino, Txn};

use crate::file;
use crate::mutant::VfsMutant;
use crate::vfs::{Counters, Shared};

/// Why [`atomic`] did not commit.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AtomicError {
    /// The connection already has a transaction open.
    #[error("a transaction is already open on this connection")]
    InTransaction,
    /// A database of the connection is not a file of a Tally VFS.
    #[error("database {0:?} is not a file of a Tally VFS")]
    NotTally(String),
    /// Two databases of the connection are on different Tally file systems.
    #[error("database {0:?} is on another Tally file system than the main database")]
    OtherFs(String),
    /// A database is in WAL mode (its commits go to the `-wal` file, not through the pager's
    /// rollback path this relies on).
    #[error("database {0:?} is in WAL mode")]
    Wal(String),
    /// SQLite kept another journal mode than `memory` for a database.
    #[error("database {0:?} stays in journal_mode={1}")]
    JournalMode(String, String),
    /// A database file already takes part in another atomic group.
    #[error("database {0:?} already takes part in another atomic group")]
    Busy(String),
    /// SQLite failed, or the closure did: nothing was committed.
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    /// The file system could not begin the transaction.
    #[error("the file system refused to begin a transaction: {0}")]
    Fs(#[from] FsError),
}

/// How a group ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Outcome {
    /// Its transaction is still open.
    #[default]
    Open,
    /// Committed durably.
    Committed,
    /// The commit failed (the `Fs` undid the transaction).
    CommitFailed,
    /// Aborted: SQLite rolled back, or nothing was committed.
    Aborted,
}

/// State of one group.
#[derive(Default)]
pub(crate) struct GroupState {
    /// The `Fs` transaction every member's writes go into, until it ends.
    pub(crate) txn: Option<Txn>,
    /// Bytes (whole blocks) written into it, over all members.
    pub(crate) bytes: u64,
    /// The members' inodes (marked durable when the group commits).
    members: Vec<Ino>,
    /// The wrapper is done: members let go of the group at their next call.
    pub(crate) ended: bool,
    pub(crate) outcome: Outcome,
}

/// One `Fs` transaction shared by several open database files.
pub(crate) struct Group {
    pub(crate) shared: Arc<Shared>,
    state: Mutex<GroupState>,
}

impl Group {
    pub(crate) fn state(&self) -> MutexGuard<'_, GroupState> {
        // Changed in whole steps; a panic elsewhere leaves it consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Commit the group durably (SQLite's phase two has begun): an SQLite result code.
    pub(crate) fn commit(&self) -> std::ffi::c_int {
        let mut st = self.state();
        let Some(txn) = st.txn.take() else { return ffi::SQLITE_OK };
        let shared = &self.shared;
        let writes: Vec<(Ino, u64)> = {
            let mut locks = shared.locks();
            st.members.iter().map(|&ino| (ino, locks.writes(ino))).collect()
        };
        match shared.fs.commit_durable(txn) {
            Ok(()) => {
                let mut locks = shared.locks();
                for (ino, w) in writes {
                    locks.durable(ino, w);
                }
                st.outcome = Outcome::Committed;
                Counters::bump(&shared.counters.group_commits);
                ffi::SQLITE_OK
            }
            Err(_) if shared.mutant() == Some(VfsMutant::PhaseTwoFailureIgnored) => {
                st.outcome = Outcome::Committed;
                ffi::SQLITE_OK
            }
            Err(e) => {
                st.outcome = Outcome::CommitFailed;
                Counters::bump(&shared.counters.group_aborts);
                match e {
                    FsError::NoSpace => ffi::SQLITE_FULL,
                    _ => ffi::SQLITE_IOERR_COMMIT_ATOMIC,
                }
            }
        }
    }

    /// Abort the group if its transaction is still open (SQLite ended without committing).
    pub(crate) fn abort(&self) {
        let mut st = self.state();
        if let Some(txn) = st.txn.take() {
            // An abort of an open transaction fails only for an unknown one; either way
            // nothing of it reaches the log.
            let _ = self.shared.fs.abort(txn);
            st.outcome = Outcome::Aborted;
            Counters::bump(&self.shared.counters.group_aborts);
        }
    }

    /// The wrapper is done. A transaction still open is committed if SQLite committed and it
    /// holds writes (SQLite sent no phase two: not expected, but the writes are SQLite's
    /// commit), else aborted.
    fn end(&self, sqlite_committed: bool) -> Outcome {
        let pending = {
            let st = self.state();
            st.txn.is_some() && st.bytes > 0
        };
        if sqlite_committed && pending {
            let _ = self.commit();
        } else {
            self.abort();
        }
        let mut st = self.state();
        st.ended = true;
        st.outcome
    }
}

/// Run `f` in one SQLite transaction over every database of `conn` (its main database and
/// every `ATTACH`ed one), all files of one [`TallyVfs`](crate::TallyVfs), and commit it as one
/// Tally transaction with one flush: after a crash every database shows the transaction, or
/// none does. `f`'s error, or a failed commit, rolls everything back and nothing reaches the
/// files.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use rusqlite::{Connection, OpenFlags};
/// use tally_fs::{Fs, MkfsOptions, MountOptions};
/// use tally_sqlite::{atomic, TallyVfs, VfsOptions};
///
/// let dev: Arc<dyn tally_media::Device> = Arc::new(tally_media::MemDevice::new(4096, 16384)?);
/// Fs::mkfs(dev.clone(), &MkfsOptions::default())?;
/// let fs = Arc::new(Fs::mount(dev.clone(), MountOptions::default())?);
/// let vfs = TallyVfs::register("tally-atomic-doc", fs, VfsOptions::default())?;
/// let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE;
/// let db = Connection::open_with_flags_and_vfs("/checking.db", flags, vfs.name())?;
/// db.execute_batch(
///     "ATTACH '/savings.db' AS savings;
///      CREATE TABLE main.acct(id INTEGER PRIMARY KEY, balance INTEGER);
///      CREATE TABLE savings.acct(id INTEGER PRIMARY KEY, balance INTEGER);
///      INSERT INTO main.acct VALUES (1, 100); INSERT INTO savings.acct VALUES (1, 0);",
/// )?;
/// let flushes = dev.stats().flushes;
/// atomic(&db, |tx| {
///     tx.execute("UPDATE main.acct SET balance = balance - 30 WHERE id = 1", [])?;
///     tx.execute("UPDATE savings.acct SET balance = balance + 30 WHERE id = 1", [])?;
///     Ok(())
/// })?;
/// assert_eq!(dev.stats().flushes - flushes, 1); // two databases, one flush
/// assert_eq!(vfs.stats().group_commits, 1);
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// [`AtomicError`]: a transaction already open, a database that cannot join (not on this
/// VFS's file system, WAL mode, in another group), SQLite's or `f`'s error (rolled back), a
/// commit that failed (rolled back: `SQLITE_FULL` or `SQLITE_IOERR_COMMIT_ATOMIC` from
/// `COMMIT`).
pub fn atomic<T>(
    conn: &Connection,
    f: impl FnOnce(&Transaction<'_>) -> rusqlite::Result<T>,
) -> Result<T, AtomicError> {
    if !conn.is_autocommit() {
        return Err(AtomicError::InTransaction);
    }
    let mut names = Vec::new();
    conn.pragma_query(None, "database_list", |row| {
        let name: String = row.get(1)?;
        let file: String = row.get(2)?;
        if name != "temp" && !file.is_empty() {
            names.push(name);
        }
        Ok(())
    })?;
    let mut members = Vec::with_capacity(names.len());
    for name in &names {
        let Some(member) = file::member(conn, name) else {
            return Err(AtomicError::NotTally(name.clone()));
        };
        members.push(member);
    }
    let Some(shared) = members.first().map(file::Member::shared) else {
        return Err(AtomicError::NotTally("main".to_owned()));
    };
    for (name, m) in names.iter().zip(&members) {
        if !Arc::ptr_eq(&m.shared(), &shared) {
            return Err(AtomicError::OtherFs(name.clone()));
        }
    }
    let mut modes = Modes { conn, restore: Vec::new() };
    for name in &names {
        let mode: String = conn.pragma_query_value(Some(name), "journal_mode", |r| r.get(0))?;
        match mode.as_str() {
            "wal" => return Err(AtomicError::Wal(name.clone())),
            "memory" => {}
            _ => {
                let set: String =
                    conn.pragma_update_and_check(Some(name), "journal_mode", "memory", |r| {
                        r.get(0)
                    })?;
                modes.restore.push((name.clone(), mode));
                if set != "memory" {
                    return Err(AtomicError::JournalMode(name.clone(), set));
                }
            }
        }
    }

    let group = Arc::new(Group {
        shared: shared.clone(),
        state: Mutex::new(GroupState {
            txn: Some(shared.fs.begin()?),
            members: members.iter().filter_map(file::Member::ino).collect(),
            ..GroupState::default()
        }),
    });
    let ended = End(&group);
    let leave_out = shared.mutant() == Some(VfsMutant::GroupLeavesSecondFile);
    for (i, (name, m)) in names.iter().zip(&members).enumerate() {
        if leave_out && i == 1 {
            continue;
        }
        if !m.join(&group) {
            return Err(AtomicError::Busy(name.clone()));
        }
    }

    let tx = Transaction::new_unchecked(conn, TransactionBehavior::Deferred)?;
    let result = match f(&tx) {
        Ok(v) => tx.commit().map(|()| v),
        Err(e) => {
            drop(tx); // rolls back
            Err(e)
        }
    };
    let outcome = group.end(result.is_ok());
    drop(ended);
    modes.restore()?;
    let v = result?;
    match outcome {
        Outcome::Committed | Outcome::Aborted | Outcome::Open => Ok(v),
        // SQLite was told (phase two failed) and rolled back, so its COMMIT failed and this
        // is not reached; kept as an error all the same.
        Outcome::CommitFailed => Err(AtomicError::Sqlite(rusqlite::Error::SqliteFailure(
            ffi::Error::new(ffi::SQLITE_IOERR_COMMIT_ATOMIC),
            Some("the Tally transaction did not commit".to_owned()),
        ))),
    }
}

/// Ends the group (aborting it) if [`atomic`] returns early or `f` panics.
struct End<'a>(&'a Arc<Group>);

impl Drop for End<'_> {
    fn drop(&mut self) {
        self.0.end(false);
    }
}

/// Journal modes to put back.
struct Modes<'c> {
    conn: &'c Connection,
    restore: Vec<(String, String)>,
}

impl Modes<'_> {
    fn restore(mut self) -> rusqlite::Result<()> {
        let mut first = Ok(());
        for (name, mode) in std::mem::take(&mut self.restore) {
            let r =
                self.conn.pragma_update_and_check(Some(&name), "journal_mode", &mode, |_| Ok(()));
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

impl Drop for Modes<'_> {
    fn drop(&mut self) {
        for (name, mode) in std::mem::take(&mut self.restore) {
            let _ =
                self.conn.pragma_update_and_check(Some(&name), "journal_mode", &mode, |_| Ok(()));
        }
    }
}

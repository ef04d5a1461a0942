//! SQLite's five lock levels, kept in memory per file (per inode).
//!
//! One process: every connection that can reach a `tally_fs::Fs` lives in the process that
//! mounted it (the library owns the device), so the lock state of a file is a table in this
//! process, not POSIX advisory locks. Two connections of the same process on one database
//! exclude each other exactly as SQLite's unix VFS makes two processes do.
//!
//! Invariants, per inode (checked by [`InodeLocks::check`] after every change):
//! - `shared` counts the handles at level SHARED or above;
//! - at most one handle holds RESERVED, PENDING or EXCLUSIVE (`writer`);
//! - EXCLUSIVE is held only when no other handle holds SHARED (`shared == 1`);
//! - while a writer holds PENDING or EXCLUSIVE no new SHARED lock is granted.
//!
//! The table also counts each inode's plain writes and the count covered by the last
//! fsync or durable commit, so `xSync` costs nothing when nothing is left to make durable.

use std::collections::HashMap;

use rusqlite::ffi;
use tally_fs::Ino;

/// Identifies one open handle (a `sqlite3_file`).
pub(crate) type HandleId = u64;

/// Lock and durability state of one inode.
#[derive(Debug, Default)]
pub(crate) struct InodeLocks {
    /// Handles at SHARED or above.
    shared: u32,
    /// The handle at RESERVED, PENDING or EXCLUSIVE, and its level.
    writer: Option<(HandleId, i32)>,
    /// Plain (non-batch) writes and truncates made to the file.
    writes: u64,
    /// `writes` as it was when the last fsync or durable batch commit began.
    writes_durable: u64,
    /// Handles open on the inode (the entry is dropped with the last).
    handles: u32,
}

impl InodeLocks {
    fn check(&self) {
        if let Some((_, level)) = self.writer {
            assert!(
                (ffi::SQLITE_LOCK_RESERVED..=ffi::SQLITE_LOCK_EXCLUSIVE).contains(&level),
                "writer at level {level}"
            );
            assert!(self.shared >= 1, "a writer holds SHARED too");
            assert!(level != ffi::SQLITE_LOCK_EXCLUSIVE || self.shared == 1, "EXCLUSIVE shared");
        }
        assert!(self.shared <= self.handles, "more SHARED locks than handles");
        assert!(self.writes_durable <= self.writes, "durable count ahead of writes");
    }
}

/// Lock state of every open inode.
#[derive(Debug, Default)]
pub(crate) struct LockTable {
    inodes: HashMap<Ino, InodeLocks>,
}

impl LockTable {
    /// A handle opened `ino`.
    pub(crate) fn open(&mut self, ino: Ino) {
        self.inodes.entry(ino).or_default().handles += 1;
    }

    /// A handle on `ino` closed (its lock must be NONE by then).
    pub(crate) fn close(&mut self, ino: Ino) {
        if let Some(l) = self.inodes.get_mut(&ino) {
            l.handles = l.handles.saturating_sub(1);
            l.check();
            if l.handles == 0 {
                self.inodes.remove(&ino);
            }
        }
    }

    fn entry(&mut self, ino: Ino) -> &mut InodeLocks {
        self.inodes.entry(ino).or_default()
    }

    /// Raise handle `id` from `level` to `want`; returns the new level, or `Err(level)` with
    /// the level it holds now when another handle is in the way (SQLITE_BUSY).
    pub(crate) fn lock(
        &mut self,
        ino: Ino,
        id: HandleId,
        level: i32,
        want: i32,
    ) -> Result<i32, i32> {
        let l = self.entry(ino);
        if level >= want {
            return Ok(level);
        }
        let other_writer = l.writer.filter(|&(w, _)| w != id);
        let result = match want {
            ffi::SQLITE_LOCK_SHARED => {
                assert_eq!(level, ffi::SQLITE_LOCK_NONE);
                match other_writer {
                    Some((_, wl)) if wl >= ffi::SQLITE_LOCK_PENDING => Err(level),
                    _ => {
                        l.shared += 1;
                        Ok(want)
                    }
                }
            }
            ffi::SQLITE_LOCK_RESERVED => {
                assert_eq!(level, ffi::SQLITE_LOCK_SHARED, "RESERVED from a level but SHARED");
                if other_writer.is_some() {
                    Err(level)
                } else {
                    l.writer = Some((id, want));
                    Ok(want)
                }
            }
            ffi::SQLITE_LOCK_EXCLUSIVE | ffi::SQLITE_LOCK_PENDING => {
                assert!(level >= ffi::SQLITE_LOCK_SHARED, "EXCLUSIVE without SHARED");
                if other_writer.is_some() {
                    Err(level)
                } else if l.shared > 1 {
                    // PENDING keeps new readers out while the ones inside finish.
                    l.writer = Some((id, ffi::SQLITE_LOCK_PENDING));
                    Err(ffi::SQLITE_LOCK_PENDING)
                } else {
                    l.writer = Some((id, want));
                    Ok(want)
                }
            }
            _ => Err(level),
        };
        l.check();
        result
    }

    /// Lower handle `id` to `want` (SHARED or NONE).
    pub(crate) fn unlock(&mut self, ino: Ino, id: HandleId, level: i32, want: i32) -> i32 {
        let l = self.entry(ino);
        if level <= want {
            return level;
        }
        if l.writer.is_some_and(|(w, _)| w == id) {
            l.writer = None;
        }
        if want == ffi::SQLITE_LOCK_NONE && level >= ffi::SQLITE_LOCK_SHARED {
            l.shared = l.shared.saturating_sub(1);
        }
        l.check();
        want
    }

    /// Whether any handle holds RESERVED or above.
    pub(crate) fn reserved(&mut self, ino: Ino) -> bool {
        self.entry(ino).writer.is_some()
    }

    /// A plain write or truncate changed `ino`.
    pub(crate) fn wrote(&mut self, ino: Ino) {
        let l = self.entry(ino);
        l.writes += 1;
    }

    /// The write count now, before a sync or durable commit begins.
    pub(crate) fn writes(&mut self, ino: Ino) -> u64 {
        self.entry(ino).writes
    }

    /// Whether writes since the last durable point are left.
    pub(crate) fn unsynced(&mut self, ino: Ino) -> bool {
        let l = self.entry(ino);
        l.writes > l.writes_durable
    }

    /// Writes up to `writes` (read before the sync began) are durable.
    pub(crate) fn durable(&mut self, ino: Ino, writes: u64) {
        let l = self.entry(ino);
        l.writes_durable = l.writes_durable.max(writes);
        l.check();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ffi::{
        SQLITE_LOCK_EXCLUSIVE as X, SQLITE_LOCK_NONE as N, SQLITE_LOCK_PENDING as P,
        SQLITE_LOCK_RESERVED as R, SQLITE_LOCK_SHARED as S,
    };

    #[test]
    fn a_writer_waits_for_readers_and_keeps_new_ones_out() {
        let mut t = LockTable::default();
        t.open(7);
        t.open(7);
        assert_eq!(t.lock(7, 1, N, S), Ok(S));
        assert_eq!(t.lock(7, 2, N, S), Ok(S));
        assert_eq!(t.lock(7, 1, S, R), Ok(R));
        assert_eq!(t.lock(7, 2, S, R), Err(S), "one RESERVED at a time");
        assert!(t.reserved(7));
        assert_eq!(t.lock(7, 1, R, X), Err(P), "a reader is still inside");
        assert_eq!(t.unlock(7, 2, S, N), N);
        assert_eq!(t.lock(7, 2, N, S), Err(N), "PENDING keeps new readers out");
        assert_eq!(t.lock(7, 1, P, X), Ok(X));
        assert_eq!(t.unlock(7, 1, X, S), S);
        assert!(!t.reserved(7));
        assert_eq!(t.lock(7, 2, N, S), Ok(S));
        assert_eq!(t.unlock(7, 1, S, N), N);
        assert_eq!(t.unlock(7, 2, S, N), N);
        t.close(7);
        t.close(7);
        assert!(t.inodes.is_empty());
    }

    #[test]
    fn sync_is_needed_only_after_plain_writes() {
        let mut t = LockTable::default();
        t.open(3);
        assert!(!t.unsynced(3));
        t.wrote(3);
        let w = t.writes(3);
        t.wrote(3); // lands while the sync runs: not covered by it
        t.durable(3, w);
        assert!(t.unsynced(3));
        let w = t.writes(3);
        t.durable(3, w);
        assert!(!t.unsynced(3));
    }
}

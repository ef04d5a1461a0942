//! Durability and order (fsync, sync, barrier) and explicit transactions.

use std::collections::HashMap;

use tally_log::TxId;

use crate::mutant::FsMutant;
use crate::state::{Key, State};
use crate::txn::TxnState;
use crate::types::*;
use crate::{FsError, Result};

use super::commit::dying_blocks;
use super::{lock, Fs, Txn};

impl Fs {
    /// Make `ino`'s committed changes, and everything they depend on, durable; and every
    /// namespace change committed before the call (any directory's entries: the rule of
    /// `docs/FS.md`, "Durability of names"). Other files' data and attribute changes are
    /// flushed along only if they precede one of those on its stream.
    ///
    /// # Errors
    /// `ENOENT`, I/O errors (after which the file system is read-only).
    pub fn fsync(&self, ino: Ino) -> Result<()> {
        let wants = {
            let mut st = self.lock_waited()?;
            let last = st.inode(ino)?.last_tx;
            let mut wants = self.pending_barriers(&mut st).to_vec();
            wants.extend(last);
            wants
        };
        if self.mutant != Some(FsMutant::FsyncNotDurable) && !wants.is_empty() {
            self.log.wait_durable_all(&wants).map_err(|e| self.fail(e))?;
        }
        // Dropping what became durable is not this call's result: skipped when the lock is
        // busy (the next durable wait, or the cache limit's write-out, drops it), so an fsync
        // never waits for the state lock after its durable wait.
        self.prune_cache_in_slices(self.durable_upto(), false)
    }

    /// [`Fs::fsync`]: every change of a file is one record set, so data-only sync costs the same.
    ///
    /// # Errors
    /// As [`Fs::fsync`].
    pub fn fdatasync(&self, ino: Ino) -> Result<()> {
        self.fsync(ino)
    }

    /// Make everything committed durable.
    ///
    /// # Errors
    /// I/O errors.
    pub fn sync(&self) -> Result<()> {
        self.log.sync().map_err(|e| self.fail(e))?;
        self.prune_cache_in_slices(self.durable_upto(), true)
    }

    /// Order without waiting: every operation after this call, on any file, survives a crash
    /// only if `ino`'s changes before it survive too. Returns at once.
    ///
    /// # Errors
    /// `ENOENT`.
    pub fn barrier(&self, ino: Ino) -> Result<()> {
        let mut st = lock(&self.state)?;
        if let Some(t) = st.inode(ino)?.last_tx {
            self.note_barrier(&mut st, t);
        }
        Ok(())
    }

    /// Begin an explicit transaction: operations given it are applied to the DRAM state at
    /// once (readers see them) and written to the log only at commit, as one atomic
    /// transaction. It is bound to the calling thread: an operation outside it on this thread
    /// that meets what it holds gets `EBUSY` instead of waiting for itself.
    ///
    /// # Errors
    /// Read-only after an I/O error.
    pub fn begin(&self) -> Result<Txn> {
        self.begin_for(Some(crate::sync::current_thread()))
    }

    /// [`Fs::begin`] for a server that begins transactions on behalf of its clients (the FUSE
    /// adapter): bound to no thread, so an operation outside it waits for it on whichever
    /// thread it runs, the thread that served the begin included. Bound to that thread, a
    /// later request of another client served there got `EBUSY` at once.
    ///
    /// # Errors
    /// Read-only after an I/O error.
    pub fn begin_detached(&self) -> Result<Txn> {
        self.begin_for(None)
    }

    fn begin_for(&self, thread: Option<crate::sync::ThreadId>) -> Result<Txn> {
        let mut st = lock(&self.state)?;
        if let Some(e) = &st.failed {
            return Err(FsError::read_only(e));
        }
        // The last chance to clean before this transaction's writes need space: operations
        // inside a transaction never clean (liveness is judged on what is on media), and a
        // writer that is always inside one (SQLite's atomic writes on the mount) would
        // otherwise fill the log with dead blocks until `ENOSPC`. Back-pressure: the begin
        // waits for the cleaning.
        if self.cleaning_due(&mut st) {
            drop(st);
            self.clean_for_space(false)?;
            st = lock(&self.state)?;
        }
        st.txns.next += 1;
        let id = st.txns.next;
        st.txns.open.insert(id, TxnState { thread, ..TxnState::default() });
        Ok(Txn { id })
    }

    /// Commit: ordered and atomic; returns before it is durable.
    ///
    /// # Errors
    /// `ENOSPC` when it does not fit (the transaction is then aborted), I/O errors.
    pub fn commit(&self, txn: Txn) -> Result<()> {
        self.end(txn).map(|_| ())
    }

    /// Commit and wait until the transaction (and what it depends on) is durable, with every
    /// namespace change committed before it (as [`Fs::fsync`]).
    ///
    /// # Errors
    /// As [`Fs::commit`].
    pub fn commit_durable(&self, txn: Txn) -> Result<()> {
        let wants = self.end(txn)?;
        if !wants.is_empty() {
            self.log.wait_durable_all(&wants).map_err(|e| self.fail(e))?;
        }
        Ok(())
    }

    /// End (commit) `txn`. Returns what a durable wait for it waits for: its last log
    /// transaction, if it wrote anything, and the pending barriers (namespace changes
    /// included) from when it committed.
    pub(crate) fn end(&self, txn: Txn) -> Result<Vec<TxId>> {
        let mut st = lock(&self.state)?;
        let Some(t) = st.txns.open.remove(&txn.id) else { return Err(FsError::NoTxn) };
        let stream = t.stream.unwrap_or(0);
        // Storage versions of shared directory attributes, with this transaction's deltas.
        let mut overrides = HashMap::new();
        for (&dir, diff) in &t.dir_diffs {
            if st.txns.locks.get(&Key::Inode(dir)) == Some(&txn.id) {
                // Locked whole (no other transaction can hold a delta on it): its memory
                // version is what to write, and becomes its storage version.
                if let Some(i) = st.inodes.get(&dir) {
                    overrides.insert(dir, i.attr);
                }
                continue;
            }
            if let Some(stored) = st.inodes.get(&dir).and_then(|i| i.stored) {
                let mut s = stored;
                diff.apply(&mut s);
                overrides.insert(dir, s);
            }
        }
        let ver = st.next_ver();
        let deps = self.deps_of(&mut st, &t.touched, &t.undo, stream);
        let result = self.persist_txn(&mut st, &t, &overrides, ver, stream, &deps);
        match &result {
            Ok(close) => {
                if let Some(close) = *close {
                    self.names_changed(&mut st, &t.touched, close);
                }
                let dying = dying_blocks(&st, &t.undo);
                st.dead_blocks += dying;
                for (&dir, s) in &overrides {
                    if let Some(i) = st.inodes.get_mut(&dir) {
                        i.stored = Some(*s);
                    }
                }
                for &dir in t.dir_diffs.keys() {
                    let State { txns, inodes, .. } = &mut *st;
                    if let Some(i) = inodes.get_mut(&dir) {
                        txns.recompute_dir(i, dir);
                    }
                }
            }
            Err(_) => {
                self.revert_streamed(&mut st, &t);
                Self::undo_txn(&mut st, t.undo, t.dir_diffs.keys().copied().collect());
            }
        }
        st.txns.locks.retain(|_, owner| *owner != txn.id);
        let wants = result.map(|close| {
            let mut wants = self.pending_barriers(&mut st).to_vec();
            wants.extend(close);
            wants
        });
        drop(st);
        self.cv.notify_all();
        wants
    }

    pub(crate) fn undo_txn(st: &mut State, undo: Vec<crate::txn::Undo>, dirs: Vec<Ino>) {
        let mut undo = undo;
        while let Some(u) = undo.pop() {
            u.apply(st);
        }
        for dir in dirs {
            let State { txns, inodes, .. } = &mut *st;
            if let Some(i) = inodes.get_mut(&dir) {
                txns.recompute_dir(i, dir);
            }
        }
    }

    /// Abort: the DRAM state returns exactly to what it would be had the transaction never
    /// run (other operations that ran meanwhile stay); nothing is written.
    ///
    /// # Errors
    /// `EINVAL` for an unknown transaction.
    pub fn abort(&self, txn: Txn) -> Result<()> {
        let mut st = lock(&self.state)?;
        let Some(t) = st.txns.open.remove(&txn.id) else { return Err(FsError::NoTxn) };
        self.revert_streamed(&mut st, &t);
        Self::undo_txn(&mut st, t.undo, t.dir_diffs.keys().copied().collect());
        st.txns.locks.retain(|_, owner| *owner != txn.id);
        drop(st);
        self.cv.notify_all();
        Ok(())
    }
}

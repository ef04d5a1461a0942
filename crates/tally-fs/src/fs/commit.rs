//! Committing one operation: its touched objects become records of one log transaction, with
//! the dependencies on other streams it needs; then the bookkeeping (versions, counts, cache).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use tally_log::{CommitInfo, Transaction, TxId};

use crate::mutant::FsMutant;
use crate::record::{Record, DATA_HOLE};
use crate::state::{Cached, Key, State};
use crate::txn::Cx;
use crate::types::*;
use crate::{FsError, Result};

use super::Fs;

/// What one record of a built transaction wrote: its key, whether it is a tombstone, and
/// the index of its data block in the transaction.
/// Blocks let go of a hold of the state lock in [`Fs::prune_cache_in_slices`]: 4 MiB of
/// 4 KiB blocks, about 0.2 ms a hold on a 2-vCPU VM (`examples/prune_hold.rs`).
pub(crate) const PRUNE_SLICE: usize = 1024;

pub(crate) type Written = (Key, bool, Option<u32>);

/// A log transaction built from the state, not committed yet.
pub(crate) struct Built {
    pub tx: Transaction,
    pub written: Vec<Written>,
}

/// Committed data blocks that a committed change (with pre-images `undo`) made dead:
/// overwritten or removed blocks, and every block of a freed inode. A hint for cleaning.
pub(crate) fn dying_blocks(st: &State, undo: &[crate::txn::Undo]) -> u64 {
    undo.iter().map(|u| u.dying_blocks(st)).sum()
}

/// When a commit's write-out is submitted to the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Submit {
    /// Inside the commit, under the state lock (`Log::commit`): a write that fails at its
    /// submission fails the commit, and the caller undoes what it changed. Explicit
    /// transactions commit so: a transaction whose commit returns an error changed nothing a
    /// reader can see (tally-sqlite's `attach_fail`).
    Now,
    /// Once the state lock is given up (`Log::commit_deferred`, `Fs::submit_deferred`): a
    /// plain operation's. A write failing then fails the file system (fail-stop) but not the
    /// operation, which is committed in memory, as with write-behind.
    Deferred,
}

impl Fs {
    /// Commit one operation outside any explicit transaction.
    pub(crate) fn commit_op(&self, st: &mut State, mut cx: Cx, stream: u16) -> Result<()> {
        let overrides = cx.storage_attrs(st);
        let ver = st.next_ver();
        let mut deps = self.deps_of(st, &cx.touched, &cx.undo, stream);
        if !cx.split.is_empty() {
            // Mutant: part of the operation committed as a transaction of its own.
            let first: BTreeSet<Key> = std::mem::take(&mut cx.split);
            let rest: BTreeSet<Key> = cx.touched.difference(&first).cloned().collect();
            match self.persist(st, &first, &overrides, ver, stream, &deps, Submit::Deferred) {
                Ok(t) => {
                    if let Some(t) = t {
                        self.names_changed(st, &first, t);
                    }
                }
                Err(e) => {
                    cx.rollback(st);
                    return Err(e);
                }
            }
            deps.clear();
            let ver2 = st.next_ver();
            let t = self.persist(st, &rest, &overrides, ver2, stream, &deps, Submit::Deferred)?;
            if let Some(t) = t {
                self.names_changed(st, &rest, t);
            }
            return Ok(());
        }
        match self.persist(st, &cx.touched, &overrides, ver, stream, &deps, Submit::Deferred) {
            Ok(t) => {
                if let Some(t) = t {
                    self.names_changed(st, &cx.touched, t);
                }
                st.dead_blocks += dying_blocks(st, &cx.undo);
                Ok(())
            }
            Err(e) => {
                cx.rollback(st);
                Err(e)
            }
        }
    }

    /// Dependencies of a transaction touching `keys` on `stream`: the last transaction of every
    /// inode it touches, when that one is on another stream and not yet durable; and every
    /// barrier not yet durable.
    pub(crate) fn deps_of(
        &self,
        st: &mut State,
        keys: &BTreeSet<Key>,
        undo: &[crate::txn::Undo],
        stream: u16,
    ) -> Vec<TxId> {
        if self.mutant == Some(FsMutant::NoDependencies) {
            return Vec::new();
        }
        // A few keys and owners per operation: a vector, sorted and deduplicated once, costs
        // less than sets built for them.
        let mut deps: Vec<TxId> = keys
            .iter()
            .filter_map(|k| st.inodes.get(&k.owner()).and_then(|i| i.last_tx))
            .chain(undo.iter().filter_map(crate::txn::Undo::last_tx))
            .collect();
        deps.extend_from_slice(self.pending_barriers(st));
        deps.sort_unstable();
        deps.dedup();
        deps.retain(|t| t.stream != stream && self.log.durable_seq(t.stream) < t.seq);
        deps
    }

    /// After transaction `t`, which wrote `keys`, was committed: if it changed a directory's
    /// entries (create, mkdir, mknod, symlink, link, unlink, rmdir, rename, alone or inside an
    /// explicit transaction), it is a barrier until durable. Every later transaction on another
    /// stream then depends on it, and every durable wait waits for it (`Fs::pending_barriers`),
    /// so a durable wait makes every earlier namespace change durable, as ext4's one journal
    /// does, and programs rely on it (SQLite commits by unlinking its journal, and never syncs
    /// the directory). Data and attribute changes of other files stay out of that wait.
    pub(crate) fn names_changed(&self, st: &mut State, keys: &BTreeSet<Key>, t: TxId) {
        if self.mutant == Some(FsMutant::NamespaceNotOrdered) {
            return;
        }
        if keys.iter().any(|k| matches!(k, Key::Dentry(..))) {
            self.note_barrier(st, t);
        }
    }

    /// Make `t` a barrier while it is not durable: later transactions on other streams depend
    /// on it (`Fs::deps_of`), durable waits wait for it. Recovery keeps a prefix of each
    /// stream, so depending on a stream's newest barrier implies its older ones: one entry per
    /// stream, however many barriers come before anything is durable.
    pub(crate) fn note_barrier(&self, st: &mut State, t: TxId) {
        if self.log.durable_seq(t.stream) >= t.seq {
            return;
        }
        match st.barriers.iter_mut().find(|b| b.stream == t.stream) {
            Some(b) if b.seq < t.seq && self.mutant != Some(FsMutant::BarrierKeepsOldest) => {
                *b = t;
            }
            Some(_) => {}
            None => st.barriers.push(t),
        }
    }

    /// The barriers not yet durable (namespace changes and `Fs::barrier`s): what every durable
    /// wait takes along.
    pub(crate) fn pending_barriers<'s>(&self, st: &'s mut State) -> &'s [TxId] {
        st.barriers.retain(|t| self.log.durable_seq(t.stream) < t.seq);
        &st.barriers
    }

    /// Write the current state of `keys` as one log transaction with version `ver`; update the
    /// bookkeeping. Returns the transaction's id (`None` if there was nothing to write).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn persist(
        &self,
        st: &mut State,
        keys: &BTreeSet<Key>,
        overrides: &HashMap<Ino, Attr>,
        ver: u64,
        stream: u16,
        deps: &[TxId],
        submit: Submit,
    ) -> Result<Option<TxId>> {
        let Some(built) = Self::build(st, keys.iter(), overrides, ver, stream, deps) else {
            return Ok(None);
        };
        let info = self.log_commit(st, built.tx, submit)?;
        self.bookkeep(st, built.written, info, ver);
        for key in keys {
            if let Some(i) = st.inodes.get_mut(&key.owner()) {
                i.last_tx = Some(info.ticket);
            }
        }
        // Past `CACHE_LIMIT` the caller writes the cache out once the state lock is dropped
        // (`Fs::write_out_cache`).
        Ok(Some(info.ticket))
    }

    /// Commit `tx` ordered; an I/O failure makes the file system read-only.
    pub(crate) fn log_commit(
        &self,
        st: &mut State,
        tx: Transaction,
        submit: Submit,
    ) -> Result<CommitInfo> {
        let info = self.log_commit_part(st, tx, submit)?;
        if let Some(last) = self.whole_committed.get(usize::from(info.ticket.stream)) {
            last.fetch_max(info.ticket.seq, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(info)
    }

    /// [`Fs::log_commit`] for a part of a large transaction (`fs/large.rs`): not something
    /// a maintenance round flushes for, since nothing of it survives before its close.
    pub(crate) fn log_commit_part(
        &self,
        st: &mut State,
        tx: Transaction,
        submit: Submit,
    ) -> Result<CommitInfo> {
        let committed = match submit {
            Submit::Now => self.log.commit(tx),
            Submit::Deferred => self.log.commit_deferred(tx),
        };
        committed.map_err(|e| {
            let e = FsError::from(e);
            if let Some(first) = e.stops_writes() {
                st.failed = Some(first);
            }
            e
        })
    }

    /// The current state of `keys` as one log transaction with version `ver` (records, data
    /// blocks, dependencies), and what each record wrote; `None` when there is nothing to
    /// write. Nothing of the bookkeeping changes but forgetting tombstones of keys that are
    /// gone and were never in the log.
    pub(crate) fn build<'k>(
        st: &mut State,
        keys: impl Iterator<Item = &'k Key>,
        overrides: &HashMap<Ino, Attr>,
        ver: u64,
        stream: u16,
        deps: &[TxId],
    ) -> Option<Built> {
        let mut tx = Transaction::new(stream);
        for d in deps {
            tx.depend_on(*d);
        }
        let mut written: Vec<Written> = Vec::new();
        for key in keys {
            let owner = key.owner();
            let Some(inode) = st.inodes.get(&owner) else {
                // The owner was freed: one `Free` covers everything of it.
                if matches!(key, Key::Inode(_)) && st.ino_count.get(&owner).is_some_and(|&c| c > 0)
                {
                    tx.record(Record::Free { ver, ino: owner }.encode());
                    written.push((key.clone(), true, None));
                }
                continue;
            };
            let rec = match key {
                Key::Fs => continue,
                Key::Inode(_) => Some(Record::Inode {
                    ver,
                    attr: overrides.get(&owner).copied().unwrap_or(inode.attr),
                    target: inode.target.clone(),
                }),
                Key::Dentry(dir, name) => {
                    let d = inode.dir.as_ref().and_then(|d| d.entries().get(name));
                    d.map(|d| Record::Dentry {
                        ver,
                        dir: *dir,
                        name: name.clone(),
                        ino: d.ino,
                        kind: d.kind,
                        cookie: d.cookie,
                    })
                }
                Key::Block(ino, b) => match inode.blocks.get(b) {
                    Some(block) => {
                        let Some(data) = &block.data else { continue };
                        // The block's crc goes down with it: the log does not compute it
                        // again; its bytes are shared with the log, not copied (they never
                        // change: a later write makes a new block).
                        let idx = tx.data_shared(data.clone(), block.crc);
                        written.push((key.clone(), false, Some(idx)));
                        tx.record(
                            Record::Extent { ver, ino: *ino, block: *b, data: idx, crc: block.crc }
                                .encode(),
                        );
                        continue;
                    }
                    None => None,
                },
                Key::Xattr(ino, name) => inode.xattrs.get(name).map(|x| Record::Xattr {
                    ver,
                    ino: *ino,
                    name: name.clone(),
                    value: Some(x.value.clone()),
                }),
            };
            match rec {
                Some(r) => {
                    tx.record(r.encode());
                    written.push((key.clone(), false, None));
                }
                None if st.in_log(key) => {
                    let tomb = match key {
                        Key::Dentry(dir, name) => Record::Dentry {
                            ver,
                            dir: *dir,
                            name: name.clone(),
                            ino: 0,
                            kind: FileKind::File,
                            cookie: 0,
                        },
                        Key::Block(ino, b) => {
                            Record::Extent { ver, ino: *ino, block: *b, data: DATA_HOLE, crc: 0 }
                        }
                        Key::Xattr(ino, name) => {
                            Record::Xattr { ver, ino: *ino, name: name.clone(), value: None }
                        }
                        Key::Fs | Key::Inode(_) => continue,
                    };
                    tx.record(tomb.encode());
                    written.push((key.clone(), true, None));
                }
                None => {
                    st.tombs.remove(key);
                }
            }
        }
        if written.is_empty() {
            return None;
        }
        Some(Built { tx, written })
    }

    /// After a built transaction was committed as `info`: versions, places, record counts,
    /// tombstones, and the data blocks held in memory until durable.
    pub(crate) fn bookkeep(
        &self,
        st: &mut State,
        written: Vec<Written>,
        info: CommitInfo,
        ver: u64,
    ) {
        let ticket = info.ticket;
        for (key, tomb, idx) in written {
            st.count(&key);
            let owner = key.owner();
            if tomb {
                match key {
                    Key::Inode(ino) => {
                        st.freed.insert(ino, ver);
                    }
                    k => {
                        st.tombs.insert(k, ver);
                    }
                }
                continue;
            }
            st.tombs.remove(&key);
            let Some(inode) = st.inodes.get_mut(&owner) else { continue };
            match &key {
                Key::Fs => {}
                Key::Inode(_) => inode.ver = ver,
                Key::Dentry(_, name) => {
                    if let Some(d) = inode.dir.as_mut() {
                        d.set_ver(name, ver);
                    }
                }
                Key::Block(ino, b) => {
                    if let (Some(block), Some(idx)) = (inode.blocks.get_mut(b), idx) {
                        st.usage.remove(block);
                        block.ver = ver;
                        block.addr = info.data_start + u64::from(idx);
                        block.tx = Some(ticket);
                        st.usage.add(block);
                        st.cached.push(Cached { tx: ticket, ino: *ino, block: *b, ver });
                        st.cached_bytes += self.bs as usize;
                    }
                }
                Key::Xattr(_, name) => {
                    if let Some(x) = inode.xattrs.get_mut(name) {
                        x.ver = ver;
                    }
                }
            }
        }
    }

    /// Drop the cached bytes of data blocks whose transactions are durable: each stream's
    /// durable prefix, so the cost is what is dropped, all of it under the caller's hold of
    /// the state lock (unmount, cleaning while space is low). Elsewhere
    /// [`Fs::prune_cache_in_slices`].
    pub(crate) fn prune_cache(&self, st: &mut State) {
        drop(self.prune_some(st, &self.durable_upto(), usize::MAX));
    }

    /// Each stream's durable seq, for the prunes.
    pub(crate) fn durable_upto(&self) -> impl Fn(usize) -> u64 + '_ {
        |s| u16::try_from(s).map_or(0, |stream| self.log.durable_seq(stream))
    }

    /// Drop the cached bytes of data blocks of stream `s` whose transactions are at or below
    /// `upto(s)` (durable, or at least complete on the device) without holding other
    /// operations up for long: at most [`PRUNE_SLICE`] blocks a hold of the state lock, the
    /// bytes let go of freed after it is given up, and the threads blocked on it let in
    /// between holds. In one hold, letting go of 60 MiB held the lock 2.6–3.7 ms on a quiet
    /// 2-vCPU VM (15,360 block map lookups and frees), and through the mount the cache limit's
    /// write-out of 64 MiB kept request threads waiting 17.6 ms with a CI run beside
    /// (docs/bench/fs.md).
    ///
    /// `wait` false: each hold is only tried, and the prune stops when the lock is busy (an
    /// `fsync`, which never waits for the state lock after its durable wait; the next durable
    /// wait or write-out drops what it left).
    ///
    /// # Errors
    /// [`FsError::Poisoned`](crate::FsError::Poisoned).
    pub(crate) fn prune_cache_in_slices(
        &self,
        upto: impl Fn(usize) -> u64,
        wait: bool,
    ) -> Result<()> {
        // Each stream's bound as it is now: what becomes durable meanwhile is left to the next
        // drop, so a caller never goes on letting go of what others keep making durable.
        let upto: Vec<u64> = (0..usize::from(self.streams)).map(upto).collect();
        let upto = |s: usize| upto.get(s).copied().unwrap_or(0);
        loop {
            let mut st = if wait {
                self.lock_waited()?
            } else {
                match self.state.try_lock() {
                    Ok(st) => st,
                    Err(std::sync::TryLockError::WouldBlock) => return Ok(()),
                    Err(std::sync::TryLockError::Poisoned(_)) => return Err(FsError::Poisoned),
                }
            };
            let (gone, more) = self.prune_some(&mut st, &upto, PRUNE_SLICE);
            drop(st);
            drop(gone);
            if !more {
                return Ok(());
            }
            self.yield_to_waiters();
        }
    }

    /// Let go of at most `max` cached blocks of the streams' prefixes at or below `upto(s)`:
    /// their bytes, and whether more were left.
    pub(crate) fn prune_some(
        &self,
        st: &mut State,
        upto: &impl Fn(usize) -> u64,
        max: usize,
    ) -> (Vec<Arc<Vec<u8>>>, bool) {
        let bs = self.bs as usize;
        let State { cached, cached_bytes, inodes, .. } = st;
        let mut gone = Vec::new();
        let mut count = 0;
        for (s, queue) in cached.0.iter_mut().enumerate() {
            let durable = upto(s);
            while let Some(c) = queue.front().filter(|c| c.tx.seq <= durable).copied() {
                if count == max {
                    return (gone, true);
                }
                queue.pop_front();
                count += 1;
                *cached_bytes = cached_bytes.saturating_sub(bs);
                gone.extend(inodes.let_go_of_bytes(c.ino, c.block, c.ver, c.tx));
            }
        }
        (gone, false)
    }
}

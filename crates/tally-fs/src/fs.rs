//! The file system: operations shaped like the POSIX calls, each one atomic transaction on the
//! log; explicit transactions; fsync, barrier, sync.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use crate::sync::{Condvar, Mutex, MutexGuard};

use tally_log::{Log, LogConfig, LogError, OpenOptions, Transaction, TxId};
use tally_media::Device;

use crate::mutant::FsMutant;
use crate::record::{Record, DATA_HOLE};
use crate::state::{fresh_attr, Block, Cached, Dentry, Inode, Key, State};
use crate::txn::{Cx, OpResult, Stop, TxnId, TxnState};
use crate::types::{
    Attr, DirEntry, FallocFlags, FileKind, Ino, Owner, RenameFlags, SetAttr, SetTime, StatFs,
    Timespec, XattrSet, FILE_SIZE_MAX, LINK_MAX, NAME_MAX, ROOT, SYMLINK_MAX, XATTR_NAME_MAX,
    XATTR_VALUE_MAX,
};
use crate::{FsError, Result};

/// Shape of a new file system, given to [`Fs::mkfs`].
#[derive(Debug, Clone)]
pub struct MkfsOptions {
    /// Log streams (ordering domains). Operations on a file go to stream `ino % streams`.
    pub streams: u16,
    /// Blocks per log segment. A transaction (one operation, or an explicit transaction) must
    /// fit in half a segment.
    pub segment_blocks: u32,
    /// Identity of the image; random when `None`.
    pub uuid: Option<[u8; 16]>,
}

impl Default for MkfsOptions {
    fn default() -> Self {
        MkfsOptions { streams: 4, segment_blocks: 1024, uuid: None }
    }
}

/// How operations are spread over the log's streams.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub enum StreamPolicy {
    /// Stream `ino % streams` of the file written (the directory, for namespace operations):
    /// `fsync` of a file waits only for that stream's prefix, and operations on one file never
    /// need a cross-stream dependency.
    #[default]
    PerFile,
    /// Stream of the calling thread (threads numbered in order of first use): threads never
    /// share a stream's submission path, files touched by several threads gather dependencies.
    PerThread,
}

/// Options of [`Fs::mount`].
#[derive(Debug, Clone, Copy, Default)]
pub struct MountOptions {
    /// How operations are spread over streams.
    pub streams: StreamPolicy,
    /// A deliberately broken variant of the file system (needs the `mutants` feature).
    pub mutant: Option<FsMutant>,
    /// A deliberately broken variant of the log underneath.
    pub log_mutant: Option<tally_log::Mutant>,
}

/// Data bytes held in memory until durable before the file system makes them durable itself.
const CACHE_LIMIT: usize = 64 << 20;
/// Free log segments kept for deletes and cleaning: operations that add data or objects fail
/// with `ENOSPC` when no more than this many are free; deletes and truncates may use them.
pub(crate) const RESERVED_SEGMENTS: u32 = 2;

/// An open explicit transaction; pass it to operations, then to [`Fs::commit`],
/// [`Fs::commit_durable`] or [`Fs::abort`].
#[derive(Debug)]
#[must_use = "an explicit transaction holds locks until it is committed or aborted"]
pub struct Txn {
    pub(crate) id: TxnId,
}

impl Txn {
    /// Its number (for front ends that name transactions across calls, e.g. ioctls).
    #[must_use]
    pub fn id(&self) -> u64 {
        self.id
    }
}

/// A mounted file system. Every method takes `&self`; it can be shared between threads.
pub struct Fs {
    pub(crate) log: Log,
    pub(crate) state: Mutex<State>,
    /// Signalled when an explicit transaction ends (waiters retry).
    cv: Condvar,
    pub(crate) streams: u16,
    pub(crate) bs: u32,
    /// Most data blocks one operation's transaction carries.
    max_tx_blocks: u64,
    pub(crate) segment_blocks: u32,
    pub(crate) mutant: Option<FsMutant>,
    policy: StreamPolicy,
    report: MountReport,
}

/// How a mount went.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct MountReport {
    /// The state came from a clean-unmount snapshot (no scan, no replay).
    pub from_snapshot: bool,
    /// Blocks read from the device: the snapshot's, or the scan's.
    pub blocks_read: u64,
    /// Log transactions whose records were replayed (0 from a snapshot).
    pub transactions_replayed: u64,
    /// Inodes after mount.
    pub inodes: u64,
    /// Files without links (open at their last unlink) freed by the mount.
    pub orphans_freed: u64,
    /// Time from the start of mount to the state being ready.
    #[serde(serialize_with = "crate::fs::secs")]
    pub time: std::time::Duration,
}

fn secs<S: serde::Serializer>(
    d: &std::time::Duration,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// Committed data blocks that a committed change of `touched` (with pre-images `undo`) made
/// dead: overwritten or removed blocks, and every block of a freed inode. A hint for cleaning.
fn dying_blocks(st: &State, touched: &BTreeSet<Key>, undo: &[crate::txn::Undo]) -> u64 {
    let mut n = 0;
    for u in undo {
        let crate::txn::Undo::Inode(ino, Some(old)) = u else { continue };
        match st.inodes.get(ino) {
            None => n += old.blocks.values().filter(|b| b.tx.is_some()).count() as u64,
            Some(_) => {
                for key in touched.range(Key::Block(*ino, 0)..=Key::Block(*ino, u64::MAX)) {
                    if let Key::Block(_, b) = key {
                        n += u64::from(old.blocks.get(b).is_some_and(|b| b.tx.is_some()));
                    }
                }
            }
        }
    }
    n
}

/// A small number per thread, in order of first use.
fn thread_slot() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    thread_local!(static SLOT: u64 = NEXT.fetch_add(1, Ordering::Relaxed));
    SLOT.with(|s| *s)
}

pub(crate) fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > NAME_MAX {
        return Err(FsError::NameTooLong);
    }
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return Err(FsError::Invalid("illegal name"));
    }
    if name == b"." || name == b".." {
        return Err(FsError::Invalid("`.` and `..` cannot be created, removed or renamed"));
    }
    Ok(())
}

/// What a new inode is made of.
struct Node<'a> {
    kind: FileKind,
    perm: u16,
    rdev: u64,
    target: &'a [u8],
    owner: Owner,
}

/// `ctime`/`mtime` to now.
fn touch_times(attr: &mut Attr, now: Timespec) {
    attr.mtime = now;
    attr.ctime = now;
}

impl Fs {
    /// Make a new, empty file system on `dev` (the log, then its first transaction: the
    /// file-system record and the root directory, durable before this returns).
    ///
    /// # Errors
    /// Bad options, I/O errors.
    pub fn mkfs(dev: Arc<dyn Device>, opts: &MkfsOptions) -> Result<()> {
        let mut cfg = LogConfig {
            streams: opts.streams,
            segment_blocks: opts.segment_blocks,
            ..LogConfig::default()
        };
        if let Some(uuid) = opts.uuid {
            cfg.uuid = uuid;
        }
        if opts.segment_blocks < 8 {
            return Err(FsError::Invalid("segments must hold at least 8 blocks"));
        }
        Log::format(&*dev, &cfg)?;
        let (log, _) = Log::open(dev.clone(), OpenOptions::default())?;
        let bs = dev.geometry().block_size;
        let now = Timespec::now();
        let root = fresh_attr(ROOT, FileKind::Dir, 0o755, 0, 0, now);
        let mut tx = Transaction::new(0);
        tx.record(Record::Fs { ver: 1, block_size: bs }.encode());
        tx.record(Record::Inode { ver: 2, attr: root, target: Vec::new() }.encode());
        log.commit_durable(tx)?;
        Ok(())
    }

    /// Mount the file system on `dev`: recover the log (after a crash: a parallel per-stream
    /// scan) and rebuild the DRAM state from the surviving records.
    ///
    /// # Errors
    /// Not a Tally file system, corrupted records, I/O errors, a mutant without the feature.
    pub fn mount(dev: Arc<dyn Device>, opts: MountOptions) -> Result<Fs> {
        if opts.mutant.is_some() && !crate::mutant::available() {
            return Err(FsError::Invalid("mutants need the `mutants` feature"));
        }
        let started = std::time::Instant::now();
        let log_opts = OpenOptions { mutant: opts.log_mutant };
        let (mut log, mut recovery) = Log::open(dev.clone(), log_opts)?;
        let mut report = MountReport::default();
        let mut from_snapshot = None;
        if let Some(payload) = recovery.snapshot.take() {
            match crate::snapshot::decode(&payload) {
                Ok(st) => from_snapshot = Some(st),
                Err(e) => {
                    // The log still holds everything the snapshot described: scan it.
                    tracing::warn!("clean-unmount snapshot unusable ({e}); scanning the log");
                    drop(log);
                    (log, recovery) = Log::open(dev, log_opts)?;
                }
            }
        }
        report.blocks_read = recovery.blocks_scanned;
        let mut st = match from_snapshot {
            Some(st) => {
                report.from_snapshot = true;
                st
            }
            None => {
                let streams: Vec<_> = recovery.streams.into_iter().map(|s| s.txs).collect();
                report.transactions_replayed = streams.iter().map(|s| s.len() as u64).sum();
                let ignore_versions = opts.mutant == Some(FsMutant::ReplayInLogOrder);
                State::replay(&streams, ignore_versions)?
            }
        };
        let orphans: Vec<Ino> = st
            .inodes
            .iter()
            .filter(|(_, i)| i.attr.nlink == 0 && i.dir.is_none())
            .map(|(&ino, _)| ino)
            .collect();
        let bs = log.device().geometry().block_size;
        if st.block_size != bs {
            return Err(FsError::Corrupted(format!(
                "made with {}-byte blocks, device has {bs}",
                st.block_size
            )));
        }
        st.block_size = bs;
        let segment_blocks = log.segment_blocks();
        let mut fs = Fs {
            streams: log.stream_count(),
            bs,
            max_tx_blocks: u64::from(segment_blocks / 2).saturating_sub(2).max(1),
            segment_blocks,
            log,
            state: Mutex::new(st),
            cv: Condvar::new(),
            mutant: opts.mutant,
            policy: opts.streams,
            report,
        };
        // Files that were open when their last link went, and then the crash (or an unmount
        // with handles still open): nobody can reach them any more.
        fs.report.orphans_freed = orphans.len() as u64;
        for ino in orphans {
            fs.free_orphan(ino)?;
        }
        fs.report.inodes = lock(&fs.state).inodes.len() as u64;
        fs.report.time = started.elapsed();
        Ok(fs)
    }

    /// How the mount went (snapshot or scan, blocks read, time).
    #[must_use]
    pub fn mount_report(&self) -> MountReport {
        self.report
    }

    /// Make everything durable and unmount, writing a snapshot of the DRAM state so the next
    /// mount reads it instead of scanning the log.
    ///
    /// # Errors
    /// I/O errors; read-only after an earlier error; open explicit transactions (they are
    /// aborted first, then reported).
    pub fn unmount(self) -> Result<()> {
        let open: Vec<TxnId> = lock(&self.state).txns.open.keys().copied().collect();
        for id in &open {
            self.abort(Txn { id: *id })?;
        }
        self.log.sync().map_err(|e| self.fail(e))?;
        let payload = {
            let mut st = lock(&self.state);
            if let Some(e) = &st.failed {
                return Err(FsError::ReadOnly(e.clone()));
            }
            self.prune_cache(&mut st);
            crate::snapshot::encode(&st)
        };
        let Fs { log, .. } = self;
        log.close_clean(&payload)?;
        if !open.is_empty() {
            return Err(FsError::Invalid(
                "explicit transactions were open at unmount and were aborted",
            ));
        }
        Ok(())
    }

    /// The log underneath (statistics, cleaning).
    #[must_use]
    pub fn log(&self) -> &Log {
        &self.log
    }

    /// Block size.
    #[must_use]
    pub fn block_size(&self) -> u32 {
        self.bs
    }

    // ----- reading -------------------------------------------------------------------------

    /// The entry `name` of directory `parent`.
    ///
    /// # Errors
    /// `ENOENT`, `ENOTDIR`, `ENAMETOOLONG`.
    pub fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Attr> {
        if name.len() > NAME_MAX {
            return Err(FsError::NameTooLong);
        }
        let st = lock(&self.state);
        let dir = st.dir(parent)?;
        let ino = match name {
            b"." => parent,
            b".." => dir.parent,
            _ => dir.entries.get(name).ok_or(FsError::NotFound)?.ino,
        };
        Ok(st.inode(ino)?.attr)
    }

    /// An inode's attributes.
    ///
    /// # Errors
    /// `ENOENT`.
    pub fn getattr(&self, ino: Ino) -> Result<Attr> {
        Ok(lock(&self.state).inode(ino)?.attr)
    }

    /// Data blocks an inode holds (for `st_blocks`).
    ///
    /// # Errors
    /// `ENOENT`.
    pub fn allocated_blocks(&self, ino: Ino) -> Result<u64> {
        Ok(lock(&self.state).inode(ino)?.blocks.len() as u64)
    }

    /// A symlink's target.
    ///
    /// # Errors
    /// `ENOENT`, `EINVAL` if not a symlink.
    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        let st = lock(&self.state);
        let i = st.inode(ino)?;
        if i.attr.kind != FileKind::Symlink {
            return Err(FsError::Invalid("not a symlink"));
        }
        Ok(i.target.clone())
    }

    /// Read up to `len` bytes at `offset` (short at end of file). Every block read from the
    /// device is checked against the crc in its record: a mismatch is `EIO`, never wrong data.
    ///
    /// # Errors
    /// `ENOENT`, `EISDIR`, `EINVAL` (not a regular file), `EIO`.
    pub fn read(&self, ino: Ino, offset: u64, len: usize) -> Result<Vec<u8>> {
        // The blocks to read are found under the lock; the device is read without it, so
        // readers do not hold up other operations. A block is never overwritten while the
        // records pointing at it are current, except by cleaning reusing its segment after a
        // relocation: a crc mismatch is therefore first retried under the lock.
        let bs = u64::from(self.bs);
        let (offset, end, blocks) = {
            let st = lock(&self.state);
            let inode = st.inode(ino)?;
            match inode.attr.kind {
                FileKind::File => {}
                FileKind::Dir => return Err(FsError::IsDir),
                _ => return Err(FsError::Invalid("not a regular file")),
            }
            let size = inode.attr.size;
            if offset >= size || len == 0 {
                return Ok(Vec::new());
            }
            let end = size.min(offset.saturating_add(len as u64));
            let (first, last) = (offset / bs, (end - 1) / bs);
            let blocks: Vec<(u64, Block)> =
                inode.blocks.range(first..=last).map(|(&b, block)| (b, block.clone())).collect();
            (offset, end, blocks)
        };
        let mut out = vec![0u8; (end - offset) as usize];
        for (b, block) in blocks {
            let bytes = match self.block_bytes(ino, b, &block) {
                Ok(bytes) => bytes,
                Err(_) => {
                    let st = lock(&self.state);
                    match st.inode(ino)?.blocks.get(&b) {
                        Some(now) => self.block_bytes(ino, b, now)?,
                        None => continue, // punched or truncated meanwhile: zeros
                    }
                }
            };
            let (bstart, bend) = (b * bs, (b + 1) * bs);
            let (from, to) = (offset.max(bstart), end.min(bend));
            out[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&bytes[(from - bstart) as usize..(to - bstart) as usize]);
        }
        Ok(out)
    }

    pub(crate) fn block_bytes(&self, ino: Ino, b: u64, block: &Block) -> Result<Arc<Vec<u8>>> {
        if let Some(d) = &block.data {
            return Ok(d.clone());
        }
        let mut buf = vec![0u8; self.bs as usize];
        self.log.device().read(block.addr, &mut buf).map_err(|e| FsError::Io(e.to_string()))?;
        if crc32c::crc32c(&buf) != block.crc {
            return Err(FsError::Io(format!(
                "checksum mismatch in block {b} of inode {ino} (device block {})",
                block.addr
            )));
        }
        Ok(Arc::new(buf))
    }

    /// Entries of a directory after `offset` (0 to start): `.` (offset 1) and `..` (offset 2)
    /// first, then the entries in a stable order.
    ///
    /// # Errors
    /// `ENOENT`, `ENOTDIR`.
    pub fn readdir(&self, ino: Ino, offset: u64) -> Result<Vec<DirEntry>> {
        let st = lock(&self.state);
        let dir = st.dir(ino)?;
        let mut out = Vec::new();
        if offset < 1 {
            out.push(DirEntry { name: b".".to_vec(), ino, kind: FileKind::Dir, offset: 1 });
        }
        if offset < 2 {
            out.push(DirEntry {
                name: b"..".to_vec(),
                ino: dir.parent,
                kind: FileKind::Dir,
                offset: 2,
            });
        }
        for (&cookie, name) in dir.order.range(offset.max(2) + 1..) {
            if let Some(d) = dir.entries.get(name) {
                out.push(DirEntry { name: name.clone(), ino: d.ino, kind: d.kind, offset: cookie });
            }
        }
        Ok(out)
    }

    /// File-system statistics.
    #[must_use]
    pub fn statfs(&self) -> StatFs {
        let st = lock(&self.state);
        let seg = u64::from(self.segment_blocks);
        let blocks = self.log.device().geometry().block_count;
        let free = u64::from(self.log.free_segments().saturating_sub(RESERVED_SEGMENTS)) * seg;
        StatFs {
            block_size: self.bs,
            blocks,
            blocks_free: free,
            files: st.files(),
            files_free: free * u64::from(self.bs / 128),
            name_max: NAME_MAX as u32,
        }
    }

    /// An extended attribute's value.
    ///
    /// # Errors
    /// `ENOENT`, `ENODATA`.
    pub fn getxattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        let st = lock(&self.state);
        st.inode(ino)?.xattrs.get(name).map(|x| x.value.clone()).ok_or(FsError::NoAttr)
    }

    /// Names of an inode's extended attributes.
    ///
    /// # Errors
    /// `ENOENT`.
    pub fn listxattr(&self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        Ok(lock(&self.state).inode(ino)?.xattrs.keys().cloned().collect())
    }

    // ----- the operation machinery ---------------------------------------------------------

    /// Run one operation: `f` changes the DRAM state through `cx` (which keeps pre-images);
    /// then the changes are committed as one log transaction (or handed to the explicit
    /// transaction). Any failure rolls the DRAM state back exactly.
    fn op<T>(
        &self,
        txn: Option<&Txn>,
        primary: Ino,
        grows: bool,
        mut f: impl FnMut(&mut State, &mut Cx) -> OpResult<T>,
    ) -> Result<T> {
        let mut st = lock(&self.state);
        loop {
            if let Some(e) = &st.failed {
                return Err(FsError::ReadOnly(e.clone()));
            }
            let id = txn.map(|t| t.id);
            if let Some(id) = id {
                if !st.txns.open.contains_key(&id) {
                    return Err(FsError::NoTxn);
                }
            }
            // Clean while space is low and cleaning frees something (any operation: deletes
            // need room for their records too); cleaning plans its relocations before writing,
            // so it fails cleanly when even they do not fit.
            for _ in 0..self.streams.max(1) * 4 {
                if self.log.free_segments() > RESERVED_SEGMENTS + 1 {
                    break;
                }
                match self.clean_some(&mut st) {
                    Ok(true) => {}
                    Ok(false) | Err(FsError::NoSpace) => break,
                    Err(e) => return Err(e),
                }
            }
            // Operations that add data or objects leave the reserve to deletes and cleaning.
            if grows && self.log.free_segments() <= RESERVED_SEGMENTS {
                return Err(FsError::NoSpace);
            }
            let mut cx = Cx::new(id);
            match f(&mut st, &mut cx) {
                Ok(v) => {
                    let stream = self.stream_of(primary);
                    match id {
                        Some(id) => cx.into_txn(&mut st, id, stream),
                        None => {
                            self.commit_op(&mut st, cx, stream)?;
                        }
                    }
                    return Ok(v);
                }
                Err(Stop::Err(e)) => {
                    cx.rollback(&mut st);
                    return Err(e);
                }
                Err(Stop::Wait) => {
                    cx.rollback(&mut st);
                    st = self.cv.wait(st).unwrap_or_else(std::sync::PoisonError::into_inner);
                }
            }
        }
    }

    fn stream_of(&self, ino: Ino) -> u16 {
        let n = u64::from(self.streams.max(1));
        match self.policy {
            StreamPolicy::PerFile => (ino % n) as u16,
            StreamPolicy::PerThread => (thread_slot() % n) as u16,
        }
    }

    /// Commit one operation outside any explicit transaction.
    fn commit_op(&self, st: &mut State, mut cx: Cx, stream: u16) -> Result<()> {
        let overrides = cx.storage_attrs(st);
        let ver = st.next_ver();
        let mut deps = self.deps_of(st, &cx.touched, &cx.undo, stream);
        if !cx.split.is_empty() {
            // Mutant: part of the operation committed as a transaction of its own.
            let first: BTreeSet<Key> = std::mem::take(&mut cx.split);
            let rest: BTreeSet<Key> = cx.touched.difference(&first).cloned().collect();
            if let Err(e) = self.persist(st, &first, &overrides, ver, stream, &deps) {
                cx.rollback(st);
                return Err(e);
            }
            deps.clear();
            let ver2 = st.next_ver();
            return self.persist(st, &rest, &overrides, ver2, stream, &deps).map(|_| ());
        }
        match self.persist(st, &cx.touched, &overrides, ver, stream, &deps) {
            Ok(_) => {
                st.dead_blocks += dying_blocks(st, &cx.touched, &cx.undo);
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
    fn deps_of(
        &self,
        st: &mut State,
        keys: &BTreeSet<Key>,
        undo: &[crate::txn::Undo],
        stream: u16,
    ) -> Vec<TxId> {
        if self.mutant == Some(FsMutant::NoDependencies) {
            return Vec::new();
        }
        let mut deps: BTreeSet<TxId> = BTreeSet::new();
        let owners: BTreeSet<Ino> = keys.iter().map(Key::owner).collect();
        for ino in &owners {
            if let Some(t) = st.inodes.get(ino).and_then(|i| i.last_tx) {
                deps.insert(t);
            }
        }
        for u in undo {
            if let crate::txn::Undo::Inode(_, Some(i)) = u {
                if let Some(t) = i.last_tx {
                    deps.insert(t);
                }
            }
        }
        st.barriers.retain(|t| self.log.durable_seq(t.stream) < t.seq);
        deps.extend(st.barriers.iter().copied());
        deps.into_iter()
            .filter(|t| t.stream != stream && self.log.durable_seq(t.stream) < t.seq)
            .collect()
    }

    /// Write the current state of `keys` as one log transaction with version `ver`; update the
    /// bookkeeping. Returns the transaction's id (`None` if there was nothing to write).
    fn persist(
        &self,
        st: &mut State,
        keys: &BTreeSet<Key>,
        overrides: &HashMap<Ino, Attr>,
        ver: u64,
        stream: u16,
        deps: &[TxId],
    ) -> Result<Option<TxId>> {
        let mut tx = Transaction::new(stream);
        for d in deps {
            tx.depend_on(*d);
        }
        // (key, tombstone?, data index)
        let mut written: Vec<(Key, bool, Option<u32>)> = Vec::new();
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
                    let d = inode.dir.as_ref().and_then(|d| d.entries.get(name));
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
                        let idx = tx.data(data.as_slice());
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
            return Ok(None);
        }
        let info = match self.log.commit(tx) {
            Ok(info) => info,
            Err(e) => {
                let e = FsError::from(e);
                if let FsError::ReadOnly(m) | FsError::Io(m) = &e {
                    st.failed = Some(m.clone());
                }
                return Err(e);
            }
        };
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
                    if let Some(d) = inode.dir.as_mut().and_then(|d| d.entries.get_mut(name)) {
                        d.ver = ver;
                    }
                }
                Key::Block(ino, b) => {
                    if let (Some(block), Some(idx)) = (inode.blocks.get_mut(b), idx) {
                        block.ver = ver;
                        block.addr = info.data_start + u64::from(idx);
                        block.tx = Some(ticket);
                        st.cached.push_back(Cached { tx: ticket, ino: *ino, block: *b, ver });
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
        let owners: BTreeSet<Ino> = keys.iter().map(Key::owner).collect();
        for ino in owners {
            if let Some(i) = st.inodes.get_mut(&ino) {
                i.last_tx = Some(ticket);
            }
        }
        if st.cached_bytes > CACHE_LIMIT {
            self.log.sync()?;
            self.prune_cache(st);
        }
        Ok(Some(ticket))
    }

    /// Drop the cached bytes of data blocks whose transactions are durable.
    pub(crate) fn prune_cache(&self, st: &mut State) {
        let bs = self.bs as usize;
        let log = &self.log;
        let mut keep = std::collections::VecDeque::new();
        for c in std::mem::take(&mut st.cached) {
            if log.durable_seq(c.tx.stream) >= c.tx.seq {
                st.cached_bytes = st.cached_bytes.saturating_sub(bs);
                if let Some(b) = st.inodes.get_mut(&c.ino).and_then(|i| i.blocks.get_mut(&c.block))
                {
                    if b.ver == c.ver {
                        b.data = None;
                    }
                }
            } else {
                keep.push_back(c);
            }
        }
        st.cached = keep;
    }

    // ----- namespace -------------------------------------------------------------------------

    fn make_node(
        &self,
        txn: Option<&Txn>,
        parent: Ino,
        name: &[u8],
        node: Node<'_>,
    ) -> Result<Attr> {
        let Node { kind, perm, rdev, target, owner } = node;
        check_name(name)?;
        if target.len() > SYMLINK_MAX {
            return Err(FsError::NameTooLong);
        }
        self.op(txn, parent, true, |st, cx| {
            let pdir = st.inode(parent)?;
            let Some(dir) = &pdir.dir else { return Err(FsError::NotDir.into()) };
            if dir.entries.contains_key(name) {
                return Err(FsError::Exists.into());
            }
            if kind == FileKind::Dir && pdir.attr.nlink >= LINK_MAX {
                return Err(FsError::TooManyLinks.into());
            }
            let psgid = pdir.attr.perm & 0o2000 != 0;
            let pgid = pdir.attr.gid;
            let now = Timespec::now();
            cx.dentry(st, parent, name)?;
            cx.dir_attr(st, parent)?;
            let ino = st.next_ino;
            st.next_ino += 1;
            cx.inode(st, ino)?;
            let mut attr = fresh_attr(ino, kind, perm, owner.uid, owner.gid, now);
            if psgid {
                attr.gid = pgid;
                if kind == FileKind::Dir {
                    attr.perm |= 0o2000;
                }
            }
            attr.rdev = rdev;
            if kind == FileKind::Symlink {
                attr.size = target.len() as u64;
            }
            st.inodes.insert(ino, Inode::new(attr, target.to_vec(), parent));
            let dir = st.dir_mut(parent)?;
            let cookie = dir.next_cookie;
            dir.insert(name.to_vec(), Dentry { ino, kind, cookie, ver: 0 });
            let p = st.inode_mut(parent)?;
            touch_times(&mut p.attr, now);
            if kind == FileKind::Dir {
                p.attr.nlink += 1;
            }
            Ok(attr)
        })
    }

    /// Create a regular file.
    ///
    /// # Errors
    /// `EEXIST`, `ENOENT`, `ENOTDIR`, `ENAMETOOLONG`, `EINVAL`, `ENOSPC`, `EBUSY`.
    pub fn create(
        &self,
        txn: Option<&Txn>,
        parent: Ino,
        name: &[u8],
        perm: u16,
        owner: Owner,
    ) -> Result<Attr> {
        self.make_node(
            txn,
            parent,
            name,
            Node { kind: FileKind::File, perm, rdev: 0, target: &[], owner },
        )
    }

    /// Create a directory.
    ///
    /// # Errors
    /// As [`Fs::create`], and `EMLINK`.
    pub fn mkdir(
        &self,
        txn: Option<&Txn>,
        parent: Ino,
        name: &[u8],
        perm: u16,
        owner: Owner,
    ) -> Result<Attr> {
        self.make_node(
            txn,
            parent,
            name,
            Node { kind: FileKind::Dir, perm, rdev: 0, target: &[], owner },
        )
    }

    /// Create a special file (fifo, socket, device node) or a regular file.
    ///
    /// # Errors
    /// As [`Fs::create`]; `EINVAL` for a directory or symlink kind.
    #[allow(clippy::too_many_arguments)]
    pub fn mknod(
        &self,
        txn: Option<&Txn>,
        parent: Ino,
        name: &[u8],
        kind: FileKind,
        perm: u16,
        rdev: u64,
        owner: Owner,
    ) -> Result<Attr> {
        if matches!(kind, FileKind::Dir | FileKind::Symlink) {
            return Err(FsError::Invalid("mknod makes files, fifos, sockets and device nodes"));
        }
        self.make_node(txn, parent, name, Node { kind, perm, rdev, target: &[], owner })
    }

    /// Create a symbolic link.
    ///
    /// # Errors
    /// As [`Fs::create`]; `ENAMETOOLONG` for a target over 4095 bytes, `ENOENT` for an empty one.
    pub fn symlink(
        &self,
        txn: Option<&Txn>,
        parent: Ino,
        name: &[u8],
        target: &[u8],
        owner: Owner,
    ) -> Result<Attr> {
        if target.is_empty() {
            return Err(FsError::NotFound);
        }
        self.make_node(
            txn,
            parent,
            name,
            Node { kind: FileKind::Symlink, perm: 0o777, rdev: 0, target, owner },
        )
    }

    /// Add a hard link `name` in `parent` to `ino`.
    ///
    /// # Errors
    /// `EPERM` for a directory, `EMLINK`, `EEXIST`, `ENOENT`, `ENOTDIR`, `ENOSPC`, `EBUSY`.
    pub fn link(&self, txn: Option<&Txn>, ino: Ino, parent: Ino, name: &[u8]) -> Result<Attr> {
        check_name(name)?;
        self.op(txn, parent, true, |st, cx| {
            let target = st.inode(ino)?.attr;
            if target.kind == FileKind::Dir {
                return Err(FsError::NotPermitted.into());
            }
            if target.nlink >= LINK_MAX {
                return Err(FsError::TooManyLinks.into());
            }
            if st.dir(parent)?.entries.contains_key(name) {
                return Err(FsError::Exists.into());
            }
            let now = Timespec::now();
            cx.dentry(st, parent, name)?;
            cx.dir_attr(st, parent)?;
            cx.inode(st, ino)?;
            let dir = st.dir_mut(parent)?;
            let cookie = dir.next_cookie;
            dir.insert(name.to_vec(), Dentry { ino, kind: target.kind, cookie, ver: 0 });
            touch_times(&mut st.inode_mut(parent)?.attr, now);
            let i = st.inode_mut(ino)?;
            i.attr.nlink += 1;
            i.attr.ctime = now;
            Ok(i.attr)
        })
    }

    /// Drop one link to `child` (already removed from its directory); free it at zero.
    /// A file still open (pinned) at its last unlink stays, with no links, until released:
    /// an orphan. Directories go at once.
    fn drop_link(st: &mut State, cx: &mut Cx, child: Ino, now: Timespec) -> OpResult<()> {
        cx.inode(st, child)?;
        let pinned = st.pins.get(&child).is_some_and(|&n| n > 0);
        let c = st.inode_mut(child)?;
        c.attr.nlink = c.attr.nlink.saturating_sub(1);
        c.attr.ctime = now;
        let is_dir = c.dir.is_some();
        if is_dir || (c.attr.nlink == 0 && !pinned) {
            st.inodes.remove(&child);
        }
        Ok(())
    }

    /// Pin `ino` while a handle to it is open (FUSE `open`/`opendir`): unlinking its last
    /// name keeps it readable and writable until [`Fs::release`].
    ///
    /// # Errors
    /// `ENOENT`.
    pub fn open(&self, ino: Ino) -> Result<()> {
        let mut st = lock(&self.state);
        st.inode(ino)?;
        *st.pins.entry(ino).or_default() += 1;
        Ok(())
    }

    /// Drop a pin taken by [`Fs::open`]; the last release of a file without links frees it (one
    /// transaction). Orphans left by a crash are freed at the next mount.
    ///
    /// # Errors
    /// As the free's commit (out of space, I/O).
    pub fn release(&self, ino: Ino) -> Result<()> {
        {
            let mut st = lock(&self.state);
            match st.pins.get_mut(&ino) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    return Ok(());
                }
                Some(_) => {
                    st.pins.remove(&ino);
                }
                None => return Ok(()),
            }
        }
        self.free_orphan(ino)
    }

    /// Free `ino` if it is a file without links and without pins.
    pub(crate) fn free_orphan(&self, ino: Ino) -> Result<()> {
        self.op(None, ino, false, |st, cx| {
            let orphan = st.inodes.get(&ino).is_some_and(|i| i.attr.nlink == 0 && i.dir.is_none());
            if orphan && !st.pins.contains_key(&ino) {
                cx.inode(st, ino)?;
                st.inodes.remove(&ino);
            }
            Ok(())
        })
    }

    /// Remove a non-directory entry.
    ///
    /// # Errors
    /// `ENOENT`, `EISDIR`, `ENOTDIR`, `EBUSY`.
    pub fn unlink(&self, txn: Option<&Txn>, parent: Ino, name: &[u8]) -> Result<()> {
        check_name(name)?;
        self.op(txn, parent, false, |st, cx| {
            let d = st.dir(parent)?.entries.get(name).cloned().ok_or(FsError::NotFound)?;
            if d.kind == FileKind::Dir {
                return Err(FsError::IsDir.into());
            }
            let now = Timespec::now();
            cx.dentry(st, parent, name)?;
            cx.dir_attr(st, parent)?;
            st.dir_mut(parent)?.remove(name);
            touch_times(&mut st.inode_mut(parent)?.attr, now);
            if self.mutant == Some(FsMutant::UnlinkSplit) {
                cx.split = cx.touched.clone();
            }
            Self::drop_link(st, cx, d.ino, now)
        })
    }

    /// Remove an empty directory.
    ///
    /// # Errors
    /// `ENOENT`, `ENOTDIR`, `ENOTEMPTY`, `EBUSY`.
    pub fn rmdir(&self, txn: Option<&Txn>, parent: Ino, name: &[u8]) -> Result<()> {
        check_name(name)?;
        self.op(txn, parent, false, |st, cx| {
            let d = st.dir(parent)?.entries.get(name).cloned().ok_or(FsError::NotFound)?;
            if d.kind != FileKind::Dir {
                return Err(FsError::NotDir.into());
            }
            if !st.dir(d.ino)?.entries.is_empty() {
                return Err(FsError::NotEmpty.into());
            }
            let now = Timespec::now();
            cx.dentry(st, parent, name)?;
            cx.dir_attr(st, parent)?;
            st.dir_mut(parent)?.remove(name);
            let p = st.inode_mut(parent)?;
            touch_times(&mut p.attr, now);
            p.attr.nlink = p.attr.nlink.saturating_sub(1);
            Self::drop_link(st, cx, d.ino, now)
        })
    }

    /// Is `ino` equal to `ancestor` or inside it?
    fn within(st: &State, mut ino: Ino, ancestor: Ino) -> bool {
        for _ in 0..=st.inodes.len() {
            if ino == ancestor {
                return true;
            }
            if ino == ROOT {
                return false;
            }
            match st.inodes.get(&ino).and_then(|i| i.dir.as_ref()) {
                Some(d) => ino = d.parent,
                None => return false,
            }
        }
        false
    }

    /// Rename `name` in `parent` to `new_name` in `new_parent`, atomically (one transaction,
    /// whichever directories are involved).
    ///
    /// # Errors
    /// `ENOENT`, `EEXIST` (noreplace), `EISDIR`, `ENOTDIR`, `ENOTEMPTY`, `EINVAL` (a
    /// directory into its own subtree, bad flags), `EBUSY`.
    pub fn rename(
        &self,
        txn: Option<&Txn>,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        check_name(name)?;
        check_name(new_name)?;
        if flags.noreplace && flags.exchange {
            return Err(FsError::Invalid("RENAME_NOREPLACE with RENAME_EXCHANGE"));
        }
        self.op(txn, parent, false, |st, cx| {
            let src = st.dir(parent)?.entries.get(name).cloned().ok_or(FsError::NotFound)?;
            let dst = st.dir(new_parent)?.entries.get(new_name).cloned();
            if src.kind == FileKind::Dir && Self::within(st, new_parent, src.ino) {
                return Err(FsError::Invalid("a directory cannot move into its own subtree").into());
            }
            if let Some(dst) = &dst {
                if flags.noreplace {
                    return Err(FsError::Exists.into());
                }
                if flags.exchange && dst.kind == FileKind::Dir && Self::within(st, parent, dst.ino)
                {
                    return Err(
                        FsError::Invalid("a directory cannot move into its own subtree").into()
                    );
                }
                if dst.ino == src.ino && !flags.exchange {
                    return Ok(()); // two links to one inode: nothing to do
                }
                if !flags.exchange {
                    match (src.kind == FileKind::Dir, dst.kind == FileKind::Dir) {
                        (true, false) => return Err(FsError::NotDir.into()),
                        (false, true) => return Err(FsError::IsDir.into()),
                        (true, true) if !st.dir(dst.ino)?.entries.is_empty() => {
                            return Err(FsError::NotEmpty.into())
                        }
                        _ => {}
                    }
                }
            } else if flags.exchange {
                return Err(FsError::NotFound.into());
            }
            let now = Timespec::now();
            cx.dentry(st, parent, name)?;
            cx.dentry(st, new_parent, new_name)?;
            cx.dir_attr(st, parent)?;
            cx.dir_attr(st, new_parent)?;
            cx.inode(st, src.ino)?;
            if self.mutant == Some(FsMutant::RenameSplit) {
                cx.split = [Key::Dentry(parent, name.to_vec()), Key::Inode(parent)].into();
            }
            let moved_dir =
                |st: &mut State, cx: &mut Cx, ino: Ino, from: Ino, to: Ino| -> OpResult<()> {
                    if from != to {
                        cx.parent(st, ino)?;
                        st.dir_mut(ino)?.parent = to;
                        let f = st.inode_mut(from)?;
                        f.attr.nlink = f.attr.nlink.saturating_sub(1);
                        st.inode_mut(to)?.attr.nlink += 1;
                    }
                    Ok(())
                };
            match dst {
                Some(dst) if flags.exchange => {
                    cx.inode(st, dst.ino)?;
                    let c1 = st.dir_mut(new_parent)?.next_cookie;
                    st.dir_mut(new_parent)?
                        .insert(new_name.to_vec(), Dentry { cookie: c1, ver: 0, ..src.clone() });
                    let c2 = st.dir_mut(parent)?.next_cookie;
                    st.dir_mut(parent)?
                        .insert(name.to_vec(), Dentry { cookie: c2, ver: 0, ..dst.clone() });
                    if src.kind == FileKind::Dir {
                        moved_dir(st, cx, src.ino, parent, new_parent)?;
                    }
                    if dst.kind == FileKind::Dir {
                        moved_dir(st, cx, dst.ino, new_parent, parent)?;
                    }
                    st.inode_mut(dst.ino)?.attr.ctime = now;
                }
                dst => {
                    if let Some(dst) = dst {
                        st.dir_mut(new_parent)?.remove(new_name);
                        if dst.kind == FileKind::Dir {
                            let np = st.inode_mut(new_parent)?;
                            np.attr.nlink = np.attr.nlink.saturating_sub(1);
                        }
                        Self::drop_link(st, cx, dst.ino, now)?;
                    }
                    st.dir_mut(parent)?.remove(name);
                    let cookie = st.dir_mut(new_parent)?.next_cookie;
                    st.dir_mut(new_parent)?
                        .insert(new_name.to_vec(), Dentry { cookie, ver: 0, ..src.clone() });
                    if src.kind == FileKind::Dir {
                        moved_dir(st, cx, src.ino, parent, new_parent)?;
                    }
                }
            }
            st.inode_mut(src.ino)?.attr.ctime = now;
            touch_times(&mut st.inode_mut(parent)?.attr, now);
            touch_times(&mut st.inode_mut(new_parent)?.attr, now);
            Ok(())
        })
    }

    // ----- attributes ------------------------------------------------------------------------

    /// Change attributes. A size change truncates or extends (with zeros) a regular file.
    ///
    /// # Errors
    /// `ENOENT`, `EISDIR`/`EINVAL` for a size change on a non-file, `EFBIG`, `EBUSY`.
    pub fn setattr(&self, txn: Option<&Txn>, ino: Ino, set: &SetAttr) -> Result<Attr> {
        if set.size.is_some_and(|s| s > FILE_SIZE_MAX) {
            return Err(FsError::FileTooBig);
        }
        self.op(txn, ino, false, |st, cx| {
            let kind = st.inode(ino)?.attr.kind;
            if set.size.is_some() {
                match kind {
                    FileKind::File => {}
                    FileKind::Dir => return Err(FsError::IsDir.into()),
                    _ => return Err(FsError::Invalid("size of a non-file").into()),
                }
            }
            cx.inode(st, ino)?;
            let now = Timespec::now();
            if let Some(size) = set.size {
                self.truncate(st, cx, ino, size)?;
                let a = &mut st.inode_mut(ino)?.attr;
                a.mtime = now;
            }
            let a = &mut st.inode_mut(ino)?.attr;
            if let Some(p) = set.perm {
                a.perm = p & 0o7777;
            }
            let owner_changed =
                set.uid.is_some_and(|u| u != a.uid) || set.gid.is_some_and(|g| g != a.gid);
            if let Some(u) = set.uid {
                a.uid = u;
            }
            if let Some(g) = set.gid {
                a.gid = g;
            }
            if owner_changed && set.perm.is_none() && kind != FileKind::Dir {
                a.perm &= !0o4000;
                if a.perm & 0o010 != 0 {
                    a.perm &= !0o2000;
                }
            }
            let time = |t: SetTime| match t {
                SetTime::Now => now,
                SetTime::At(t) => t,
            };
            if let Some(t) = set.atime {
                a.atime = time(t);
            }
            if let Some(t) = set.mtime {
                a.mtime = time(t);
            }
            a.ctime = set.ctime.unwrap_or(now);
            Ok(*a)
        })
    }

    /// Set a file's size: blocks past it become holes; the tail of a partial last block is
    /// zeroed (so a later extension reads zeros).
    fn truncate(&self, st: &mut State, cx: &mut Cx, ino: Ino, size: u64) -> OpResult<()> {
        let bs = u64::from(self.bs);
        let old = st.inode(ino)?.attr.size;
        if size < old {
            let keep = size.div_ceil(bs);
            for b in st.block_keys(ino, keep) {
                cx.block(ino, b);
                st.inode_mut(ino)?.blocks.remove(&b);
            }
            if !size.is_multiple_of(bs) {
                let b = size / bs;
                if let Some(block) = st.inode(ino)?.blocks.get(&b).cloned() {
                    let mut bytes = self.block_bytes(ino, b, &block)?.as_ref().clone();
                    bytes[(size % bs) as usize..].fill(0);
                    cx.block(ino, b);
                    Self::put_block(st, ino, b, bytes)?;
                }
            }
        }
        st.inode_mut(ino)?.attr.size = size;
        Ok(())
    }

    fn put_block(st: &mut State, ino: Ino, b: u64, bytes: Vec<u8>) -> Result<()> {
        let crc = crc32c::crc32c(&bytes);
        let block = Block { ver: 0, crc, addr: 0, tx: None, data: Some(Arc::new(bytes)) };
        st.inode_mut(ino)?.blocks.insert(b, block);
        Ok(())
    }

    // ----- data ------------------------------------------------------------------------------

    /// Write `data` at `offset` (any offset and length; a gap past the end becomes a hole).
    /// Copy-on-write: new blocks, partial blocks merged in memory. A write larger than a
    /// transaction can hold is split into several transactions, each atomic; if a later one
    /// fails (out of space) after earlier ones committed, the count written so far is returned
    /// (a short write, as POSIX has it).
    ///
    /// # Errors
    /// `ENOENT`, `EISDIR`, `EINVAL`, `EFBIG`, `ENOSPC`, `EIO`, `EBUSY`.
    pub fn write(&self, txn: Option<&Txn>, ino: Ino, offset: u64, data: &[u8]) -> Result<usize> {
        let end = offset.checked_add(data.len() as u64).ok_or(FsError::FileTooBig)?;
        if end > FILE_SIZE_MAX {
            return Err(FsError::FileTooBig);
        }
        if data.is_empty() {
            self.getattr(ino)?;
            return Ok(0);
        }
        let bs = u64::from(self.bs);
        let chunk = if txn.is_some() { u64::MAX } else { self.max_tx_blocks * bs };
        let mut at = offset;
        while at < end {
            let stop = end.min((at / bs * bs).saturating_add(chunk));
            let part = &data[(at - offset) as usize..(stop - offset) as usize];
            match self.op(txn, ino, true, |st, cx| self.write_part(st, cx, ino, at, part)) {
                Ok(()) => at = stop,
                // A short write, as POSIX has it: the parts written are committed.
                Err(_) if at > offset => return Ok((at - offset) as usize),
                Err(e) => return Err(e),
            }
        }
        Ok(data.len())
    }

    fn write_part(
        &self,
        st: &mut State,
        cx: &mut Cx,
        ino: Ino,
        offset: u64,
        data: &[u8],
    ) -> OpResult<()> {
        match st.inode(ino)?.attr.kind {
            FileKind::File => {}
            FileKind::Dir => return Err(FsError::IsDir.into()),
            _ => return Err(FsError::Invalid("not a regular file").into()),
        }
        cx.inode(st, ino)?;
        let bs = u64::from(self.bs);
        let end = offset + data.len() as u64;
        for b in offset / bs..=(end - 1) / bs {
            let (bstart, bend) = (b * bs, (b + 1) * bs);
            let (from, to) = (offset.max(bstart), end.min(bend));
            let mut bytes = if from == bstart && to == bend {
                vec![0u8; bs as usize]
            } else {
                match st.inode(ino)?.blocks.get(&b).cloned() {
                    Some(block) => self.block_bytes(ino, b, &block)?.as_ref().clone(),
                    None => vec![0u8; bs as usize],
                }
            };
            bytes[(from - bstart) as usize..(to - bstart) as usize]
                .copy_from_slice(&data[(from - offset) as usize..(to - offset) as usize]);
            cx.block(ino, b);
            Self::put_block(st, ino, b, bytes)?;
        }
        let now = Timespec::now();
        let a = &mut st.inode_mut(ino)?.attr;
        a.size = a.size.max(end);
        touch_times(a, now);
        Ok(())
    }

    /// Allocate (extend the size unless `keep_size`) or punch a hole. Copy-on-write cannot
    /// reserve blocks for later overwrites, so allocation only sets the size: a later write can
    /// still get `ENOSPC` (as on other copy-on-write file systems).
    ///
    /// # Errors
    /// `ENOENT`, `EISDIR`, `EINVAL`, `EFBIG`, `EBUSY`.
    pub fn fallocate(
        &self,
        txn: Option<&Txn>,
        ino: Ino,
        offset: u64,
        len: u64,
        flags: FallocFlags,
    ) -> Result<()> {
        let end = offset.checked_add(len).ok_or(FsError::FileTooBig)?;
        if len == 0 {
            return Err(FsError::Invalid("zero length"));
        }
        if end > FILE_SIZE_MAX {
            return Err(FsError::FileTooBig);
        }
        if flags.punch_hole && !flags.keep_size {
            return Err(FsError::Invalid("punching a hole needs KEEP_SIZE"));
        }
        self.op(txn, ino, !flags.punch_hole, |st, cx| {
            match st.inode(ino)?.attr.kind {
                FileKind::File => {}
                FileKind::Dir => return Err(FsError::IsDir.into()),
                _ => return Err(FsError::Invalid("not a regular file").into()),
            }
            cx.inode(st, ino)?;
            let now = Timespec::now();
            if flags.punch_hole {
                let bs = u64::from(self.bs);
                let size = st.inode(ino)?.attr.size;
                let end = end.min(size);
                if offset < end {
                    for b in offset / bs..=(end - 1) / bs {
                        let Some(block) = st.inode(ino)?.blocks.get(&b).cloned() else { continue };
                        let (bstart, bend) = (b * bs, (b + 1) * bs);
                        let (from, to) = (offset.max(bstart), end.min(bend));
                        cx.block(ino, b);
                        if from == bstart && to == bend {
                            st.inode_mut(ino)?.blocks.remove(&b);
                        } else {
                            let mut bytes = self.block_bytes(ino, b, &block)?.as_ref().clone();
                            bytes[(from - bstart) as usize..(to - bstart) as usize].fill(0);
                            Self::put_block(st, ino, b, bytes)?;
                        }
                    }
                }
                touch_times(&mut st.inode_mut(ino)?.attr, now);
            } else if !flags.keep_size {
                let a = &mut st.inode_mut(ino)?.attr;
                if end > a.size {
                    a.size = end;
                    a.ctime = now;
                }
            }
            Ok(())
        })
    }

    // ----- extended attributes ---------------------------------------------------------------

    /// Set an extended attribute.
    ///
    /// # Errors
    /// `ENOENT`, `EEXIST` (create), `ENODATA` (replace), `ERANGE` (name or value too long),
    /// `EINVAL` (empty name), `ENOSPC`, `EBUSY`.
    pub fn setxattr(
        &self,
        txn: Option<&Txn>,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        how: XattrSet,
    ) -> Result<()> {
        if name.is_empty() {
            return Err(FsError::Invalid("empty attribute name"));
        }
        if name.len() > XATTR_NAME_MAX || value.len() > XATTR_VALUE_MAX {
            return Err(FsError::Range);
        }
        self.op(txn, ino, true, |st, cx| {
            let exists = st.inode(ino)?.xattrs.contains_key(name);
            match how {
                XattrSet::Create if exists => return Err(FsError::Exists.into()),
                XattrSet::Replace if !exists => return Err(FsError::NoAttr.into()),
                _ => {}
            }
            cx.inode(st, ino)?;
            cx.xattr(ino, name);
            let i = st.inode_mut(ino)?;
            i.xattrs.insert(name.to_vec(), crate::state::Xattr { value: value.to_vec(), ver: 0 });
            i.attr.ctime = Timespec::now();
            Ok(())
        })
    }

    /// Remove an extended attribute.
    ///
    /// # Errors
    /// `ENOENT`, `ENODATA`, `EBUSY`.
    pub fn removexattr(&self, txn: Option<&Txn>, ino: Ino, name: &[u8]) -> Result<()> {
        self.op(txn, ino, false, |st, cx| {
            if !st.inode(ino)?.xattrs.contains_key(name) {
                return Err(FsError::NoAttr.into());
            }
            cx.inode(st, ino)?;
            cx.xattr(ino, name);
            let i = st.inode_mut(ino)?;
            i.xattrs.remove(name);
            i.attr.ctime = Timespec::now();
            Ok(())
        })
    }

    // ----- durability and order ----------------------------------------------------------

    /// Make `ino`'s committed changes, and everything they depend on, durable. Other files'
    /// changes are flushed along only if they precede it on its stream.
    ///
    /// # Errors
    /// `ENOENT`, I/O errors (after which the file system is read-only).
    pub fn fsync(&self, ino: Ino) -> Result<()> {
        let last = {
            let st = lock(&self.state);
            st.inode(ino)?.last_tx
        };
        if let Some(t) = last.filter(|_| self.mutant != Some(FsMutant::FsyncNotDurable)) {
            self.log.wait_durable(t).map_err(|e| self.fail(e))?;
        }
        let mut st = lock(&self.state);
        self.prune_cache(&mut st);
        Ok(())
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
        let mut st = lock(&self.state);
        self.prune_cache(&mut st);
        Ok(())
    }

    /// Order without waiting: every operation after this call, on any file, survives a crash
    /// only if `ino`'s changes before it survive too. Returns at once.
    ///
    /// # Errors
    /// `ENOENT`.
    pub fn barrier(&self, ino: Ino) -> Result<()> {
        let mut st = lock(&self.state);
        if let Some(t) = st.inode(ino)?.last_tx {
            if self.log.durable_seq(t.stream) < t.seq {
                st.barriers.push(t);
            }
        }
        Ok(())
    }

    fn fail(&self, e: LogError) -> FsError {
        let e = FsError::from(e);
        if let FsError::ReadOnly(m) | FsError::Io(m) = &e {
            lock(&self.state).failed.get_or_insert_with(|| m.clone());
        }
        e
    }

    // ----- explicit transactions -------------------------------------------------------

    /// Begin an explicit transaction: operations given it are applied to the DRAM state at
    /// once (readers see them) and written to the log only at commit, as one atomic
    /// transaction.
    ///
    /// # Errors
    /// Read-only after an I/O error.
    pub fn begin(&self) -> Result<Txn> {
        let mut st = lock(&self.state);
        if let Some(e) = &st.failed {
            return Err(FsError::ReadOnly(e.clone()));
        }
        st.txns.next += 1;
        let id = st.txns.next;
        st.txns.open.insert(
            id,
            TxnState { thread: Some(crate::sync::current_thread()), ..TxnState::default() },
        );
        Ok(Txn { id })
    }

    /// Commit: ordered and atomic; returns before it is durable.
    ///
    /// # Errors
    /// `ENOSPC` when it does not fit (the transaction is then aborted), I/O errors.
    pub fn commit(&self, txn: Txn) -> Result<()> {
        self.end(txn).map(|_| ())
    }

    /// Commit and wait until the transaction (and what it depends on) is durable.
    ///
    /// # Errors
    /// As [`Fs::commit`].
    pub fn commit_durable(&self, txn: Txn) -> Result<()> {
        if let Some(t) = self.end(txn)? {
            self.log.wait_durable(t).map_err(|e| self.fail(e))?;
        }
        Ok(())
    }

    fn end(&self, txn: Txn) -> Result<Option<TxId>> {
        let mut st = lock(&self.state);
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
        let result = self.persist(&mut st, &t.touched, &overrides, ver, stream, &deps);
        match &result {
            Ok(_) => {
                let dying = dying_blocks(&st, &t.touched, &t.undo);
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
            Err(_) => Self::undo_txn(&mut st, t.undo, t.dir_diffs.keys().copied().collect()),
        }
        st.txns.locks.retain(|_, owner| *owner != txn.id);
        drop(st);
        self.cv.notify_all();
        result
    }

    fn undo_txn(st: &mut State, undo: Vec<crate::txn::Undo>, dirs: Vec<Ino>) {
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
        let mut st = lock(&self.state);
        let Some(t) = st.txns.open.remove(&txn.id) else { return Err(FsError::NoTxn) };
        Self::undo_txn(&mut st, t.undo, t.dir_diffs.keys().copied().collect());
        st.txns.locks.retain(|_, owner| *owner != txn.id);
        drop(st);
        self.cv.notify_all();
        Ok(())
    }
}

//! One open file (`sqlite3_file`) and its I/O methods.
//!
//! A named file is an inode of the `Fs`, pinned with `Fs::open` while the handle lives; a
//! file SQLite opens without a name (temporary tables, sorter spill, statement journals) is a
//! byte vector in memory, since nothing in it has to survive the connection.
//!
//! Batch-atomic commit: `SQLITE_FCNTL_BEGIN_ATOMIC_WRITE` begins an `Fs` transaction owned by
//! the handle; every write and truncate through the handle goes into it until
//! `SQLITE_FCNTL_COMMIT_ATOMIC_WRITE` commits it durably (one flush: units and data in one
//! submission, no commit record) or `SQLITE_FCNTL_ROLLBACK_ATOMIC_WRITE` aborts it (the DRAM
//! state is rolled back, nothing was written). Invariant: a handle has a transaction open only
//! between those calls, and it holds the EXCLUSIVE lock meanwhile (SQLite writes the database
//! file only under it), so no other handle writes the file during a batch.

use std::ffi::{c_int, c_void, CString};
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use rusqlite::{ffi, Connection};
use tally_fs::{FileKind, FsError, Ino, SetAttr, Txn};

use crate::atomic::Group;
use crate::lock::HandleId;
use crate::mutant::VfsMutant;
use crate::path;
use crate::vfs::{guard, Counters, PendingJournal, Shared};

/// What SQLite allocates for each open file (`szOsFile` bytes): the base struct first, as the
/// VFS contract requires, then our handle.
#[repr(C)]
pub(crate) struct FileObject {
    base: ffi::sqlite3_file,
    handle: *mut Handle,
}

/// Where a file's bytes live.
enum Backing {
    /// An inode of the file system.
    Fs { ino: Ino },
    /// A nameless temporary file.
    Memory(Vec<u8>),
}

/// State of one open file.
pub(crate) struct Handle {
    shared: Arc<Shared>,
    backing: Backing,
    id: HandleId,
    /// SQLite lock level held.
    level: c_int,
    /// The batch open on this handle.
    txn: Option<Txn>,
    /// Bytes (whole blocks) written in the batch.
    batch_bytes: u64,
    /// A rollback journal: each write is ordered before every later write (see `write`).
    journal: bool,
    /// The [`atomic`](crate::atomic) group this database file belongs to, if any: while its
    /// transaction is open every write and truncate goes into it.
    group: Option<Arc<Group>>,
    /// The batch's first write after the header page, kept only for the
    /// `rollback-forgets-a-page` mutant.
    batch_last: Option<(u64, Vec<u8>)>,
}

static IO_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    // 1: no shared memory (WAL needs `PRAGMA locking_mode=EXCLUSIVE`) and no memory mapping.
    iVersion: 1,
    xClose: Some(x_close),
    xRead: Some(x_read),
    xWrite: Some(x_write),
    xTruncate: Some(x_truncate),
    xSync: Some(x_sync),
    xFileSize: Some(x_file_size),
    xLock: Some(x_lock),
    xUnlock: Some(x_unlock),
    xCheckReservedLock: Some(x_check_reserved_lock),
    xFileControl: Some(x_file_control),
    xSectorSize: Some(x_sector_size),
    xDeviceCharacteristics: Some(x_device_characteristics),
    xShmMap: None,
    xShmLock: None,
    xShmBarrier: None,
    xShmUnmap: None,
    xFetch: None,
    xUnfetch: None,
};

/// Open (or create) the file `name` (`None`: a temporary file) for SQLite's `flags`.
pub(crate) fn open(
    shared: &Arc<Shared>,
    name: Option<&[u8]>,
    flags: c_int,
) -> Result<Handle, c_int> {
    let handle = |backing| Handle {
        shared: shared.clone(),
        backing,
        id: shared.next_handle(),
        level: ffi::SQLITE_LOCK_NONE,
        txn: None,
        batch_bytes: 0,
        journal: flags & ffi::SQLITE_OPEN_MAIN_JOURNAL != 0,
        group: None,
        batch_last: None,
    };
    let Some(name) = name else { return Ok(handle(Backing::Memory(Vec::new()))) };
    let fs = &shared.fs;
    let (dir, leaf) = path::parent(fs, name).map_err(|_| ffi::SQLITE_CANTOPEN)?;
    let create = flags & ffi::SQLITE_OPEN_CREATE != 0;
    let ino = match fs.lookup(dir, leaf) {
        Ok(_) if create && flags & ffi::SQLITE_OPEN_EXCLUSIVE != 0 => {
            return Err(ffi::SQLITE_CANTOPEN);
        }
        Ok(attr) if attr.kind == FileKind::File => attr.ino,
        Ok(_) => return Err(ffi::SQLITE_CANTOPEN),
        Err(FsError::NotFound) if create => {
            match fs.create(None, dir, leaf, 0o644, shared.options.owner) {
                Ok(attr) => attr.ino,
                Err(e) => return Err(code(&e, ffi::SQLITE_CANTOPEN)),
            }
        }
        Err(_) => return Err(ffi::SQLITE_CANTOPEN),
    };
    fs.open(ino).map_err(|_| ffi::SQLITE_CANTOPEN)?;
    if flags & ffi::SQLITE_OPEN_DELETEONCLOSE != 0 {
        // As on unix: the name goes now, the pin keeps the file until close.
        if fs.unlink(None, dir, leaf).is_err() {
            let _ = fs.release(ino);
            return Err(ffi::SQLITE_CANTOPEN);
        }
    }
    if flags & ffi::SQLITE_OPEN_MAIN_JOURNAL != 0 {
        Counters::bump(&shared.counters.journal_opens);
    }
    shared.locks().open(ino);
    Ok(handle(Backing::Fs { ino }))
}

/// Put `handle` into the buffer SQLite allocated, with our methods.
///
/// # Safety
/// `file` points to at least `size_of::<FileObject>()` writable bytes, aligned for it (SQLite
/// allocates `szOsFile` bytes with its 8-byte-aligned allocator).
pub(crate) unsafe fn install(file: *mut ffi::sqlite3_file, handle: Handle) {
    handle.shared.open_files.fetch_add(1, Ordering::AcqRel);
    let object = FileObject {
        base: ffi::sqlite3_file { pMethods: &IO_METHODS },
        handle: Box::into_raw(Box::new(handle)),
    };
    // SAFETY: by the caller's contract.
    unsafe { file.cast::<FileObject>().write(object) };
}

/// The handle of a file SQLite calls a method on.
///
/// # Safety
/// `file` was set up by [`install`] and not closed; SQLite calls one method of a file at a
/// time, so the reference is unique for the call.
unsafe fn handle<'a>(file: *mut ffi::sqlite3_file) -> &'a mut Handle {
    // SAFETY: by the caller's contract.
    unsafe { &mut *(*file.cast::<FileObject>()).handle }
}

/// The SQLite code for a file-system error; `otherwise` for errors without a better one.
fn code(e: &FsError, otherwise: c_int) -> c_int {
    match e {
        FsError::NoSpace | FsError::FileTooBig => ffi::SQLITE_FULL,
        _ => otherwise,
    }
}

impl Handle {
    fn block_size(&self) -> u64 {
        u64::from(self.shared.fs.block_size())
    }

    fn read(&self, buf: &mut [u8], offset: u64) -> c_int {
        if self.is_fs() && self.shared.settle().is_err() {
            return ffi::SQLITE_IOERR_READ;
        }
        let got = match &self.backing {
            Backing::Fs { ino } => match self.shared.fs.read(*ino, offset, buf.len()) {
                Ok(bytes) => bytes,
                Err(_) => return ffi::SQLITE_IOERR_READ,
            },
            Backing::Memory(bytes) => {
                let start = usize::try_from(offset).unwrap_or(usize::MAX).min(bytes.len());
                let end = start.saturating_add(buf.len()).min(bytes.len());
                bytes.get(start..end).unwrap_or_default().to_vec()
            }
        };
        let n = got.len().min(buf.len());
        let (head, tail) = buf.split_at_mut(n);
        head.copy_from_slice(got.get(..n).unwrap_or_default());
        if tail.is_empty() {
            ffi::SQLITE_OK
        } else {
            // SQLite requires the unread part zeroed.
            tail.fill(0);
            ffi::SQLITE_IOERR_SHORT_READ
        }
    }

    fn write(&mut self, data: &[u8], offset: u64) -> c_int {
        let ino = match &mut self.backing {
            Backing::Fs { ino } => *ino,
            Backing::Memory(bytes) => {
                let Some(end) = usize::try_from(offset)
                    .ok()
                    .and_then(|o| o.checked_add(data.len()).map(|e| (o, e)))
                else {
                    return ffi::SQLITE_FULL;
                };
                if bytes.len() < end.1 {
                    bytes.resize(end.1, 0);
                }
                if let Some(dst) = bytes.get_mut(end.0..end.1) {
                    dst.copy_from_slice(data);
                }
                return ffi::SQLITE_OK;
            }
        };
        let counters = &self.shared.counters;
        Counters::bump(&counters.file_writes);
        counters.file_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        if self.journal && self.txn.is_none() && self.group.is_none() {
            return self.append_journal(ino, data, offset);
        }
        if self.shared.mutant() != Some(VfsMutant::JournalAfterPages) {
            if let Err(e) = self.shared.settle() {
                return code(&e, ffi::SQLITE_IOERR_WRITE);
            }
        }
        if let Some(group) = self.group() {
            let mut st = group.state();
            if st.txn.is_some() {
                let total = st.bytes.saturating_add(self.span_bytes(data.len(), offset));
                if total > self.shared.batch_bytes_max {
                    // SQLite's phase one fails, and it rolls the whole transaction back.
                    Counters::bump(&self.shared.counters.batch_overflows);
                    return ffi::SQLITE_IOERR_WRITE;
                }
                let result = self.shared.fs.write(st.txn.as_ref(), ino, offset, data);
                st.bytes = total;
                return match result {
                    Ok(n) if n == data.len() => ffi::SQLITE_OK,
                    _ => ffi::SQLITE_IOERR_WRITE,
                };
            }
        }
        let fs = &self.shared.fs;
        if let Some(txn) = &self.txn {
            let total = self.batch_bytes.saturating_add(self.span_bytes(data.len(), offset));
            if total > self.shared.batch_bytes_max {
                // SQLite answers an I/O error in a batch by rolling it back and redoing the
                // commit through a journal: the way out for transactions too large for one.
                Counters::bump(&self.shared.counters.batch_overflows);
                return ffi::SQLITE_IOERR_WRITE;
            }
            self.batch_bytes = total;
            if self.shared.mutant() == Some(VfsMutant::RollbackForgetsAPage)
                && offset > 0
                && self.batch_last.is_none()
            {
                self.batch_last = Some((offset, data.to_vec()));
            }
            return match fs.write(Some(txn), ino, offset, data) {
                Ok(n) if n == data.len() => ffi::SQLITE_OK,
                // Any failure inside a batch is an I/O error, so that SQLite falls back to a
                // journal, which reports a full disk as such if it is one.
                _ => ffi::SQLITE_IOERR_WRITE,
            };
        }
        let result = fs.write(None, ino, offset, data);
        self.shared.locks().wrote(ino);
        match result {
            Ok(n) if n == data.len() => ffi::SQLITE_OK,
            Ok(_) => ffi::SQLITE_FULL,
            Err(e) => code(&e, ffi::SQLITE_IOERR_WRITE),
        }
    }

    /// A plain write to a rollback journal: joined to the pending appends if it continues them
    /// and they stay small enough, else the pending ones are written out and this one starts
    /// anew (`vfs::PendingJournal`).
    fn append_journal(&self, ino: Ino, data: &[u8], offset: u64) -> c_int {
        let max = self.shared.pending_max();
        let mut pending = self.shared.pending();
        if let Some(p) = pending.as_mut() {
            let joins = p.ino == ino
                && p.offset.checked_add(p.data.len() as u64) == Some(offset)
                && p.data.len().saturating_add(data.len()) <= max;
            if joins {
                p.data.extend_from_slice(data);
                return ffi::SQLITE_OK;
            }
        }
        if let Some(p) = pending.take() {
            if let Err(e) = self.shared.write_out(&p) {
                return code(&e, ffi::SQLITE_IOERR_WRITE);
            }
        }
        let p = PendingJournal { ino, offset, data: data.to_vec() };
        if p.data.len() > max {
            // Too large to keep: written at once.
            return match self.shared.write_out(&p) {
                Ok(()) => ffi::SQLITE_OK,
                Err(e) => code(&e, ffi::SQLITE_IOERR_WRITE),
            };
        }
        *pending = Some(p);
        ffi::SQLITE_OK
    }

    fn is_fs(&self) -> bool {
        matches!(self.backing, Backing::Fs { .. })
    }

    /// Bytes of the whole blocks a write of `len` bytes at `offset` covers.
    fn span_bytes(&self, len: usize, offset: u64) -> u64 {
        let bs = self.block_size();
        let end = offset.saturating_add(len as u64);
        end.div_ceil(bs).saturating_sub(offset / bs).saturating_mul(bs)
    }

    /// The group this file belongs to while it is in use (a group the wrapper has ended is let
    /// go here).
    fn group(&mut self) -> Option<Arc<Group>> {
        if self.shared.mutant() == Some(VfsMutant::GroupCommitsEachFile) {
            return None;
        }
        if self.group.as_ref().is_some_and(|g| g.state().ended) {
            self.group = None;
        }
        self.group.clone()
    }

    /// Whether this file's writes go into an open group transaction now.
    fn in_group_txn(&mut self) -> bool {
        self.group().is_some_and(|g| g.state().txn.is_some())
    }

    fn truncate(&mut self, size: u64) -> c_int {
        let ino = match &mut self.backing {
            Backing::Fs { ino } => *ino,
            Backing::Memory(bytes) => {
                bytes.truncate(usize::try_from(size).unwrap_or(usize::MAX));
                return ffi::SQLITE_OK;
            }
        };
        if let Err(e) = self.shared.settle() {
            return code(&e, ffi::SQLITE_IOERR_TRUNCATE);
        }
        let set = SetAttr { size: Some(size), ..SetAttr::default() };
        if let Some(group) = self.group() {
            let st = group.state();
            if st.txn.is_some() {
                if self.shared.mutant() == Some(VfsMutant::GroupTruncateDropped) {
                    return ffi::SQLITE_OK;
                }
                return match self.shared.fs.setattr(st.txn.as_ref(), ino, &set) {
                    Ok(_) => ffi::SQLITE_OK,
                    Err(_) => ffi::SQLITE_IOERR_TRUNCATE,
                };
            }
        }
        let result = self.shared.fs.setattr(self.txn.as_ref(), ino, &set);
        if self.txn.is_none() {
            self.shared.locks().wrote(ino);
        }
        match result {
            Ok(_) => ffi::SQLITE_OK,
            Err(e) => code(&e, ffi::SQLITE_IOERR_TRUNCATE),
        }
    }

    fn sync(&mut self) -> c_int {
        let Backing::Fs { ino } = self.backing else { return ffi::SQLITE_OK };
        if self.shared.settle().is_err() {
            return ffi::SQLITE_IOERR_FSYNC;
        }
        if self.in_group_txn() {
            // The group's durable commit, before SQLite unlocks, makes it all durable.
            Counters::bump(&self.shared.counters.syncs_skipped);
            return ffi::SQLITE_OK;
        }
        let counters = &self.shared.counters;
        let writes = {
            let mut locks = self.shared.locks();
            if !locks.unsynced(ino) {
                // Everything written was committed durably by the batch (one flush already).
                Counters::bump(&counters.syncs_skipped);
                return ffi::SQLITE_OK;
            }
            locks.writes(ino)
        };
        Counters::bump(&counters.syncs);
        match self.shared.fs.fsync(ino) {
            Ok(()) => {
                self.shared.locks().durable(ino, writes);
                ffi::SQLITE_OK
            }
            Err(_) => ffi::SQLITE_IOERR_FSYNC,
        }
    }

    fn file_size(&self) -> Result<u64, c_int> {
        match &self.backing {
            Backing::Fs { ino } => {
                self.shared.settle().map_err(|_| ffi::SQLITE_IOERR_FSTAT)?;
                self.shared.fs.getattr(*ino).map(|a| a.size).map_err(|_| ffi::SQLITE_IOERR_FSTAT)
            }
            Backing::Memory(bytes) => Ok(bytes.len() as u64),
        }
    }

    fn begin_batch(&mut self) -> c_int {
        let Backing::Fs { .. } = self.backing else { return ffi::SQLITE_NOTFOUND };
        if self.txn.is_some() || self.shared.settle().is_err() {
            return ffi::SQLITE_IOERR_BEGIN_ATOMIC;
        }
        if self.in_group_txn() {
            // The batch's writes go into the group, which commits at phase two.
            return ffi::SQLITE_OK;
        }
        match self.shared.fs.begin() {
            Ok(txn) => {
                self.txn = Some(txn);
                self.batch_bytes = 0;
                self.batch_last = None;
                ffi::SQLITE_OK
            }
            Err(_) => ffi::SQLITE_IOERR_BEGIN_ATOMIC,
        }
    }

    fn commit_batch(&mut self) -> c_int {
        let Backing::Fs { ino } = self.backing else { return ffi::SQLITE_NOTFOUND };
        if self.txn.is_none() && self.in_group_txn() {
            return ffi::SQLITE_OK;
        }
        let Some(txn) = self.txn.take() else { return ffi::SQLITE_IOERR_COMMIT_ATOMIC };
        let fs = &self.shared.fs;
        if self.shared.settle().is_err() {
            let _ = fs.abort(txn);
            return ffi::SQLITE_IOERR_COMMIT_ATOMIC;
        }
        // Plain writes before the batch are covered by its durable commit: they precede it on
        // the file's stream, or it depends on them.
        let writes = self.shared.locks().writes(ino);
        let result = if self.shared.mutant() == Some(VfsMutant::CommitNotDurable) {
            fs.commit(txn)
        } else {
            fs.commit_durable(txn)
        };
        match result {
            Ok(()) => {
                self.shared.locks().durable(ino, writes);
                Counters::bump(&self.shared.counters.batch_commits);
                ffi::SQLITE_OK
            }
            // The Fs undid the transaction (it does on every failed commit). An I/O error
            // code makes SQLite redo the commit through a journal: a transaction too large
            // for one Fs transaction (ENOSPC here) still commits that way.
            Err(_) => ffi::SQLITE_IOERR_COMMIT_ATOMIC,
        }
    }

    fn rollback_batch(&mut self) -> c_int {
        let Some(txn) = self.txn.take() else { return ffi::SQLITE_OK };
        Counters::bump(&self.shared.counters.batch_rollbacks);
        let fs = &self.shared.fs;
        let result = if self.shared.mutant() == Some(VfsMutant::RollbackKeepsPages) {
            fs.commit(txn)
        } else {
            fs.abort(txn)
        };
        let forgotten = self.batch_last.take();
        if let (Some((offset, data)), Backing::Fs { ino }) = (forgotten, &self.backing) {
            // The mutant: one page of the batch outlives the rollback, as a plain write.
            let _ = fs.write(None, *ino, offset, &data);
        }
        match result {
            Ok(()) => ffi::SQLITE_OK,
            Err(_) => ffi::SQLITE_IOERR_ROLLBACK_ATOMIC,
        }
    }

    /// `SQLITE_FCNTL_COMMIT_PHASETWO`: every database's phase one is done and none is unlocked
    /// yet; the first member to get it commits the group.
    fn phase_two(&mut self) -> c_int {
        match self.group() {
            Some(group) => group.commit(),
            None => ffi::SQLITE_NOTFOUND,
        }
    }

    /// SQLite lowers this file's lock from `from` to `to`: the end of a transaction that did
    /// not commit the group (a commit would have ended it at phase two) aborts it.
    fn unlocking(&mut self, from: c_int, to: c_int) {
        if from >= ffi::SQLITE_LOCK_RESERVED && to < ffi::SQLITE_LOCK_RESERVED {
            if let Some(group) = self.group() {
                group.abort();
            }
        }
    }

    fn close(mut self) -> c_int {
        let mut rc = ffi::SQLITE_OK;
        if self.is_fs() && self.shared.settle().is_err() {
            rc = ffi::SQLITE_IOERR_CLOSE;
        }
        if let Some(txn) = self.txn.take() {
            // SQLite always ends a batch first; a batch left open is given up, never kept.
            if self.shared.fs.abort(txn).is_err() {
                rc = ffi::SQLITE_IOERR_CLOSE;
            }
        }
        if let Backing::Fs { ino } = self.backing {
            let mut locks = self.shared.locks();
            locks.unlock(ino, self.id, self.level, ffi::SQLITE_LOCK_NONE);
            locks.close(ino);
            drop(locks);
            if self.shared.fs.release(ino).is_err() {
                rc = ffi::SQLITE_IOERR_CLOSE;
            }
        }
        self.shared.open_files.fetch_sub(1, Ordering::AcqRel);
        rc
    }
}

unsafe extern "C" fn x_close(file: *mut ffi::sqlite3_file) -> c_int {
    guard(|| {
        // SAFETY: SQLite calls xClose once, on a file `install` set up; the handle is not used
        // after this, and pMethods is cleared so a stray call finds no methods.
        let boxed = unsafe {
            let object = file.cast::<FileObject>();
            (*object).base.pMethods = std::ptr::null();
            Box::from_raw((*object).handle)
        };
        boxed.close()
    })
}

/// `len` and `offset` as SQLite gives them, checked.
fn span(len: c_int, offset: ffi::sqlite3_int64) -> Option<(usize, u64)> {
    Some((usize::try_from(len).ok()?, u64::try_from(offset).ok()?))
}

unsafe extern "C" fn x_read(
    file: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    len: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    guard(|| {
        let Some((len, offset)) = span(len, offset) else { return ffi::SQLITE_IOERR_READ };
        // SAFETY: an installed file; SQLite passes a buffer of `len` writable bytes.
        let (h, buf) =
            unsafe { (handle(file), std::slice::from_raw_parts_mut(buf.cast::<u8>(), len)) };
        h.read(buf, offset)
    })
}

unsafe extern "C" fn x_write(
    file: *mut ffi::sqlite3_file,
    buf: *const c_void,
    len: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    guard(|| {
        let Some((len, offset)) = span(len, offset) else { return ffi::SQLITE_IOERR_WRITE };
        // SAFETY: an installed file; SQLite passes `len` readable bytes.
        let (h, data) =
            unsafe { (handle(file), std::slice::from_raw_parts(buf.cast::<u8>(), len)) };
        h.write(data, offset)
    })
}

unsafe extern "C" fn x_truncate(file: *mut ffi::sqlite3_file, size: ffi::sqlite3_int64) -> c_int {
    guard(|| {
        let Ok(size) = u64::try_from(size) else { return ffi::SQLITE_IOERR_TRUNCATE };
        // SAFETY: an installed file.
        unsafe { handle(file) }.truncate(size)
    })
}

unsafe extern "C" fn x_sync(file: *mut ffi::sqlite3_file, _flags: c_int) -> c_int {
    // SAFETY: an installed file. (NORMAL, FULL and DATAONLY are all one fsync on Tally.)
    guard(|| unsafe { handle(file) }.sync())
}

unsafe extern "C" fn x_file_size(
    file: *mut ffi::sqlite3_file,
    out: *mut ffi::sqlite3_int64,
) -> c_int {
    guard(|| {
        // SAFETY: an installed file.
        match unsafe { handle(file) }.file_size() {
            Ok(size) => {
                let Ok(size) = ffi::sqlite3_int64::try_from(size) else {
                    return ffi::SQLITE_IOERR_FSTAT;
                };
                // SAFETY: SQLite passes a valid pointer.
                unsafe { *out = size };
                ffi::SQLITE_OK
            }
            Err(rc) => rc,
        }
    })
}

unsafe extern "C" fn x_lock(file: *mut ffi::sqlite3_file, want: c_int) -> c_int {
    guard(|| {
        // SAFETY: an installed file.
        let h = unsafe { handle(file) };
        let Backing::Fs { ino } = h.backing else {
            h.level = want;
            return ffi::SQLITE_OK;
        };
        let result = h.shared.locks().lock(ino, h.id, h.level, want);
        match result {
            Ok(level) => {
                h.level = level;
                ffi::SQLITE_OK
            }
            Err(level) => {
                h.level = level;
                ffi::SQLITE_BUSY
            }
        }
    })
}

unsafe extern "C" fn x_unlock(file: *mut ffi::sqlite3_file, want: c_int) -> c_int {
    guard(|| {
        // SAFETY: an installed file.
        let h = unsafe { handle(file) };
        let Backing::Fs { ino } = h.backing else {
            h.level = want;
            return ffi::SQLITE_OK;
        };
        h.unlocking(h.level, want);
        h.level = h.shared.locks().unlock(ino, h.id, h.level, want);
        ffi::SQLITE_OK
    })
}

unsafe extern "C" fn x_check_reserved_lock(file: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    guard(|| {
        // SAFETY: an installed file.
        let h = unsafe { handle(file) };
        let reserved = match h.backing {
            Backing::Fs { ino } => h.shared.locks().reserved(ino),
            Backing::Memory(_) => false,
        };
        // SAFETY: SQLite passes a valid pointer.
        unsafe { *out = c_int::from(reserved) };
        ffi::SQLITE_OK
    })
}

unsafe extern "C" fn x_file_control(
    file: *mut ffi::sqlite3_file,
    op: c_int,
    _arg: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: an installed file.
        let h = unsafe { handle(file) };
        match op {
            ffi::SQLITE_FCNTL_BEGIN_ATOMIC_WRITE => h.begin_batch(),
            ffi::SQLITE_FCNTL_COMMIT_ATOMIC_WRITE => h.commit_batch(),
            ffi::SQLITE_FCNTL_ROLLBACK_ATOMIC_WRITE => h.rollback_batch(),
            ffi::SQLITE_FCNTL_COMMIT_PHASETWO => h.phase_two(),
            _ => ffi::SQLITE_NOTFOUND,
        }
    })
}

unsafe extern "C" fn x_sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    guard(|| {
        // SAFETY: an installed file.
        let h = unsafe { handle(file) };
        c_int::try_from(h.block_size()).unwrap_or(4096)
    })
}

unsafe extern "C" fn x_device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    guard(|| {
        // SAFETY: an installed file.
        let h = unsafe { handle(file) };
        let Backing::Fs { .. } = h.backing else { return 0 };
        // Copy-on-write: a write never disturbs bytes it does not cover (POWERSAFE_OVERWRITE);
        // each write is one transaction carrying its data and the new size (SAFE_APPEND).
        let mut caps = ffi::SQLITE_IOCAP_POWERSAFE_OVERWRITE | ffi::SQLITE_IOCAP_SAFE_APPEND;
        if h.shared.options.batch_atomic {
            caps |= ffi::SQLITE_IOCAP_BATCH_ATOMIC;
        }
        caps
    })
}

/// A database file of a connection, reached through `SQLITE_FCNTL_FILE_POINTER` by
/// [`atomic`](crate::atomic) before it begins the transaction.
pub(crate) struct Member(NonNull<Handle>);

impl Member {
    fn handle(&self) -> &Handle {
        // SAFETY: `member` checked the file is one of ours; the connection keeps it open and
        // runs no SQLite call while `atomic` holds `&Connection` between statements (a
        // Connection is not Sync), so nothing else touches the handle meanwhile.
        unsafe { self.0.as_ref() }
    }

    /// The VFS state the file belongs to.
    pub(crate) fn shared(&self) -> Arc<Shared> {
        self.handle().shared.clone()
    }

    /// The file's inode (none for a memory file).
    pub(crate) fn ino(&self) -> Option<Ino> {
        match self.handle().backing {
            Backing::Fs { ino } => Some(ino),
            Backing::Memory(_) => None,
        }
    }

    /// Make the file a member of `group`; false if it is in another group still in use.
    pub(crate) fn join(&self, group: &Arc<Group>) -> bool {
        // SAFETY: as in `handle`, and no reference from `handle` is alive.
        let h = unsafe { &mut *self.0.as_ptr() };
        if h.group().is_some() {
            return false;
        }
        h.group = Some(group.clone());
        true
    }
}

/// The file of database `schema` of `conn`, if it is a file of a Tally VFS.
pub(crate) fn member(conn: &Connection, schema: &str) -> Option<Member> {
    let name = CString::new(schema).ok()?;
    let mut file: *mut ffi::sqlite3_file = std::ptr::null_mut();
    // SAFETY: a live connection; FILE_POINTER writes the database's `sqlite3_file *` into the
    // pointer passed, or fails for an unknown schema.
    let rc = unsafe {
        ffi::sqlite3_file_control(
            conn.handle(),
            name.as_ptr(),
            ffi::SQLITE_FCNTL_FILE_POINTER,
            (&raw mut file).cast::<c_void>(),
        )
    };
    if rc != ffi::SQLITE_OK || file.is_null() {
        return None;
    }
    // SAFETY: SQLite returned the open file of that database; its first field is pMethods.
    let methods = unsafe { (*file).pMethods };
    if !std::ptr::eq(methods, &IO_METHODS) {
        return None;
    }
    // SAFETY: the methods are ours, so `install` set the file up as a FileObject.
    let handle = unsafe { (*file.cast::<FileObject>()).handle };
    NonNull::new(handle).map(Member)
}

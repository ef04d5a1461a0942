//! The `sqlite3_vfs` object: registration under a name, and its file-system-wide methods
//! (open, delete, access, full pathname). Randomness, time, sleep and the dynamic loader are
//! delegated to SQLite's default VFS, which owns them on this platform.
//!
//! Invariants:
//! - a registered `sqlite3_vfs` is the first field of a live [`VfsBox`], whose `pAppData` is
//!   null and whose `shared` outlives every file opened through it (each holds an `Arc`);
//! - the box is freed only after `sqlite3_vfs_unregister` and only when no file is open
//!   (otherwise it is leaked, a few hundred bytes, rather than freed under a connection).

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rusqlite::ffi;
use tally_fs::{Fs, FsError, Ino, Owner};

use crate::file::{self, FileObject};
use crate::lock::LockTable;
use crate::mutant::VfsMutant;
use crate::path;

/// Longest full pathname SQLite may hand to this VFS.
const PATHNAME_MAX: c_int = 512;

/// How a [`TallyVfs`] behaves.
#[derive(Debug, Clone)]
pub struct VfsOptions {
    /// Report `SQLITE_IOCAP_BATCH_ATOMIC`, so SQLite (built with
    /// `SQLITE_ENABLE_BATCH_ATOMIC_WRITE`) commits rollback-mode transactions as one Tally
    /// transaction with no journal. Off: SQLite journals as on any file system (for comparing).
    pub batch_atomic: bool,
    /// Most bytes (counted in whole blocks) one batch may write. A write past it fails with
    /// `SQLITE_IOERR_WRITE`, on which SQLite aborts the batch and redoes the commit through a
    /// journal. `None`: three quarters of what one `Fs` transaction can hold (half a segment).
    pub batch_bytes_max: Option<u64>,
    /// Owner of the files the VFS creates.
    pub owner: Owner,
    /// A deliberately broken variant (needs the `mutants` feature).
    pub mutant: Option<VfsMutant>,
}

impl Default for VfsOptions {
    fn default() -> Self {
        VfsOptions {
            batch_atomic: true,
            batch_bytes_max: None,
            owner: Owner::default(),
            mutant: None,
        }
    }
}

/// Why a VFS could not be registered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VfsError {
    /// The name has a NUL byte.
    #[error("VFS name {0:?} contains a NUL byte")]
    BadName(String),
    /// SQLite already has a VFS of that name.
    #[error("a VFS named {0:?} is already registered")]
    NameTaken(String),
    /// SQLite has no default VFS to take randomness, time and sleep from.
    #[error("SQLite has no default VFS")]
    NoDefaultVfs,
    /// `sqlite3_vfs_register` failed.
    #[error("sqlite3_vfs_register failed with code {0}")]
    Register(c_int),
    /// A mutant was asked for in a build without the `mutants` feature.
    #[error("mutant {0} needs the `mutants` feature")]
    MutantsNotCompiled(&'static str),
}

/// What a VFS did since it was registered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct VfsStats {
    /// Batches committed (`SQLITE_FCNTL_COMMIT_ATOMIC_WRITE` that succeeded).
    pub batch_commits: u64,
    /// Batches rolled back (`SQLITE_FCNTL_ROLLBACK_ATOMIC_WRITE` with a batch open).
    pub batch_rollbacks: u64,
    /// Writes refused because the batch grew past `batch_bytes_max`.
    pub batch_overflows: u64,
    /// Rollback journals opened (`SQLITE_OPEN_MAIN_JOURNAL`): none on the batch path.
    pub journal_opens: u64,
    /// `xSync` calls that waited for durability.
    pub syncs: u64,
    /// `xSync` calls with nothing left to make durable (after a batch commit, or inside an
    /// [`atomic`](crate::atomic) group).
    pub syncs_skipped: u64,
    /// [`atomic`](crate::atomic) groups committed (one `Fs` transaction each).
    pub group_commits: u64,
    /// [`atomic`](crate::atomic) groups aborted, or whose commit failed.
    pub group_aborts: u64,
    /// `xWrite` calls on files of the file system (database and journal files; not the
    /// in-memory temporary files).
    pub file_writes: u64,
    /// Bytes SQLite handed to those `xWrite` calls.
    pub file_bytes: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) batch_commits: AtomicU64,
    pub(crate) batch_rollbacks: AtomicU64,
    pub(crate) batch_overflows: AtomicU64,
    pub(crate) journal_opens: AtomicU64,
    pub(crate) syncs: AtomicU64,
    pub(crate) syncs_skipped: AtomicU64,
    pub(crate) group_commits: AtomicU64,
    pub(crate) group_aborts: AtomicU64,
    pub(crate) file_writes: AtomicU64,
    pub(crate) file_bytes: AtomicU64,
}

impl Counters {
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// SQLite's default VFS (the platform's), for randomness, time, sleep and the loader.
struct DefaultVfs(NonNull<ffi::sqlite3_vfs>);

// SAFETY: the pointer is SQLite's built-in default VFS, a static object never freed, whose
// methods SQLite itself calls from any thread.
unsafe impl Send for DefaultVfs {}
// SAFETY: as for Send; it is only read.
unsafe impl Sync for DefaultVfs {}

/// State shared by the VFS and every file open through it.
pub(crate) struct Shared {
    pub(crate) fs: Arc<Fs>,
    pub(crate) options: VfsOptions,
    pub(crate) batch_bytes_max: u64,
    pub(crate) locks: Mutex<LockTable>,
    pub(crate) counters: Counters,
    /// Files open now (the box is freed at drop only when none is).
    pub(crate) open_files: AtomicU64,
    /// A rollback journal's appends not handed to the `Fs` yet (see [`PendingJournal`]).
    pub(crate) pending: Mutex<Option<PendingJournal>>,
    next_handle: AtomicU64,
    default_vfs: DefaultVfs,
}

/// Contiguous appends to one rollback journal, kept in memory and handed to the `Fs` as one
/// write (one `Fs` transaction) instead of one per `xWrite`: SQLite writes each journaled page
/// as three writes (page number, page, checksum), and each `Fs` write rewrites whole blocks and
/// adds its records, so a 4-byte write cost a block and more (`speedtest1` wrote 2.7 bytes to
/// the device per byte SQLite wrote). The buffer is written out, with the barrier every
/// journal write gets, before anything else touches a file of the VFS (any read, write,
/// truncate, sync, size, begin or commit, close or delete): every later operation sees the
/// journal as if each append had gone through, and nothing written to a database file can
/// reach the device ahead of the journal that undoes it. Invariant: at most one journal has
/// pending appends, `offset + data.len()` is where the next append must start to join them,
/// and `data.len()` stays under [`Shared::pending_max`].
pub(crate) struct PendingJournal {
    pub(crate) ino: Ino,
    pub(crate) offset: u64,
    pub(crate) data: Vec<u8>,
}

impl Shared {
    /// Most bytes kept in a [`PendingJournal`] (the written-out appends are one `Fs`
    /// transaction: half of what a batch may hold, and at most 1 MiB).
    pub(crate) fn pending_max(&self) -> usize {
        usize::try_from((self.batch_bytes_max / 2).min(1 << 20)).unwrap_or(1 << 20)
    }

    /// The pending journal buffer, locked.
    pub(crate) fn pending(&self) -> MutexGuard<'_, Option<PendingJournal>> {
        // Changed in whole steps; a panic elsewhere leaves it consistent.
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Write out the pending journal appends, if any (see [`PendingJournal`]).
    ///
    /// # Errors
    /// The `Fs` write's or barrier's error; the appends are dropped then, and SQLite, told of
    /// the failed I/O, rolls its transaction back.
    pub(crate) fn settle(&self) -> Result<(), FsError> {
        let Some(p) = self.pending().take() else { return Ok(()) };
        self.write_out(&p)
    }

    /// Hand `p` to the `Fs` as one write, ordered before every later write.
    pub(crate) fn write_out(&self, p: &PendingJournal) -> Result<(), FsError> {
        let n = self.fs.write(None, p.ino, p.offset, &p.data)?;
        self.locks().wrote(p.ino);
        if n != p.data.len() {
            return Err(FsError::NoSpace);
        }
        // After a batch it rolled back, SQLite writes the journal from memory and then the
        // database pages with no sync in between (pager.c, sqlite3PagerCommitPhaseOne), so
        // nothing else keeps a crash from persisting pages without the journal that undoes
        // them. A barrier (no wait) makes every later write, the pages included, survive only
        // if this journal write does.
        self.fs.barrier(p.ino)
    }

    pub(crate) fn locks(&self) -> MutexGuard<'_, LockTable> {
        // The table is changed in whole steps; a panic elsewhere leaves it consistent.
        self.locks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn next_handle(&self) -> u64 {
        self.next_handle.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn mutant(&self) -> Option<VfsMutant> {
        self.options.mutant
    }
}

/// The registered object: SQLite holds a pointer to `raw`, the first field.
#[repr(C)]
struct VfsBox {
    raw: ffi::sqlite3_vfs,
    name: CString,
    shared: Arc<Shared>,
}

/// An SQLite VFS over a `tally_fs::Fs`, registered under a name until dropped. Open databases
/// through it with `rusqlite::Connection::open_with_flags_and_vfs(path, flags, vfs.name())`;
/// paths are paths in the `Fs` tree. Close every connection before dropping it.
pub struct TallyVfs {
    raw: NonNull<VfsBox>,
    shared: Arc<Shared>,
    name: String,
}

// SAFETY: the box is only touched by SQLite (which serialises its VFS list) and by `drop`;
// `Shared` is Send and Sync.
unsafe impl Send for TallyVfs {}
// SAFETY: as for Send; `&TallyVfs` only reads `name` and the atomic counters.
unsafe impl Sync for TallyVfs {}

impl TallyVfs {
    /// Register a VFS named `name` over `fs` (not as SQLite's default).
    ///
    /// # Errors
    /// A bad or taken name, no default VFS, a mutant without the feature, SQLite's refusal.
    pub fn register(name: &str, fs: Arc<Fs>, options: VfsOptions) -> Result<TallyVfs, VfsError> {
        if let Some(m) = options.mutant {
            if !crate::mutant::available() {
                return Err(VfsError::MutantsNotCompiled(m.name()));
            }
        }
        let c_name = CString::new(name).map_err(|_| VfsError::BadName(name.to_owned()))?;
        // SAFETY: a valid NUL-terminated string; sqlite3_vfs_find initialises SQLite if needed
        // and only reads its VFS list.
        if !unsafe { ffi::sqlite3_vfs_find(c_name.as_ptr()) }.is_null() {
            return Err(VfsError::NameTaken(name.to_owned()));
        }
        // SAFETY: a null name asks for the default VFS.
        let default = NonNull::new(unsafe { ffi::sqlite3_vfs_find(std::ptr::null()) })
            .ok_or(VfsError::NoDefaultVfs)?;
        let batch_bytes_max = options.batch_bytes_max.unwrap_or_else(|| default_batch_max(&fs));
        let shared = Arc::new(Shared {
            fs,
            options,
            batch_bytes_max,
            locks: Mutex::new(LockTable::default()),
            counters: Counters::default(),
            open_files: AtomicU64::new(0),
            pending: Mutex::new(None),
            next_handle: AtomicU64::new(1),
            default_vfs: DefaultVfs(default),
        });
        let raw = ffi::sqlite3_vfs {
            // 2: xCurrentTimeInt64 is there; 3's system-call hooks are for os_unix only.
            iVersion: 2,
            szOsFile: c_int::try_from(std::mem::size_of::<FileObject>())
                .map_err(|_| VfsError::Register(ffi::SQLITE_MISUSE))?,
            mxPathname: PATHNAME_MAX,
            pNext: std::ptr::null_mut(),
            zName: c_name.as_ptr(),
            pAppData: std::ptr::null_mut(),
            xOpen: Some(x_open),
            xDelete: Some(x_delete),
            xAccess: Some(x_access),
            xFullPathname: Some(x_full_pathname),
            xDlOpen: Some(x_dl_open),
            xDlError: Some(x_dl_error),
            xDlSym: Some(x_dl_sym),
            xDlClose: Some(x_dl_close),
            xRandomness: Some(x_randomness),
            xSleep: Some(x_sleep),
            xCurrentTime: Some(x_current_time),
            xGetLastError: Some(x_get_last_error),
            xCurrentTimeInt64: Some(x_current_time_int64),
            xSetSystemCall: None,
            xGetSystemCall: None,
            xNextSystemCall: None,
        };
        // `zName` points into the CString's heap buffer, which moving the CString into the box
        // does not move.
        let boxed = Box::new(VfsBox { raw, name: c_name, shared: shared.clone() });
        let raw_box = NonNull::from(Box::leak(boxed));
        // SAFETY: `raw` is the first field of a repr(C) box that lives until `drop` below
        // unregisters it; SQLite keeps the pointer and calls the methods above with it.
        let rc = unsafe { ffi::sqlite3_vfs_register(raw_box.as_ptr().cast(), 0) };
        if rc != ffi::SQLITE_OK {
            // SAFETY: not registered, so nothing else holds the pointer.
            drop(unsafe { Box::from_raw(raw_box.as_ptr()) });
            return Err(VfsError::Register(rc));
        }
        Ok(TallyVfs { raw: raw_box, shared, name: name.to_owned() })
    }

    /// The name to open databases with.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The file system underneath.
    #[must_use]
    pub fn fs(&self) -> &Arc<Fs> {
        &self.shared.fs
    }

    /// What the VFS did so far.
    #[must_use]
    pub fn stats(&self) -> VfsStats {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        VfsStats {
            batch_commits: get(&c.batch_commits),
            batch_rollbacks: get(&c.batch_rollbacks),
            batch_overflows: get(&c.batch_overflows),
            journal_opens: get(&c.journal_opens),
            syncs: get(&c.syncs),
            syncs_skipped: get(&c.syncs_skipped),
            group_commits: get(&c.group_commits),
            group_aborts: get(&c.group_aborts),
            file_writes: get(&c.file_writes),
            file_bytes: get(&c.file_bytes),
        }
    }
}

impl Drop for TallyVfs {
    fn drop(&mut self) {
        // SAFETY: registered in `register`; unregistering an object SQLite holds is the
        // documented way to withdraw it (no new connection can find it afterwards).
        unsafe { ffi::sqlite3_vfs_unregister(self.raw.as_ptr().cast()) };
        if self.shared.open_files.load(Ordering::Acquire) == 0 {
            // SAFETY: unregistered, and no file is open, so no connection is using it (a
            // connection keeps its main database file open for its whole life).
            drop(unsafe { Box::from_raw(self.raw.as_ptr()) });
        }
    }
}

/// Three quarters of the data one `Fs` transaction can hold (half a segment, less the blocks
/// its records need), in bytes: past it a batch is redone through a journal.
fn default_batch_max(fs: &Fs) -> u64 {
    let blocks = u64::from(fs.log().segment_blocks() / 2).saturating_sub(2);
    (blocks * 3 / 4).max(1) * u64::from(fs.block_size())
}

/// Run a VFS method, turning a panic (a bug) into an I/O error instead of unwinding into C.
pub(crate) fn guard(f: impl FnOnce() -> c_int) -> c_int {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(ffi::SQLITE_IOERR)
}

/// The shared state of the VFS SQLite called.
///
/// # Safety
/// `vfs` must be a pointer registered by [`TallyVfs::register`] and not yet freed.
unsafe fn shared_of<'a>(vfs: *mut ffi::sqlite3_vfs) -> &'a Arc<Shared> {
    // SAFETY: by the caller's contract `vfs` is the first field of a live VfsBox.
    unsafe { &(*vfs.cast::<VfsBox>()).shared }
}

/// The default VFS of the VFS SQLite called.
///
/// # Safety
/// As [`shared_of`].
unsafe fn default_of(vfs: *mut ffi::sqlite3_vfs) -> *mut ffi::sqlite3_vfs {
    // SAFETY: as the caller's contract.
    unsafe { shared_of(vfs) }.default_vfs.0.as_ptr()
}

/// A name SQLite passed, as bytes.
///
/// # Safety
/// `name` is null or a NUL-terminated string that lives through the call.
unsafe fn name_bytes<'a>(name: *const c_char) -> Option<&'a [u8]> {
    // SAFETY: as the caller's contract.
    (!name.is_null()).then(|| unsafe { CStr::from_ptr(name) }.to_bytes())
}

unsafe extern "C" fn x_open(
    vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    // SAFETY: SQLite passes a `szOsFile`-sized buffer; pMethods must be null if open fails, so
    // that SQLite does not call xClose.
    unsafe { (*file).pMethods = std::ptr::null() };
    guard(|| {
        // SAFETY: SQLite calls with the pointer it was registered with, and a name that is
        // null (a temporary file) or a NUL-terminated string.
        let (shared, name) = unsafe { (shared_of(vfs), name_bytes(name)) };
        match file::open(shared, name, flags) {
            Ok(handle) => {
                // SAFETY: `file` is the buffer SQLite gave, of our `szOsFile` size.
                unsafe { file::install(file, handle) };
                if !out_flags.is_null() {
                    // SAFETY: SQLite passes a valid int pointer when not null.
                    unsafe { *out_flags = flags };
                }
                ffi::SQLITE_OK
            }
            Err(code) => code,
        }
    })
}

unsafe extern "C" fn x_delete(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    _sync_dir: c_int,
) -> c_int {
    guard(|| {
        // SAFETY: as in x_open.
        let (shared, name) = unsafe { (shared_of(vfs), name_bytes(name)) };
        let Some(name) = name else { return ffi::SQLITE_IOERR_DELETE };
        if shared.settle().is_err() {
            return ffi::SQLITE_IOERR_DELETE;
        }
        let fs = &shared.fs;
        let Ok((dir, leaf)) = path::parent(fs, name) else {
            return ffi::SQLITE_IOERR_DELETE_NOENT;
        };
        match fs.unlink(None, dir, leaf) {
            Ok(()) => {}
            Err(FsError::NotFound) => return ffi::SQLITE_IOERR_DELETE_NOENT,
            Err(_) => return ffi::SQLITE_IOERR_DELETE,
        }
        // Always durable, whatever `sync_dir` says: deleting the journal is the commit point
        // of a journaled commit, and an acknowledged commit must not come back as a hot
        // journal after a crash (SQLite's `synchronous=EXTRA` on unix). Only journaled
        // commits delete a journal, so the batch path never pays for it.
        match fs.fsync(dir) {
            Ok(()) => ffi::SQLITE_OK,
            Err(_) => ffi::SQLITE_IOERR_DIR_FSYNC,
        }
    })
}

unsafe extern "C" fn x_access(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    _flags: c_int,
    out: *mut c_int,
) -> c_int {
    guard(|| {
        // SAFETY: as in x_open.
        let (shared, name) = unsafe { (shared_of(vfs), name_bytes(name)) };
        let fs = &shared.fs;
        // Permissions are not checked: the library's caller owns the whole file system.
        let exists = name
            .and_then(|n| path::parent(fs, n).ok())
            .is_some_and(|(dir, leaf)| fs.lookup(dir, leaf).is_ok());
        if out.is_null() {
            return ffi::SQLITE_IOERR_ACCESS;
        }
        // SAFETY: SQLite passes a valid int pointer.
        unsafe { *out = c_int::from(exists) };
        ffi::SQLITE_OK
    })
}

unsafe extern "C" fn x_full_pathname(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    out_len: c_int,
    out: *mut c_char,
) -> c_int {
    guard(|| {
        // SAFETY: SQLite passes a NUL-terminated name.
        let Some(name) = (unsafe { name_bytes(name) }) else { return ffi::SQLITE_CANTOPEN };
        let Ok(full) = path::canonical(name) else { return ffi::SQLITE_CANTOPEN };
        let Ok(cap) = usize::try_from(out_len) else { return ffi::SQLITE_CANTOPEN };
        if full.len() >= cap || out.is_null() {
            return ffi::SQLITE_CANTOPEN;
        }
        // SAFETY: `out` holds `out_len` bytes (SQLite's contract), and full.len() + 1 fit.
        unsafe {
            std::ptr::copy_nonoverlapping(full.as_ptr().cast::<c_char>(), out, full.len());
            *out.add(full.len()) = 0;
        }
        ffi::SQLITE_OK
    })
}

// The rest delegates to the default VFS, with the default VFS's own pointer.

unsafe extern "C" fn x_dl_open(vfs: *mut ffi::sqlite3_vfs, name: *const c_char) -> *mut c_void {
    // SAFETY: registered pointer; the default VFS's method gets its own object.
    unsafe {
        let d = default_of(vfs);
        (*d).xDlOpen.map_or(std::ptr::null_mut(), |f| f(d, name))
    }
}

unsafe extern "C" fn x_dl_error(vfs: *mut ffi::sqlite3_vfs, len: c_int, out: *mut c_char) {
    // SAFETY: as x_dl_open.
    unsafe {
        let d = default_of(vfs);
        if let Some(f) = (*d).xDlError {
            f(d, len, out);
        }
    }
}

unsafe extern "C" fn x_dl_sym(
    vfs: *mut ffi::sqlite3_vfs,
    handle: *mut c_void,
    symbol: *const c_char,
) -> Option<unsafe extern "C" fn(*mut ffi::sqlite3_vfs, *mut c_void, *const c_char)> {
    // SAFETY: as x_dl_open.
    unsafe {
        let d = default_of(vfs);
        (*d).xDlSym.and_then(|f| f(d, handle, symbol))
    }
}

unsafe extern "C" fn x_dl_close(vfs: *mut ffi::sqlite3_vfs, handle: *mut c_void) {
    // SAFETY: as x_dl_open.
    unsafe {
        let d = default_of(vfs);
        if let Some(f) = (*d).xDlClose {
            f(d, handle);
        }
    }
}

unsafe extern "C" fn x_randomness(
    vfs: *mut ffi::sqlite3_vfs,
    len: c_int,
    out: *mut c_char,
) -> c_int {
    // SAFETY: as x_dl_open.
    unsafe {
        let d = default_of(vfs);
        (*d).xRandomness.map_or(0, |f| f(d, len, out))
    }
}

unsafe extern "C" fn x_sleep(vfs: *mut ffi::sqlite3_vfs, micros: c_int) -> c_int {
    // SAFETY: as x_dl_open.
    unsafe {
        let d = default_of(vfs);
        (*d).xSleep.map_or(0, |f| f(d, micros))
    }
}

unsafe extern "C" fn x_current_time(vfs: *mut ffi::sqlite3_vfs, out: *mut f64) -> c_int {
    // SAFETY: as x_dl_open.
    unsafe {
        let d = default_of(vfs);
        (*d).xCurrentTime.map_or(ffi::SQLITE_ERROR, |f| f(d, out))
    }
}

unsafe extern "C" fn x_get_last_error(
    vfs: *mut ffi::sqlite3_vfs,
    len: c_int,
    out: *mut c_char,
) -> c_int {
    // SAFETY: as x_dl_open.
    unsafe {
        let d = default_of(vfs);
        (*d).xGetLastError.map_or(0, |f| f(d, len, out))
    }
}

unsafe extern "C" fn x_current_time_int64(
    vfs: *mut ffi::sqlite3_vfs,
    out: *mut ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: as x_dl_open; the default VFS is version 2 or later on every platform SQLite
    // ships (checked before the call all the same).
    unsafe {
        let d = default_of(vfs);
        if (*d).iVersion >= 2 {
            if let Some(f) = (*d).xCurrentTimeInt64 {
                return f(d, out);
            }
        }
        ffi::SQLITE_ERROR
    }
}

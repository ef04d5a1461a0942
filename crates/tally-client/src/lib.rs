//! Transactions on a Tally FUSE mount (`tally mount`) from any program: the ioctl numbers and
//! thin typed wrappers over them. Other languages use `include/tally.h`, which defines the same
//! numbers (a test compiles it and compares).
//!
//! A transaction is begun with an ioctl on any open file or directory of the mount and is
//! **owned by that open file**: commit, commit durable and abort go through the same open file
//! (a duplicate or an inherited copy of it works too); when the last copy is closed, an open
//! transaction is aborted. It is **bound** to the process that began it ([`begin`]) or to that
//! process and every process it starts, at any depth ([`begin_tree`]): every change those
//! processes make under the mount goes into the transaction, through any file descriptor.
//! Other processes' changes do not; an object the transaction changed is theirs to change again
//! only after it ends (they wait a short while, then get `EBUSY`). See `docs/TRANSACTIONS.md`.
//!
//! ```no_run
//! # fn main() -> Result<(), tally_client::Error> {
//! use std::fs::File;
//! use std::io::Write;
//!
//! let dir = File::open("/mnt/tally")?;          // any file or directory of the mount
//! let id = tally_client::begin(&dir)?;           // this process's writes now go into it
//! File::create("/mnt/tally/a")?.write_all(b"debit")?;
//! File::create("/mnt/tally/b")?.write_all(b"credit")?;
//! assert_eq!(tally_client::current(&dir)?, Some(id));
//! tally_client::commit_durable(&dir)?;            // both files, on stable media, or neither
//! # Ok(())
//! # }
//! ```
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use std::io;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;

/// The ioctl numbers, encoded as Linux's `_IO`/`_IOR` macros do (generic encoding: x86, Arm,
/// RISC-V; the direction bits differ on a few other architectures, where the header is right
/// and these constants are not — `tests/header.rs` checks them against it).
pub mod ioctl {
    /// The type byte of every Tally ioctl (`'T'` is taken by terminals; this one is unused in
    /// the kernel's `ioctl-number.rst`).
    pub const MAGIC: u8 = 0xB7;

    const NONE: u32 = 0;
    const READ: u32 = 2;

    const fn encode(dir: u32, nr: u8, size: u32) -> u32 {
        (dir << 30) | (size << 16) | ((MAGIC as u32) << 8) | nr as u32
    }

    /// `_IOR(MAGIC, 1, uint64_t)`: begin a transaction bound to the calling process; writes
    /// its id (never 0).
    pub const BEGIN: u32 = encode(READ, 1, 8);
    /// `_IOR(MAGIC, 2, uint64_t)`: begin a transaction bound to the calling process and every
    /// process it starts, at any depth; writes its id.
    pub const BEGIN_TREE: u32 = encode(READ, 2, 8);
    /// `_IO(MAGIC, 3)`: commit the transaction this open file owns: ordered and atomic,
    /// returns before it is durable.
    pub const COMMIT: u32 = encode(NONE, 3, 0);
    /// `_IO(MAGIC, 4)`: commit and wait until the transaction is on stable media.
    pub const COMMIT_DURABLE: u32 = encode(NONE, 4, 0);
    /// `_IO(MAGIC, 5)`: abort the transaction this open file owns: every change it made is
    /// undone, nothing is written.
    pub const ABORT: u32 = encode(NONE, 5, 0);
    /// `_IO(MAGIC, 6)`: barrier on this file: every later change, to any file, survives a
    /// crash only if this file's earlier changes do. Returns at once.
    pub const BARRIER: u32 = encode(NONE, 6, 0);
    /// `_IOR(MAGIC, 7, uint64_t)`: the id of the transaction the caller's changes go into, 0
    /// when none.
    pub const CURRENT: u32 = encode(READ, 7, 8);
    /// `_IO(MAGIC, 8)`: make everything committed on the whole mount durable (what `sync(2)`
    /// and `syncfs(2)` promise, which Linux does not forward to FUSE servers).
    pub const SYNC: u32 = encode(NONE, 8, 0);
    /// Every request number, in the order of their numbers (and of `include/tally.h`).
    pub const ALL: [u32; 8] =
        [BEGIN, BEGIN_TREE, COMMIT, COMMIT_DURABLE, ABORT, BARRIER, CURRENT, SYNC];
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The file is not on a Tally mount (`ENOTTY`).
    #[error("not a file on a Tally mount")]
    NotTally,
    /// Begin: the open file already owns a transaction, or the caller's changes already go
    /// into one (`EBUSY`); commit: an object it changed is held by another transaction.
    #[error("a transaction is already open here")]
    Busy,
    /// Commit or abort through an open file that owns no transaction (`EINVAL`), e.g. it was
    /// already ended or aborted when its open file was closed.
    #[error("this open file owns no transaction")]
    NoTransaction,
    /// The transaction did not fit; it was aborted (`ENOSPC`).
    #[error("no space for the transaction; it was aborted")]
    NoSpace,
    /// Any other failure, as the kernel or the file system reported it (`EIO` after an I/O
    /// error: the mount is then read-only until remounted).
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl Error {
    fn from_errno(e: io::Error) -> Error {
        match e.raw_os_error() {
            Some(libc::ENOTTY) => Error::NotTally,
            Some(libc::EBUSY) => Error::Busy,
            Some(libc::EINVAL) => Error::NoTransaction,
            Some(libc::ENOSPC) => Error::NoSpace,
            _ => Error::Io(e),
        }
    }
}

/// The result of a call.
pub type Result<T> = std::result::Result<T, Error>;

/// Issue an ioctl without argument.
fn call(file: &impl AsFd, request: u32) -> Result<()> {
    let fd = file.as_fd().as_raw_fd();
    // SAFETY: `fd` is open for the life of `file`; these requests take no argument.
    let rc = unsafe { libc::ioctl(fd, request as _, 0) };
    if rc < 0 {
        return Err(Error::from_errno(io::Error::last_os_error()));
    }
    Ok(())
}

/// Issue an ioctl that writes a `u64`.
fn call_u64(file: &impl AsFd, request: u32) -> Result<u64> {
    let fd = file.as_fd().as_raw_fd();
    let mut out: u64 = 0;
    // SAFETY: `fd` is open; the request's encoded size is 8 bytes and `out` is a valid,
    // writable u64 for the duration of the call.
    let rc = unsafe { libc::ioctl(fd, request as _, std::ptr::from_mut(&mut out)) };
    if rc < 0 {
        return Err(Error::from_errno(io::Error::last_os_error()));
    }
    Ok(out)
}

/// Begin a transaction owned by `file`'s open file and bound to the calling process: every
/// change this process makes under the mount goes into it until it ends. Returns its id.
///
/// # Errors
/// [`Error::NotTally`], [`Error::Busy`], [`Error::Io`].
pub fn begin(file: &impl AsFd) -> Result<u64> {
    call_u64(file, ioctl::BEGIN)
}

/// Begin a transaction owned by `file`'s open file and bound to the calling process and every
/// process it starts, at any depth (`tally atomic` uses it). A process whose parent exits is
/// adopted by init and leaves the tree, unless the caller is a child subreaper
/// (`prctl(PR_SET_CHILD_SUBREAPER)`), as `tally atomic` is. Returns its id.
///
/// # Errors
/// As [`begin`].
pub fn begin_tree(file: &impl AsFd) -> Result<u64> {
    call_u64(file, ioctl::BEGIN_TREE)
}

/// Commit the transaction `file`'s open file owns: ordered and atomic, returns before it is
/// durable (a later `fsync`, `sync` or the mount's periodic flush makes it so).
///
/// # Errors
/// [`Error::NoTransaction`], [`Error::NoSpace`] (aborted), [`Error::Io`].
pub fn commit(file: &impl AsFd) -> Result<()> {
    call(file, ioctl::COMMIT)
}

/// Commit and wait until the transaction and everything it depends on are on stable media.
///
/// # Errors
/// As [`commit`].
pub fn commit_durable(file: &impl AsFd) -> Result<()> {
    call(file, ioctl::COMMIT_DURABLE)
}

/// Abort the transaction `file`'s open file owns: every change made in it is undone (the
/// kernel's caches of them are dropped too), nothing is written.
///
/// # Errors
/// [`Error::NoTransaction`], [`Error::Io`].
pub fn abort(file: &impl AsFd) -> Result<()> {
    call(file, ioctl::ABORT)
}

/// Barrier on `file`: every later change, to any file, survives a crash only if `file`'s
/// earlier changes do. Returns at once, without waiting for the device.
///
/// # Errors
/// [`Error::NotTally`], [`Error::Io`].
pub fn barrier(file: &impl AsFd) -> Result<()> {
    call(file, ioctl::BARRIER)
}

/// The id of the transaction the caller's changes go into, if any.
///
/// # Errors
/// [`Error::NotTally`], [`Error::Io`].
pub fn current(file: &impl AsFd) -> Result<Option<u64>> {
    call_u64(file, ioctl::CURRENT).map(|id| (id != 0).then_some(id))
}

/// Make everything committed on `file`'s mount durable, whoever committed it: one flush round
/// of the whole file system. This is what `sync(2)` and `syncfs(2)` promise; Linux (up to at
/// least 6.18) does not forward either to a FUSE server, so on a Tally mount they do not reach
/// the log — call this (or `tally sync`) instead.
///
/// # Errors
/// [`Error::NotTally`], [`Error::Io`] (`EIO` after an I/O error: nothing is then promised).
pub fn sync(file: &impl AsFd) -> Result<()> {
    call(file, ioctl::SYNC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_distinct_and_carry_the_magic() {
        let all = ioctl::ALL;
        for (i, a) in all.iter().enumerate() {
            assert_eq!((a >> 8) & 0xff, u32::from(ioctl::MAGIC));
            assert!(all[i + 1..].iter().all(|b| b != a));
        }
        // The terminal ioctl isatty() sends must never look like one of ours.
        assert!(!all.contains(&(libc::TCGETS as u32)));
        assert_eq!(ioctl::BEGIN, 0x8008_b701);
    }

    #[test]
    fn a_file_elsewhere_is_not_tally() {
        let f = std::fs::File::open("Cargo.toml").unwrap();
        assert!(matches!(begin(&f), Err(Error::NotTally)));
        assert!(matches!(commit(&f), Err(Error::NotTally)));
    }
}

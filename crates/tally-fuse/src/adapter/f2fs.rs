//! F2FS's atomic-write ioctls on the mount: the door SQLite built with
//! `SQLITE_ENABLE_BATCH_ATOMIC_WRITE` knocks on (its unix VFS asks `GET_FEATURES` of every
//! database file and, given the atomic-write bit, commits a rollback-mode transaction with
//! `START`, its page writes, `COMMIT`; no journal file). Each maps onto a Tally transaction
//! owned by the open file (`txns.rs`, `Scope::Handle`).
//!
//! Invariants:
//! - the numbers are Linux's generic `_IO`/`_IOR` encoding, so the kernel's restricted FUSE
//!   ioctl path carries them: `_IO` with no data, `GET_FEATURES` with 4 bytes out;
//! - errno as F2FS has it (`fs/f2fs/file.c`): `EBADF` for a handle not open for writing (start,
//!   commit, abort), `EACCES` for a caller neither owner nor root, `EINVAL` to start on what is
//!   not a regular file; start twice is 0, commit without start is an `fsync`, abort without
//!   start is 0;
//! - an atomic write is owned only by a handle the kernel sends `FLUSH` for, where it is
//!   aborted if its process dies: start through a handle opened with `O_EXCL`, `O_TRUNC` or
//!   `O_APPEND` (which get `FOPEN_NOFLUSH`, `TallyFuse::file_open_flags`) is `EOPNOTSUPP`, and
//!   SQLite, given an error at start, commits with its journal;
//! - commit is `Fs::commit_durable` (one flush), so the `fsync` SQLite sends after it finds
//!   the file durable and costs no flush.

use fuser::{Errno, FileHandle};
use tally_fs::FileKind;

use super::{Caller, TallyFuse};
use crate::errno::{errno, Failure};
use crate::requests::Opcode;
use crate::txns::End;

/// F2FS's ioctl type byte.
const MAGIC: u32 = 0xf5;

/// `_IO(MAGIC, nr)`.
const fn io(nr: u32) -> u32 {
    (MAGIC << 8) | nr
}

/// `F2FS_IOC_START_ATOMIC_WRITE`, `_IO(0xf5, 1)`.
pub(crate) const START_ATOMIC_WRITE: u32 = io(1);
/// `F2FS_IOC_COMMIT_ATOMIC_WRITE`, `_IO(0xf5, 2)`.
pub(crate) const COMMIT_ATOMIC_WRITE: u32 = io(2);
/// `F2FS_IOC_ABORT_VOLATILE_WRITE` (`F2FS_IOC_ABORT_ATOMIC_WRITE` in newer headers),
/// `_IO(0xf5, 5)`.
pub(crate) const ABORT_ATOMIC_WRITE: u32 = io(5);
/// `F2FS_IOC_GET_FEATURES`, `_IOR(0xf5, 12, u32)`: direction read (2) in bits 30–31, size 4
/// in bits 16–29.
pub(crate) const GET_FEATURES: u32 = (2 << 30) | (4 << 16) | io(12);
/// `F2FS_FEATURE_ATOMIC_WRITE`: the only feature bit the mount reports.
pub(crate) const FEATURE_ATOMIC_WRITE: u32 = 0x4;

/// The request counter for `cmd` if it is one of F2FS's ioctls this module answers.
pub(crate) fn f2fs_opcode(cmd: u32) -> Option<Opcode> {
    match cmd {
        GET_FEATURES => Some(Opcode::F2fsGetFeatures),
        START_ATOMIC_WRITE => Some(Opcode::F2fsStartAtomicWrite),
        COMMIT_ATOMIC_WRITE => Some(Opcode::F2fsCommitAtomicWrite),
        ABORT_ATOMIC_WRITE => Some(Opcode::F2fsAbortAtomicWrite),
        _ => None,
    }
}

impl TallyFuse {
    /// One of F2FS's atomic-write ioctls on `ino` through handle `fh`; its reply data.
    pub(super) fn f2fs_ioctl(
        &self,
        who: Caller,
        ino: u64,
        fh: FileHandle,
        cmd: u32,
        out_size: u32,
    ) -> Result<Vec<u8>, Errno> {
        if !self.atomic_writes {
            return Err(Errno::from_i32(libc::ENOTTY));
        }
        if cmd == GET_FEATURES {
            if out_size < 4 {
                return Err(errno(&Failure::Fs(tally_fs::FsError::Invalid("ioctl buffer"))));
            }
            return Ok(FEATURE_ATOMIC_WRITE.to_ne_bytes().to_vec());
        }
        if !Self::writable(fh) {
            return Err(errno(&Failure::NotWritable));
        }
        let attr = self.call("getattr", |fs| Ok(fs.getattr(ino)?))?;
        if who.uid != 0 && who.uid != attr.uid {
            return Err(errno(&Failure::NotOwner));
        }
        match cmd {
            START_ATOMIC_WRITE if !Self::flushed(fh) => {
                // No FLUSH at this handle's close: a dying owner could not be aborted before
                // the kernel drops its POSIX locks and a reader takes them.
                return Err(Errno::from_i32(libc::EOPNOTSUPP));
            }
            START_ATOMIC_WRITE => {
                if attr.kind != FileKind::File {
                    let why = "atomic write on what is not a regular file";
                    return Err(errno(&Failure::Fs(tally_fs::FsError::Invalid(why))));
                }
                self.call("start_atomic_write", |fs| {
                    self.txns.begin_atomic(fs, fh.0, ino, who.pid)
                })?;
            }
            COMMIT_ATOMIC_WRITE if self.txns.owns_atomic(fh.0) => {
                self.call("commit_atomic_write", |fs| self.txns.end(fs, fh.0, End::CommitDurable))?;
            }
            // No atomic write on this handle: F2FS syncs the file.
            COMMIT_ATOMIC_WRITE => self.call("fsync", |fs| Ok(fs.fsync(ino)?))?,
            ABORT_ATOMIC_WRITE if self.txns.owns_atomic(fh.0) => {
                self.call("abort_atomic_write", |fs| self.txns.end(fs, fh.0, End::Abort))?;
            }
            // Nothing to abort: 0, as on F2FS.
            _ => {}
        }
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_linuxs_encoding() {
        // As <linux/f2fs.h> (and SQLite's os_unix.c) define them on x86 and Arm.
        assert_eq!(START_ATOMIC_WRITE, 0xf501);
        assert_eq!(COMMIT_ATOMIC_WRITE, 0xf502);
        assert_eq!(ABORT_ATOMIC_WRITE, 0xf505);
        assert_eq!(GET_FEATURES, 0x8004_f50c);
        // None collides with Tally's own.
        for cmd in tally_client::ioctl::ALL {
            assert!(f2fs_opcode(cmd).is_none());
        }
    }
}

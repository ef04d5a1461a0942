//! Conversions between the file system's types and the kernel's: attributes, kinds, times.
//! Pure functions, no I/O; nothing here can fail on a value the kernel sends.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileType, INodeNo, TimeOrNow};
use tally_fs::{Attr, FileKind, SetTime, Timespec};

/// Bytes in one unit of `st_blocks`.
const STAT_BLOCK_BYTES: u64 = 512;

/// The kernel's file type for a kind.
pub(crate) fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDev => FileType::CharDevice,
        FileKind::BlockDev => FileType::BlockDevice,
    }
}

/// The kind a `mknod` mode asks for (`S_IFMT` bits); `None` for a directory, a symlink or
/// garbage, which `mknod` does not make.
pub(crate) fn mknod_kind(mode: u32) -> Option<FileKind> {
    match mode & libc::S_IFMT {
        libc::S_IFREG | 0 => Some(FileKind::File),
        libc::S_IFIFO => Some(FileKind::Fifo),
        libc::S_IFSOCK => Some(FileKind::Socket),
        libc::S_IFCHR => Some(FileKind::CharDev),
        libc::S_IFBLK => Some(FileKind::BlockDev),
        _ => None,
    }
}

/// Permission bits of a mode (the kernel has already applied the umask: the adapter does not
/// ask for `FUSE_DONT_MASK`).
pub(crate) fn perm(mode: u32) -> u16 {
    (mode & 0o7777) as u16
}

/// A file-system time as the kernel's `SystemTime` (times before 1970 included).
pub(crate) fn system_time(t: Timespec) -> SystemTime {
    let nsec = Duration::from_nanos(u64::from(t.nsec.min(999_999_999)));
    let at = if t.sec >= 0 {
        UNIX_EPOCH.checked_add(Duration::from_secs(t.sec.unsigned_abs()))
    } else {
        UNIX_EPOCH.checked_sub(Duration::from_secs(t.sec.unsigned_abs()))
    };
    at.and_then(|at| at.checked_add(nsec)).unwrap_or(UNIX_EPOCH)
}

/// A kernel time as the file system's: whole seconds rounded down, so nanoseconds stay
/// below one second (as in `struct timespec`).
pub(crate) fn timespec(t: SystemTime) -> Timespec {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => {
            Timespec { sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX), nsec: d.subsec_nanos() }
        }
        Err(before) => {
            let d = before.duration();
            let sec = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
            match d.subsec_nanos() {
                0 => Timespec { sec: -sec, nsec: 0 },
                n => Timespec { sec: -sec - 1, nsec: 1_000_000_000 - n },
            }
        }
    }
}

/// A time to set, from `setattr` (`UTIME_NOW` arrives as [`TimeOrNow::Now`]; `UTIME_OMIT`
/// as no time at all).
pub(crate) fn set_time(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(at) => SetTime::At(timespec(at)),
    }
}

/// The kernel's attributes for an inode. `allocated` is the number of file-system blocks the
/// inode holds (for `st_blocks`, in 512-byte units); `block_size` is `st_blksize`.
pub(crate) fn file_attr(a: &Attr, allocated: u64, block_size: u32) -> FileAttr {
    let units_per_block = u64::from(block_size) / STAT_BLOCK_BYTES;
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: allocated.saturating_mul(units_per_block),
        atime: system_time(a.atime),
        mtime: system_time(a.mtime),
        ctime: system_time(a.ctime),
        crtime: system_time(a.crtime),
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        // The kernel's device numbers are 32 bits (new_encode_dev); mknod stored what it sent.
        rdev: u32::try_from(a.rdev).unwrap_or(u32::MAX),
        blksize: block_size,
        flags: 0,
    }
}

/// The attributes of a negative entry (inode 0): none, the kernel reads only the inode number.
pub(crate) fn absent_attr() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_both_sides_of_the_epoch() {
        for t in [
            Timespec { sec: 0, nsec: 0 },
            Timespec { sec: 1_700_000_000, nsec: 123_456_789 },
            Timespec { sec: -1, nsec: 500_000_000 },
            Timespec { sec: -86_400, nsec: 0 },
        ] {
            assert_eq!(timespec(system_time(t)), t, "{t:?}");
        }
    }

    #[test]
    fn mknod_kinds() {
        assert_eq!(mknod_kind(libc::S_IFIFO | 0o644), Some(FileKind::Fifo));
        assert_eq!(mknod_kind(libc::S_IFCHR), Some(FileKind::CharDev));
        assert_eq!(mknod_kind(libc::S_IFREG | 0o600), Some(FileKind::File));
        assert_eq!(mknod_kind(libc::S_IFDIR | 0o755), None);
        assert_eq!(mknod_kind(libc::S_IFLNK), None);
        assert_eq!(perm(libc::S_IFREG | 0o4755), 0o4755);
    }

    #[test]
    fn st_blocks_counts_512_byte_units() {
        let now = Timespec { sec: 1, nsec: 0 };
        let a = Attr {
            ino: 7,
            kind: FileKind::File,
            perm: 0o644,
            uid: 1,
            gid: 2,
            nlink: 1,
            size: 10_000,
            rdev: 0,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
        };
        let f = file_attr(&a, 3, 4096);
        assert_eq!(f.blocks, 24);
        assert_eq!(f.blksize, 4096);
        assert_eq!(f.ino, INodeNo(7));
        assert_eq!(f.kind, FileType::RegularFile);
    }
}

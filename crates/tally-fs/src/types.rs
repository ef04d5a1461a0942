//! The objects the file system hands out: attributes, directory entries, statistics.

use std::time::{SystemTime, UNIX_EPOCH};

/// An inode number. [`ROOT`] is the root directory; numbers are never reused while any record
/// of the old inode remains in the log.
pub type Ino = u64;

/// The root directory.
pub const ROOT: Ino = 1;
/// Longest name, in bytes.
pub const NAME_MAX: usize = 255;
/// Longest symlink target, in bytes.
pub const SYMLINK_MAX: usize = 4095;
/// Largest file size: 16 TiB.
pub const FILE_SIZE_MAX: u64 = 1 << 44;
/// Most hard links to one inode.
pub const LINK_MAX: u32 = 65_000;
/// Longest extended attribute name and value.
pub const XATTR_NAME_MAX: usize = 255;
/// Longest extended attribute value.
pub const XATTR_VALUE_MAX: usize = 3072;

/// What an inode is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum FileKind {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link.
    Symlink,
    /// Named pipe.
    Fifo,
    /// Unix socket.
    Socket,
    /// Character device node.
    CharDev,
    /// Block device node.
    BlockDev,
}

impl FileKind {
    /// On-media code (docs/FORMAT.md).
    #[must_use]
    pub fn code(self) -> u8 {
        match self {
            FileKind::File => 1,
            FileKind::Dir => 2,
            FileKind::Symlink => 3,
            FileKind::Fifo => 4,
            FileKind::Socket => 5,
            FileKind::CharDev => 6,
            FileKind::BlockDev => 7,
        }
    }

    /// Decode an on-media code.
    #[must_use]
    pub fn from_code(code: u8) -> Option<FileKind> {
        Some(match code {
            1 => FileKind::File,
            2 => FileKind::Dir,
            3 => FileKind::Symlink,
            4 => FileKind::Fifo,
            5 => FileKind::Socket,
            6 => FileKind::CharDev,
            7 => FileKind::BlockDev,
            _ => return None,
        })
    }
}

/// A point in time, seconds and nanoseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize)]
pub struct Timespec {
    /// Seconds.
    pub sec: i64,
    /// Nanoseconds, below 1e9.
    pub nsec: u32,
}

impl Timespec {
    /// The current time.
    #[must_use]
    pub fn now() -> Timespec {
        match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(d) => Timespec { sec: d.as_secs() as i64, nsec: d.subsec_nanos() },
            Err(e) => {
                let d = e.duration();
                Timespec { sec: -(d.as_secs() as i64), nsec: 0 }
            }
        }
    }
}

/// An inode's attributes, as `stat` shows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Attr {
    /// Inode number.
    pub ino: Ino,
    /// Kind.
    pub kind: FileKind,
    /// Permission bits and set-id/sticky bits (`0o7777`).
    pub perm: u16,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Hard links (directories: 2 + subdirectories).
    pub nlink: u32,
    /// Size in bytes (symlinks: target length).
    pub size: u64,
    /// Device number of a device node.
    pub rdev: u64,
    /// Last access.
    pub atime: Timespec,
    /// Last data change.
    pub mtime: Timespec,
    /// Last attribute change.
    pub ctime: Timespec,
    /// Creation.
    pub crtime: Timespec,
}

impl Attr {
    /// Number of 512-byte units of data held, for `st_blocks` (filled by the file system).
    #[must_use]
    pub fn is_dir(&self) -> bool {
        self.kind == FileKind::Dir
    }
}

/// Who creates an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Owner {
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

/// A time to set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetTime {
    /// The time of the call.
    Now,
    /// This time.
    At(Timespec),
}

/// Changes for [`crate::Fs::setattr`]; `None` leaves a field alone. `ctime` follows the rules
/// of POSIX: every change sets it to now, unless `ctime` is given explicitly.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// New permission bits.
    pub perm: Option<u16>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size (truncate or extend with zeros).
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<SetTime>,
    /// New modification time.
    pub mtime: Option<SetTime>,
    /// New change time (FUSE passes it when the kernel sets it).
    pub ctime: Option<Timespec>,
}

/// One entry of [`crate::Fs::readdir`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// Name.
    pub name: Vec<u8>,
    /// Inode it names.
    pub ino: Ino,
    /// Kind of that inode.
    pub kind: FileKind,
    /// Pass this offset to the next `readdir` call to continue after this entry. Stable across
    /// other entries being added or removed, and across remounts.
    pub offset: u64,
}

/// `statfs` figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct StatFs {
    /// Block size.
    pub block_size: u32,
    /// Blocks the log can hold, less what is kept back for good (the streams' next segments,
    /// the reserve segments, the cleaning headroom), as ext4 leaves its journal out.
    pub blocks: u64,
    /// Blocks free for new data (space kept for cleaning and deletes is not counted).
    pub blocks_free: u64,
    /// Inodes in use.
    pub files: u64,
    /// Inodes that could still be created (bounded by free space: one record each).
    pub files_free: u64,
    /// Longest name.
    pub name_max: u32,
}

/// Flags of [`crate::Fs::rename`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RenameFlags {
    /// Fail with `EEXIST` if the target exists (`RENAME_NOREPLACE`).
    pub noreplace: bool,
    /// Swap source and target, which must both exist (`RENAME_EXCHANGE`).
    pub exchange: bool,
}

/// Flags of [`crate::Fs::setxattr`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum XattrSet {
    /// Create or replace.
    #[default]
    Any,
    /// Fail with `EEXIST` if it exists (`XATTR_CREATE`).
    Create,
    /// Fail with `ENODATA` if it does not exist (`XATTR_REPLACE`).
    Replace,
}

/// Flags of [`crate::Fs::fallocate`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FallocFlags {
    /// Do not change the size (`FALLOC_FL_KEEP_SIZE`).
    pub keep_size: bool,
    /// Deallocate the range; reads return zeros (`FALLOC_FL_PUNCH_HOLE`, needs `keep_size`).
    pub punch_hole: bool,
    /// Make the range read as zeros and reserve it (`FALLOC_FL_ZERO_RANGE`).
    pub zero_range: bool,
}

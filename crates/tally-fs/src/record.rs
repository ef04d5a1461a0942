//! The file system's records: the only persistent state it has. Each is one opaque record of a
//! log transaction (docs/FORMAT.md, "File-system records"). All integers are little-endian.
//!
//! Every record carries `ver`, a file-system-wide version taken from one clock. Replay applies
//! the surviving records in version order, so a record relocated by cleaning (written later in
//! the log, same version) never overrides a newer one.
//!
//! Decoding never panics: every length is checked and a bad record is an error.

use tally_log::format::codec::{Appender, Cursor, Truncated};

use crate::types::{Attr, FileKind, Ino, Timespec};
use crate::{FsError, Result};

/// Record tags.
pub const TAG_FS: u8 = 1;
/// Inode attributes.
pub const TAG_INODE: u8 = 2;
/// Inode freed.
pub const TAG_FREE: u8 = 3;
/// Directory entry.
pub const TAG_DENTRY: u8 = 4;
/// One block of file data.
pub const TAG_EXTENT: u8 = 5;
/// Extended attribute.
pub const TAG_XATTR: u8 = 6;

/// Magic of the file-system record.
pub const FS_MAGIC: [u8; 8] = *b"TALLYFS1";
/// Format version of the records.
pub const FS_VERSION: u32 = 1;
/// `Extent::data` of a hole (a block deallocated by truncate or punch).
pub const DATA_HOLE: u32 = u32::MAX;

/// A decoded record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// Marks the log as holding a Tally file system; written by mkfs.
    Fs {
        /// Version.
        ver: u64,
        /// Block size the file system was made with.
        block_size: u32,
    },
    /// An inode's attributes (and a symlink's target).
    Inode {
        /// Version.
        ver: u64,
        /// The attributes.
        attr: Attr,
        /// Symlink target; empty otherwise.
        target: Vec<u8>,
    },
    /// The inode and everything of it with a lower version are gone.
    Free {
        /// Version.
        ver: u64,
        /// The inode.
        ino: Ino,
    },
    /// `name` in `dir` names `ino` (or, with `ino == 0`, nothing any more).
    Dentry {
        /// Version.
        ver: u64,
        /// The directory.
        dir: Ino,
        /// The name.
        name: Vec<u8>,
        /// The inode named, 0 if removed.
        ino: Ino,
        /// Kind of the inode named.
        kind: FileKind,
        /// Stable readdir offset of the entry.
        cookie: u64,
    },
    /// Block `block` of file `ino` is data block `data` of this record's transaction
    /// ([`DATA_HOLE`]: a hole), whose crc32c is `crc`.
    Extent {
        /// Version.
        ver: u64,
        /// The file.
        ino: Ino,
        /// File block index.
        block: u64,
        /// Index of the data block in the transaction.
        data: u32,
        /// crc32c of the block's bytes.
        crc: u32,
    },
    /// An extended attribute of `ino`: set to `value`, or removed when `value` is `None`.
    Xattr {
        /// Version.
        ver: u64,
        /// The inode.
        ino: Ino,
        /// Name.
        name: Vec<u8>,
        /// Value, or `None` when removed.
        value: Option<Vec<u8>>,
    },
}

impl Record {
    /// Its version.
    #[must_use]
    pub fn ver(&self) -> u64 {
        match self {
            Record::Fs { ver, .. }
            | Record::Inode { ver, .. }
            | Record::Free { ver, .. }
            | Record::Dentry { ver, .. }
            | Record::Extent { ver, .. }
            | Record::Xattr { ver, .. } => *ver,
        }
    }

    /// Encode.
    ///
    /// # Panics
    /// If a name, target or value is longer than its length field allows: the file system
    /// refuses those before it writes a record (a bug otherwise).
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut a = Appender::with_capacity(96);
        match self {
            Record::Fs { ver, block_size } => {
                a.u8(TAG_FS);
                a.u64(*ver);
                a.put(&FS_MAGIC);
                a.u32(FS_VERSION);
                a.u32(*block_size);
            }
            Record::Inode { ver, attr, target } => {
                a.u8(TAG_INODE);
                a.u64(*ver);
                a.u64(attr.ino);
                a.u8(attr.kind.code());
                a.u16(attr.perm);
                a.u32(attr.uid);
                a.u32(attr.gid);
                a.u32(attr.nlink);
                a.u64(attr.size);
                a.u64(attr.rdev);
                for t in [attr.atime, attr.mtime, attr.ctime, attr.crtime] {
                    a.put(&t.sec.to_le_bytes());
                    a.u32(t.nsec);
                }
                a.u16(len16(target));
                a.put(target);
            }
            Record::Free { ver, ino } => {
                a.u8(TAG_FREE);
                a.u64(*ver);
                a.u64(*ino);
            }
            Record::Dentry { ver, dir, name, ino, kind, cookie } => {
                a.u8(TAG_DENTRY);
                a.u64(*ver);
                a.u64(*dir);
                a.u64(*ino);
                a.u8(kind.code());
                a.u64(*cookie);
                a.bytes_len8(name);
            }
            Record::Extent { ver, ino, block, data, crc } => {
                a.u8(TAG_EXTENT);
                a.u64(*ver);
                a.u64(*ino);
                a.u64(*block);
                a.u32(*data);
                a.u32(*crc);
            }
            Record::Xattr { ver, ino, name, value } => {
                a.u8(TAG_XATTR);
                a.u64(*ver);
                a.u64(*ino);
                a.u8(u8::from(value.is_some()));
                let v = value.as_deref().unwrap_or(&[]);
                let Ok(name_len) = u8::try_from(name.len()) else {
                    panic!("extended attribute name of {} bytes", name.len());
                };
                a.u8(name_len);
                a.u16(len16(v));
                a.put(name);
                a.put(v);
            }
        }
        a.into_vec()
    }

    /// Decode one record.
    ///
    /// # Errors
    /// [`FsError::Corrupted`] for anything the format does not allow.
    pub fn decode(bytes: &[u8]) -> Result<Record> {
        let mut c = Cursor::new(bytes);
        let tag = c.u8()?;
        let ver = c.u64()?;
        let rec = match tag {
            TAG_FS => {
                if c.take(8)? != FS_MAGIC {
                    return Err(bad("file-system record without the magic"));
                }
                let version = c.u32()?;
                if version != FS_VERSION {
                    return Err(FsError::corrupted(
                        "record",
                        format!(
                            "file-system format version {version}, this build reads {FS_VERSION}"
                        ),
                    ));
                }
                Record::Fs { ver, block_size: c.u32()? }
            }
            TAG_INODE => {
                let ino = c.u64()?;
                let kind = kind(&mut c)?;
                let perm = c.u16()?;
                let uid = c.u32()?;
                let gid = c.u32()?;
                let nlink = c.u32()?;
                let size = c.u64()?;
                let rdev = c.u64()?;
                let mut times = [Timespec::default(); 4];
                for t in &mut times {
                    let sec = i64::from_le_bytes(c.array()?);
                    let nsec = c.u32()?;
                    if nsec >= 1_000_000_000 {
                        return Err(bad("nanoseconds out of range"));
                    }
                    *t = Timespec { sec, nsec };
                }
                let len = usize::from(c.u16()?);
                if len > crate::types::SYMLINK_MAX {
                    return Err(bad("symlink target too long"));
                }
                let target = c.take(len)?.to_vec();
                let [atime, mtime, ctime, crtime] = times;
                let attr = Attr {
                    ino,
                    kind,
                    perm: perm & 0o7777,
                    uid,
                    gid,
                    nlink,
                    size,
                    rdev,
                    atime,
                    mtime,
                    ctime,
                    crtime,
                };
                Record::Inode { ver, attr, target }
            }
            TAG_FREE => Record::Free { ver, ino: c.u64()? },
            TAG_DENTRY => {
                let dir = c.u64()?;
                let ino = c.u64()?;
                let kind = kind(&mut c)?;
                let cookie = c.u64()?;
                let name = c.bytes_len8()?.to_vec();
                if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
                    return Err(bad("directory entry with an illegal name"));
                }
                Record::Dentry { ver, dir, name, ino, kind, cookie }
            }
            TAG_EXTENT => Record::Extent {
                ver,
                ino: c.u64()?,
                block: c.u64()?,
                data: c.u32()?,
                crc: c.u32()?,
            },
            TAG_XATTR => {
                let ino = c.u64()?;
                let present = c.u8()?;
                let name_len = usize::from(c.u8()?);
                let value_len = usize::from(c.u16()?);
                let name = c.take(name_len)?.to_vec();
                let value = c.take(value_len)?.to_vec();
                let value = match present {
                    0 if value.is_empty() => None,
                    1 => Some(value),
                    _ => return Err(bad("extended attribute with a bad presence flag")),
                };
                Record::Xattr { ver, ino, name, value }
            }
            other => return Err(bad(&format!("unknown record tag {other}"))),
        };
        if !c.at_end() {
            return Err(bad("trailing bytes after a record"));
        }
        Ok(rec)
    }
}

fn bad(what: &str) -> FsError {
    FsError::corrupted("record", what)
}

/// The records' and the snapshot's decoders read through the shared codec: bytes that end
/// before a field, or a length or count that reaches past them, are corruption.
impl From<Truncated> for FsError {
    fn from(_: Truncated) -> Self {
        bad("a record or snapshot is shorter than its fields")
    }
}

/// A length that the file system bounds below 64 KiB before it encodes (a bug otherwise).
fn len16(b: &[u8]) -> u16 {
    let Ok(n) = u16::try_from(b.len()) else {
        panic!("{} bytes behind a u16 length", b.len());
    };
    n
}

/// A file kind code.
fn kind(c: &mut Cursor<'_>) -> Result<FileKind> {
    let code = c.u8()?;
    FileKind::from_code(code).ok_or_else(|| bad(&format!("bad file kind {code}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Record> {
        let t = Timespec { sec: 1_700_000_000, nsec: 5 };
        let attr = Attr {
            ino: 7,
            kind: FileKind::Symlink,
            perm: 0o777,
            uid: 1,
            gid: 2,
            nlink: 1,
            size: 3,
            rdev: 0,
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
        };
        vec![
            Record::Fs { ver: 1, block_size: 4096 },
            Record::Inode { ver: 2, attr, target: b"a/b".to_vec() },
            Record::Free { ver: 3, ino: 7 },
            Record::Dentry {
                ver: 4,
                dir: 1,
                name: vec![0xff; 255],
                ino: 7,
                kind: FileKind::File,
                cookie: 3,
            },
            Record::Extent { ver: 5, ino: 7, block: 1 << 30, data: 0, crc: 0xdead_beef },
            Record::Xattr { ver: 6, ino: 7, name: b"user.a".to_vec(), value: Some(vec![1; 9]) },
            Record::Xattr { ver: 7, ino: 7, name: b"user.a".to_vec(), value: None },
        ]
    }

    #[test]
    fn round_trip() {
        for r in samples() {
            assert_eq!(Record::decode(&r.encode()).unwrap(), r);
        }
    }

    #[test]
    fn every_truncation_and_extension_is_an_error() {
        for r in samples() {
            let bytes = r.encode();
            for n in 0..bytes.len() {
                assert!(Record::decode(&bytes[..n]).is_err(), "{r:?} cut at {n}");
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert!(Record::decode(&longer).is_err());
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut rng = fastrand::Rng::with_seed(3);
        for _ in 0..20_000 {
            let len = rng.usize(0..80);
            let mut bytes: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
            if let Some(b) = bytes.first_mut() {
                *b = rng.u8(0..8);
            }
            let _ = Record::decode(&bytes);
        }
    }
}

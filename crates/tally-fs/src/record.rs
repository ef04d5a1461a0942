//! The file system's records: the only persistent state it has. Each is one opaque record of a
//! log transaction (docs/FORMAT.md, "File-system records"). All integers are little-endian.
//!
//! Every record carries `ver`, a file-system-wide version taken from one clock. Replay applies
//! the surviving records in version order, so a record relocated by cleaning (written later in
//! the log, same version) never overrides a newer one.
//!
//! Decoding never panics: every length is checked and a bad record is an error.

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
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(96);
        match self {
            Record::Fs { ver, block_size } => {
                out.push(TAG_FS);
                out.extend_from_slice(&ver.to_le_bytes());
                out.extend_from_slice(&FS_MAGIC);
                out.extend_from_slice(&FS_VERSION.to_le_bytes());
                out.extend_from_slice(&block_size.to_le_bytes());
            }
            Record::Inode { ver, attr, target } => {
                out.push(TAG_INODE);
                out.extend_from_slice(&ver.to_le_bytes());
                out.extend_from_slice(&attr.ino.to_le_bytes());
                out.push(attr.kind.code());
                out.extend_from_slice(&attr.perm.to_le_bytes());
                out.extend_from_slice(&attr.uid.to_le_bytes());
                out.extend_from_slice(&attr.gid.to_le_bytes());
                out.extend_from_slice(&attr.nlink.to_le_bytes());
                out.extend_from_slice(&attr.size.to_le_bytes());
                out.extend_from_slice(&attr.rdev.to_le_bytes());
                for t in [attr.atime, attr.mtime, attr.ctime, attr.crtime] {
                    out.extend_from_slice(&t.sec.to_le_bytes());
                    out.extend_from_slice(&t.nsec.to_le_bytes());
                }
                out.extend_from_slice(&(target.len() as u16).to_le_bytes());
                out.extend_from_slice(target);
            }
            Record::Free { ver, ino } => {
                out.push(TAG_FREE);
                out.extend_from_slice(&ver.to_le_bytes());
                out.extend_from_slice(&ino.to_le_bytes());
            }
            Record::Dentry { ver, dir, name, ino, kind, cookie } => {
                out.push(TAG_DENTRY);
                out.extend_from_slice(&ver.to_le_bytes());
                out.extend_from_slice(&dir.to_le_bytes());
                out.extend_from_slice(&ino.to_le_bytes());
                out.push(kind.code());
                out.extend_from_slice(&cookie.to_le_bytes());
                out.push(name.len() as u8);
                out.extend_from_slice(name);
            }
            Record::Extent { ver, ino, block, data, crc } => {
                out.push(TAG_EXTENT);
                out.extend_from_slice(&ver.to_le_bytes());
                out.extend_from_slice(&ino.to_le_bytes());
                out.extend_from_slice(&block.to_le_bytes());
                out.extend_from_slice(&data.to_le_bytes());
                out.extend_from_slice(&crc.to_le_bytes());
            }
            Record::Xattr { ver, ino, name, value } => {
                out.push(TAG_XATTR);
                out.extend_from_slice(&ver.to_le_bytes());
                out.extend_from_slice(&ino.to_le_bytes());
                out.push(u8::from(value.is_some()));
                out.push(name.len() as u8);
                let v = value.as_deref().unwrap_or(&[]);
                out.extend_from_slice(&(v.len() as u16).to_le_bytes());
                out.extend_from_slice(name);
                out.extend_from_slice(v);
            }
        }
        out
    }

    /// Decode one record.
    ///
    /// # Errors
    /// [`FsError::Corrupted`] for anything the format does not allow.
    pub fn decode(bytes: &[u8]) -> Result<Record> {
        let mut c = Cursor { bytes, at: 0 };
        let tag = c.u8()?;
        let ver = c.u64()?;
        let rec = match tag {
            TAG_FS => {
                if c.take(8)? != FS_MAGIC {
                    return Err(bad("file-system record without the magic"));
                }
                let version = c.u32()?;
                if version != FS_VERSION {
                    return Err(FsError::Corrupted(format!(
                        "file-system format version {version}, this build reads {FS_VERSION}"
                    )));
                }
                Record::Fs { ver, block_size: c.u32()? }
            }
            TAG_INODE => {
                let ino = c.u64()?;
                let kind = c.kind()?;
                let perm = c.u16()?;
                let uid = c.u32()?;
                let gid = c.u32()?;
                let nlink = c.u32()?;
                let size = c.u64()?;
                let rdev = c.u64()?;
                let mut times = [Timespec::default(); 4];
                for t in &mut times {
                    let sec = c.u64()? as i64;
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
                let kind = c.kind()?;
                let cookie = c.u64()?;
                let len = usize::from(c.u8()?);
                let name = c.take(len)?.to_vec();
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
            other => return Err(FsError::Corrupted(format!("unknown record tag {other}"))),
        };
        if c.at != bytes.len() {
            return Err(bad("trailing bytes after a record"));
        }
        Ok(rec)
    }
}

fn bad(what: &str) -> FsError {
    FsError::Corrupted(what.to_string())
}

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| bad("record shorter than its fields"))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn kind(&mut self) -> Result<FileKind> {
        let code = self.u8()?;
        FileKind::from_code(code).ok_or_else(|| FsError::Corrupted(format!("bad file kind {code}")))
    }
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

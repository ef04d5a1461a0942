//! The kernel's FUSE messages as a ring entry carries them (`include/uapi/linux/fuse.h`):
//! decoding the requests the adapter serves, encoding its answers.
//!
//! A ring entry has two buffers. The header buffer is `struct fuse_uring_req_header`: 128
//! bytes `in_out` (the request's `fuse_in_header`; the answer's `fuse_out_header`), 128 bytes
//! `op_in` (the request's first argument, its fixed-size op struct, when it has one), and
//! `struct fuse_uring_ent_in_out` (the request's `commit_id` and both directions'
//! `payload_sz`). The payload buffer holds the request's other arguments back to back (names
//! with their NUL, write data) and, on the way back, every output argument (no header).
//!
//! Invariants:
//! - every byte from the kernel is checked before use: lengths against the buffer, names for
//!   their NUL, sizes against what follows; a request that does not hold together is a
//!   [`Malformed`] error (answered `EIO`), never a panic or an out-of-bounds read;
//! - `op_in` is read only for opcodes whose first argument is an op struct: the kernel leaves
//!   it untouched for the others (its first argument is empty, `fuse_set_zero_arg0`), so it
//!   may still hold an earlier request's bytes;
//! - multi-byte fields are the host's byte order (the kernel's own structs, not a format).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileHandle, FileType, TimeOrNow};

use crate::adapter::{DirEntryOut, Entry, SetattrIn, StatfsOut};

/// `sizeof(struct fuse_uring_req_header)`: `in_out[128]`, `op_in[128]`, `ring_ent_in_out`.
pub(crate) const HEADER_SIZE: usize = 288;
/// Where `op_in` starts in the header buffer.
const OP_IN_AT: usize = 128;
/// Where `struct fuse_uring_ent_in_out` starts: `flags` u64, `commit_id` u64, `payload_sz`
/// u32, padding u32, reserved u64.
const ENT_IN_OUT_AT: usize = 256;
/// `sizeof(struct fuse_in_header)`.
const IN_HEADER_SIZE: usize = 40;
/// `sizeof(struct fuse_out_header)`: `len` u32, `error` i32, `unique` u64.
pub(crate) const OUT_HEADER_SIZE: usize = 16;
/// `sizeof(struct fuse_entry_out)`: nodeid, generation, entry_valid, attr_valid (u64),
/// entry_valid_nsec, attr_valid_nsec (u32), `struct fuse_attr` (88).
const ENTRY_OUT_SIZE: usize = 128;
/// `sizeof(struct fuse_dirent)` without its name.
const DIRENT_SIZE: usize = 24;

const _: () = assert!(OP_IN_AT + 128 == ENT_IN_OUT_AT && ENT_IN_OUT_AT + 32 == HEADER_SIZE);

// Opcodes (`enum fuse_opcode`).
const LOOKUP: u32 = 1;
const GETATTR: u32 = 3;
const SETATTR: u32 = 4;
const READLINK: u32 = 5;
const SYMLINK: u32 = 6;
const MKNOD: u32 = 8;
const MKDIR: u32 = 9;
const UNLINK: u32 = 10;
const RMDIR: u32 = 11;
const RENAME: u32 = 12;
const LINK: u32 = 13;
const OPEN: u32 = 14;
const READ: u32 = 15;
const WRITE: u32 = 16;
const STATFS: u32 = 17;
const RELEASE: u32 = 18;
const FSYNC: u32 = 20;
const SETXATTR: u32 = 21;
const GETXATTR: u32 = 22;
const LISTXATTR: u32 = 23;
const REMOVEXATTR: u32 = 24;
const FLUSH: u32 = 25;
const OPENDIR: u32 = 27;
const READDIR: u32 = 28;
const RELEASEDIR: u32 = 29;
const FSYNCDIR: u32 = 30;
const ACCESS: u32 = 34;
const CREATE: u32 = 35;
const DESTROY: u32 = 38;
const IOCTL: u32 = 39;
const POLL: u32 = 40;
const FALLOCATE: u32 = 43;
const READDIRPLUS: u32 = 44;
const RENAME2: u32 = 45;
const LSEEK: u32 = 46;
const COPY_FILE_RANGE: u32 = 47;
const SYNCFS: u32 = 50;

// `fuse_setattr_in.valid` bits.
const FATTR_MODE: u32 = 1 << 0;
const FATTR_UID: u32 = 1 << 1;
const FATTR_GID: u32 = 1 << 2;
const FATTR_SIZE: u32 = 1 << 3;
const FATTR_ATIME: u32 = 1 << 4;
const FATTR_MTIME: u32 = 1 << 5;
const FATTR_FH: u32 = 1 << 6;
const FATTR_ATIME_NOW: u32 = 1 << 7;
const FATTR_MTIME_NOW: u32 = 1 << 8;
const FATTR_CTIME: u32 = 1 << 10;

/// `FUSE_FSYNC_FDATASYNC`.
const FSYNC_FDATASYNC: u32 = 1;
/// `FUSE_WRITE_KILL_SUIDGID`.
const WRITE_KILL_SUIDGID: u32 = 1 << 2;

/// A request that does not hold together: what was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Malformed(pub &'static str);

/// `struct fuse_in_header`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InHeader {
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// A decoded request; names and data borrow the entry's payload buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Request<'a> {
    Lookup {
        name: &'a [u8],
    },
    Getattr,
    Setattr(SetattrIn),
    Readlink,
    Symlink {
        name: &'a [u8],
        target: &'a [u8],
    },
    Mknod {
        mode: u32,
        rdev: u32,
        name: &'a [u8],
    },
    Mkdir {
        mode: u32,
        name: &'a [u8],
    },
    Unlink {
        name: &'a [u8],
    },
    Rmdir {
        name: &'a [u8],
    },
    /// `RENAME` and `RENAME2` (`flags` 0 for the first).
    Rename {
        newdir: u64,
        flags: u32,
        name: &'a [u8],
        newname: &'a [u8],
    },
    Link {
        ino: u64,
        newname: &'a [u8],
    },
    Open {
        flags: u32,
    },
    Read {
        offset: u64,
        size: u32,
    },
    Write {
        fh: FileHandle,
        offset: u64,
        data: &'a [u8],
        kill_suidgid: bool,
    },
    Statfs,
    Release {
        fh: FileHandle,
    },
    Fsync {
        datasync: bool,
    },
    Setxattr {
        flags: u32,
        name: &'a [u8],
        value: &'a [u8],
    },
    Getxattr {
        size: u32,
        name: &'a [u8],
    },
    Listxattr {
        size: u32,
    },
    Removexattr {
        name: &'a [u8],
    },
    Flush {
        fh: FileHandle,
    },
    Opendir,
    Readdir {
        offset: u64,
        size: u32,
    },
    Releasedir {
        fh: FileHandle,
    },
    Fsyncdir,
    Access,
    Create {
        flags: u32,
        mode: u32,
        name: &'a [u8],
    },
    Destroy,
    Ioctl {
        fh: FileHandle,
        cmd: u32,
        out_size: u32,
    },
    Poll {
        events: u32,
    },
    Fallocate {
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: u32,
    },
    Readdirplus {
        offset: u64,
        size: u32,
    },
    Lseek,
    CopyFileRange {
        offset_in: u64,
        ino_out: u64,
        offset_out: u64,
        len: u64,
        flags: u64,
    },
    /// `struct fuse_syncfs_in` carries only padding.
    Syncfs,
    /// An opcode the adapter does not serve (answered `ENOSYS`).
    Other,
}

/// Little reader over kernel bytes: every read checks the length.
struct Bytes<'a> {
    buf: &'a [u8],
}

impl<'a> Bytes<'a> {
    fn array<const N: usize>(&self, at: usize) -> Result<[u8; N], Malformed> {
        let end = at.checked_add(N).ok_or(Malformed("offset overflow"))?;
        let s = self.buf.get(at..end).ok_or(Malformed("request shorter than its struct"))?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    fn u16(&self, at: usize) -> Result<u16, Malformed> {
        self.array(at).map(u16::from_ne_bytes)
    }
    fn u32(&self, at: usize) -> Result<u32, Malformed> {
        self.array(at).map(u32::from_ne_bytes)
    }
    fn u64(&self, at: usize) -> Result<u64, Malformed> {
        self.array(at).map(u64::from_ne_bytes)
    }
    /// A NUL-terminated string from the start, and what follows it.
    fn cstr(self) -> Result<(&'a [u8], Bytes<'a>), Malformed> {
        let nul = self.buf.iter().position(|&b| b == 0).ok_or(Malformed("name without NUL"))?;
        let (name, rest) = self.buf.split_at(nul);
        Ok((name, Bytes { buf: rest.get(1..).unwrap_or(&[]) }))
    }
}

/// The request's `commit_id` and payload size, from `fuse_uring_ent_in_out`.
pub(crate) fn ent_in(header: &[u8; HEADER_SIZE]) -> Result<(u64, u32), Malformed> {
    let b = Bytes { buf: header };
    Ok((b.u64(ENT_IN_OUT_AT + 8)?, b.u32(ENT_IN_OUT_AT + 16)?))
}

/// Decode the request in a ring entry: its header and, for the opcodes the adapter serves,
/// its arguments (`payload` is the payload buffer cut to the kernel's `payload_sz`).
pub(crate) fn decode<'a>(
    header: &[u8; HEADER_SIZE],
    payload: &'a [u8],
) -> Result<(InHeader, Request<'a>), Malformed> {
    let h = Bytes { buf: &header[..IN_HEADER_SIZE] };
    let in_header = InHeader {
        opcode: h.u32(4)?,
        unique: h.u64(8)?,
        nodeid: h.u64(16)?,
        uid: h.u32(24)?,
        gid: h.u32(28)?,
        pid: h.u32(32)?,
    };
    // Extensions (security context, supplementary groups) follow the arguments when asked
    // for at INIT; the adapter asks for none, so `total_extlen` (in 8-byte units) is 0.
    let _ext_units = h.u16(36)?;
    let op = Bytes { buf: &header[OP_IN_AT..ENT_IN_OUT_AT] };
    let p = Bytes { buf: payload };
    let fh = |at| op.u64(at).map(FileHandle);
    let r = match in_header.opcode {
        LOOKUP => Request::Lookup { name: p.cstr()?.0 },
        GETATTR => Request::Getattr,
        SETATTR => Request::Setattr(setattr_in(&op)?),
        READLINK => Request::Readlink,
        SYMLINK => {
            let (name, rest) = p.cstr()?;
            Request::Symlink { name, target: rest.cstr()?.0 }
        }
        MKNOD => Request::Mknod { mode: op.u32(0)?, rdev: op.u32(4)?, name: p.cstr()?.0 },
        MKDIR => Request::Mkdir { mode: op.u32(0)?, name: p.cstr()?.0 },
        UNLINK => Request::Unlink { name: p.cstr()?.0 },
        RMDIR => Request::Rmdir { name: p.cstr()?.0 },
        RENAME | RENAME2 => {
            let flags = if in_header.opcode == RENAME2 { op.u32(8)? } else { 0 };
            let (name, rest) = p.cstr()?;
            Request::Rename { newdir: op.u64(0)?, flags, name, newname: rest.cstr()?.0 }
        }
        LINK => Request::Link { ino: op.u64(0)?, newname: p.cstr()?.0 },
        OPEN => Request::Open { flags: op.u32(0)? },
        READ => Request::Read { offset: op.u64(8)?, size: op.u32(16)? },
        WRITE => {
            let size = usize::try_from(op.u32(16)?).map_err(|_| Malformed("write size"))?;
            let data = payload.get(..size).ok_or(Malformed("write data shorter than its size"))?;
            let kill_suidgid = op.u32(20)? & WRITE_KILL_SUIDGID != 0;
            Request::Write { fh: fh(0)?, offset: op.u64(8)?, data, kill_suidgid }
        }
        STATFS => Request::Statfs,
        RELEASE => Request::Release { fh: fh(0)? },
        FSYNC => Request::Fsync { datasync: op.u32(8)? & FSYNC_FDATASYNC != 0 },
        SETXATTR => {
            // `fuse_setxattr_in` without FUSE_SETXATTR_EXT (not asked for): size, flags.
            let size = usize::try_from(op.u32(0)?).map_err(|_| Malformed("xattr size"))?;
            let (name, rest) = p.cstr()?;
            let value =
                rest.buf.get(..size).ok_or(Malformed("xattr value shorter than its size"))?;
            Request::Setxattr { flags: op.u32(4)?, name, value }
        }
        GETXATTR => Request::Getxattr { size: op.u32(0)?, name: p.cstr()?.0 },
        LISTXATTR => Request::Listxattr { size: op.u32(0)? },
        REMOVEXATTR => Request::Removexattr { name: p.cstr()?.0 },
        FLUSH => Request::Flush { fh: fh(0)? },
        OPENDIR => Request::Opendir,
        READDIR => Request::Readdir { offset: op.u64(8)?, size: op.u32(16)? },
        READDIRPLUS => Request::Readdirplus { offset: op.u64(8)?, size: op.u32(16)? },
        RELEASEDIR => Request::Releasedir { fh: fh(0)? },
        FSYNCDIR => Request::Fsyncdir,
        ACCESS => Request::Access,
        CREATE => Request::Create { flags: op.u32(0)?, mode: op.u32(4)?, name: p.cstr()?.0 },
        DESTROY => Request::Destroy,
        IOCTL => Request::Ioctl { fh: fh(0)?, cmd: op.u32(12)?, out_size: op.u32(28)? },
        POLL => Request::Poll { events: op.u32(20)? },
        FALLOCATE => Request::Fallocate {
            fh: fh(0)?,
            offset: op.u64(8)?,
            length: op.u64(16)?,
            mode: op.u32(24)?,
        },
        LSEEK => Request::Lseek,
        COPY_FILE_RANGE => Request::CopyFileRange {
            offset_in: op.u64(8)?,
            ino_out: op.u64(16)?,
            offset_out: op.u64(32)?,
            len: op.u64(40)?,
            flags: op.u64(48)?,
        },
        SYNCFS => Request::Syncfs,
        _ => Request::Other,
    };
    Ok((in_header, r))
}

/// `struct fuse_setattr_in`: valid, padding, fh, size, lock_owner, atime, mtime, ctime (u64),
/// atimensec, mtimensec, ctimensec, mode, unused, uid, gid, unused (u32).
fn setattr_in(op: &Bytes<'_>) -> Result<SetattrIn, Malformed> {
    let valid = op.u32(0)?;
    let has = |bit| valid & bit != 0;
    let time = |sec_at, nsec_at| -> Result<SystemTime, Malformed> {
        Ok(system_time(op.u64(sec_at)?.cast_signed(), op.u32(nsec_at)?))
    };
    let set_time = |bit, now_bit, sec_at, nsec_at| -> Result<Option<TimeOrNow>, Malformed> {
        Ok(match (has(bit), has(now_bit)) {
            (false, _) => None,
            (true, true) => Some(TimeOrNow::Now),
            (true, false) => Some(TimeOrNow::SpecificTime(time(sec_at, nsec_at)?)),
        })
    };
    Ok(SetattrIn {
        mode: has(FATTR_MODE).then(|| op.u32(68)).transpose()?,
        uid: has(FATTR_UID).then(|| op.u32(76)).transpose()?,
        gid: has(FATTR_GID).then(|| op.u32(80)).transpose()?,
        size: has(FATTR_SIZE).then(|| op.u64(16)).transpose()?,
        atime: set_time(FATTR_ATIME, FATTR_ATIME_NOW, 32, 56)?,
        mtime: set_time(FATTR_MTIME, FATTR_MTIME_NOW, 40, 60)?,
        ctime: has(FATTR_CTIME).then(|| time(48, 64)).transpose()?,
        fh: has(FATTR_FH).then(|| op.u64(8).map(FileHandle)).transpose()?,
    })
}

/// A kernel time (seconds may be negative) as a `SystemTime`.
fn system_time(sec: i64, nsec: u32) -> SystemTime {
    let nsec = Duration::from_nanos(u64::from(nsec.min(999_999_999)));
    let at = if sec >= 0 {
        UNIX_EPOCH.checked_add(Duration::from_secs(sec.unsigned_abs()))
    } else {
        UNIX_EPOCH.checked_sub(Duration::from_secs(sec.unsigned_abs()))
    };
    at.and_then(|t| t.checked_add(nsec)).unwrap_or(UNIX_EPOCH)
}

/// Where an answer is written: the payload it fills, and its length so far.
pub(crate) struct Out<'a> {
    buf: &'a mut [u8],
    len: usize,
}

/// The answer does not fit the entry's payload buffer (a bug: the buffer is as large as the
/// kernel's largest request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TooLong;

impl<'a> Out<'a> {
    pub(crate) fn new(buf: &'a mut [u8]) -> Out<'a> {
        Out { buf, len: 0 }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn room(&self) -> usize {
        self.buf.len() - self.len
    }

    pub(crate) fn bytes(&mut self, b: &[u8]) -> Result<(), TooLong> {
        let end = self.len.checked_add(b.len()).ok_or(TooLong)?;
        self.buf.get_mut(self.len..end).ok_or(TooLong)?.copy_from_slice(b);
        self.len = end;
        Ok(())
    }
    pub(crate) fn u32(&mut self, v: u32) -> Result<(), TooLong> {
        self.bytes(&v.to_ne_bytes())
    }
    pub(crate) fn u64(&mut self, v: u64) -> Result<(), TooLong> {
        self.bytes(&v.to_ne_bytes())
    }

    /// `struct fuse_attr`.
    fn attr(&mut self, a: &FileAttr) -> Result<(), TooLong> {
        let (at, mt, ct) = (times(a.atime), times(a.mtime), times(a.ctime));
        for v in [a.ino.0, a.size, a.blocks, at.0, mt.0, ct.0] {
            self.u64(v)?;
        }
        let mode = kind_bits(a.kind) | u32::from(a.perm);
        for v in [at.1, mt.1, ct.1, mode, a.nlink, a.uid, a.gid, a.rdev, a.blksize, 0] {
            self.u32(v)?;
        }
        Ok(())
    }

    /// `struct fuse_entry_out`.
    pub(crate) fn entry(&mut self, e: &Entry) -> Result<(), TooLong> {
        let start = self.len;
        self.u64(e.attr.ino.0)?;
        self.u64(0)?; // generation: inode numbers are never reused while mounted
        self.u64(e.entry_ttl.as_secs())?;
        self.u64(e.attr_ttl.as_secs())?;
        self.u32(e.entry_ttl.subsec_nanos())?;
        self.u32(e.attr_ttl.subsec_nanos())?;
        self.attr(&e.attr)?;
        debug_assert_eq!(self.len - start, ENTRY_OUT_SIZE);
        Ok(())
    }

    /// `struct fuse_attr_out`.
    pub(crate) fn attr_out(&mut self, attr: &FileAttr, ttl: Duration) -> Result<(), TooLong> {
        self.u64(ttl.as_secs())?;
        self.u32(ttl.subsec_nanos())?;
        self.u32(0)?;
        self.attr(attr)
    }

    /// `struct fuse_open_out`: fh, open_flags, backing_id.
    pub(crate) fn open_out(&mut self, fh: FileHandle, flags: u32) -> Result<(), TooLong> {
        self.u64(fh.0)?;
        self.u32(flags)?;
        self.u32(0)
    }

    /// `struct fuse_kstatfs`.
    pub(crate) fn statfs(&mut self, s: &StatfsOut) -> Result<(), TooLong> {
        for v in [s.blocks, s.bfree, s.bavail, s.files, s.ffree] {
            self.u64(v)?;
        }
        for v in [s.bsize, s.namelen, s.frsize, 0, 0, 0, 0, 0, 0, 0] {
            self.u32(v)?;
        }
        Ok(())
    }

    /// Add one `struct fuse_dirent` (`plus`: a `fuse_direntplus`, its entry first) if it fits
    /// in `size` bytes of answer; false when it does not (the listing stops there).
    pub(crate) fn dirent(
        &mut self,
        d: &DirEntryOut,
        plus: Option<&Entry>,
        size: usize,
    ) -> Result<bool, TooLong> {
        let name_len = u32::try_from(d.name.len()).map_err(|_| TooLong)?;
        let unpadded = DIRENT_SIZE + d.name.len() + if plus.is_some() { ENTRY_OUT_SIZE } else { 0 };
        let padded = unpadded.next_multiple_of(8);
        if self.len + padded > size.min(self.buf.len()) || padded > self.room() {
            return Ok(false);
        }
        if let Some(e) = plus {
            self.entry(e)?;
        }
        self.u64(d.ino)?;
        self.u64(d.offset)?;
        self.u32(name_len)?;
        self.u32(kind_bits(d.kind) >> 12)?;
        self.bytes(&d.name)?;
        self.bytes(&[0u8; 8][..padded - unpadded])?;
        Ok(true)
    }
}

/// Write the answer's `fuse_out_header` into the header buffer's `in_out`, and its payload
/// size into `fuse_uring_ent_in_out` (0 with an error: the kernel copies nothing then).
pub(crate) fn finish(header: &mut [u8; HEADER_SIZE], unique: u64, error: i32, payload_len: u32) {
    let total = u32::try_from(OUT_HEADER_SIZE).unwrap_or(16).saturating_add(payload_len);
    header[0..4].copy_from_slice(&total.to_ne_bytes());
    header[4..8].copy_from_slice(&error.to_ne_bytes());
    header[8..16].copy_from_slice(&unique.to_ne_bytes());
    let at = ENT_IN_OUT_AT + 16;
    header[at..at + 4].copy_from_slice(&payload_len.to_ne_bytes());
}

/// A time as the kernel's seconds and nanoseconds.
fn times(t: SystemTime) -> (u64, u32) {
    let ts = crate::attr::timespec(t);
    (ts.sec.cast_unsigned(), ts.nsec)
}

/// The `S_IFMT` bits of a kind.
fn kind_bits(kind: FileType) -> u32 {
    match kind {
        FileType::NamedPipe => libc::S_IFIFO,
        FileType::CharDevice => libc::S_IFCHR,
        FileType::BlockDevice => libc::S_IFBLK,
        FileType::Directory => libc::S_IFDIR,
        FileType::RegularFile => libc::S_IFREG,
        FileType::Symlink => libc::S_IFLNK,
        FileType::Socket => libc::S_IFSOCK,
    }
}

/// A request's header buffer as the kernel fills it: `opcode` on inode `nodeid` from pid 4242,
/// unique (and commit id) 77, `op` in `op_in`, `payload_len` bytes of payload.
#[cfg(test)]
pub(crate) fn test_header(
    opcode: u32,
    nodeid: u64,
    op: &[u8],
    payload_len: u32,
) -> Box<[u8; HEADER_SIZE]> {
    let mut h = Box::new([0u8; HEADER_SIZE]);
    h[0..4].copy_from_slice(&(40 + payload_len).to_ne_bytes());
    h[4..8].copy_from_slice(&opcode.to_ne_bytes());
    h[8..16].copy_from_slice(&77u64.to_ne_bytes());
    h[16..24].copy_from_slice(&nodeid.to_ne_bytes());
    h[32..36].copy_from_slice(&4242u32.to_ne_bytes());
    h[OP_IN_AT..OP_IN_AT + op.len()].copy_from_slice(op);
    h[ENT_IN_OUT_AT + 8..ENT_IN_OUT_AT + 16].copy_from_slice(&77u64.to_ne_bytes());
    h[ENT_IN_OUT_AT + 16..ENT_IN_OUT_AT + 20].copy_from_slice(&payload_len.to_ne_bytes());
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(opcode: u32, op: &[u8], payload_len: u32) -> Box<[u8; HEADER_SIZE]> {
        test_header(opcode, 1, op, payload_len)
    }

    #[test]
    fn requests_decode_from_op_in_and_payload() {
        let h = header(LOOKUP, &[], 4);
        let (hd, r) = decode(&h, b"abc\0").unwrap();
        assert_eq!((hd.unique, hd.nodeid, hd.pid), (77, 1, 4242));
        assert_eq!(r, Request::Lookup { name: b"abc" });
        assert_eq!(ent_in(&h).unwrap(), (77, 4));

        let mut op = vec![0u8; 40];
        op[0..8].copy_from_slice(&9u64.to_ne_bytes());
        op[8..16].copy_from_slice(&4096u64.to_ne_bytes());
        op[16..20].copy_from_slice(&3u32.to_ne_bytes());
        op[20..24].copy_from_slice(&WRITE_KILL_SUIDGID.to_ne_bytes());
        let (_, r) = decode(&header(WRITE, &op, 3), b"xyz").unwrap();
        assert_eq!(
            r,
            Request::Write { fh: FileHandle(9), offset: 4096, data: b"xyz", kill_suidgid: true }
        );

        let mut op = vec![0u8; 16];
        op[0..8].copy_from_slice(&5u64.to_ne_bytes());
        op[8..12].copy_from_slice(&1u32.to_ne_bytes());
        let (_, r) = decode(&header(RENAME2, &op, 6), b"a\0bcd\0").unwrap();
        assert_eq!(r, Request::Rename { newdir: 5, flags: 1, name: b"a", newname: b"bcd" });

        let (_, r) = decode(&header(SYMLINK, &[], 9), b"ln\0target\0").unwrap();
        assert_eq!(r, Request::Symlink { name: b"ln", target: b"target" });

        let mut op = vec![0u8; 8];
        op[0..4].copy_from_slice(&2u32.to_ne_bytes());
        let (_, r) = decode(&header(SETXATTR, &op, 9), b"user.a\0vv").unwrap();
        assert_eq!(r, Request::Setxattr { flags: 0, name: b"user.a", value: b"vv" });
        let (_, r) = decode(&header(9999, &[], 0), b"").unwrap();
        assert_eq!(r, Request::Other);
    }

    #[test]
    fn setattr_takes_only_the_valid_fields() {
        let mut op = vec![0u8; 88];
        let valid = FATTR_MODE | FATTR_SIZE | FATTR_MTIME | FATTR_MTIME_NOW | FATTR_FH;
        op[0..4].copy_from_slice(&valid.to_ne_bytes());
        op[8..16].copy_from_slice(&6u64.to_ne_bytes());
        op[16..24].copy_from_slice(&123u64.to_ne_bytes());
        op[68..72].copy_from_slice(&0o100_644u32.to_ne_bytes());
        op[76..80].copy_from_slice(&1000u32.to_ne_bytes());
        let (_, r) = decode(&header(SETATTR, &op, 0), b"").unwrap();
        let Request::Setattr(s) = r else { panic!("{r:?}") };
        assert_eq!((s.mode, s.size, s.uid, s.gid), (Some(0o100_644), Some(123), None, None));
        assert_eq!((s.mtime, s.atime, s.fh), (Some(TimeOrNow::Now), None, Some(FileHandle(6))));
    }

    #[test]
    fn hostile_bytes_are_errors_not_panics() {
        // Names without their NUL, sizes past the payload, truncated op structs.
        assert!(decode(&header(LOOKUP, &[], 3), b"abc").is_err());
        assert!(decode(&header(SYMLINK, &[], 3), b"ab\0c").is_err());
        let mut op = vec![0u8; 40];
        op[16..20].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert!(decode(&header(WRITE, &op, 3), b"xyz").is_err());
        let mut op = vec![0u8; 8];
        op[0..4].copy_from_slice(&100u32.to_ne_bytes());
        assert!(decode(&header(SETXATTR, &op, 4), b"a\0bb").is_err());
        // Every opcode, every payload prefix of garbage: never a panic.
        let garbage: Vec<u8> = (0..300u32).map(|i| (i * 37 % 251) as u8 + 1).collect();
        for opcode in 0..64 {
            let h = header(opcode, &garbage[..128], 0);
            for n in [0, 1, 7, 40, 300] {
                let _ = decode(&h, &garbage[..n]);
            }
        }
    }

    #[test]
    fn answers_have_the_kernels_sizes() {
        let mut buf = vec![0u8; 4096];
        let attr = crate::attr::absent_attr();
        let e = Entry { attr, attr_ttl: Duration::from_millis(1500), entry_ttl: Duration::ZERO };
        let mut out = Out::new(&mut buf);
        out.entry(&e).unwrap();
        assert_eq!(out.len(), ENTRY_OUT_SIZE);
        let mut out = Out::new(&mut buf);
        out.attr_out(&attr, Duration::ZERO).unwrap();
        assert_eq!(out.len(), 104);
        let mut out = Out::new(&mut buf);
        let s = StatfsOut {
            blocks: 1,
            bfree: 2,
            bavail: 3,
            files: 4,
            ffree: 5,
            bsize: 6,
            namelen: 7,
            frsize: 8,
        };
        out.statfs(&s).unwrap();
        assert_eq!(out.len(), 80);
        let mut out = Out::new(&mut buf);
        let d = DirEntryOut { ino: 5, offset: 3, kind: FileType::Directory, name: b"abc".to_vec() };
        assert!(out.dirent(&d, None, 4096).unwrap());
        assert_eq!(out.len(), 32);
        assert!(out.dirent(&d, Some(&e), 4096).unwrap());
        assert_eq!(out.len(), 32 + 160);
        // A listing stops at the kernel's buffer size.
        assert!(!out.dirent(&d, None, 200).unwrap());
        assert_eq!(out.len(), 192);
        let mut small = [0u8; 8];
        assert_eq!(Out::new(&mut small).bytes(&[0u8; 9]), Err(TooLong));
    }
}

//! One ring request: decode it, call the operation of [`TallyFuse`] it names, encode the
//! answer into the entry's buffers. The same operations serve `/dev/fuse`
//! (`adapter/fuser_glue.rs`); nothing here decides anything about the file system.

use fuser::{Errno, RenameFlags};

use super::wire::{self, InHeader, Out, Request, TooLong, HEADER_SIZE};
use crate::adapter::{Caller, TallyFuse, XattrOut};

/// Answer the request in a ring entry: `header` and `payload` are the entry's buffers, the
/// request in them, the answer written over it. Returns the request's `commit_id` (its
/// `unique`), which the commit names; `None` when not even that could be read (the entry is
/// then given up: the kernel cannot be answered without it).
pub(crate) fn serve(
    ops: &TallyFuse,
    header: &mut [u8; HEADER_SIZE],
    payload: &mut [u8],
) -> Option<u64> {
    let (commit_id, payload_size) = match wire::ent_in(header) {
        Ok(v) => v,
        Err(e) => {
            tracing::error!("ring entry without its commit id: {e:?}");
            return None;
        }
    };
    let size = usize::try_from(payload_size).unwrap_or(usize::MAX).min(payload.len());
    ops.requests().count_ring();
    let answer = match wire::decode(header, &payload[..size]) {
        // The answer is built before the payload is written over: a request's names and data
        // borrow it.
        Ok((h, request)) => answer(ops, &h, request),
        Err(e) => {
            tracing::error!(commit_id, "malformed ring request: {e:?}");
            Err(Errno::from_i32(libc::EIO))
        }
    };
    let (error, len) = match answer {
        Ok(Answer::None) => (0, 0),
        Ok(answer) => {
            let mut out = Out::new(payload);
            match answer.encode(&mut out) {
                Ok(()) => (0, out.len()),
                Err(TooLong) => {
                    tracing::error!(commit_id, "answer larger than the ring's payload buffer");
                    (-libc::EIO, 0)
                }
            }
        }
        Err(e) => (-e.code(), 0),
    };
    wire::finish(header, commit_id, error, u32::try_from(len).unwrap_or(0));
    Some(commit_id)
}

/// An answer before it is encoded (owned: the payload it goes to still holds the request).
enum Answer {
    None,
    Entry(crate::adapter::Entry),
    Attr(crate::adapter::AttrOut),
    Data(Vec<u8>),
    Opened(crate::adapter::Opened),
    Created(crate::adapter::Entry, crate::adapter::Opened),
    Written(u32),
    Statfs(crate::adapter::StatfsOut),
    XattrSize(u32),
    Listing(Vec<crate::adapter::DirEntryOut>, usize),
    ListingPlus(Vec<(crate::adapter::DirEntryOut, crate::adapter::Entry)>, usize),
    Ioctl(Vec<u8>),
    Poll(u32),
}

impl Answer {
    fn encode(&self, out: &mut Out<'_>) -> Result<(), TooLong> {
        match self {
            Answer::None => Ok(()),
            Answer::Entry(e) => out.entry(e),
            Answer::Attr(a) => out.attr_out(&a.attr, a.ttl),
            Answer::Data(d) => out.bytes(d),
            Answer::Opened(o) => out.open_out(o.fh, o.flags.bits()),
            Answer::Created(e, o) => {
                out.entry(e)?;
                out.open_out(o.fh, o.flags.bits())
            }
            // `fuse_write_out`, `fuse_getxattr_out`, `fuse_poll_out`: a u32 and padding.
            Answer::Written(n) | Answer::XattrSize(n) | Answer::Poll(n) => {
                out.u32(*n)?;
                out.u32(0)
            }
            Answer::Statfs(s) => out.statfs(s),
            Answer::Listing(entries, size) => {
                for d in entries {
                    if !out.dirent(d, None, *size)? {
                        break;
                    }
                }
                Ok(())
            }
            Answer::ListingPlus(entries, size) => {
                for (d, e) in entries {
                    if !out.dirent(d, Some(e), *size)? {
                        break;
                    }
                }
                Ok(())
            }
            // `fuse_ioctl_out` (result, flags, in_iovs, out_iovs), then the data.
            Answer::Ioctl(data) => {
                for v in [0, 0, 0, 0] {
                    out.u32(v)?;
                }
                out.bytes(data)
            }
        }
    }
}

/// The smallest a listed name takes in a READDIR reply: a 24-byte `fuse_dirent` and its name
/// padded to 8 bytes.
const DIRENT_MIN: usize = 32;
/// The same in a READDIRPLUS reply: a 128-byte `fuse_entry_out` before it.
const DIRENTPLUS_MIN: usize = 160;

/// At most how many names a listing reply of `size` bytes can hold: the page to ask the file
/// system for (never fewer than fit, so a page is never cut short by the ask; the transport
/// sends what fits and the kernel asks again from the last cookie sent).
fn entries_fitting(size: u32, entry_min: usize) -> usize {
    (usize::try_from(size).unwrap_or(usize::MAX) / entry_min).max(1)
}

fn answer(ops: &TallyFuse, h: &InHeader, request: Request<'_>) -> Result<Answer, Errno> {
    let who = Caller { uid: h.uid, gid: h.gid, pid: h.pid };
    let ino = h.nodeid;
    let size_of = |size: u32| usize::try_from(size).unwrap_or(usize::MAX);
    Ok(match request {
        Request::Lookup { name } => Answer::Entry(ops.lookup(ino, name)?),
        Request::Getattr => Answer::Attr(ops.getattr(ino)?),
        Request::Setattr(s) => Answer::Attr(ops.setattr(who, ino, &s)?),
        Request::Readlink => Answer::Data(ops.readlink(ino)?),
        Request::Symlink { name, target } => Answer::Entry(ops.symlink(who, ino, name, target)?),
        Request::Mknod { mode, rdev, name } => {
            Answer::Entry(ops.mknod(who, ino, name, mode, rdev)?)
        }
        Request::Mkdir { mode, name } => Answer::Entry(ops.mkdir(who, ino, name, mode)?),
        Request::Unlink { name } => ops.unlink(who, ino, name).map(|()| Answer::None)?,
        Request::Rmdir { name } => ops.rmdir(who, ino, name).map(|()| Answer::None)?,
        Request::Rename { newdir, flags, name, newname } => {
            let flags = RenameFlags::from_bits_retain(flags);
            ops.rename(who, ino, name, newdir, newname, flags).map(|()| Answer::None)?
        }
        // LINK names the new parent in the header and the linked inode in its struct.
        Request::Link { ino: target, newname } => {
            Answer::Entry(ops.link(who, target, ino, newname)?)
        }
        Request::Open { flags } => Answer::Opened(ops.open(ino, flags.cast_signed())?),
        Request::Read { offset, size } => Answer::Data(ops.read(ino, offset, size)?),
        Request::Write { fh, offset, data, kill_suidgid } => {
            Answer::Written(ops.write(who, ino, fh, offset, data, kill_suidgid)?)
        }
        Request::Statfs => Answer::Statfs(ops.statfs()?),
        Request::Release { fh } => ops.release(ino, fh).map(|()| Answer::None)?,
        Request::Fsync { datasync } => ops.fsync(ino, datasync).map(|()| Answer::None)?,
        Request::Setxattr { flags, name, value } => {
            ops.setxattr(who, ino, name, value, flags.cast_signed(), 0).map(|()| Answer::None)?
        }
        Request::Getxattr { size, name } => xattr(ops.getxattr(ino, name, size)?),
        Request::Listxattr { size } => xattr(ops.listxattr(ino, size)?),
        Request::Removexattr { name } => ops.removexattr(who, ino, name).map(|()| Answer::None)?,
        Request::Flush { fh } => ops.flush(who, fh).map(|()| Answer::None)?,
        Request::Opendir => Answer::Opened(ops.opendir(ino)?),
        Request::Readdir { offset, size } => Answer::Listing(
            ops.readdir(ino, offset, entries_fitting(size, DIRENT_MIN))?,
            size_of(size),
        ),
        Request::Readdirplus { offset, size } => Answer::ListingPlus(
            ops.readdirplus(ino, offset, entries_fitting(size, DIRENTPLUS_MIN))?,
            size_of(size),
        ),
        Request::Releasedir { fh } => ops.releasedir(ino, fh).map(|()| Answer::None)?,
        Request::Fsyncdir => ops.fsyncdir(ino).map(|()| Answer::None)?,
        Request::Access => ops.access(ino).map(|()| Answer::None)?,
        Request::Create { flags, mode, name } => {
            let (e, o) = ops.create(who, ino, name, mode, flags.cast_signed())?;
            Answer::Created(e, o)
        }
        // The file system is unmounted when the session ends, after every transport stopped
        // (`Mounted::run`): DESTROY itself has nothing to do.
        Request::Destroy => Answer::None,
        Request::Ioctl { fh, cmd, out_size } => {
            let data = ops.ioctl(who, ino, fh, cmd, out_size)?;
            if data.len() > size_of(out_size) {
                return Err(Errno::from_i32(libc::EINVAL));
            }
            Answer::Ioctl(data)
        }
        Request::Poll { events } => Answer::Poll(ops.poll(ino, events)?),
        Request::Fallocate { fh, offset, length, mode } => ops
            .fallocate(who, ino, fh, offset, length, mode.cast_signed())
            .map(|()| Answer::None)?,
        Request::Lseek => ops.lseek().map(|_| Answer::None)?,
        Request::CopyFileRange { offset_in, ino_out, offset_out, len, flags } => Answer::Written(
            ops.copy_file_range(who, ino, offset_in, ino_out, offset_out, len, flags)?,
        ),
        Request::Syncfs => ops.syncfs().map(|()| Answer::None)?,
        Request::Other => {
            tracing::debug!(opcode = h.opcode, "opcode not served over the ring");
            return Err(Errno::from_i32(libc::ENOSYS));
        }
    })
}

fn xattr(x: XattrOut) -> Answer {
    match x {
        XattrOut::Size(n) => Answer::XattrSize(n),
        XattrOut::Data(d) => Answer::Data(d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::wire::test_header;

    /// Serve one request of `opcode` on `nodeid`; the answer's error and payload.
    fn ask(ops: &TallyFuse, opcode: u32, nodeid: u64, op: &[u8], payload: &[u8]) -> (i32, Vec<u8>) {
        let mut header = test_header(opcode, nodeid, op, u32::try_from(payload.len()).unwrap());
        let mut buf = vec![0u8; 1 << 16];
        buf[..payload.len()].copy_from_slice(payload);
        assert_eq!(serve(ops, &mut header, &mut buf), Some(77));
        let u32_at = |at: usize| u32::from_ne_bytes(header[at..at + 4].try_into().unwrap());
        let error = i32::from_ne_bytes(header[4..8].try_into().unwrap());
        let unique = u64::from_ne_bytes(header[8..16].try_into().unwrap());
        let len = usize::try_from(u32_at(256 + 16)).unwrap();
        assert_eq!(unique, 77, "the answer names its request");
        assert_eq!(usize::try_from(u32_at(0)).unwrap(), 16 + len, "out header length");
        (error, buf[..len].to_vec())
    }

    fn u64_at(b: &[u8], at: usize) -> u64 {
        u64::from_ne_bytes(b[at..at + 8].try_into().unwrap())
    }

    #[test]
    fn requests_reach_the_operations_and_answers_have_the_kernels_layout() {
        let ops = TallyFuse::for_tests();
        let root = tally_fs::ROOT;
        // MKDIR: fuse_mkdir_in {mode, umask}, then the name; answer fuse_entry_out.
        let mut mkdir_in = 0o755u32.to_ne_bytes().to_vec();
        mkdir_in.extend_from_slice(&0u32.to_ne_bytes());
        let (error, entry) = ask(&ops, 9, root, &mkdir_in, b"d\0");
        assert_eq!((error, entry.len()), (0, 128));
        let ino = u64_at(&entry, 0);
        assert!(ino > root);
        let mode = u32::from_ne_bytes(entry[40 + 60..40 + 64].try_into().unwrap());
        assert_eq!(mode, libc::S_IFDIR | 0o755);
        // LOOKUP of an absent name: a negative entry (inode 0) kept for negative_timeout.
        let (error, entry) = ask(&ops, 1, root, &[], b"nope\0");
        assert_eq!((error, u64_at(&entry, 0), u64_at(&entry, 16)), (0, 0, 86_400));
        // READDIR of 80 bytes: ".", ".." (32 bytes each), and "d" does not fit.
        let mut read_in = vec![0u8; 40];
        read_in[16..20].copy_from_slice(&80u32.to_ne_bytes());
        let (error, listing) = ask(&ops, 28, root, &read_in, &[]);
        assert_eq!((error, listing.len()), (0, 64));
        assert_eq!(&listing[24..25], b".");
        read_in[16..20].copy_from_slice(&4096u32.to_ne_bytes());
        let (_, listing) = ask(&ops, 28, root, &read_in, &[]);
        assert_eq!(listing.len(), 96);
        assert_eq!(u64_at(&listing, 64), ino);
        // Errors: the negative errno and no payload.
        let (error, none) = ask(&ops, 22, ino, &[0u8; 8], b"user.x\0");
        assert_eq!((error, none.len()), (-libc::ENODATA, 0));
        let (error, _) = ask(&ops, 9999, root, &[], &[]);
        assert_eq!(error, -libc::ENOSYS);
        let (error, _) = ask(&ops, 1, root, &[], b"no-nul");
        assert_eq!(error, -libc::EIO);
        // SYNCFS (fuse_syncfs_in: 8 bytes of padding): served, no payload.
        let (error, none) = ask(&ops, 50, root, &[0u8; 8], &[]);
        assert_eq!((error, none.len()), (0, 0));
        // Counted under their opcodes and as ring requests (the malformed one only as the latter).
        let counts = ops.requests().snapshot();
        assert_eq!((counts.get(crate::Opcode::Readdir), counts.ring()), (2, 8));
        assert_eq!(counts.get(crate::Opcode::Syncfs), 1);
    }
}

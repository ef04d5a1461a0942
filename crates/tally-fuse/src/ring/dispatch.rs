//! One ring request: decode it, call the operation of [`TallyFuse`] it names, encode the
//! answer into the entry's buffers. The same operations serve `/dev/fuse`
//! (`adapter/fuser_glue.rs`); nothing here decides anything about the file system.

use fuser::{Errno, RenameFlags};

use super::wire::{self, HEADER_SIZE, InHeader, Out, Request, TooLong};
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
    let answer = match wire::decode(header, &payload[..size]) {
        Ok((h, request)) => {
            // The answer is built before the payload is written over: a request's names and
            // data borrow it.
            let answer = answer(ops, &h, request);
            ops.requests().count_ring();
            answer
        }
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
        Request::Readdir { offset, size } => {
            Answer::Listing(ops.readdir(ino, offset)?, size_of(size))
        }
        Request::Readdirplus { offset, size } => {
            Answer::ListingPlus(ops.readdirplus(ino, offset)?, size_of(size))
        }
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

//! Attributes, data and extended attributes of one inode.

use std::sync::Arc;

use crate::state::{Block, State};
use crate::txn::{Cx, OpResult};
use crate::types::*;
use crate::{FsError, Result};

use super::{touch_times, Fs, Txn};

/// The extended attribute holding a file's capabilities, which Linux removes on a write, a
/// truncate and a change of owner.
const XATTR_CAPABILITY: &[u8] = b"security.capability";

/// The prefix of the attributes that hold POSIX ACLs (`system.posix_acl_access`,
/// `system.posix_acl_default`).
const XATTR_POSIX_ACL_PREFIX: &[u8] = b"system.posix_acl_";

/// Tally has no POSIX ACLs: their attributes are refused with `EOPNOTSUPP`, as ext4 mounted
/// `noacl` does, so tools that copy ACLs (GNU sed -i, cp -a, rsync -A, tar --acls, setfacl
/// with an ACL the mode can express) fall back to `chmod` and the mode is what they set.
/// Stored as a plain attribute, an ACL would change nothing (the kernel checks the mode) and
/// the mode would not follow it (`sed -i` left files 0600).
pub(crate) fn refuse_posix_acl(name: &[u8]) -> Result<()> {
    if name.starts_with(XATTR_POSIX_ACL_PREFIX) {
        return Err(FsError::NotSupported("POSIX ACLs (the mode is the only permission)"));
    }
    Ok(())
}

/// Take away what Linux takes from a file when it is written, truncated or given to another
/// owner: its `security.capability` attribute, and when `suidgid`, its set-user-ID bit and its
/// set-group-ID bit if it is group-executable (without group execution the bit marks mandatory
/// locking, not privilege). Returns whether the permission bits changed.
fn drop_privs(st: &mut State, cx: &mut Cx, ino: Ino, suidgid: bool) -> OpResult<bool> {
    let inode = st.inode(ino)?;
    let perm = inode.attr.perm;
    let mut kept = perm;
    if suidgid {
        kept &= !0o4000;
        if perm & 0o010 != 0 {
            kept &= !0o2000;
        }
    }
    let capability = inode.xattrs.contains_key(XATTR_CAPABILITY);
    if kept == perm && !capability {
        return Ok(false);
    }
    cx.inode(st, ino)?;
    if capability {
        cx.xattr(st, ino, XATTR_CAPABILITY);
        st.inode_mut(ino)?.xattrs.remove(XATTR_CAPABILITY);
    }
    let a = &mut st.inode_mut(ino)?.attr;
    a.perm = kept;
    a.ctime = Timespec::now();
    Ok(kept != perm)
}

impl Fs {
    /// Change attributes. A size change truncates or extends (with zeros) a regular file.
    ///
    /// # Errors
    /// `ENOENT`, `EISDIR`/`EINVAL` for a size change on a non-file, `EFBIG`, `EBUSY`.
    pub fn setattr(&self, txn: Option<&Txn>, ino: Ino, set: &SetAttr) -> Result<Attr> {
        self.setattr_as(txn, ino, set, None)
    }

    /// [`Fs::setattr`] on behalf of a caller the kernel left the dropping of privileges to
    /// (FUSE's `HANDLE_KILLPRIV_V2`), in the same transaction: a change of owner or group of a
    /// non-directory drops `security.capability`, the set-user-ID bit and a group-executable
    /// set-group-ID bit (whatever the caller; the new owner must not inherit them); a size
    /// change drops `security.capability`, and the bits too when `suidgid` (the caller lacks
    /// `CAP_FSETID`). Permission bits given in `set` are applied after.
    ///
    /// # Errors
    /// As [`Fs::setattr`].
    pub fn setattr_dropping_privs(
        &self,
        txn: Option<&Txn>,
        ino: Ino,
        set: &SetAttr,
        suidgid: bool,
    ) -> Result<Attr> {
        self.setattr_as(txn, ino, set, Some(suidgid))
    }

    /// [`Fs::setattr`]; `drop`: see [`Fs::setattr_dropping_privs`].
    fn setattr_as(
        &self,
        txn: Option<&Txn>,
        ino: Ino,
        set: &SetAttr,
        drop: Option<bool>,
    ) -> Result<Attr> {
        if set.size.is_some_and(|s| s > FILE_SIZE_MAX) {
            return Err(FsError::FileTooBig);
        }
        self.op(txn, ino, false, |st, cx| {
            let kind = st.inode(ino)?.attr.kind;
            if set.size.is_some() {
                match kind {
                    FileKind::File => {}
                    FileKind::Dir => return Err(FsError::IsDir.into()),
                    _ => return Err(FsError::Invalid("size of a non-file").into()),
                }
            }
            cx.inode(st, ino)?;
            if let Some(suidgid) = drop {
                let chown = (set.uid.is_some() || set.gid.is_some()) && kind != FileKind::Dir;
                if chown || set.size.is_some() {
                    drop_privs(st, cx, ino, chown || suidgid)?;
                }
            }
            let now = Timespec::now();
            if let Some(size) = set.size {
                self.truncate(st, cx, ino, size)?;
                let a = &mut st.inode_mut(ino)?.attr;
                a.mtime = now;
            }
            let a = &mut st.inode_mut(ino)?.attr;
            if let Some(p) = set.perm {
                a.perm = p & 0o7777;
            }
            let owner_changed =
                set.uid.is_some_and(|u| u != a.uid) || set.gid.is_some_and(|g| g != a.gid);
            if let Some(u) = set.uid {
                a.uid = u;
            }
            if let Some(g) = set.gid {
                a.gid = g;
            }
            if owner_changed && set.perm.is_none() && kind != FileKind::Dir {
                a.perm &= !0o4000;
                if a.perm & 0o010 != 0 {
                    a.perm &= !0o2000;
                }
            }
            let time = |t: SetTime| match t {
                SetTime::Now => now,
                SetTime::At(t) => t,
            };
            if let Some(t) = set.atime {
                a.atime = time(t);
            }
            if let Some(t) = set.mtime {
                a.mtime = time(t);
            }
            a.ctime = set.ctime.unwrap_or(now);
            Ok(*a)
        })
    }

    /// Set a file's size: blocks past it become holes; the tail of a partial last block is
    /// zeroed (so a later extension reads zeros).
    pub(crate) fn truncate(
        &self,
        st: &mut State,
        cx: &mut Cx,
        ino: Ino,
        size: u64,
    ) -> OpResult<()> {
        let bs = u64::from(self.bs);
        let old = st.inode(ino)?.attr.size;
        if size < old {
            let keep = size.div_ceil(bs);
            st.reserved.remove(ino, keep, u64::MAX);
            for b in st.block_keys(ino, keep) {
                cx.block(st, ino, b);
                st.remove_block(ino, b)?;
            }
            if !size.is_multiple_of(bs) {
                let b = size / bs;
                if let Some(block) = st.inode(ino)?.blocks.get(&b).cloned() {
                    let mut bytes = cx.block_bytes(ino, b, &block)?.as_ref().clone();
                    bytes[(size % bs) as usize..].fill(0);
                    cx.block(st, ino, b);
                    Self::put_block(st, ino, b, bytes)?;
                }
            }
        }
        st.inode_mut(ino)?.attr.size = size;
        Ok(())
    }

    pub(crate) fn put_block(st: &mut State, ino: Ino, b: u64, bytes: Vec<u8>) -> Result<()> {
        let crc = crc32c::crc32c(&bytes);
        Self::put_whole(st, ino, b, Arc::new(bytes), crc)
    }

    /// [`Fs::put_block`] of bytes whose crc is known (a [`Whole`] block).
    fn put_whole(st: &mut State, ino: Ino, b: u64, bytes: Arc<Vec<u8>>, crc: u32) -> Result<()> {
        let block = Block { ver: 0, crc, addr: 0, tx: None, data: Some(bytes) };
        st.insert_block(ino, b, block)?;
        Ok(())
    }

    /// Write `data` at `offset` (any offset and length; a gap past the end becomes a hole).
    /// Copy-on-write: new blocks, partial blocks merged in memory. A write larger than a
    /// transaction can hold is split into several transactions, each atomic; if a later one
    /// fails (out of space) after earlier ones committed, the count written so far is returned
    /// (a short write, as POSIX has it).
    ///
    /// # Errors
    /// `ENOENT`, `EISDIR`, `EINVAL`, `EFBIG`, `ENOSPC`, `EIO`, `EBUSY`.
    pub fn write(&self, txn: Option<&Txn>, ino: Ino, offset: u64, data: &[u8]) -> Result<usize> {
        self.write_as(txn, ino, offset, data, None).map(|(n, _)| n)
    }

    /// [`Fs::write`] on behalf of a caller the kernel left the dropping of privileges to
    /// (FUSE's `HANDLE_KILLPRIV_V2`): the write's first transaction also drops the file's
    /// `security.capability`, and when `suidgid` (the caller lacks `CAP_FSETID`) its
    /// set-user-ID bit and group-executable set-group-ID bit. Returns the bytes written and
    /// whether the permission bits changed (a kernel caching them must be told).
    ///
    /// # Errors
    /// As [`Fs::write`].
    pub fn write_dropping_privs(
        &self,
        txn: Option<&Txn>,
        ino: Ino,
        offset: u64,
        data: &[u8],
        suidgid: bool,
    ) -> Result<(usize, bool)> {
        self.write_as(txn, ino, offset, data, Some(suidgid))
    }

    /// [`Fs::write`]; `drop`: see [`Fs::write_dropping_privs`].
    fn write_as(
        &self,
        txn: Option<&Txn>,
        ino: Ino,
        offset: u64,
        data: &[u8],
        drop: Option<bool>,
    ) -> Result<(usize, bool)> {
        let end = offset.checked_add(data.len() as u64).ok_or(FsError::FileTooBig)?;
        if end > FILE_SIZE_MAX {
            return Err(FsError::FileTooBig);
        }
        if data.is_empty() {
            self.getattr(ino)?;
            return Ok((0, false));
        }
        let bs = u64::from(self.bs);
        let chunk = if txn.is_some() { u64::MAX } else { self.max_tx_blocks * bs };
        let mut at = offset;
        let mut perm_dropped = false;
        while at < end {
            let stop = end.min((at / bs * bs).saturating_add(chunk));
            let part = &data[(at - offset) as usize..(stop - offset) as usize];
            // Privileges go in the first part's transaction: a crash never keeps written
            // data on a file that still has them.
            let first_drop = if at == offset { drop } else { None };
            // The whole blocks' copies and crcs are made before the state lock is taken: for
            // large writes they were most of the time the lock was held (issue 16).
            let whole = Whole::of(at, part, self.bs);
            let written = self.op(txn, ino, true, |st, cx| {
                self.write_part(st, cx, ino, at, part, &whole)?;
                match first_drop {
                    Some(suidgid) => drop_privs(st, cx, ino, suidgid),
                    None => Ok(false),
                }
            });
            match written {
                Ok(dropped) => {
                    perm_dropped |= dropped;
                    at = stop;
                }
                // A short write, as POSIX has it: the parts written are committed.
                Err(_) if at > offset => return Ok(((at - offset) as usize, perm_dropped)),
                Err(e) => return Err(e),
            }
        }
        Ok((data.len(), perm_dropped))
    }

    /// Write `data` at `offset` in the state, taking the blocks of `whole` (made from `data`
    /// beforehand, or none) as they are; every other block is copied (and merged) here.
    pub(crate) fn write_part(
        &self,
        st: &mut State,
        cx: &mut Cx,
        ino: Ino,
        offset: u64,
        data: &[u8],
        whole: &Whole,
    ) -> OpResult<()> {
        match st.inode(ino)?.attr.kind {
            FileKind::File => {}
            FileKind::Dir => return Err(FsError::IsDir.into()),
            _ => return Err(FsError::Invalid("not a regular file").into()),
        }
        cx.inode(st, ino)?;
        let bs = u64::from(self.bs);
        let end = offset + data.len() as u64;
        for b in offset / bs..=(end - 1) / bs {
            let (bstart, bend) = (b * bs, (b + 1) * bs);
            let (from, to) = (offset.max(bstart), end.min(bend));
            let part = &data[(from - offset) as usize..(to - offset) as usize];
            if let Some((bytes, crc)) = whole.get(b) {
                cx.block(st, ino, b);
                Self::put_whole(st, ino, b, bytes.clone(), *crc)?;
                continue;
            }
            let bytes = if from == bstart && to == bend {
                // A whole block: copied once, never zeroed first.
                part.to_vec()
            } else {
                let mut bytes = match st.inode(ino)?.blocks.get(&b).cloned() {
                    Some(block) => cx.block_bytes(ino, b, &block)?.as_ref().clone(),
                    None => vec![0u8; bs as usize],
                };
                bytes[(from - bstart) as usize..(to - bstart) as usize].copy_from_slice(part);
                bytes
            };
            cx.block(st, ino, b);
            Self::put_block(st, ino, b, bytes)?;
        }
        let now = Timespec::now();
        let a = &mut st.inode_mut(ino)?.attr;
        a.size = a.size.max(end);
        touch_times(a, now);
        Ok(())
    }

    /// Reserve space for a range (extending the size unless `keep_size`), punch a hole in it,
    /// or zero it (a hole, then reserved). Copy-on-write cannot set blocks aside on the device,
    /// so a reservation is counted against free space instead (`reserve.rs`, `space.rs`):
    /// operations that need space outside reservations get `ENOSPC` first, and the first write
    /// of each block of a reserved range finds room. A later rewrite of a block is an ordinary
    /// write (as on other copy-on-write file systems). Reservations live while the file system
    /// is mounted: a remount forgets them. A punched or truncated block loses its reservation.
    ///
    /// # Errors
    /// `ENOENT`, `EISDIR`, `EINVAL`, `EFBIG`, `ENOSPC` (the range does not fit in the free
    /// space left by the reserves and other reservations), `EBUSY`.
    pub fn fallocate(
        &self,
        txn: Option<&Txn>,
        ino: Ino,
        offset: u64,
        len: u64,
        flags: FallocFlags,
    ) -> Result<()> {
        let end = offset.checked_add(len).ok_or(FsError::FileTooBig)?;
        if len == 0 {
            return Err(FsError::Invalid("zero length"));
        }
        if end > FILE_SIZE_MAX {
            return Err(FsError::FileTooBig);
        }
        if flags.punch_hole && !flags.keep_size {
            return Err(FsError::Invalid("punching a hole needs KEEP_SIZE"));
        }
        if flags.punch_hole && flags.zero_range {
            return Err(FsError::Invalid("punch a hole or zero a range, not both"));
        }
        self.op(txn, ino, !flags.punch_hole, |st, cx| {
            match st.inode(ino)?.attr.kind {
                FileKind::File => {}
                FileKind::Dir => return Err(FsError::IsDir.into()),
                _ => return Err(FsError::Invalid("not a regular file").into()),
            }
            cx.inode(st, ino)?;
            let now = Timespec::now();
            let bs = u64::from(self.bs);
            if flags.punch_hole || flags.zero_range {
                self.punch(st, cx, ino, offset, end)?;
                touch_times(&mut st.inode_mut(ino)?.attr, now);
            }
            if !flags.punch_hole {
                let (first, last) = (offset / bs, end.div_ceil(bs));
                let total = st.reserved.blocks() + st.reserved.missing(ino, first, last);
                // Within the free segments (a reserved write never waits for cleaning) and
                // within what statfs reports free (`live.rs`).
                let told =
                    self.space_usage(st).free_blocks + Self::reservation_cost(st.reserved.blocks());
                if Self::reservation_cost(total) > self.growth_blocks(st).min(told) {
                    return Err(FsError::NoSpace.into());
                }
                st.reserved.add(ino, first, last);
                let a = &mut st.inode_mut(ino)?.attr;
                if !flags.keep_size && end > a.size {
                    a.size = end;
                    a.ctime = now;
                }
            }
            Ok(())
        })
    }

    /// Make `offset..end` of a file read as zeros: whole blocks become holes (and lose their
    /// reservations), partial ones are rewritten.
    fn punch(&self, st: &mut State, cx: &mut Cx, ino: Ino, offset: u64, end: u64) -> OpResult<()> {
        let bs = u64::from(self.bs);
        st.reserved.remove(ino, offset.div_ceil(bs), end / bs);
        let end = end.min(st.inode(ino)?.attr.size);
        if offset >= end {
            return Ok(());
        }
        for b in offset / bs..=(end - 1) / bs {
            let Some(block) = st.inode(ino)?.blocks.get(&b).cloned() else { continue };
            let (bstart, bend) = (b * bs, (b + 1) * bs);
            let (from, to) = (offset.max(bstart), end.min(bend));
            cx.block(st, ino, b);
            if from == bstart && to == bend {
                st.remove_block(ino, b)?;
            } else {
                let mut bytes = cx.block_bytes(ino, b, &block)?.as_ref().clone();
                bytes[(from - bstart) as usize..(to - bstart) as usize].fill(0);
                Self::put_block(st, ino, b, bytes)?;
            }
        }
        Ok(())
    }

    /// Set an extended attribute.
    ///
    /// # Errors
    /// `ENOENT`, `EEXIST` (create), `ENODATA` (replace), `ERANGE` (name or value too long),
    /// `EINVAL` (empty name), `EOPNOTSUPP` (a POSIX ACL), `ENOSPC`, `EBUSY`.
    pub fn setxattr(
        &self,
        txn: Option<&Txn>,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        how: XattrSet,
    ) -> Result<()> {
        if name.is_empty() {
            return Err(FsError::Invalid("empty attribute name"));
        }
        refuse_posix_acl(name)?;
        if name.len() > XATTR_NAME_MAX || value.len() > XATTR_VALUE_MAX {
            return Err(FsError::Range);
        }
        self.op(txn, ino, true, |st, cx| {
            let exists = st.inode(ino)?.xattrs.contains_key(name);
            match how {
                XattrSet::Create if exists => return Err(FsError::Exists.into()),
                XattrSet::Replace if !exists => return Err(FsError::NoAttr.into()),
                _ => {}
            }
            cx.inode(st, ino)?;
            cx.xattr(st, ino, name);
            let i = st.inode_mut(ino)?;
            i.xattrs.insert(name.to_vec(), crate::state::Xattr { value: value.to_vec(), ver: 0 });
            i.attr.ctime = Timespec::now();
            Ok(())
        })
    }

    /// Remove an extended attribute.
    ///
    /// # Errors
    /// `ENOENT`, `ENODATA`, `EOPNOTSUPP` (a POSIX ACL), `EBUSY`.
    pub fn removexattr(&self, txn: Option<&Txn>, ino: Ino, name: &[u8]) -> Result<()> {
        refuse_posix_acl(name)?;
        self.op(txn, ino, false, |st, cx| {
            if !st.inode(ino)?.xattrs.contains_key(name) {
                return Err(FsError::NoAttr.into());
            }
            cx.inode(st, ino)?;
            cx.xattr(st, ino, name);
            let i = st.inode_mut(ino)?;
            i.xattrs.remove(name);
            i.attr.ctime = Timespec::now();
            Ok(())
        })
    }
}

/// The blocks a write covers whole, copied and their crcs computed before the state lock is
/// taken (they need nothing of the state); shared, not copied again, if the operation runs
/// more than once (after a fetch, or cleaning for space).
#[derive(Debug, Default)]
pub(crate) struct Whole {
    /// The file block of `blocks[0]`.
    first: u64,
    blocks: Vec<(Arc<Vec<u8>>, u32)>,
}

impl Whole {
    /// Fewer whole blocks than this in a write are left to be copied under the lock (the
    /// hand-over costs more than it saves for a block or two).
    const MIN_BLOCKS: u64 = 4;

    /// The whole blocks of `data` written at `offset`, in blocks of `bs` bytes.
    fn of(offset: u64, data: &[u8], bs: u32) -> Whole {
        let bs = u64::from(bs);
        let end = offset + data.len() as u64;
        let first = offset.div_ceil(bs);
        let last = end / bs; // exclusive
        if last < first.saturating_add(Self::MIN_BLOCKS) {
            return Whole::default();
        }
        let blocks = (first..last)
            .map(|b| {
                let at = (b * bs - offset) as usize;
                let bytes = data[at..at + bs as usize].to_vec();
                let crc = crc32c::crc32c(&bytes);
                (Arc::new(bytes), crc)
            })
            .collect();
        Whole { first, blocks }
    }

    fn get(&self, b: u64) -> Option<&(Arc<Vec<u8>>, u32)> {
        let i = usize::try_from(b.checked_sub(self.first)?).ok()?;
        self.blocks.get(i)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tally_media::{Device, MemDevice};

    use super::XATTR_CAPABILITY;
    use crate::types::{Owner, SetAttr, XattrSet, ROOT};
    use crate::{Fs, MkfsOptions, MountOptions};

    fn fs() -> (Arc<dyn Device>, Fs) {
        let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, 16384).unwrap());
        Fs::mkfs(dev.clone(), &MkfsOptions::default()).unwrap();
        let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
        (dev, fs)
    }

    /// The blocks a write covers whole are made before the lock (`Whole`): only those, each
    /// the right slice of the write with its crc; partial blocks at either end are merged with
    /// the file's bytes as before, and a remount reads back exactly what was written.
    #[test]
    fn whole_blocks_made_ahead_land_where_they_belong() {
        let bs = 4096usize;
        let data: Vec<u8> = (0..9 * bs + 300).map(|i| (i * 31 % 251) as u8).collect();
        let offset = 1000u64;
        let whole = super::Whole::of(offset, &data, 4096);
        // Bytes 1000..38164 cover block 0 in part, blocks 1..=8 whole, block 9 in part.
        assert_eq!(whole.first, 1);
        assert_eq!(whole.blocks.len(), 8);
        for (i, (bytes, crc)) in whole.blocks.iter().enumerate() {
            let at = (i + 1) * bs - offset as usize;
            assert_eq!(bytes.as_slice(), &data[at..at + bs]);
            assert_eq!(*crc, crc32c::crc32c(bytes));
        }
        assert!(whole.get(0).is_none() && whole.get(9).is_none());
        // Too few whole blocks: left to the copy under the lock.
        assert!(super::Whole::of(0, &data[..3 * bs], 4096).blocks.is_empty());

        let (dev, fs) = fs();
        let me = Owner { uid: 0, gid: 0 };
        let ino = fs.create(None, ROOT, b"f", 0o644, me).unwrap().ino;
        fs.write(None, ino, 0, &vec![5u8; 12 * bs]).unwrap();
        fs.write(None, ino, offset, &data).unwrap();
        let mut want = vec![5u8; 12 * bs];
        want[offset as usize..offset as usize + data.len()].copy_from_slice(&data);
        assert_eq!(fs.read(ino, 0, 12 * bs).unwrap(), want);
        fs.unmount().unwrap();
        let fs = Fs::mount(dev, MountOptions::default()).unwrap();
        assert_eq!(fs.read(ino, 0, 12 * bs).unwrap(), want);
        assert!(fs.fsck().is_clean());
    }

    /// A file of mode `perm` owned by uid 1 holding a capability attribute.
    fn privileged(fs: &Fs, name: &[u8], perm: u16) -> u64 {
        let a = fs.create(None, ROOT, name, perm, Owner { uid: 1, gid: 1 }).unwrap();
        fs.setxattr(None, a.ino, XATTR_CAPABILITY, b"caps", XattrSet::Any).unwrap();
        a.ino
    }

    fn state(fs: &Fs, ino: u64) -> (u16, bool) {
        let caps = fs.getxattr(ino, XATTR_CAPABILITY).is_ok();
        (fs.getattr(ino).unwrap().perm, caps)
    }

    #[test]
    fn a_write_drops_capabilities_and_with_suidgid_the_bits() {
        let (_, fs) = fs();
        let f = privileged(&fs, b"f", 0o6775);
        assert_eq!(fs.write_dropping_privs(None, f, 0, b"x", false).unwrap(), (1, false));
        assert_eq!(state(&fs, f), (0o6775, false), "a privileged writer keeps the bits");
        assert_eq!(fs.write_dropping_privs(None, f, 1, b"y", true).unwrap(), (1, true));
        assert_eq!(state(&fs, f), (0o0775, false));
        // Set-group-ID without group execution marks mandatory locking: it stays.
        let g = privileged(&fs, b"g", 0o6764);
        assert_eq!(fs.write_dropping_privs(None, g, 0, b"x", true).unwrap(), (1, true));
        assert_eq!(state(&fs, g), (0o2764, false));
        // The plain write takes nothing.
        let h = privileged(&fs, b"h", 0o6775);
        fs.write(None, h, 0, b"x").unwrap();
        assert_eq!(state(&fs, h), (0o6775, true));
    }

    #[test]
    fn chown_drops_them_whoever_asks_truncate_as_told() {
        let (dev, fs) = fs();
        let f = privileged(&fs, b"f", 0o6755);
        let same_owner = SetAttr { uid: Some(1), ..SetAttr::default() };
        fs.setattr_dropping_privs(None, f, &same_owner, false).unwrap();
        assert_eq!(state(&fs, f), (0o0755, false), "chown, even to the same owner");
        let g = privileged(&fs, b"g", 0o6755);
        let truncate = SetAttr { size: Some(0), ..SetAttr::default() };
        fs.setattr_dropping_privs(None, g, &truncate, false).unwrap();
        assert_eq!(state(&fs, g), (0o6755, false));
        fs.setattr_dropping_privs(None, g, &truncate, true).unwrap();
        assert_eq!(state(&fs, g), (0o0755, false));
        // A chmod alone drops nothing; nor does a directory's chown.
        let h = privileged(&fs, b"h", 0o6755);
        let chmod = SetAttr { perm: Some(0o6711), ..SetAttr::default() };
        fs.setattr_dropping_privs(None, h, &chmod, true).unwrap();
        assert_eq!(state(&fs, h), (0o6711, true));
        let d = fs.mkdir(None, ROOT, b"d", 0o2775, Owner { uid: 1, gid: 1 }).unwrap().ino;
        let chown = SetAttr { uid: Some(2), ..SetAttr::default() };
        fs.setattr_dropping_privs(None, d, &chown, true).unwrap();
        assert_eq!(fs.getattr(d).unwrap().perm, 0o2775);
        // What was dropped stays dropped after a remount.
        fs.unmount().unwrap();
        let fs = Fs::mount(dev, MountOptions::default()).unwrap();
        assert_eq!(
            (state(&fs, f), state(&fs, g), state(&fs, h)),
            ((0o0755, false), (0o0755, false), (0o6711, true))
        );
    }

    #[test]
    fn abort_gives_them_back() {
        let (_, fs) = fs();
        let f = privileged(&fs, b"f", 0o6775);
        let txn = fs.begin().unwrap();
        fs.write_dropping_privs(Some(&txn), f, 0, b"new", true).unwrap();
        assert_eq!(state(&fs, f), (0o0775, false));
        fs.abort(txn).unwrap();
        assert_eq!(state(&fs, f), (0o6775, true));
        assert_eq!(fs.getattr(f).unwrap().size, 0);
    }
}

//! Reading: lookups, attributes, file data (checked against its crc), directories, statfs, xattrs.

use std::sync::Arc;

use crate::state::Block;
use crate::types::*;
use crate::{FsError, Result};

use super::Fs;

/// Most blocks one device read of [`Fs::read`] asks for (1 MiB of 4 KiB blocks: the largest
/// FUSE request, and a bound on the buffer).
pub(crate) const READ_RUN_BLOCKS: usize = 256;

/// How many of `blocks` (in file order, the first not in memory) one device read can fetch:
/// the first and those after it that are the next block of the file, at the next device
/// block, and not in memory, up to [`READ_RUN_BLOCKS`].
fn device_run(blocks: &[(u64, Block)]) -> usize {
    let Some(((b0, first), after)) = blocks.split_first() else { return 0 };
    let mut run = 1;
    for (b, block) in after.iter().take(READ_RUN_BLOCKS - 1) {
        let step = run as u64;
        if block.data.is_some() || *b != b0 + step || block.addr != first.addr + step {
            break;
        }
        run += 1;
    }
    run
}

impl Fs {
    /// The entry `name` of directory `parent`.
    ///
    /// # Errors
    /// `ENOENT`, `ENOTDIR`, `ENAMETOOLONG`.
    pub fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Attr> {
        if name.len() > NAME_MAX {
            return Err(FsError::NameTooLong);
        }
        let st = self.lock_waited()?;
        let dir = st.dir(parent)?;
        let ino = match name {
            b"." => parent,
            b".." => dir.parent,
            _ => dir.entries().get(name).ok_or(FsError::NotFound)?.ino,
        };
        Ok(st.inode(ino)?.attr)
    }

    /// An inode's attributes.
    ///
    /// # Errors
    /// `ENOENT`.
    pub fn getattr(&self, ino: Ino) -> Result<Attr> {
        Ok(self.lock_waited()?.inode(ino)?.attr)
    }

    /// Data blocks an inode holds (for `st_blocks`).
    ///
    /// # Errors
    /// `ENOENT`.
    pub fn allocated_blocks(&self, ino: Ino) -> Result<u64> {
        Ok(self.lock_waited()?.inode(ino)?.blocks.len() as u64)
    }

    /// A symlink's target.
    ///
    /// # Errors
    /// `ENOENT`, `EINVAL` if not a symlink.
    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        let st = self.lock_waited()?;
        let i = st.inode(ino)?;
        if i.attr.kind != FileKind::Symlink {
            return Err(FsError::Invalid("not a symlink"));
        }
        Ok(i.target.clone())
    }

    /// Read up to `len` bytes at `offset` (short at end of file). Every block read from the
    /// device is checked against the crc in its record: a mismatch is `EIO`, never wrong data.
    /// Blocks that follow each other in the file and on the device (written by one
    /// transaction) are read in one device request of up to [`READ_RUN_BLOCKS`] blocks, so a
    /// large read costs a few requests, not one per block.
    ///
    /// # Errors
    /// `ENOENT`, `EISDIR`, `EINVAL` (not a regular file), `EIO`.
    pub fn read(&self, ino: Ino, offset: u64, len: usize) -> Result<Vec<u8>> {
        // The blocks to read are found under the lock; the device is read without it, so
        // readers do not hold up other operations. A block is never overwritten while the
        // records pointing at it are current, except by cleaning reusing its segment after a
        // relocation: a crc mismatch is therefore first retried under the lock.
        let bs = u64::from(self.bs);
        let (offset, end, blocks) = {
            let st = self.lock_waited()?;
            let inode = st.inode(ino)?;
            match inode.attr.kind {
                FileKind::File => {}
                FileKind::Dir => return Err(FsError::IsDir),
                _ => return Err(FsError::Invalid("not a regular file")),
            }
            let size = inode.attr.size;
            if offset >= size || len == 0 {
                return Ok(Vec::new());
            }
            let end = size.min(offset.saturating_add(len as u64));
            let (first, last) = (offset / bs, (end - 1) / bs);
            let blocks: Vec<(u64, Block)> =
                inode.blocks.range(first..=last).map(|(&b, block)| (b, block.clone())).collect();
            (offset, end, blocks)
        };
        let mut out = vec![0u8; (end - offset) as usize];
        let mut put = |b: u64, bytes: &[u8]| {
            let (bstart, bend) = (b * bs, (b + 1) * bs);
            let (from, to) = (offset.max(bstart), end.min(bend));
            out[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&bytes[(from - bstart) as usize..(to - bstart) as usize]);
        };
        let mut rest = blocks.as_slice();
        while let Some(((b, block), _)) = rest.split_first() {
            if let Some(d) = &block.data {
                put(*b, d);
                rest = &rest[1..];
                continue;
            }
            let run = device_run(rest);
            let (here, after) = rest.split_at(run);
            rest = after;
            let mut buf = tally_media::IoBuf::zeroed(run * self.bs as usize);
            let read = self.log.device().read(block.addr, &mut buf);
            for (i, (b, block)) in here.iter().enumerate() {
                let bytes = &buf[i * self.bs as usize..(i + 1) * self.bs as usize];
                if read.is_ok() && crc32c::crc32c(bytes) == block.crc {
                    put(*b, bytes);
                    continue;
                }
                // Moved by cleaning (its old place reused), punched or truncated meanwhile
                // (zeros): look again.
                if let Some(now) = self.block_now(ino, *b)? {
                    put(*b, &now);
                }
            }
        }
        Ok(out)
    }

    /// Block `b` of `ino` as it is now (`None`: a hole), read with the state lock dropped; a
    /// read that fails for the block as it still is, twice, is `EIO`.
    fn block_now(&self, ino: Ino, b: u64) -> Result<Option<Arc<Vec<u8>>>> {
        let mut failed_at = None;
        loop {
            let block = {
                let st = self.lock_waited()?;
                match st.inode(ino)?.blocks.get(&b) {
                    Some(block) => block.clone(),
                    None => return Ok(None),
                }
            };
            match self.fetch_block(ino, b, &block) {
                Ok(bytes) => return Ok(Some(bytes)),
                Err(why) if failed_at == Some((block.addr, block.ver, block.crc)) => {
                    return Err(FsError::io(why));
                }
                Err(_) => failed_at = Some((block.addr, block.ver, block.crc)),
            }
        }
    }

    /// A committed block's bytes: from memory, or read from the device (with no lock held)
    /// and checked against its crc. The error says why, in words.
    pub(crate) fn fetch_block(
        &self,
        ino: Ino,
        b: u64,
        block: &Block,
    ) -> std::result::Result<Arc<Vec<u8>>, crate::IoCause> {
        if let Some(d) = &block.data {
            return Ok(d.clone());
        }
        let mut buf = vec![0u8; self.bs as usize];
        self.log.device().read(block.addr, &mut buf).map_err(|e| crate::IoCause::from(&e))?;
        if crc32c::crc32c(&buf) != block.crc {
            return Err(crate::IoCause::Checksum { ino, block: b, addr: block.addr });
        }
        Ok(Arc::new(buf))
    }

    /// Entries of a directory after `offset` (0 to start): `.` (offset 1) and `..` (offset 2)
    /// first, then the entries in a stable order.
    ///
    /// # Errors
    /// `ENOENT`, `ENOTDIR`.
    pub fn readdir(&self, ino: Ino, offset: u64) -> Result<Vec<DirEntry>> {
        self.readdir_page(ino, offset, usize::MAX)
    }

    /// At most `count_max` of [`Fs::readdir`]'s entries: one page of a listing, at a cost
    /// bounded by the page. A caller that sends a page at a time (FUSE's READDIR, whose reply
    /// holds what the kernel's buffer takes) asks for what fits: listing every entry left at
    /// each page made reading a directory of n entries cost O(n²) (`ls -l` of 32,000 entries
    /// on the mount: 1.6-2.2 s of the daemon's CPU, 0.11-0.13 s a page at a time). A
    /// `count_max` of 0 gives an empty page, which FUSE takes for the end of the listing.
    ///
    /// # Errors
    /// `ENOENT`, `ENOTDIR`.
    pub fn readdir_page(&self, ino: Ino, offset: u64, count_max: usize) -> Result<Vec<DirEntry>> {
        let st = self.lock_waited()?;
        let page = Self::page(&st, ino, offset, count_max)?.map(|(e, _)| e).collect();
        Ok(page)
    }

    /// [`Fs::readdir_page`] with each entry's attributes and the data blocks its inode holds
    /// (for `st_blocks`), read under one lock: FUSE's READDIRPLUS, which asked for them entry
    /// by entry, two locks each.
    ///
    /// # Errors
    /// `ENOENT`, `ENOTDIR`.
    pub fn readdir_plus(
        &self,
        ino: Ino,
        offset: u64,
        count_max: usize,
    ) -> Result<Vec<(DirEntry, Attr, u64)>> {
        let st = self.lock_waited()?;
        let page = Self::page(&st, ino, offset, count_max)?
            .filter_map(|(e, i)| Some((e, i?.attr, i?.blocks.len() as u64)))
            .collect();
        Ok(page)
    }

    /// Up to `count_max` entries of directory `ino` after `offset`, each with the inode it
    /// names (`None` if gone: never, under the state lock, but not a panic if so).
    fn page<'s>(
        st: &'s crate::state::State,
        ino: Ino,
        offset: u64,
        count_max: usize,
    ) -> Result<impl Iterator<Item = (DirEntry, Option<&'s crate::state::Inode>)> + 's> {
        let dir = st.dir(ino)?;
        let dots = [(&b"."[..], ino, 1u64), (&b".."[..], dir.parent, 2)]
            .into_iter()
            .filter(move |d| offset < d.2)
            .map(|(name, i, cookie)| {
                let e =
                    DirEntry { name: name.to_vec(), ino: i, kind: FileKind::Dir, offset: cookie };
                (e, st.inodes.get(&i))
            });
        // From the cookie on: the cost is the page, not the directory.
        let named = dir.order().range(offset.max(2).saturating_add(1)..).filter_map(
            move |(&cookie, name)| {
                let d = dir.entries().get(name)?;
                let e = DirEntry { name: name.clone(), ino: d.ino, kind: d.kind, offset: cookie };
                Some((e, st.inodes.get(&d.ino)))
            },
        );
        Ok(dots.chain(named).take(count_max))
    }

    /// File-system statistics. Answered also after a panic stopped the file system (only
    /// counts are read; every other call fails then).
    #[must_use]
    pub fn statfs(&self) -> StatFs {
        let mut st = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Capacity − live − reserved: dead space counts as free at once; the size leaves out
        // what is kept back for good (`live.rs`).
        let usage = self.space_usage(&mut st);
        let free = usage.free_blocks;
        StatFs {
            block_size: self.bs,
            blocks: usage.capacity_blocks - usage.fixed_blocks,
            blocks_free: free,
            files: st.files(),
            files_free: free * u64::from(self.bs / 128),
            name_max: NAME_MAX as u32,
        }
    }

    /// An extended attribute's value.
    ///
    /// # Errors
    /// `ENOENT`, `ENODATA`, `EOPNOTSUPP` (a POSIX ACL: there are none).
    pub fn getxattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        super::data::refuse_posix_acl(name)?;
        let st = self.lock_waited()?;
        st.inode(ino)?.xattrs.get(name).map(|x| x.value.clone()).ok_or(FsError::NoAttr)
    }

    /// Names of an inode's extended attributes (an ACL an older version stored as a plain
    /// attribute is left out: it never meant anything, and can no longer be read).
    ///
    /// # Errors
    /// `ENOENT`.
    pub fn listxattr(&self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        let st = self.lock_waited()?;
        let names = st.inode(ino)?.xattrs.keys();
        Ok(names.filter(|n| super::data::refuse_posix_acl(n).is_ok()).cloned().collect())
    }
}

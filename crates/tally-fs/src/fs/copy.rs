//! `copy_file_range`: a copy between two files inside the file system, one transaction.

use crate::types::*;
use crate::{FsError, Result};

use super::{Fs, Txn};

impl Fs {
    /// Copy up to `len` bytes of `from` at `from_offset` to `to` at `to_offset`, as one atomic
    /// transaction: after a crash the destination holds all of the copied bytes or none. The
    /// copy stops at the end of `from`, and at what one transaction can carry (half a segment
    /// of blocks, less the first block's offset) outside an explicit transaction; the count
    /// copied is returned (0 at or past the end of `from`), as `copy_file_range(2)` does — the
    /// caller asks again for the rest. The data is copied into new blocks: a block is never
    /// shared between files (cleaning moves a block for the one file that owns it).
    ///
    /// # Errors
    /// `ENOENT`, `EISDIR`, `EINVAL` (not regular files; overlapping ranges of one file),
    /// `EFBIG`, `ENOSPC`, `EIO`, `EBUSY`.
    pub fn copy_file_range(
        &self,
        txn: Option<&Txn>,
        from: Ino,
        from_offset: u64,
        to: Ino,
        to_offset: u64,
        len: u64,
    ) -> Result<u64> {
        let bs = u64::from(self.bs);
        let carried = if txn.is_some() {
            len
        } else {
            (self.max_tx_blocks * bs).saturating_sub(to_offset % bs).max(1)
        };
        let len = len.min(carried);
        let overlap = from_offset < to_offset.saturating_add(len)
            && to_offset < from_offset.saturating_add(len);
        if from == to && overlap {
            return Err(FsError::Invalid("overlapping ranges of one file"));
        }
        let end = to_offset.checked_add(len).ok_or(FsError::FileTooBig)?;
        if end > FILE_SIZE_MAX {
            return Err(FsError::FileTooBig);
        }
        self.op(txn, to, true, |st, cx| {
            let source = st.inode(from)?;
            match source.attr.kind {
                FileKind::File => {}
                FileKind::Dir => return Err(FsError::IsDir.into()),
                _ => return Err(FsError::Invalid("not a regular file").into()),
            }
            let len = len.min(source.attr.size.saturating_sub(from_offset));
            if len == 0 {
                // Nothing to copy: still checks the destination, changes nothing.
                return match st.inode(to)?.attr.kind {
                    FileKind::File => Ok(0),
                    FileKind::Dir => Err(FsError::IsDir.into()),
                    _ => Err(FsError::Invalid("not a regular file").into()),
                };
            }
            // Read under the lock, so the copy is of one state of the source.
            let mut bytes = vec![0u8; usize::try_from(len).map_err(|_| FsError::FileTooBig)?];
            let (first, last) = (from_offset / bs, (from_offset + len - 1) / bs);
            let blocks: Vec<_> =
                source.blocks.range(first..=last).map(|(&b, block)| (b, block.clone())).collect();
            cx.need(from, &blocks)?;
            for (b, block) in blocks {
                let data = cx.block_bytes(from, b, &block)?;
                let (bstart, bend) = (b * bs, (b + 1) * bs);
                let (lo, hi) = (from_offset.max(bstart), (from_offset + len).min(bend));
                bytes[(lo - from_offset) as usize..(hi - from_offset) as usize]
                    .copy_from_slice(&data[(lo - bstart) as usize..(hi - bstart) as usize]);
            }
            self.write_part(st, cx, to, to_offset, &bytes, &super::data::Whole::default())?;
            Ok(len)
        })
    }
}

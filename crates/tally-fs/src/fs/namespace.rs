//! Names: create, link, unlink, rmdir, rename, and the pins of open files.

use crate::mutant::FsMutant;
use crate::state::{fresh_attr, Dentry, Inode, Key, State};
use crate::txn::{Cx, OpResult};
use crate::types::*;
use crate::{FsError, Result};

use super::{lock, touch_times, Fs, Txn};

/// What a new inode is made of.
struct Node<'a> {
    kind: FileKind,
    perm: u16,
    rdev: u64,
    target: &'a [u8],
    owner: Owner,
}

fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > NAME_MAX {
        return Err(FsError::NameTooLong);
    }
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return Err(FsError::Invalid("illegal name"));
    }
    if name == b"." || name == b".." {
        return Err(FsError::Invalid("`.` and `..` cannot be created, removed or renamed"));
    }
    Ok(())
}

impl Fs {
    fn make_node(
        &self,
        txn: Option<&Txn>,
        parent: Ino,
        name: &[u8],
        node: Node<'_>,
    ) -> Result<Attr> {
        let Node { kind, perm, rdev, target, owner } = node;
        check_name(name)?;
        if target.len() > SYMLINK_MAX {
            return Err(FsError::NameTooLong);
        }
        self.op(txn, parent, true, |st, cx| {
            let pdir = st.inode(parent)?;
            let Some(dir) = &pdir.dir else { return Err(FsError::NotDir.into()) };
            if dir.entries().contains_key(name) {
                return Err(FsError::Exists.into());
            }
            if kind == FileKind::Dir && pdir.attr.nlink >= LINK_MAX {
                return Err(FsError::TooManyLinks.into());
            }
            let psgid = pdir.attr.perm & 0o2000 != 0;
            let pgid = pdir.attr.gid;
            let now = Timespec::now();
            cx.dentry(st, parent, name)?;
            cx.dir_attr(st, parent)?;
            let ino = st.next_ino;
            st.next_ino += 1;
            cx.inode(st, ino)?;
            let mut attr = fresh_attr(ino, kind, perm, owner.uid, owner.gid, now);
            if psgid {
                attr.gid = pgid;
                if kind == FileKind::Dir {
                    attr.perm |= 0o2000;
                }
            }
            attr.rdev = rdev;
            if kind == FileKind::Symlink {
                attr.size = target.len() as u64;
            }
            st.inodes.insert(ino, Box::new(Inode::new(attr, target.to_vec(), parent)));
            let dir = st.dir_mut(parent)?;
            let cookie = dir.next_cookie;
            dir.insert(name.to_vec(), Dentry { ino, kind, cookie, ver: 0 });
            let p = st.inode_mut(parent)?;
            touch_times(&mut p.attr, now);
            if kind == FileKind::Dir {
                p.attr.nlink += 1;
            }
            Ok(attr)
        })
    }

    /// Create a regular file.
    ///
    /// # Errors
    /// `EEXIST`, `ENOENT`, `ENOTDIR`, `ENAMETOOLONG`, `EINVAL`, `ENOSPC`, `EBUSY`.
    pub fn create(
        &self,
        txn: Option<&Txn>,
        parent: Ino,
        name: &[u8],
        perm: u16,
        owner: Owner,
    ) -> Result<Attr> {
        self.make_node(
            txn,
            parent,
            name,
            Node { kind: FileKind::File, perm, rdev: 0, target: &[], owner },
        )
    }

    /// Create a directory.
    ///
    /// # Errors
    /// As [`Fs::create`], and `EMLINK`.
    pub fn mkdir(
        &self,
        txn: Option<&Txn>,
        parent: Ino,
        name: &[u8],
        perm: u16,
        owner: Owner,
    ) -> Result<Attr> {
        self.make_node(
            txn,
            parent,
            name,
            Node { kind: FileKind::Dir, perm, rdev: 0, target: &[], owner },
        )
    }

    /// Create a special file (fifo, socket, device node) or a regular file.
    ///
    /// # Errors
    /// As [`Fs::create`]; `EINVAL` for a directory or symlink kind.
    #[allow(clippy::too_many_arguments)]
    pub fn mknod(
        &self,
        txn: Option<&Txn>,
        parent: Ino,
        name: &[u8],
        kind: FileKind,
        perm: u16,
        rdev: u64,
        owner: Owner,
    ) -> Result<Attr> {
        if matches!(kind, FileKind::Dir | FileKind::Symlink) {
            return Err(FsError::Invalid("mknod makes files, fifos, sockets and device nodes"));
        }
        self.make_node(txn, parent, name, Node { kind, perm, rdev, target: &[], owner })
    }

    /// Create a symbolic link.
    ///
    /// # Errors
    /// As [`Fs::create`]; `ENAMETOOLONG` for a target over 4095 bytes, `ENOENT` for an empty one.
    pub fn symlink(
        &self,
        txn: Option<&Txn>,
        parent: Ino,
        name: &[u8],
        target: &[u8],
        owner: Owner,
    ) -> Result<Attr> {
        if target.is_empty() {
            return Err(FsError::NotFound);
        }
        self.make_node(
            txn,
            parent,
            name,
            Node { kind: FileKind::Symlink, perm: 0o777, rdev: 0, target, owner },
        )
    }

    /// Add a hard link `name` in `parent` to `ino`.
    ///
    /// # Errors
    /// `EPERM` for a directory, `EMLINK`, `EEXIST`, `ENOENT`, `ENOTDIR`, `ENOSPC`, `EBUSY`.
    pub fn link(&self, txn: Option<&Txn>, ino: Ino, parent: Ino, name: &[u8]) -> Result<Attr> {
        check_name(name)?;
        self.op(txn, parent, true, |st, cx| {
            let target = st.inode(ino)?.attr;
            if target.kind == FileKind::Dir {
                return Err(FsError::NotPermitted.into());
            }
            if target.nlink >= LINK_MAX {
                return Err(FsError::TooManyLinks.into());
            }
            if st.dir(parent)?.entries().contains_key(name) {
                return Err(FsError::Exists.into());
            }
            let now = Timespec::now();
            cx.dentry(st, parent, name)?;
            cx.dir_attr(st, parent)?;
            cx.inode(st, ino)?;
            let dir = st.dir_mut(parent)?;
            let cookie = dir.next_cookie;
            dir.insert(name.to_vec(), Dentry { ino, kind: target.kind, cookie, ver: 0 });
            touch_times(&mut st.inode_mut(parent)?.attr, now);
            let i = st.inode_mut(ino)?;
            i.attr.nlink += 1;
            i.attr.ctime = now;
            Ok(i.attr)
        })
    }

    /// Drop one link to `child` (already removed from its directory); free it at zero.
    /// A file still open (pinned) at its last unlink stays, with no links, until released:
    /// an orphan. Directories go at once.
    pub(crate) fn drop_link(
        st: &mut State,
        cx: &mut Cx,
        child: Ino,
        now: Timespec,
    ) -> OpResult<()> {
        cx.inode(st, child)?;
        let pinned = st.pins.get(&child).is_some_and(|&n| n > 0);
        let c = st.inode_mut(child)?;
        c.attr.nlink = c.attr.nlink.saturating_sub(1);
        c.attr.ctime = now;
        let is_dir = c.dir.is_some();
        if is_dir || (c.attr.nlink == 0 && !pinned) {
            cx.free(st, child)?;
        }
        Ok(())
    }

    /// Pin `ino` while a handle to it is open (FUSE `open`/`opendir`): unlinking its last
    /// name keeps it readable and writable until [`Fs::release`].
    ///
    /// # Errors
    /// `ENOENT`.
    pub fn open(&self, ino: Ino) -> Result<()> {
        let mut st = lock(&self.state)?;
        st.inode(ino)?;
        *st.pins.entry(ino).or_default() += 1;
        Ok(())
    }

    /// Drop a pin taken by [`Fs::open`]; the last release of a file without links frees it (one
    /// transaction). Orphans left by a crash are freed at the next mount.
    ///
    /// # Errors
    /// As the free's commit (out of space, I/O).
    pub fn release(&self, ino: Ino) -> Result<()> {
        {
            let mut st = lock(&self.state)?;
            match st.pins.get_mut(&ino) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    return Ok(());
                }
                Some(_) => {
                    st.pins.remove(&ino);
                }
                None => return Ok(()),
            }
        }
        self.free_orphan(ino)
    }

    /// Free `ino` if it is a file without links and without pins.
    pub(crate) fn free_orphan(&self, ino: Ino) -> Result<()> {
        self.op(None, ino, false, |st, cx| {
            let orphan = st.inodes.get(&ino).is_some_and(|i| i.attr.nlink == 0 && i.dir.is_none());
            if orphan && !st.pins.contains_key(&ino) {
                cx.free(st, ino)?;
            }
            Ok(())
        })
    }

    /// Remove a non-directory entry.
    ///
    /// # Errors
    /// `ENOENT`, `EISDIR`, `ENOTDIR`, `EBUSY`.
    pub fn unlink(&self, txn: Option<&Txn>, parent: Ino, name: &[u8]) -> Result<()> {
        check_name(name)?;
        self.op(txn, parent, false, |st, cx| {
            let d = st.dir(parent)?.entries().get(name).cloned().ok_or(FsError::NotFound)?;
            if d.kind == FileKind::Dir {
                return Err(FsError::IsDir.into());
            }
            let now = Timespec::now();
            cx.dentry(st, parent, name)?;
            cx.dir_attr(st, parent)?;
            st.dir_mut(parent)?.remove(name);
            touch_times(&mut st.inode_mut(parent)?.attr, now);
            if self.mutant == Some(FsMutant::UnlinkSplit) {
                cx.split = cx.touched.clone();
            }
            Self::drop_link(st, cx, d.ino, now)
        })
    }

    /// Remove an empty directory.
    ///
    /// # Errors
    /// `ENOENT`, `ENOTDIR`, `ENOTEMPTY`, `EBUSY`.
    pub fn rmdir(&self, txn: Option<&Txn>, parent: Ino, name: &[u8]) -> Result<()> {
        check_name(name)?;
        self.op(txn, parent, false, |st, cx| {
            let d = st.dir(parent)?.entries().get(name).cloned().ok_or(FsError::NotFound)?;
            if d.kind != FileKind::Dir {
                return Err(FsError::NotDir.into());
            }
            if !st.dir(d.ino)?.entries().is_empty() {
                return Err(FsError::NotEmpty.into());
            }
            let now = Timespec::now();
            cx.dentry(st, parent, name)?;
            cx.dir_attr(st, parent)?;
            st.dir_mut(parent)?.remove(name);
            let p = st.inode_mut(parent)?;
            touch_times(&mut p.attr, now);
            p.attr.nlink = p.attr.nlink.saturating_sub(1);
            Self::drop_link(st, cx, d.ino, now)
        })
    }

    /// Is `ino` equal to `ancestor` or inside it?
    fn within(st: &State, mut ino: Ino, ancestor: Ino) -> bool {
        for _ in 0..=st.inodes.len() {
            if ino == ancestor {
                return true;
            }
            if ino == ROOT {
                return false;
            }
            match st.inodes.get(&ino).and_then(|i| i.dir.as_ref()) {
                Some(d) => ino = d.parent,
                None => return false,
            }
        }
        false
    }

    /// Rename `name` in `parent` to `new_name` in `new_parent`, atomically (one transaction,
    /// whichever directories are involved).
    ///
    /// # Errors
    /// `ENOENT`, `EEXIST` (noreplace), `EISDIR`, `ENOTDIR`, `ENOTEMPTY`, `EINVAL` (a
    /// directory into its own subtree, bad flags), `EBUSY`.
    pub fn rename(
        &self,
        txn: Option<&Txn>,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        check_name(name)?;
        check_name(new_name)?;
        if flags.noreplace && flags.exchange {
            return Err(FsError::Invalid("RENAME_NOREPLACE with RENAME_EXCHANGE"));
        }
        let at = RenameAt { parent, name, new_parent, new_name };
        self.op(txn, parent, false, |st, cx| {
            let src = st.dir(parent)?.entries().get(name).cloned().ok_or(FsError::NotFound)?;
            let dst = st.dir(new_parent)?.entries().get(new_name).cloned();
            if Self::rename_allowed(st, cx, &at, &src, dst.as_ref(), flags)? == Allowed::Nothing {
                return Ok(());
            }
            let now = Timespec::now();
            cx.dentry(st, parent, name)?;
            cx.dentry(st, new_parent, new_name)?;
            cx.dir_attr(st, parent)?;
            cx.dir_attr(st, new_parent)?;
            cx.inode(st, src.ino)?;
            if self.mutant == Some(FsMutant::RenameSplit) {
                cx.split = [Key::Dentry(parent, name.to_vec()), Key::Inode(parent)].into();
            }
            match dst {
                Some(dst) if flags.exchange => {
                    Self::exchange_entries(st, cx, &at, &src, &dst, now)?
                }
                dst => Self::move_entry(st, cx, &at, &src, dst.as_ref(), now)?,
            }
            st.inode_mut(src.ino)?.attr.ctime = now;
            touch_times(&mut st.inode_mut(parent)?.attr, now);
            touch_times(&mut st.inode_mut(new_parent)?.attr, now);
            Ok(())
        })
    }

    /// Step 1 of [`Fs::rename`]: whether the rename of `src` onto `dst` (the entry at the new
    /// name, if any) may happen — the errors POSIX gives, in its order — or changes nothing
    /// (two names of one inode, once neither is held by an open transaction).
    fn rename_allowed(
        st: &State,
        cx: &mut Cx,
        at: &RenameAt<'_>,
        src: &Dentry,
        dst: Option<&Dentry>,
        flags: RenameFlags,
    ) -> OpResult<Allowed> {
        let &RenameAt { parent, name, new_parent, new_name } = at;
        if src.kind == FileKind::Dir && Self::within(st, new_parent, src.ino) {
            return Err(FsError::Invalid("a directory cannot move into its own subtree").into());
        }
        let Some(dst) = dst else {
            return if flags.exchange { Err(FsError::NotFound.into()) } else { Ok(Allowed::Yes) };
        };
        if flags.noreplace {
            return Err(FsError::Exists.into());
        }
        if flags.exchange && dst.kind == FileKind::Dir && Self::within(st, parent, dst.ino) {
            return Err(FsError::Invalid("a directory cannot move into its own subtree").into());
        }
        if dst.ino == src.ino && !flags.exchange {
            // Two links to one inode: nothing to do, as POSIX has it — once neither name
            // is held by an open transaction, whose abort could remove it and leave
            // this `Ok` a rename that never happened.
            cx.unheld(st, &Key::Dentry(parent, name.to_vec()))?;
            cx.unheld(st, &Key::Dentry(new_parent, new_name.to_vec()))?;
            return Ok(Allowed::Nothing);
        }
        if !flags.exchange {
            match (src.kind == FileKind::Dir, dst.kind == FileKind::Dir) {
                (true, false) => return Err(FsError::NotDir.into()),
                (false, true) => return Err(FsError::IsDir.into()),
                (true, true) if !st.dir(dst.ino)?.entries().is_empty() => {
                    return Err(FsError::NotEmpty.into())
                }
                _ => {}
            }
        }
        Ok(Allowed::Yes)
    }

    /// Step 2 of [`Fs::rename`] with `RENAME_EXCHANGE`: the two entries swap places (new
    /// cookies in both directories), and a directory among them changes parent.
    fn exchange_entries(
        st: &mut State,
        cx: &mut Cx,
        at: &RenameAt<'_>,
        src: &Dentry,
        dst: &Dentry,
        now: Timespec,
    ) -> OpResult<()> {
        let &RenameAt { parent, name, new_parent, new_name } = at;
        cx.inode(st, dst.ino)?;
        let c1 = st.dir_mut(new_parent)?.next_cookie;
        st.dir_mut(new_parent)?
            .insert(new_name.to_vec(), Dentry { cookie: c1, ver: 0, ..src.clone() });
        let c2 = st.dir_mut(parent)?.next_cookie;
        st.dir_mut(parent)?.insert(name.to_vec(), Dentry { cookie: c2, ver: 0, ..dst.clone() });
        if src.kind == FileKind::Dir {
            Self::moved_dir(st, cx, src.ino, parent, new_parent)?;
        }
        if dst.kind == FileKind::Dir {
            Self::moved_dir(st, cx, dst.ino, new_parent, parent)?;
        }
        st.inode_mut(dst.ino)?.attr.ctime = now;
        Ok(())
    }

    /// Step 2 of [`Fs::rename`] without `RENAME_EXCHANGE`: `dst`, if any, loses its link (a
    /// directory also its `..` link to the new parent), and `src` moves to the new name.
    fn move_entry(
        st: &mut State,
        cx: &mut Cx,
        at: &RenameAt<'_>,
        src: &Dentry,
        dst: Option<&Dentry>,
        now: Timespec,
    ) -> OpResult<()> {
        let &RenameAt { parent, name, new_parent, new_name } = at;
        if let Some(dst) = dst {
            st.dir_mut(new_parent)?.remove(new_name);
            if dst.kind == FileKind::Dir {
                let np = st.inode_mut(new_parent)?;
                np.attr.nlink = np.attr.nlink.saturating_sub(1);
            }
            Self::drop_link(st, cx, dst.ino, now)?;
        }
        st.dir_mut(parent)?.remove(name);
        let cookie = st.dir_mut(new_parent)?.next_cookie;
        st.dir_mut(new_parent)?.insert(new_name.to_vec(), Dentry { cookie, ver: 0, ..src.clone() });
        if src.kind == FileKind::Dir {
            Self::moved_dir(st, cx, src.ino, parent, new_parent)?;
        }
        Ok(())
    }

    /// Directory `ino` moved from `from` to `to`: its `..` and the parents' link counts follow.
    fn moved_dir(st: &mut State, cx: &mut Cx, ino: Ino, from: Ino, to: Ino) -> OpResult<()> {
        if from != to {
            cx.parent(st, ino)?;
            st.dir_mut(ino)?.parent = to;
            let f = st.inode_mut(from)?;
            f.attr.nlink = f.attr.nlink.saturating_sub(1);
            st.inode_mut(to)?.attr.nlink += 1;
        }
        Ok(())
    }
}

/// The two names of a rename.
struct RenameAt<'a> {
    parent: Ino,
    name: &'a [u8],
    new_parent: Ino,
    new_name: &'a [u8],
}

/// What [`Fs::rename_allowed`] found.
#[derive(Debug, PartialEq, Eq)]
enum Allowed {
    /// The rename goes ahead.
    Yes,
    /// It changes nothing (two names of one inode): `Ok` at once.
    Nothing,
}

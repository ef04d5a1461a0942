//! The `/dev/fuse` transport: fuser's `Filesystem` handlers, each a call of one operation of
//! [`TallyFuse`] and the fuser reply for its typed answer. Nothing else happens here.
//!
//! With FUSE over io_uring serving (`ring/`), this loop still receives what the kernel never
//! sends over the ring: `INIT` (before the ring exists), `FORGET`/`BATCH_FORGET` and
//! `INTERRUPT`, and any request sent before every ring queue had entries.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    Errno, FileHandle, Filesystem, Generation, INodeNo, IoctlFlags, KernelConfig, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
    Request, TimeOrNow, WriteFlags,
};

use super::{AttrOut, Caller, Entry, SetattrIn, TallyFuse, XattrOut};

/// The ring transport's threads, joined before the file system is unmounted (a request they
/// still serve holds it).
pub(crate) type RingThreads = Arc<Mutex<Vec<JoinHandle<()>>>>;

/// What fuser's session owns: the shared operations and the ring threads to wait for.
pub(crate) struct FuserGlue {
    pub(crate) ops: Arc<TallyFuse>,
    pub(crate) ring_threads: RingThreads,
}

/// How long the `/dev/fuse` thread stays awake after resting from forgets before the next
/// forget makes it rest again: far more than a batch's nodes take, far less than the rest.
const FORGET_AWAKE_MAX: Duration = Duration::from_micros(100);

/// How long unmount waits for the ring threads to end.
const RING_JOIN_WAIT: Duration = Duration::from_secs(10);

impl FuserGlue {
    /// With the ring serving, pause this (then only) `/dev/fuse` thread after forgets, so the
    /// next ones queue without waking it and arrive together (`crate::ring::FORGET_REST`).
    /// fuser hands a `BATCH_FORGET` over one node at a time (its batch type is private), so
    /// the thread rests once per batch: not again within [`FORGET_AWAKE_MAX`] of its last rest.
    fn rest_after_forgets(&self) {
        thread_local! {
            static RESTED: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
        }
        if !self.ops.ring_accepted() {
            return;
        }
        let due = RESTED.get().is_none_or(|end| end.elapsed() >= FORGET_AWAKE_MAX);
        if due {
            std::thread::sleep(crate::ring::FORGET_REST);
            RESTED.set(Some(Instant::now()));
        }
    }
}

fn caller(req: &Request) -> Caller {
    Caller { uid: req.uid(), gid: req.gid(), pid: req.pid() }
}

fn reply_entry(reply: ReplyEntry, r: Result<Entry, Errno>) {
    match r {
        Ok(e) => reply.entry_with_ttls(&e.attr_ttl, &e.entry_ttl, &e.attr, Generation(0)),
        Err(e) => reply.error(e),
    }
}

fn reply_attr(reply: ReplyAttr, r: Result<AttrOut, Errno>) {
    match r {
        Ok(a) => reply.attr(&a.ttl, &a.attr),
        Err(e) => reply.error(e),
    }
}

fn reply_empty(reply: ReplyEmpty, r: Result<(), Errno>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

fn reply_data(reply: ReplyData, r: Result<Vec<u8>, Errno>) {
    match r {
        Ok(data) => reply.data(&data),
        Err(e) => reply.error(e),
    }
}

fn reply_xattr(reply: ReplyXattr, r: Result<XattrOut, Errno>) {
    match r {
        Ok(XattrOut::Size(n)) => reply.size(n),
        Ok(XattrOut::Data(d)) => reply.data(&d),
        Err(e) => reply.error(e),
    }
}

fn reply_written(reply: ReplyWrite, r: Result<u32, Errno>) {
    match r {
        Ok(n) => reply.written(n),
        Err(e) => reply.error(e),
    }
}

impl Filesystem for FuserGlue {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        self.ops.init(config);
        Ok(())
    }

    fn destroy(&mut self) {
        // Ring threads end when the kernel tears the ring down, which it has by now (the
        // connection is gone): wait for them, so none still holds the file system.
        // Bounded: a thread that never ends (a kernel that does not end its entries) must not
        // keep the file system from being unmounted; it holds it only inside a request.
        let threads =
            std::mem::take(&mut *self.ring_threads.lock().unwrap_or_else(PoisonError::into_inner));
        let deadline = Instant::now() + RING_JOIN_WAIT;
        for t in threads {
            while !t.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if !t.is_finished() {
                tracing::error!("a ring thread still runs at unmount; not waiting for it");
            } else if t.join().is_err() {
                tracing::error!("a ring thread panicked");
            }
        }
        self.ops.destroy();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEntry) {
        reply_entry(reply, self.ops.lookup(parent.0, n.as_bytes()));
    }

    fn forget(&self, _req: &Request, ino: INodeNo, _nlookup: u64) {
        self.ops.forget(ino.0);
        self.rest_after_forgets();
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        reply_attr(reply, self.ops.getattr(ino.0));
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = SetattrIn { mode, uid, gid, size, atime, mtime, ctime, fh };
        reply_attr(reply, self.ops.setattr(caller(req), ino.0, &set));
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        reply_data(reply, self.ops.readlink(ino.0));
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        reply_entry(reply, self.ops.mknod(caller(req), parent.0, n.as_bytes(), mode, rdev));
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        reply_entry(reply, self.ops.mkdir(caller(req), parent.0, n.as_bytes(), mode));
    }

    fn unlink(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.ops.unlink(caller(req), parent.0, n.as_bytes()));
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.ops.rmdir(caller(req), parent.0, n.as_bytes()));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let target = target.as_os_str().as_bytes();
        reply_entry(reply, self.ops.symlink(caller(req), parent.0, link_name.as_bytes(), target));
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (name, newname) = (n.as_bytes(), newname.as_bytes());
        reply_empty(
            reply,
            self.ops.rename(caller(req), parent.0, name, newparent.0, newname, flags),
        );
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply_entry(reply, self.ops.link(caller(req), ino.0, newparent.0, newname.as_bytes()));
    }

    fn open(&self, _req: &Request, ino: INodeNo, open_flags: OpenFlags, reply: ReplyOpen) {
        match self.ops.open(ino.0, open_flags.0) {
            Ok(o) => reply.opened(o.fh, o.flags),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        reply_data(reply, self.ops.read(ino.0, offset, size));
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        reply_written(reply, self.ops.write(caller(req), ino.0, fh, offset, data, kill));
    }

    fn flush(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.ops.flush(caller(req), fh));
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.ops.release(ino.0, fh));
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.ops.fsync(ino.0, datasync));
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.ops.opendir(ino.0) {
            Ok(o) => reply.opened(o.fh, o.flags),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        // fuser does not pass the kernel's buffer size on: a page of at most what a
        // 128 KiB buffer holds, so each request's cost stays bounded by a page.
        match self.ops.readdir(ino.0, offset, 4096) {
            Ok(entries) => {
                for e in entries {
                    if reply.add(INodeNo(e.ino), e.offset, e.kind, OsStr::from_bytes(&e.name)) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        // As readdir: at most what a 160 KiB buffer holds.
        match self.ops.readdirplus(ino.0, offset, 1024) {
            Ok(entries) => {
                for (d, e) in entries {
                    let name = OsStr::from_bytes(&d.name);
                    // One timeout for the entry and the attributes here (both the same).
                    if reply.add(
                        INodeNo(d.ino),
                        d.offset,
                        name,
                        &e.entry_ttl,
                        &e.attr,
                        Generation(0),
                    ) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.ops.releasedir(ino.0, fh));
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.ops.fsyncdir(ino.0));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.ops.statfs() {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        n: &OsStr,
        value: &[u8],
        flags: i32,
        position: u32,
        reply: ReplyEmpty,
    ) {
        let r = self.ops.setxattr(caller(req), ino.0, n.as_bytes(), value, flags, position);
        reply_empty(reply, r);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, n: &OsStr, size: u32, reply: ReplyXattr) {
        reply_xattr(reply, self.ops.getxattr(ino.0, n.as_bytes(), size));
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        reply_xattr(reply, self.ops.listxattr(ino.0, size));
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.ops.removexattr(caller(req), ino.0, n.as_bytes()));
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply_empty(reply, self.ops.access(ino.0));
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        _umask: u32,
        open_flags: i32,
        reply: ReplyCreate,
    ) {
        match self.ops.create(caller(req), parent.0, n.as_bytes(), mode, open_flags) {
            Ok((e, o)) => reply.created(&e.entry_ttl, &e.attr, Generation(0), o.fh, o.flags),
            Err(e) => reply.error(e),
        }
    }

    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        _in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        match self.ops.ioctl(caller(req), ino.0, fh, cmd, out_size) {
            Ok(data) => reply.ioctl(0, &data),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.ops.fallocate(caller(req), ino.0, fh, offset, length, mode));
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: i64,
        _whence: i32,
        reply: ReplyLseek,
    ) {
        match self.ops.lseek() {
            Ok(at) => reply.offset(at),
            Err(e) => reply.error(e),
        }
    }

    fn copy_file_range(
        &self,
        req: &Request,
        ino_in: INodeNo,
        _fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: fuser::CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let r = self.ops.copy_file_range(
            caller(req),
            ino_in.0,
            offset_in,
            ino_out.0,
            offset_out,
            len,
            flags.bits(),
        );
        reply_written(reply, r);
    }

    fn poll(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _ph: fuser::PollNotifier,
        events: fuser::PollEvents,
        _flags: fuser::PollFlags,
        reply: fuser::ReplyPoll,
    ) {
        match self.ops.poll(ino.0, events.bits()) {
            Ok(ready) => reply.poll(fuser::PollEvents::from_bits_truncate(ready)),
            Err(e) => reply.error(e),
        }
    }
}

//! Counts of the kernel's requests, by opcode, since the mount: what a workload costs in round
//! trips. The adapter counts each request as its handler starts; the daemon logs the counts at
//! unmount and on `SIGUSR1` ([`crate::Mounted::unmount_on_signals`]), and tests read them
//! through [`crate::Mounted::requests`].
//!
//! Invariants:
//! - one relaxed atomic add per request, nothing else (no lock, no allocation);
//! - every request an operation of the adapter receives is counted once, under the kernel's
//!   name for its opcode, whichever transport brought it; those the ring brought are counted
//!   once more, apart ([`RequestCounts::ring`]). fuser answers `INIT`, `DESTROY`, `INTERRUPT` and opcodes it does not know
//!   itself: those are not counted (a handful per mount; the kernel stops sending an opcode
//!   answered `ENOSYS`).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// A kind of request, named as the kernel names its opcode (`FUSE_LOOKUP` is `LOOKUP`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Opcode {
    Lookup,
    /// One per inode the kernel forgets, sent alone or in a `BATCH_FORGET` (fuser hands the
    /// adapter each inode of a batch separately).
    Forget,
    Getattr,
    Setattr,
    Readlink,
    Symlink,
    Mknod,
    Mkdir,
    Unlink,
    Rmdir,
    /// `RENAME` and `RENAME2` (fuser serves both with one handler).
    Rename,
    Link,
    Open,
    Read,
    Write,
    Statfs,
    Release,
    Fsync,
    Setxattr,
    Getxattr,
    Listxattr,
    Removexattr,
    Flush,
    Opendir,
    Readdir,
    Readdirplus,
    Releasedir,
    Fsyncdir,
    Access,
    Create,
    Ioctl,
    Fallocate,
    Lseek,
    CopyFileRange,
    Poll,
    /// `SYNCFS` (opcode 50): Linux sends it only to servers that may stall `sync(2)` (virtiofs;
    /// up to at least 6.18 never over `/dev/fuse`); answered on the ring, counted if it comes.
    Syncfs,
    /// `IOCTL` `TALLY_IOC_SYNC` (`tally sync`): the mount-wide sync the kernel does not send.
    SyncIoctl,
    /// An `IOCTL` carrying F2FS's `F2FS_IOC_GET_FEATURES` (counted here, not under `Ioctl`;
    /// so are the three below): SQLite asks it of each database file it opens.
    F2fsGetFeatures,
    /// `IOCTL` `F2FS_IOC_START_ATOMIC_WRITE`: one per batch-atomic SQLite commit.
    F2fsStartAtomicWrite,
    /// `IOCTL` `F2FS_IOC_COMMIT_ATOMIC_WRITE`.
    F2fsCommitAtomicWrite,
    /// `IOCTL` `F2FS_IOC_ABORT_VOLATILE_WRITE`.
    F2fsAbortAtomicWrite,
}

/// Number of [`Opcode`]s.
const OPCODE_COUNT: usize = 41;

impl Opcode {
    /// Every opcode, in the order counts are reported.
    pub const ALL: [Opcode; OPCODE_COUNT] = [
        Opcode::Lookup,
        Opcode::Forget,
        Opcode::Getattr,
        Opcode::Setattr,
        Opcode::Readlink,
        Opcode::Symlink,
        Opcode::Mknod,
        Opcode::Mkdir,
        Opcode::Unlink,
        Opcode::Rmdir,
        Opcode::Rename,
        Opcode::Link,
        Opcode::Open,
        Opcode::Read,
        Opcode::Write,
        Opcode::Statfs,
        Opcode::Release,
        Opcode::Fsync,
        Opcode::Setxattr,
        Opcode::Getxattr,
        Opcode::Listxattr,
        Opcode::Removexattr,
        Opcode::Flush,
        Opcode::Opendir,
        Opcode::Readdir,
        Opcode::Readdirplus,
        Opcode::Releasedir,
        Opcode::Fsyncdir,
        Opcode::Access,
        Opcode::Create,
        Opcode::Ioctl,
        Opcode::Fallocate,
        Opcode::Lseek,
        Opcode::CopyFileRange,
        Opcode::Poll,
        Opcode::Syncfs,
        Opcode::SyncIoctl,
        Opcode::F2fsGetFeatures,
        Opcode::F2fsStartAtomicWrite,
        Opcode::F2fsCommitAtomicWrite,
        Opcode::F2fsAbortAtomicWrite,
    ];

    /// The kernel's name, without `FUSE_` (an F2FS ioctl: `IOCTL(` its name `)`).
    pub fn name(self) -> &'static str {
        match self {
            Opcode::Lookup => "LOOKUP",
            Opcode::Forget => "FORGET",
            Opcode::Getattr => "GETATTR",
            Opcode::Setattr => "SETATTR",
            Opcode::Readlink => "READLINK",
            Opcode::Symlink => "SYMLINK",
            Opcode::Mknod => "MKNOD",
            Opcode::Mkdir => "MKDIR",
            Opcode::Unlink => "UNLINK",
            Opcode::Rmdir => "RMDIR",
            Opcode::Rename => "RENAME",
            Opcode::Link => "LINK",
            Opcode::Open => "OPEN",
            Opcode::Read => "READ",
            Opcode::Write => "WRITE",
            Opcode::Statfs => "STATFS",
            Opcode::Release => "RELEASE",
            Opcode::Fsync => "FSYNC",
            Opcode::Setxattr => "SETXATTR",
            Opcode::Getxattr => "GETXATTR",
            Opcode::Listxattr => "LISTXATTR",
            Opcode::Removexattr => "REMOVEXATTR",
            Opcode::Flush => "FLUSH",
            Opcode::Opendir => "OPENDIR",
            Opcode::Readdir => "READDIR",
            Opcode::Readdirplus => "READDIRPLUS",
            Opcode::Releasedir => "RELEASEDIR",
            Opcode::Fsyncdir => "FSYNCDIR",
            Opcode::Access => "ACCESS",
            Opcode::Create => "CREATE",
            Opcode::Ioctl => "IOCTL",
            Opcode::Fallocate => "FALLOCATE",
            Opcode::Lseek => "LSEEK",
            Opcode::CopyFileRange => "COPY_FILE_RANGE",
            Opcode::Poll => "POLL",
            Opcode::Syncfs => "SYNCFS",
            Opcode::SyncIoctl => "IOCTL(TALLY_SYNC)",
            Opcode::F2fsGetFeatures => "IOCTL(F2FS_GET_FEATURES)",
            Opcode::F2fsStartAtomicWrite => "IOCTL(F2FS_START_ATOMIC_WRITE)",
            Opcode::F2fsCommitAtomicWrite => "IOCTL(F2FS_COMMIT_ATOMIC_WRITE)",
            Opcode::F2fsAbortAtomicWrite => "IOCTL(F2FS_ABORT_ATOMIC_WRITE)",
        }
    }

    fn index(self) -> usize {
        // `ALL` lists the variants in declaration order (checked by a test).
        self as usize
    }
}

/// Requests received since the mount, by opcode.
#[derive(Debug)]
pub struct RequestCounts {
    counts: [AtomicU64; OPCODE_COUNT],
    /// Of those, the requests that came over FUSE over io_uring (`ring.rs`).
    ring: AtomicU64,
}

impl Default for RequestCounts {
    fn default() -> Self {
        RequestCounts {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            ring: AtomicU64::new(0),
        }
    }
}

impl RequestCounts {
    /// Count one request.
    pub(crate) fn count(&self, op: Opcode) {
        self.counts[op.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Count one request that came over the ring (besides its opcode). Every request the
    /// ring delivers counts, `DESTROY`, malformed requests and opcodes the adapter does not
    /// serve included.
    pub(crate) fn count_ring(&self) {
        self.ring.fetch_add(1, Ordering::Relaxed);
    }

    /// Requests of kind `op` so far.
    pub fn get(&self, op: Opcode) -> u64 {
        self.counts[op.index()].load(Ordering::Relaxed)
    }

    /// Requests that came over FUSE over io_uring so far (the rest came through `/dev/fuse`).
    pub fn ring(&self) -> u64 {
        self.ring.load(Ordering::Relaxed)
    }

    /// The counts now, every opcode included.
    pub fn snapshot(&self) -> RequestSnapshot {
        RequestSnapshot { counts: Opcode::ALL.map(|op| (op, self.get(op))), ring: self.ring() }
    }
}

/// The counts at one moment. Displays as `total N: LOOKUP a, GETATTR b, …` (opcodes with a
/// count of 0 left out), the line the daemon logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestSnapshot {
    counts: [(Opcode, u64); OPCODE_COUNT],
    ring: u64,
}

impl RequestSnapshot {
    /// Requests of kind `op`.
    pub fn get(&self, op: Opcode) -> u64 {
        self.counts[op.index()].1
    }

    /// Requests that came over FUSE over io_uring.
    pub fn ring(&self) -> u64 {
        self.ring
    }

    /// All requests.
    pub fn total(&self) -> u64 {
        self.counts.iter().map(|&(_, n)| n).sum()
    }

    /// Requests since `earlier` (a snapshot of the same counts taken before).
    #[must_use]
    pub fn since(&self, earlier: &RequestSnapshot) -> RequestSnapshot {
        let mut counts = self.counts;
        for (now, then) in counts.iter_mut().zip(earlier.counts.iter()) {
            now.1 = now.1.saturating_sub(then.1);
        }
        RequestSnapshot { counts, ring: self.ring.saturating_sub(earlier.ring) }
    }
}

impl fmt::Display for RequestSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "total {}", self.total())?;
        if self.ring > 0 {
            write!(f, " ({} over io_uring)", self.ring)?;
        }
        let mut first = true;
        for &(op, n) in self.counts.iter().filter(|(_, n)| *n > 0) {
            write!(f, "{} {} {n}", if first { ":" } else { "," }, op.name())?;
            first = false;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_lists_every_opcode_in_declaration_order() {
        for (i, op) in Opcode::ALL.iter().enumerate() {
            assert_eq!(op.index(), i, "{op:?}");
        }
        let names: std::collections::HashSet<_> = Opcode::ALL.iter().map(|o| o.name()).collect();
        assert_eq!(names.len(), OPCODE_COUNT);
    }

    #[test]
    fn counts_display_and_subtract() {
        let c = RequestCounts::default();
        assert_eq!(c.snapshot().to_string(), "total 0");
        c.count(Opcode::Lookup);
        let before = c.snapshot();
        c.count(Opcode::Lookup);
        c.count(Opcode::Write);
        c.count(Opcode::CopyFileRange);
        let now = c.snapshot();
        assert_eq!(now.to_string(), "total 4: LOOKUP 2, WRITE 1, COPY_FILE_RANGE 1");
        c.count(Opcode::Write);
        c.count_ring();
        assert_eq!(c.snapshot().since(&now).to_string(), "total 1 (1 over io_uring): WRITE 1");
        let d = now.since(&before);
        assert_eq!((d.get(Opcode::Lookup), d.get(Opcode::Write), d.total()), (1, 1, 3));
    }
}

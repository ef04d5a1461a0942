//! What a device did, counted so benchmarks can report per-transaction costs.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A snapshot of a device's counters. Subtract two snapshots to cost a piece of work.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct DeviceStats {
    /// Write requests (one per contiguous run of blocks).
    pub writes: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// Write requests issued with FUA.
    pub fua_writes: u64,
    /// Flushes (cache flush commands / fdatasync calls).
    pub flushes: u64,
    /// Read requests.
    pub reads: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// Calls to [`crate::Device::submit`].
    pub submissions: u64,
    /// System calls made to submit writes (io_uring_enter, pwritev2); 0 for simulated devices.
    pub submit_syscalls: u64,
}

impl std::ops::Sub for DeviceStats {
    type Output = DeviceStats;
    fn sub(self, o: DeviceStats) -> DeviceStats {
        DeviceStats {
            writes: self.writes - o.writes,
            bytes_written: self.bytes_written - o.bytes_written,
            fua_writes: self.fua_writes - o.fua_writes,
            flushes: self.flushes - o.flushes,
            reads: self.reads - o.reads,
            bytes_read: self.bytes_read - o.bytes_read,
            submissions: self.submissions - o.submissions,
            submit_syscalls: self.submit_syscalls - o.submit_syscalls,
        }
    }
}

/// Live counters, shared by the backends. Relaxed atomics: they are statistics, not sync.
#[derive(Debug, Default)]
pub struct Counters {
    writes: AtomicU64,
    bytes_written: AtomicU64,
    fua_writes: AtomicU64,
    flushes: AtomicU64,
    reads: AtomicU64,
    bytes_read: AtomicU64,
    submissions: AtomicU64,
    submit_syscalls: AtomicU64,
}

impl Counters {
    /// Count one write request of `bytes` bytes.
    pub fn write(&self, bytes: usize, fua: bool) {
        self.writes.fetch_add(1, Relaxed);
        self.bytes_written.fetch_add(bytes as u64, Relaxed);
        if fua {
            self.fua_writes.fetch_add(1, Relaxed);
        }
    }
    /// Count one flush.
    pub fn flush(&self) {
        self.flushes.fetch_add(1, Relaxed);
    }
    /// Count one read of `bytes` bytes.
    pub fn read(&self, bytes: usize) {
        self.reads.fetch_add(1, Relaxed);
        self.bytes_read.fetch_add(bytes as u64, Relaxed);
    }
    /// Count one `submit` call.
    pub fn submission(&self) {
        self.submissions.fetch_add(1, Relaxed);
    }
    /// Count `n` submission system calls.
    pub fn syscalls(&self, n: u64) {
        self.submit_syscalls.fetch_add(n, Relaxed);
    }
    /// Snapshot.
    #[must_use]
    pub fn snapshot(&self) -> DeviceStats {
        DeviceStats {
            writes: self.writes.load(Relaxed),
            bytes_written: self.bytes_written.load(Relaxed),
            fua_writes: self.fua_writes.load(Relaxed),
            flushes: self.flushes.load(Relaxed),
            reads: self.reads.load(Relaxed),
            bytes_read: self.bytes_read.load(Relaxed),
            submissions: self.submissions.load(Relaxed),
            submit_syscalls: self.submit_syscalls.load(Relaxed),
        }
    }
}

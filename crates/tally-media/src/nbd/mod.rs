//! `NbdDevice`: a [`Device`] on an export of a Network Block Device server (`nbdkit`,
//! `qemu-nbd`, `nbd-server`, `rbd-nbd`, ...), over TCP or a Unix socket.
//!
//! The client is written here rather than taken from a crate. On crates.io, `nbd` (0.3) calls
//! itself a first sketch: blocking, one request at a time, no structured replies; `libnbd`
//! binds Red Hat's C library, which needs a newer libnbd than Debian stable ships, links C
//! code into every Tally binary and brings tokio for its asynchronous API. Tally needs a small
//! subset (see [`wire`]) with many requests in flight, fail-stop errors and bounded waits, which
//! is a few hundred lines on `std` sockets.
//!
//! Mapping of the [`Device`] contract onto NBD:
//! - a submission's writes go out as `NBD_CMD_WRITE` requests (split at the server's maximum
//!   payload) on one connection; its ticket completes when the server has replied to all;
//! - FUA is `NBD_CMD_FLAG_FUA` where the server offers it, else a write, a wait and a flush;
//! - `flush` is `NBD_CMD_FLUSH`: the server makes durable every write it replied to before,
//!   which covers every ticket that completed before `flush` was called. With several
//!   connections (only to servers that set `NBD_FLAG_CAN_MULTI_CONN`, as the protocol asks)
//!   one flush covers the writes of all of them. A server without `NBD_FLAG_SEND_FLUSH` has
//!   no volatile cache to flush; `flush` is then a no-op;
//! - reads are synchronous `NBD_CMD_READ`s, split like writes and sent together;
//! - [`NbdDevice::trim`] sends `NBD_CMD_TRIM` where the server offers it.
//!
//! Invariants:
//! - every error is an I/O error ([`MediaError::Nbd`]): a server's error reply to a write or
//!   flush, a dropped connection, a timeout or a protocol violation fails the device
//!   (fail-stop: later writes and flushes return [`MediaError::Failed`]);
//! - no call waits longer than about the timeout for a server that stopped answering;
//! - the geometry is fixed at open: the export's size rounded down to whole blocks.

mod conn;
mod error;
mod handshake;
mod target;
mod wire;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::file::tracker::{Failure, Tracker};
use crate::{
    check_read, check_write, Counters, Device, DeviceStats, Geometry, MediaError, Result, Ticket,
    Write, WriteFlags, ATOMIC_WRITE_SIZE_DEFAULT, BLOCK_SIZE_DEFAULT,
};
use conn::{Conn, ConnSettings, Slot, Waiter};
use wire::{
    Command, CMD_FLAG_FUA, PAYLOAD_MAX, TFLAG_CAN_MULTI_CONN, TFLAG_READ_ONLY, TFLAG_SEND_FLUSH,
    TFLAG_SEND_FUA, TFLAG_SEND_TRIM,
};

pub use error::{errno_name, NbdError};
pub use handshake::{BlockSizes, ExportInfo};
pub use target::{NbdAddress, NbdTarget, NBD_PORT_DEFAULT};

/// How to open an [`NbdDevice`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NbdOptions {
    /// Block size; `None`: 4096, or the server's minimum block size if larger.
    pub block_size: Option<u32>,
    /// Bytes the server's storage writes all-or-nothing.
    pub atomic_write_size: u32,
    /// Connections to open; more than one only if the server allows it (multi-conn).
    pub connection_count: u32,
    /// Requests in flight per connection.
    pub queue_depth: u32,
    /// Longest wait for a connection, a handshake reply or a request's reply; past it the
    /// connection is closed and the device failed.
    pub timeout: Duration,
}

impl Default for NbdOptions {
    fn default() -> Self {
        NbdOptions {
            block_size: None,
            atomic_write_size: ATOMIC_WRITE_SIZE_DEFAULT,
            connection_count: 1,
            queue_depth: 64,
            timeout: Duration::from_secs(30),
        }
    }
}

/// A device on an NBD export.
pub struct NbdDevice {
    // Declared first so connections close (and their writes drain) before anything else goes.
    conns: Vec<Conn>,
    target: NbdTarget,
    export: ExportInfo,
    geometry: Geometry,
    /// Largest request payload, a whole number of blocks.
    piece_max: u32,
    next_conn: AtomicUsize,
    timeout: Duration,
    tracker: Arc<Tracker>,
    counters: Arc<Counters>,
}

fn media(op: &'static str) -> impl Fn(NbdError) -> MediaError {
    move |source| MediaError::Nbd { op, source: Box::new(source) }
}

impl NbdDevice {
    /// Open the export named by an `nbd://` or `nbd+unix://` URI.
    ///
    /// # Errors
    /// As [`NbdDevice::open`], and [`NbdError::BadUri`].
    pub fn open_uri(uri: &str, options: NbdOptions) -> Result<Self> {
        let target = NbdTarget::parse(uri).map_err(media("nbd connect"))?;
        Self::open(&target, options)
    }

    /// Connect to `target`, negotiate, and open `options.connection_count` connections (one
    /// if the server does not allow more).
    ///
    /// # Errors
    /// [`MediaError::Nbd`] when the server cannot be reached, refuses the export or breaks
    /// the handshake; [`MediaError::InvalidGeometry`] or [`MediaError::TooSmall`] when the
    /// export cannot hold Tally's blocks.
    pub fn open(target: &NbdTarget, options: NbdOptions) -> Result<Self> {
        assert!(!options.timeout.is_zero(), "an NBD device needs a timeout");
        let tracker = Arc::new(Tracker::new());
        let counters = Arc::new(Counters::default());
        let (first, export) = connect(target, &options, 0, &tracker, &counters)?;
        let minimum = export.block_sizes.map_or(1, |b| b.minimum);
        let block_size = options.block_size.unwrap_or(BLOCK_SIZE_DEFAULT.max(minimum));
        if !block_size.is_multiple_of(minimum) {
            return Err(MediaError::InvalidGeometry {
                reason: format!(
                    "block size {block_size} is not a multiple of the export's minimum block size {minimum}"
                ),
            });
        }
        let block_count = export.size_bytes / u64::from(block_size);
        if block_count == 0 {
            return Err(MediaError::TooSmall { size_bytes: export.size_bytes, block_size });
        }
        let geometry = Geometry::new(block_size, block_count, options.atomic_write_size)?;
        let payload_max = export.block_sizes.map_or(PAYLOAD_MAX, |b| b.maximum.min(PAYLOAD_MAX));
        let piece_max = payload_max / block_size * block_size;
        if piece_max == 0 {
            return Err(MediaError::InvalidGeometry {
                reason: format!(
                    "the export's maximum payload {payload_max} is below one block of {block_size}"
                ),
            });
        }
        let mut conns = vec![first];
        let wanted = options.connection_count.max(1);
        if wanted > 1 && export.flags & TFLAG_CAN_MULTI_CONN == 0 {
            tracing::warn!(%target, "the server does not allow multi-conn; using one connection");
        } else {
            for index in 1..wanted as usize {
                let (conn, again) = connect(target, &options, index, &tracker, &counters)?;
                if (again.size_bytes, again.flags) != (export.size_bytes, export.flags) {
                    let reason = format!(
                        "connection {index} saw a different export: {again:?} vs {export:?}"
                    );
                    let source = NbdError::Handshake { target: target.to_string(), reason };
                    return Err(MediaError::Nbd { op: "nbd connect", source: Box::new(source) });
                }
                conns.push(conn);
            }
        }
        tracing::debug!(%target, ?geometry, ?export, connections = conns.len(), "opened NBD device");
        Ok(NbdDevice {
            conns,
            target: target.clone(),
            export,
            geometry,
            piece_max,
            next_conn: AtomicUsize::new(0),
            timeout: options.timeout,
            tracker,
            counters,
        })
    }

    /// What the server said about the export.
    #[must_use]
    pub fn export(&self) -> &ExportInfo {
        &self.export
    }

    /// The server and export.
    #[must_use]
    pub fn target(&self) -> &NbdTarget {
        &self.target
    }

    /// Connections open.
    #[must_use]
    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }

    /// Requests sent so far on each connection, in connection order.
    #[must_use]
    pub fn requests_per_connection(&self) -> Vec<u64> {
        self.conns.iter().map(Conn::requests_sent).collect()
    }

    /// Whether the server rejects writes.
    #[must_use]
    pub fn read_only(&self) -> bool {
        self.has(TFLAG_READ_ONLY)
    }

    fn has(&self, flag: u16) -> bool {
        self.export.flags & flag != 0
    }

    fn byte_offset(&self, block: u64) -> u64 {
        // In range after check_read/check_write: the product is below the export's size.
        block * u64::from(self.geometry.block_size)
    }

    fn next_queue(&self) -> usize {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    /// How long a synchronous caller waits before giving up on a reply (a backstop: the
    /// connection's reader fails requests after the timeout).
    fn backstop(&self) -> Duration {
        self.timeout * 2 + Duration::from_secs(1)
    }

    /// Submit `writes` on connection `queue` (modulo the connection count), so a caller can
    /// keep one stream's writes on one connection, as RIO maps streams to queues.
    ///
    /// # Errors
    /// As [`Device::submit`].
    pub fn submit_on(&self, queue: usize, writes: Vec<Write>, flags: WriteFlags) -> Result<Ticket> {
        check_write(&self.geometry, &writes)?;
        if self.read_only() {
            return Err(media("nbd write")(NbdError::ReadOnly));
        }
        let piece = self.piece_max as usize;
        let request_count = writes.iter().map(|w| w.data.len().div_ceil(piece)).sum();
        let ticket = self.tracker.begin(request_count)?;
        self.counters.submission();
        let conn = &self.conns[queue % self.conns.len()];
        let fua_native = flags.fua && self.has(TFLAG_SEND_FUA);
        let command_flags = if fua_native { CMD_FLAG_FUA } else { 0 };
        let mut sent = 0usize;
        'writes: for write in &writes {
            self.counters.write(write.data.len(), flags.fua);
            let mut offset = self.byte_offset(write.block);
            for data in write.data.chunks(piece) {
                let length = u32::try_from(data.len()).unwrap_or(u32::MAX);
                let waiter = Waiter::Ticket(ticket);
                if let Err(error) =
                    conn.send(Command::Write, command_flags, offset, data, length, waiter)
                {
                    let failure = Failure::from_nbd(Command::Write.op(), &error);
                    self.tracker.fail_stop(&failure);
                    for _ in sent..request_count {
                        self.tracker.complete(ticket, Err(failure.clone()));
                    }
                    break 'writes;
                }
                sent += 1;
                offset += data.len() as u64;
            }
        }
        if flags.fua && !fua_native && self.has(TFLAG_SEND_FLUSH) {
            // No FUA on this server: the submission is durable once written and flushed.
            self.tracker.wait(ticket)?;
            self.flush()?;
        }
        Ok(ticket)
    }

    /// Tell the server that `block_count` blocks from `block` are no longer needed (they may
    /// then read as anything). Does nothing if the server does not offer `NBD_CMD_TRIM`.
    ///
    /// # Errors
    /// Out-of-range requests; the server's error, which fails the device like a failed write.
    pub fn trim(&self, block: u64, block_count: u64) -> Result<()> {
        let bytes = block_count.saturating_mul(u64::from(self.geometry.block_size));
        let length = usize::try_from(bytes).unwrap_or(usize::MAX);
        let count = crate::device::check_range(&self.geometry, block, length, "trim length")?;
        debug_assert_eq!(u64::from(count), block_count);
        self.tracker.check_alive()?;
        if !self.has(TFLAG_SEND_TRIM) || block_count == 0 {
            return Ok(());
        }
        let conn = &self.conns[self.next_queue() % self.conns.len()];
        let mut slots = Vec::new();
        let mut offset = self.byte_offset(block);
        let mut left = bytes;
        // TRIM carries no payload, but its length is 32 bits: split below 4 GiB.
        let step = u64::from(u32::MAX / self.geometry.block_size * self.geometry.block_size);
        let outcome = loop {
            if left == 0 {
                break Ok(());
            }
            let length = left.min(step);
            let slot = Slot::new();
            let sent =
                conn.send(Command::Trim, 0, offset, &[], length as u32, Waiter::Slot(slot.clone()));
            if let Err(error) = sent {
                break Err(error);
            }
            slots.push(slot);
            offset += length;
            left -= length;
        };
        let outcome = outcome
            .and_then(|()| slots.iter().try_for_each(|slot| slot.wait(self.backstop()).map(drop)));
        outcome.map_err(|error| {
            let failure = Failure::from_nbd(Command::Trim.op(), &error);
            self.tracker.fail_stop(&failure);
            failure.to_error()
        })
    }
}

fn connect(
    target: &NbdTarget,
    options: &NbdOptions,
    index: usize,
    tracker: &Arc<Tracker>,
    counters: &Arc<Counters>,
) -> Result<(Conn, ExportInfo)> {
    let to_media = media("nbd connect");
    let mut stream = target.connect(options.timeout).map_err(&to_media)?;
    let io = |error: std::io::Error| {
        to_media(NbdError::Connect { target: target.to_string(), reason: error.to_string() })
    };
    stream.set_read_timeout(Some(options.timeout)).map_err(io)?;
    stream.set_write_timeout(Some(options.timeout)).map_err(io)?;
    let export = handshake::negotiate(&mut stream, target, options.timeout).map_err(&to_media)?;
    let settings = ConnSettings {
        index,
        timeout: options.timeout,
        structured: export.structured_replies,
        queue_depth: options.queue_depth.max(1) as usize,
    };
    let conn =
        Conn::start(stream, &settings, Arc::clone(tracker), Arc::clone(counters)).map_err(io)?;
    Ok((conn, export))
}

impl Device for NbdDevice {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn read(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        check_read(&self.geometry, block, buf)?;
        self.counters.read(buf.len());
        let conn = &self.conns[self.next_queue() % self.conns.len()];
        let piece = self.piece_max as usize;
        let mut slots = Vec::with_capacity(buf.len().div_ceil(piece));
        let mut offset = self.byte_offset(block);
        for part in buf.chunks(piece) {
            let slot = Slot::new();
            let length = u32::try_from(part.len()).unwrap_or(u32::MAX);
            conn.send(Command::Read, 0, offset, &[], length, Waiter::Slot(slot.clone()))
                .map_err(media(Command::Read.op()))?;
            slots.push(slot);
            offset += part.len() as u64;
        }
        for (part, slot) in buf.chunks_mut(piece).zip(&slots) {
            let data = slot.wait(self.backstop()).map_err(|error| {
                if matches!(error, NbdError::Timeout { .. }) && conn.failure().is_none() {
                    conn.kill(error.clone());
                }
                media(Command::Read.op())(error)
            })?;
            debug_assert_eq!(data.len(), part.len(), "a read's reply covers it exactly");
            part.copy_from_slice(&data);
        }
        Ok(())
    }

    fn submit(&self, writes: Vec<Write>, flags: WriteFlags) -> Result<Ticket> {
        self.submit_on(self.next_queue(), writes, flags)
    }

    fn submit_stream(&self, stream: u16, writes: Vec<Write>, flags: WriteFlags) -> Result<Ticket> {
        // Stream i on connection i % count: a stream's writes never queue behind another's.
        self.submit_on(usize::from(stream), writes, flags)
    }

    fn wait(&self, ticket: Ticket) -> Result<()> {
        self.tracker.wait(ticket)
    }

    fn flush(&self) -> Result<()> {
        self.tracker.check_alive()?;
        self.counters.flush();
        if !self.has(TFLAG_SEND_FLUSH) {
            return Ok(());
        }
        // With one connection, or multi-conn, one flush covers every connection's writes.
        let conn = &self.conns[self.next_queue() % self.conns.len()];
        let slot = Slot::new();
        let outcome = conn
            .send(Command::Flush, 0, 0, &[], 0, Waiter::Slot(slot.clone()))
            .and_then(|()| slot.wait(self.backstop()).map(drop));
        outcome.map_err(|error| {
            // Never retried: what the server's cache held may be gone.
            let failure = Failure::from_nbd(Command::Flush.op(), &error);
            self.tracker.fail_stop(&failure);
            if matches!(error, NbdError::Timeout { .. }) {
                conn.kill(error);
            }
            failure.to_error()
        })
    }

    fn stats(&self) -> DeviceStats {
        self.counters.snapshot()
    }
}

impl Drop for NbdDevice {
    fn drop(&mut self) {
        for conn in &self.conns {
            conn.close();
        }
        let pending = self.tracker.pending_count();
        if pending > 0 {
            tracing::error!(pending, target = %self.target, "closed with tickets unfinished");
        }
    }
}

impl std::fmt::Debug for NbdDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NbdDevice")
            .field("target", &self.target.to_string())
            .field("geometry", &self.geometry)
            .field("export", &self.export)
            .field("connections", &self.conns.len())
            .finish_non_exhaustive()
    }
}

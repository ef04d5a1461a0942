//! Write-behind: an ordered commit returns once it is placed in its stream; the placed
//! transactions of a stream wait in memory, in order, and go out merged into large device
//! writes.
//!
//! A stream's buffer is written out (up to what is asked for):
//! - by a durability request (`wait_durable`, `sync`, `commit_durable`, a checkpoint,
//!   cleaning, a clean close): a flush round writes out every stream up to its cut first;
//! - when it passes [`WriteBehind::stream_bytes_max`];
//! - when all streams' buffers together pass [`WriteBehind::memory_bytes_max`] (every stream);
//! - when its oldest transaction is older than [`WriteBehind::interval`] (the flusher thread);
//! - by [`crate::Log::write_out`].
//!
//! A barrier needs no write-out: recovery keeps a prefix of each stream and the dependency
//! closure whatever order the blocks reach the media in, so buffering reorders nothing a crash
//! can show. What the buffer changes is what a crash loses: commits still in it were never
//! promised durable, and dropping the log (or a process crash) discards them.
//!
//! A placed transaction is encoded straight into its stream's buffer: the end of the last
//! batch buffer ([`Buffered`]) when it continues it on the device and fits, else a new one,
//! each new one of a stream twice the size of what the stream holds (from
//! [`CHUNK_BYTES_MIN`] up to [`WriteBehind::write_bytes_max`]). Its body is encoded there
//! too, straight into its units' payloads (`Log::units_and_data`), and each unit's zero tail
//! is written once and checksummed without being read (`UnitHeader::seal`). So a small
//! transaction costs no allocation of its own and its bytes are copied once, not again into a
//! merged write.
//!
//! Invariants:
//! - a stream's buffer holds its transactions in sequence order and is written out oldest
//!   first, by one thread at a time (`Stream::submitting`): a batch is submitted only after
//!   every earlier buffered transaction of its stream, so `written[s]` is a prefix watermark
//!   (every buffered transaction of stream `s` with seq <= it has been submitted) that a flush
//!   round may trust;
//! - a batch buffer holds consecutive transactions whose blocks are contiguous on the device,
//!   and is written out whole (a write-out up to a transaction takes the later ones sharing
//!   its buffer too: more than asked, never less, and still in order);
//! - a batch is one device submission of consecutive batch buffers, at most
//!   [`WriteBehind::write_bytes_max`] bytes unless a single buffer is larger; each buffer is
//!   one write (never copied again);
//! - a block placed but not completed is never read from the device: [`crate::Log::read`]
//!   copies it from the buffer, or waits for the write that carries it;
//! - `buffered[s]` and `buffered_total` count the bytes in the buffers; they change only under
//!   the stream's lock.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tally_media::{Device, IoBuf, MediaError, Ticket, Write, WriteFlags};

use crate::engine::{lock, Stream};
use crate::{LogError, Result};

/// How ordered commits are buffered before they are written out (`OpenOptions::write_behind`;
/// `None` there writes each commit out as it is placed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteBehind {
    /// Write out a stream's buffer once its oldest transaction is this old (a flusher thread
    /// runs while the log is open). `None`: no thread; only sizes and durability requests
    /// write out (deterministic, for the crash explorer).
    pub interval: Option<Duration>,
    /// Write out a stream's buffer once it holds this many bytes.
    pub stream_bytes_max: u64,
    /// Write out every stream once all buffers together hold this many bytes.
    pub memory_bytes_max: u64,
    /// Bytes per device submission of a write-out (a larger transaction goes alone).
    pub write_bytes_max: u64,
}

impl WriteBehind {
    /// The commit interval unless told otherwise: 5 s, as ext4's `commit=`.
    pub const INTERVAL_DEFAULT: Duration = Duration::from_secs(5);

    /// The defaults with the commit interval `interval`.
    #[must_use]
    pub fn with_interval(interval: Duration) -> Self {
        WriteBehind { interval: Some(interval), ..WriteBehind::default() }
    }
}

impl Default for WriteBehind {
    fn default() -> Self {
        WriteBehind {
            interval: Some(WriteBehind::INTERVAL_DEFAULT),
            stream_bytes_max: 1 << 20,
            memory_bytes_max: 16 << 20,
            write_bytes_max: 1 << 20,
        }
    }
}

/// Smallest batch buffer a stream starts (bytes; at least a block, at most
/// [`WriteBehind::write_bytes_max`]): small enough that a buffer written out after one or two
/// transactions (an fsync) costs little to make, large enough for a few small transactions.
pub(crate) const CHUNK_BYTES_MIN: u64 = 32 << 10;

/// Placed transactions' blocks, back to back as they will be written, waiting in their
/// stream's buffer.
#[derive(Debug)]
pub(crate) struct Buffered {
    /// First block of its first transaction.
    pub start: u64,
    /// Its transactions' units and data blocks: the first `used` bytes; the rest (stale bytes
    /// of a reused buffer, or zeros) is room for the stream's next transactions and is never
    /// written.
    pub buf: IoBuf,
    pub used: usize,
    /// Sequence numbers of its first and last transactions.
    pub seq: u64,
    pub last: u64,
    /// When its first transaction was placed (for the commit interval).
    pub at: Instant,
}

impl Buffered {
    /// Blocks its transactions take.
    fn blocks(&self, bs: u64) -> u64 {
        self.used as u64 / bs
    }
}

/// A submitted batch not yet known complete.
#[derive(Debug)]
pub(crate) struct InFlight {
    /// Sequence number of its first transaction.
    pub first: u64,
    pub ticket: Ticket,
    /// Blocks it writes: (first block, block count) per write.
    pub ranges: Vec<(u64, u64)>,
}

/// What a write-out needs, shared by the log and its flusher thread.
pub(crate) struct Writer {
    pub dev: Arc<dyn Device>,
    pub streams: Arc<[Mutex<Stream>]>,
    pub stream_cv: Arc<[Condvar]>,
    failed: Mutex<Option<String>>,
    pub block_size: u32,
    pub config: Option<WriteBehind>,
    /// The `WriteOutReordered` mutant: batches are taken newest first.
    reorder: bool,
    buffered: Vec<AtomicU64>,
    buffered_total: AtomicU64,
    written: Vec<AtomicU64>,
    /// Write-out submissions so far.
    pub write_outs: AtomicU64,
}

/// Which write-outs a newly buffered transaction makes due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Due {
    Nothing,
    Stream,
    Every,
}

impl Writer {
    /// Every stream's placed transactions are on the device already (a log just opened).
    pub(crate) fn new(
        dev: Arc<dyn Device>,
        streams: Arc<[Mutex<Stream>]>,
        stream_cv: Arc<[Condvar]>,
        config: Option<WriteBehind>,
        reorder: bool,
    ) -> Writer {
        let written = streams.iter().map(|st| AtomicU64::new(lock(st).last_seq)).collect();
        let buffered = streams.iter().map(|_| AtomicU64::new(0)).collect();
        Writer {
            block_size: dev.geometry().block_size,
            dev,
            streams,
            stream_cv,
            failed: Mutex::new(None),
            config,
            reorder,
            buffered,
            buffered_total: AtomicU64::new(0),
            written,
            write_outs: AtomicU64::new(0),
        }
    }

    pub(crate) fn check_failed(&self) -> Result<()> {
        // A panic while a stream's lock was held (a bug): fail-stop, the flusher included.
        if self.failed.is_poisoned() || self.streams.iter().any(Mutex::is_poisoned) {
            return Err(LogError::Failed { first_error: crate::engine::POISONED.into() });
        }
        match &*lock(&self.failed) {
            Some(first_error) => Err(LogError::Failed { first_error: first_error.clone() }),
            None => Ok(()),
        }
    }

    /// Record the first I/O error (fail-stop) and wake every stream waiter.
    pub(crate) fn fail(&self, e: MediaError) -> LogError {
        let mut failed = lock(&self.failed);
        if failed.is_none() {
            tracing::error!(error = %e, "log I/O failed; refusing further commits");
            *failed = Some(e.to_string());
        }
        drop(failed);
        for cv in self.stream_cv.iter() {
            cv.notify_all();
        }
        LogError::Media(e)
    }

    /// Every buffered transaction of stream `s` up to this seq has been submitted.
    pub(crate) fn written(&self, s: usize) -> u64 {
        self.written[s].load(Ordering::SeqCst)
    }

    /// Bytes buffered in all streams.
    pub(crate) fn buffered_bytes(&self) -> u64 {
        self.buffered_total.load(Ordering::Relaxed)
    }

    /// Add a transaction placed at block `start` with sequence number `seq`, `bytes` long
    /// (whole blocks), to stream `s`'s buffer (`st` is its locked state): `fill` writes every
    /// byte of its room there.
    pub(crate) fn buffer(
        &self,
        s: usize,
        st: &mut Stream,
        (start, seq, bytes): (u64, u64, usize),
        fill: impl FnOnce(&mut [u8]),
    ) -> Due {
        debug_assert!(st.pending.last().is_none_or(|p| p.last < seq), "buffer out of order");
        let bs = u64::from(self.block_size);
        debug_assert!((bytes as u64).is_multiple_of(bs));
        let continues = st
            .pending
            .last()
            .is_some_and(|p| p.start + p.blocks(bs) == start && p.buf.len() - p.used >= bytes);
        if !continues {
            let cap = self.chunk_bytes(st, bytes);
            let b = Buffered {
                start,
                // Never zeroed again: `fill` writes every byte of each room, and only rooms
                // are written out (`into_writes`).
                buf: IoBuf::for_overwrite(cap),
                used: 0,
                seq,
                last: seq,
                at: Instant::now(),
            };
            st.pending.push(b);
        }
        if let Some(p) = st.pending.last_mut() {
            fill(&mut p.buf[p.used..p.used + bytes]);
            p.used += bytes;
            p.last = seq;
        }
        let bytes = bytes as u64;
        let stream = self.buffered[s].fetch_add(bytes, Ordering::Relaxed) + bytes;
        let total = self.buffered_total.fetch_add(bytes, Ordering::Relaxed) + bytes;
        match self.config {
            None => Due::Stream,
            Some(c) if total >= c.memory_bytes_max => Due::Every,
            Some(c) if stream >= c.stream_bytes_max => Due::Stream,
            Some(_) => Due::Nothing,
        }
    }

    /// Size of a new batch buffer for stream `st` whose next transaction takes `bytes`: what
    /// the stream holds already (so buffers double as it fills), within [`CHUNK_BYTES_MIN`]
    /// and the most a write-out writes at once; exactly `bytes` without write-behind (each
    /// commit goes out alone) or for a transaction larger than that.
    fn chunk_bytes(&self, st: &Stream, bytes: usize) -> usize {
        let bs = u64::from(self.block_size);
        let Some(c) = self.config else { return bytes };
        let max = c.write_bytes_max.min(c.stream_bytes_max) / bs * bs;
        let min = CHUNK_BYTES_MIN.min(max).div_ceil(bs) * bs;
        let held: u64 = st.pending.iter().map(|p| p.used as u64).sum();
        // Powers of two: sizes that come round again, which `IoBuf` keeps for reuse.
        let cap = held.next_power_of_two().clamp(min, max.max(min));
        usize::try_from(cap).unwrap_or(usize::MAX).max(bytes)
    }

    /// The next batch of `pending` to submit: consecutive batch buffers whose first
    /// transaction has seq <= `upto`, oldest first, at most `write_bytes_max` bytes unless one
    /// buffer is larger.
    fn next_batch(&self, pending: &[Buffered], upto: u64) -> Option<Range<usize>> {
        let max = self.config.map_or(u64::MAX, |c| c.write_bytes_max);
        let n = pending.iter().take_while(|b| b.seq <= upto).count();
        if n == 0 {
            return None;
        }
        let len = |i: usize| pending[i].used as u64;
        if self.reorder {
            // The mutant: the newest batch first, as if the one a waiter needs could jump
            // the queue; `written` then claims the older batches too.
            let (mut start, mut bytes) = (n - 1, len(n - 1));
            while start > 0 && bytes + len(start - 1) <= max {
                start -= 1;
                bytes += len(start);
            }
            return Some(start..n);
        }
        let (mut end, mut bytes) = (1, len(0));
        while end < n && bytes + len(end) <= max {
            bytes += len(end);
            end += 1;
        }
        Some(0..end)
    }

    /// Submit stream `s`'s buffered transactions up to seq `upto`, batch after batch, unless
    /// another thread is writing it out already (it takes what was queued before it finished;
    /// callers that need the write-out wait for `submitting` to clear and check again).
    pub(crate) fn drive(&self, s: usize, upto: u64) -> Result<()> {
        let bs = u64::from(self.block_size);
        let mut st = lock(&self.streams[s]);
        loop {
            // Batches go oldest first, so once the watermark reaches `upto` every buffered
            // transaction up to it is submitted.
            if st.submitting || self.written(s) >= upto {
                return Ok(());
            }
            let Some(range) = self.next_batch(&st.pending, upto) else { return Ok(()) };
            self.check_failed()?;
            st.submitting = true;
            let batch: Vec<Buffered> = st.pending.drain(range).collect();
            let bytes: u64 = batch.iter().map(|b| b.used as u64).sum();
            self.buffered[s].fetch_sub(bytes, Ordering::Relaxed);
            self.buffered_total.fetch_sub(bytes, Ordering::Relaxed);
            drop(st);
            let first = batch.first().map_or(0, |b| b.seq);
            let last = batch.last().map_or(0, |b| b.last);
            let writes = into_writes(batch);
            let ranges = writes.iter().map(|w| (w.block, w.data.len() as u64 / bs)).collect();
            self.write_outs.fetch_add(1, Ordering::Relaxed);
            let stream = u16::try_from(s).unwrap_or(u16::MAX);
            let result = self.dev.submit_stream(stream, writes, WriteFlags::NONE);
            st = lock(&self.streams[s]);
            st.submitting = false;
            self.stream_cv[s].notify_all();
            match result {
                Ok(ticket) => {
                    st.inflight.push(InFlight { first, ticket, ranges });
                    self.written[s].fetch_max(last, Ordering::SeqCst);
                }
                Err(e) => {
                    drop(st);
                    return Err(self.fail(e));
                }
            }
        }
    }

    /// Submit every stream's whole buffer.
    pub(crate) fn write_out_all(&self) -> Result<()> {
        for s in 0..self.streams.len() {
            self.drive(s, u64::MAX)?;
        }
        Ok(())
    }

    /// Read `buf.len()` bytes (whole blocks) at `block`: blocks still buffered are copied from
    /// memory, blocks in flight are read after their write completed.
    pub(crate) fn read(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        let bs = self.block_size as usize;
        if !buf.len().is_multiple_of(bs) {
            return Err(LogError::Invalid(format!(
                "read of {} bytes: not whole blocks",
                buf.len()
            )));
        }
        let count = (buf.len() / bs) as u64;
        let mut device_reads: Vec<(u64, usize)> = Vec::new(); // (block, index into buf)
        for i in 0..count {
            let b = block + i;
            let out = &mut buf[i as usize * bs..(i as usize + 1) * bs];
            if self.read_buffered(b, out)? {
                continue;
            }
            device_reads.push((b, i as usize));
        }
        // Runs of blocks not in memory, one device read each.
        let mut k = 0;
        while k < device_reads.len() {
            let (b0, i0) = device_reads[k];
            let mut n = 1;
            while k + n < device_reads.len() && device_reads[k + n].1 == i0 + n {
                n += 1;
            }
            self.dev.read(b0, &mut buf[i0 * bs..(i0 + n) * bs])?;
            k += n;
        }
        Ok(())
    }

    /// Copy block `b` from a stream's buffer into `out` if it is there (`true`); wait for its
    /// write if one is in flight (`false`: read it from the device).
    fn read_buffered(&self, b: u64, out: &mut [u8]) -> Result<bool> {
        let bs = u64::from(self.block_size);
        for (s, m) in self.streams.iter().enumerate() {
            let mut st = lock(m);
            loop {
                let holds = |p: &&Buffered| (p.start..p.start + p.blocks(bs)).contains(&b);
                if let Some(p) = st.pending.iter().find(holds) {
                    let at = ((b - p.start) * bs) as usize;
                    out.copy_from_slice(&p.buf[at..at + bs as usize]);
                    return Ok(true);
                }
                // A batch between the buffer and `inflight`: wait until it is in one of them.
                if st.submitting {
                    self.check_failed()?;
                    st = self.stream_cv[s]
                        .wait(st)
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    continue;
                }
                break;
            }
            let carrying: Vec<Ticket> = st
                .inflight
                .iter()
                .filter(|f| f.ranges.iter().any(|&(start, n)| (start..start + n).contains(&b)))
                .map(|f| f.ticket)
                .collect();
            drop(st);
            for t in carrying {
                self.dev.wait(t).map_err(|e| self.fail(e))?;
            }
        }
        Ok(false)
    }
}

/// A batch's writes: each batch buffer's used part, as it is (no copy).
pub(crate) fn into_writes(batch: Vec<Buffered>) -> Vec<Write> {
    batch
        .into_iter()
        .map(|Buffered { start, mut buf, used, .. }| {
            buf.truncate(used);
            Write::new(start, buf)
        })
        .collect()
}

/// The thread that writes out buffers older than the commit interval; stopped and joined when
/// dropped (with the log). It stops by itself after an I/O error (the log is failed then).
pub(crate) struct Flusher {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Flusher {
    pub(crate) fn spawn(writer: Arc<Writer>, interval: Duration) -> std::io::Result<Flusher> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("tally-log-flush".into())
            .spawn(move || flusher_loop(&writer, interval, &flag))?;
        Ok(Flusher { stop, thread: Some(thread) })
    }
}

fn flusher_loop(writer: &Writer, interval: Duration, stop: &(Mutex<bool>, Condvar)) {
    // The thread re-checks at least this often even when a stream is busy being written out.
    const RETRY: Duration = Duration::from_millis(1);
    loop {
        let now = Instant::now();
        let mut next = now + interval;
        for s in 0..writer.streams.len() {
            let oldest = lock(&writer.streams[s]).pending.first().map(|b| b.at);
            let Some(at) = oldest else { continue };
            if now.duration_since(at) < interval {
                next = next.min(at + interval);
                continue;
            }
            if let Err(e) = writer.drive(s, u64::MAX) {
                tracing::error!(error = %e, "write-out after the commit interval failed");
                return;
            }
            // Another thread was writing the stream out: look again soon.
            if lock(&writer.streams[s]).pending.first().is_some_and(|b| b.at <= at) {
                next = next.min(now + RETRY);
            }
        }
        let (m, cv) = stop;
        let guard = lock(m);
        let wait = next.saturating_duration_since(Instant::now());
        let (guard, _) = cv
            .wait_timeout_while(guard, wait, |stopped| !*stopped)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *guard {
            return;
        }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        let (m, cv) = &*self.stop;
        *lock(m) = true;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tally_media::{Device, IoBuf, MemDevice};

    use super::WriteBehind;
    use crate::{Log, LogConfig, OpenOptions, Transaction};

    const BS: usize = 4096;

    fn open(write_bytes_max: u64) -> (Arc<MemDevice>, Log) {
        let dev = Arc::new(MemDevice::new(BS as u32, 2048).unwrap());
        Log::format(&*dev, &LogConfig { streams: 1, segment_blocks: 256, uuid: [5; 16] }).unwrap();
        let behind = WriteBehind {
            interval: None,
            stream_bytes_max: 1 << 30,
            memory_bytes_max: 1 << 30,
            write_bytes_max,
        };
        let opts = OpenOptions { write_behind: Some(behind), ..OpenOptions::default() };
        let (log, _) = Log::open(dev.clone(), opts).unwrap();
        (dev, log)
    }

    fn tx(tag: u32) -> Transaction {
        let mut t = Transaction::new(0);
        t.record(tag.to_le_bytes().to_vec());
        t
    }

    /// Small transactions are encoded into shared batch buffers that grow with what the
    /// stream holds; each buffer is one write of exactly its transactions' blocks, and
    /// recovery finds every transaction.
    #[test]
    fn small_transactions_share_growing_batch_buffers_written_once_each() {
        let (dev, log) = open(1 << 20);
        for i in 0..40 {
            log.commit(tx(i)).unwrap();
        }
        let sizes: Vec<usize> = {
            let st = crate::engine::lock(&log.streams[0]);
            st.pending.iter().map(|p| p.used / BS).collect()
        };
        // 32 KiB, then 32, 64 and 128 KiB buffers as the stream's holding doubles.
        assert_eq!(sizes, [8, 8, 16, 8], "blocks per batch buffer");
        let before = dev.stats();
        log.write_out().unwrap();
        let spent = dev.stats() - before;
        assert_eq!((spent.submissions, spent.writes), (1, 4), "{spent:?}");
        assert_eq!(spent.bytes_written, 40 * BS as u64, "{spent:?}");
        drop(log);
        let (_, r) = Log::open(dev, OpenOptions::default()).unwrap();
        assert_eq!(r.streams[0].txs.len(), 40);
    }

    /// Only the filled part of a reused batch buffer reaches the device: the rest holds
    /// bytes of the buffer's earlier life (`IoBuf::for_overwrite`), never written.
    #[test]
    fn the_unfilled_room_of_a_reused_buffer_is_never_written() {
        // One buffer size nothing else here uses (7 blocks), left in the pool full of junk.
        let (dev, log) = open(7 * BS as u64);
        let mut junk = IoBuf::zeroed(7 * BS);
        junk.fill(0xEE);
        drop(junk);
        let first = log.commit(tx(1)).unwrap();
        log.commit(tx(2)).unwrap();
        log.write_out().unwrap();
        log.sync().unwrap();
        let mut block = vec![0u8; BS];
        for b in 0..7 {
            dev.read(first.data_start - 1 + b, &mut block).unwrap();
            let junk = block.iter().filter(|&&x| x == 0xEE).count();
            assert!(junk < 64, "block {b} after the first transaction holds {junk} junk bytes");
        }
    }
}

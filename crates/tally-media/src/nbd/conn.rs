//! One NBD connection in the transmission phase: many requests in flight, replies matched by
//! cookie in whatever order the server sends them.
//!
//! Senders write a request under the writer lock after entering it in the in-flight table; a
//! reader thread owns the other end of the socket, decodes every reply, checks it against the
//! request it names, and completes that request exactly once (a write's ticket on the device's
//! tracker, or the slot a synchronous caller waits on).
//!
//! Invariants:
//! - a request is in `inflight` from before its first byte is sent until its final reply is
//!   decoded; whoever removes it completes it, once;
//! - `inflight` never holds more than `queue_depth` requests; a sender waits (bounded by the
//!   timeout) for room;
//! - the first failure of the connection (`dead`) is kept: every request in flight and every
//!   later one is completed with it, and the socket is shut down, so no caller waits on a
//!   reply that cannot come;
//! - no request waits more than `timeout` for its reply: the reader wakes at least every
//!   `tick` and fails the connection when the oldest request has waited longer;
//! - every length in a reply is checked against the request before any byte of its payload is
//!   read or anything is allocated for it; a read's reply must cover the read exactly once;
//! - neither lock is held across the other's socket I/O: `state` is never held while reading
//!   or writing the socket.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Read};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::target::Stream;
use super::wire::{
    be16, be32, be64, ChunkHeader, Command, Request, ERROR_MESSAGE_MAX, REPLY_FLAG_DONE,
    REPLY_TYPE_ERROR, REPLY_TYPE_ERROR_OFFSET, REPLY_TYPE_FLAG_ERROR, REPLY_TYPE_NONE,
    REPLY_TYPE_OFFSET_DATA, REPLY_TYPE_OFFSET_HOLE, SIMPLE_REPLY_MAGIC, SIMPLE_REPLY_REST,
    STRUCTURED_REPLY_MAGIC, STRUCTURED_REPLY_REST,
};
use super::NbdError;
use crate::file::tracker::{Failure, Tracker};
use crate::{Counters, Ticket};

/// Most separate pieces a read's structured reply may arrive in (adjacent pieces count as
/// one): bounds the bookkeeping a hostile server can make Tally keep.
const READ_PIECE_COUNT_MAX: usize = 4096;

/// Who is told when a request completes.
pub(crate) enum Waiter {
    /// One request of a submitted ticket.
    Ticket(Ticket),
    /// A synchronous caller.
    Slot(Arc<Slot>),
}

/// Where a synchronous caller waits for one request's outcome (a read's bytes).
pub(crate) struct Slot {
    outcome: Mutex<Option<Result<Vec<u8>, NbdError>>>,
    done: Condvar,
}

impl Slot {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Slot { outcome: Mutex::new(None), done: Condvar::new() })
    }

    fn fill(&self, outcome: Result<Vec<u8>, NbdError>) {
        let mut slot = self.outcome.lock().unwrap_or_else(PoisonError::into_inner);
        debug_assert!(slot.is_none(), "a request completes once");
        *slot = Some(outcome);
        drop(slot);
        self.done.notify_all();
    }

    /// The outcome, waiting at most `limit` (a backstop: the reader thread completes every
    /// request within the connection's timeout).
    pub(crate) fn wait(&self, limit: Duration) -> Result<Vec<u8>, NbdError> {
        let start = Instant::now();
        let mut slot = self.outcome.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(outcome) = slot.take() {
                return outcome;
            }
            let waited = start.elapsed();
            let Some(left) = limit.checked_sub(waited).filter(|l| !l.is_zero()) else {
                return Err(NbdError::Timeout { waited });
            };
            slot = self.done.wait_timeout(slot, left).unwrap_or_else(PoisonError::into_inner).0;
        }
    }
}

struct Pending {
    command: Command,
    offset: u64,
    length: u32,
    sent_at: Instant,
    waiter: Waiter,
    /// A read's bytes, `length` long; empty for other commands.
    data: Vec<u8>,
    /// A read's pieces received so far: start -> end, relative to `offset`, adjacent merged.
    pieces: BTreeMap<u64, u64>,
    covered: u64,
    error: Option<NbdError>,
}

struct State {
    next_cookie: u64,
    inflight: HashMap<u64, Pending>,
    dead: Option<NbdError>,
    closing: bool,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    tracker: Arc<Tracker>,
    counters: Arc<Counters>,
    timeout: Duration,
    structured: bool,
    queue_depth: usize,
}

/// An open connection.
pub(crate) struct Conn {
    writer: Mutex<Stream>,
    shared: Arc<Shared>,
    reader: Mutex<Option<JoinHandle<()>>>,
}

/// Settings of a connection.
pub(crate) struct ConnSettings {
    pub(crate) index: usize,
    pub(crate) timeout: Duration,
    pub(crate) structured: bool,
    pub(crate) queue_depth: usize,
}

impl Conn {
    /// Start the transmission phase on `stream` (negotiated already).
    pub(crate) fn start(
        stream: Stream,
        settings: &ConnSettings,
        tracker: Arc<Tracker>,
        counters: Arc<Counters>,
    ) -> io::Result<Conn> {
        assert!(settings.queue_depth > 0 && !settings.timeout.is_zero());
        let tick =
            (settings.timeout / 4).clamp(Duration::from_millis(10), Duration::from_millis(500));
        stream.set_read_timeout(Some(tick))?;
        stream.set_write_timeout(Some(settings.timeout))?;
        let reading = stream.try_clone()?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                next_cookie: 1,
                inflight: HashMap::new(),
                dead: None,
                closing: false,
            }),
            changed: Condvar::new(),
            tracker,
            counters,
            timeout: settings.timeout,
            structured: settings.structured,
            queue_depth: settings.queue_depth,
        });
        let for_reader = Arc::clone(&shared);
        let reader = std::thread::Builder::new()
            .name(format!("tally-nbd-{}", settings.index))
            .spawn(move || reader_main(reading, &for_reader))?;
        Ok(Conn { writer: Mutex::new(stream), shared, reader: Mutex::new(Some(reader)) })
    }

    /// Requests sent on this connection so far (cookies are handed out one per request).
    pub(crate) fn requests_sent(&self) -> u64 {
        self.shared.lock().next_cookie - 1
    }

    /// The connection's failure, if it failed.
    pub(crate) fn failure(&self) -> Option<NbdError> {
        self.shared.lock().dead.clone()
    }

    /// Send one request. `Err` means it was not entered (the caller still owns `waiter`'s
    /// completion); `Ok` means `waiter` will be completed exactly once, also if sending fails.
    pub(crate) fn send(
        &self,
        command: Command,
        flags: u16,
        offset: u64,
        payload: &[u8],
        length: u32,
        waiter: Waiter,
    ) -> Result<(), NbdError> {
        debug_assert!(command != Command::Write || payload.len() == length as usize);
        let shared = &*self.shared;
        let cookie = {
            let started = Instant::now();
            let mut state = shared.lock();
            loop {
                if let Some(dead) = &state.dead {
                    return Err(dead.clone());
                }
                if state.closing {
                    return Err(NbdError::Disconnected { reason: "the device is closing".into() });
                }
                if state.inflight.len() < shared.queue_depth {
                    break;
                }
                let waited = started.elapsed();
                let Some(left) = shared.timeout.checked_sub(waited).filter(|l| !l.is_zero()) else {
                    return Err(NbdError::Timeout { waited });
                };
                state = shared
                    .changed
                    .wait_timeout(state, left)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
            let cookie = state.next_cookie;
            state.next_cookie += 1;
            let data =
                if command == Command::Read { vec![0u8; length as usize] } else { Vec::new() };
            let pending = Pending {
                command,
                offset,
                length,
                sent_at: Instant::now(),
                waiter,
                data,
                pieces: BTreeMap::new(),
                covered: 0,
                error: None,
            };
            state.inflight.insert(cookie, pending);
            cookie
        };
        let header = Request { flags, command, cookie, offset, length }.encode();
        let mut writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        match writer.write_all_parts(&[&header, payload]) {
            Ok(calls) if command == Command::Write => shared.counters.syscalls(calls),
            Ok(_) => {}
            Err(error) => {
                drop(writer);
                shared.die(NbdError::from_io(&error, shared.timeout));
            }
        }
        Ok(())
    }

    /// Fail the connection (e.g. a caller's backstop expired).
    pub(crate) fn kill(&self, error: NbdError) {
        self.shared.die(error);
    }

    /// Wait (bounded) for requests in flight, send `NBD_CMD_DISC`, close, join the reader.
    pub(crate) fn close(&self) {
        let shared = &*self.shared;
        let started = Instant::now();
        let mut state = shared.lock();
        while state.dead.is_none() && !state.inflight.is_empty() {
            let Some(left) = shared.timeout.checked_sub(started.elapsed()).filter(|l| !l.is_zero())
            else {
                break;
            };
            state =
                shared.changed.wait_timeout(state, left).unwrap_or_else(PoisonError::into_inner).0;
        }
        state.closing = true;
        let clean = state.dead.is_none() && state.inflight.is_empty();
        drop(state);
        let mut writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        if clean {
            let header =
                Request { flags: 0, command: Command::Disconnect, cookie: 0, offset: 0, length: 0 };
            // A soft disconnect is a courtesy; the socket is shut down either way.
            let _ = writer.write_all_parts(&[&header.encode()]);
        }
        writer.shutdown();
        drop(writer);
        let reader = self.reader.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(reader) = reader {
            if reader.join().is_err() {
                tracing::error!("the NBD reader thread panicked");
            }
        }
        // Whatever is still in flight (the server did not answer in time) fails now.
        shared.die(NbdError::Disconnected { reason: "the device was closed".into() });
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.close();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Updated in whole steps under the lock; a panic elsewhere cannot leave it torn.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The connection failed with `error`: complete everything in flight with it, refuse
    /// everything later, fail the device.
    fn die(&self, error: NbdError) {
        let (first, drained, closing) = {
            let mut state = self.lock();
            if state.dead.is_none() {
                state.dead = Some(error);
            }
            let drained: Vec<Pending> = state.inflight.drain().map(|(_, p)| p).collect();
            (state.dead.clone(), drained, state.closing)
        };
        self.changed.notify_all();
        let Some(first) = first else { return };
        if !closing {
            tracing::error!(error = %first, in_flight = drained.len(), "NBD connection failed");
            self.tracker.fail_stop(&Failure::from_nbd("nbd connection", &first));
        }
        for pending in drained {
            self.finish(pending, Err(first.clone()));
        }
    }

    fn finish(&self, pending: Pending, outcome: Result<(), NbdError>) {
        let op = pending.command.op();
        match pending.waiter {
            Waiter::Ticket(ticket) => {
                let outcome = outcome.map_err(|e| Failure::from_nbd(op, &e));
                self.tracker.complete(ticket, outcome);
            }
            Waiter::Slot(slot) => slot.fill(outcome.map(|()| pending.data)),
        }
        self.changed.notify_all();
    }

    /// Called when a read timed out: `Err` to stop reading.
    fn tick(&self) -> Result<(), Stop> {
        let state = self.lock();
        if state.closing {
            return Err(Stop::Closing);
        }
        if let Some(dead) = &state.dead {
            return Err(Stop::Failed(dead.clone()));
        }
        let oldest = state.inflight.values().map(|p| p.sent_at.elapsed()).max();
        match oldest {
            Some(waited) if waited > self.timeout => {
                Err(Stop::Failed(NbdError::Timeout { waited }))
            }
            _ => Ok(()),
        }
    }
}

/// Why the reader stops.
enum Stop {
    Closing,
    Failed(NbdError),
}

impl From<NbdError> for Stop {
    fn from(error: NbdError) -> Self {
        Stop::Failed(error)
    }
}

fn reader_main(mut stream: Stream, shared: &Shared) {
    let stop = loop {
        if let Err(stop) = read_reply(&mut stream, shared) {
            break stop;
        }
    };
    stream.shutdown();
    match stop {
        Stop::Closing => {}
        Stop::Failed(error) => {
            let closing = shared.lock().closing;
            if !closing {
                shared.die(error);
            }
        }
    }
}

/// Fill `buf` from the socket, waking every tick to enforce the timeout.
fn read_exact(stream: &mut Stream, shared: &Shared, buf: &mut [u8]) -> Result<(), Stop> {
    let mut filled = 0;
    while filled < buf.len() {
        match stream.read(&mut buf[filled..]) {
            Ok(0) => {
                if shared.lock().closing {
                    return Err(Stop::Closing);
                }
                let reason = "the server closed the connection".to_string();
                return Err(Stop::Failed(NbdError::Disconnected { reason }));
            }
            Ok(n) => filled += n,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                shared.tick()?;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                if shared.lock().closing {
                    return Err(Stop::Closing);
                }
                return Err(Stop::Failed(NbdError::Disconnected { reason: e.to_string() }));
            }
        }
    }
    Ok(())
}

fn read_reply(stream: &mut Stream, shared: &Shared) -> Result<(), Stop> {
    let mut magic = [0u8; 4];
    read_exact(stream, shared, &mut magic)?;
    match be32(&magic) {
        SIMPLE_REPLY_MAGIC => {
            let mut rest = [0u8; SIMPLE_REPLY_REST];
            read_exact(stream, shared, &mut rest)?;
            simple_reply(stream, shared, be32(&rest[0..4]), be64(&rest[4..12]))
        }
        STRUCTURED_REPLY_MAGIC => {
            let mut rest = [0u8; STRUCTURED_REPLY_REST];
            read_exact(stream, shared, &mut rest)?;
            chunk(stream, shared, ChunkHeader::decode(&rest))
        }
        other => Err(NbdError::protocol(format!("reply magic {other:#010x}")).into()),
    }
}

fn not_in_flight(cookie: u64) -> Stop {
    NbdError::protocol(format!("reply for cookie {cookie}, which is not in flight")).into()
}

fn simple_reply(stream: &mut Stream, shared: &Shared, errno: u32, cookie: u64) -> Result<(), Stop> {
    let mut pending = {
        let mut state = shared.lock();
        let command = state.inflight.get(&cookie).ok_or_else(|| not_in_flight(cookie))?.command;
        if command == Command::Read && shared.structured {
            let reason = "simple reply to a read after structured replies were negotiated";
            return Err(NbdError::protocol(reason).into());
        }
        state.inflight.remove(&cookie).ok_or_else(|| not_in_flight(cookie))?
    };
    if errno != 0 {
        shared.finish(pending, Err(NbdError::server(errno, String::new())));
        return Ok(());
    }
    if pending.command == Command::Read {
        let mut data = std::mem::take(&mut pending.data);
        let read = read_exact(stream, shared, &mut data);
        pending.data = data;
        if let Err(stop) = read {
            // Back in the table, so the connection's failure completes it.
            shared.lock().inflight.insert(cookie, pending);
            return Err(stop);
        }
    }
    shared.finish(pending, Ok(()));
    Ok(())
}

/// Bounds of a chunk type's payload, given the request it answers.
fn chunk_length_ok(kind: u16, length: u32, request: &Pending) -> Result<(), NbdError> {
    let read = request.command == Command::Read;
    let ok = match kind {
        REPLY_TYPE_NONE => length == 0,
        REPLY_TYPE_OFFSET_DATA => read && length > 8 && length - 8 <= request.length,
        REPLY_TYPE_OFFSET_HOLE => read && length == 12,
        REPLY_TYPE_ERROR => (6..=6 + ERROR_MESSAGE_MAX).contains(&length),
        REPLY_TYPE_ERROR_OFFSET => (14..=14 + ERROR_MESSAGE_MAX).contains(&length),
        k if k & REPLY_TYPE_FLAG_ERROR != 0 => (6..=6 + 2 * ERROR_MESSAGE_MAX).contains(&length),
        _ => false,
    };
    if ok {
        return Ok(());
    }
    Err(NbdError::protocol(format!(
        "chunk type {kind:#06x} of {length} bytes in reply to a {} of {} bytes",
        request.command.op(),
        request.length
    )))
}

fn chunk(stream: &mut Stream, shared: &Shared, header: ChunkHeader) -> Result<(), Stop> {
    if !shared.structured {
        return Err(NbdError::protocol("structured reply that was not negotiated").into());
    }
    let cookie = header.cookie;
    let (request_offset, request_length) = {
        let state = shared.lock();
        let pending = state.inflight.get(&cookie).ok_or_else(|| not_in_flight(cookie))?;
        chunk_length_ok(header.kind, header.length, pending)?;
        (pending.offset, pending.length)
    };
    // The piece of the request a chunk names: relative start and end, checked.
    let piece = |offset: u64, size: u64| -> Result<(u64, u64), NbdError> {
        let start = offset.checked_sub(request_offset);
        let end = start.and_then(|s| s.checked_add(size));
        match (start, end) {
            (Some(start), Some(end)) if size > 0 && end <= u64::from(request_length) => {
                Ok((start, end))
            }
            _ => Err(NbdError::protocol(format!(
                "chunk for {size} bytes at {offset}, outside the request ({request_length} bytes at {request_offset})"
            ))),
        }
    };
    match header.kind {
        REPLY_TYPE_NONE => {}
        REPLY_TYPE_OFFSET_DATA => {
            let mut offset = [0u8; 8];
            read_exact(stream, shared, &mut offset)?;
            let (start, end) = piece(be64(&offset), u64::from(header.length - 8))?;
            let mut data = claim(shared, cookie, start, end)?;
            let read = read_exact(stream, shared, &mut data[start as usize..end as usize]);
            if let Some(pending) = shared.lock().inflight.get_mut(&cookie) {
                pending.data = data;
            }
            read?;
        }
        REPLY_TYPE_OFFSET_HOLE => {
            let mut body = [0u8; 12];
            read_exact(stream, shared, &mut body)?;
            let (start, end) = piece(be64(&body[0..8]), u64::from(be32(&body[8..12])))?;
            let mut data = claim(shared, cookie, start, end)?;
            data[start as usize..end as usize].fill(0);
            if let Some(pending) = shared.lock().inflight.get_mut(&cookie) {
                pending.data = data;
            }
        }
        kind => {
            debug_assert!(kind & REPLY_TYPE_FLAG_ERROR != 0, "checked by chunk_length_ok");
            let mut body = vec![0u8; header.length as usize];
            read_exact(stream, shared, &mut body)?;
            let errno = be32(&body[0..4]);
            let message_length = usize::from(be16(&body[4..6]));
            let fixed = if kind == REPLY_TYPE_ERROR_OFFSET { 14 } else { 6 };
            if errno == 0 || message_length > body.len() - fixed {
                let reason = format!(
                    "error chunk with error {errno} and a {message_length}-byte message in {} bytes",
                    body.len()
                );
                return Err(NbdError::protocol(reason).into());
            }
            let message = String::from_utf8_lossy(&body[6..6 + message_length]).into_owned();
            if kind == REPLY_TYPE_ERROR_OFFSET {
                let at = 6 + message_length;
                piece(be64(&body[at..at + 8]), 1)?;
            }
            if let Some(pending) = shared.lock().inflight.get_mut(&cookie) {
                pending.error.get_or_insert(NbdError::server(errno, message));
            }
        }
    }
    if header.flags & REPLY_FLAG_DONE != 0 {
        let pending =
            shared.lock().inflight.remove(&cookie).ok_or_else(|| not_in_flight(cookie))?;
        let outcome = match pending.error.clone() {
            Some(error) => Err(error),
            None if pending.command == Command::Read
                && pending.covered != u64::from(pending.length) =>
            {
                let reason =
                    format!("read reply covered {} of {} bytes", pending.covered, pending.length);
                shared.lock().inflight.insert(cookie, pending);
                return Err(NbdError::protocol(reason).into());
            }
            None => Ok(()),
        };
        shared.finish(pending, outcome);
    } else if header.kind == REPLY_TYPE_NONE {
        return Err(NbdError::protocol("NBD_REPLY_TYPE_NONE without NBD_REPLY_FLAG_DONE").into());
    }
    Ok(())
}

/// Record that bytes `start..end` of `cookie`'s read arrived, refusing overlap with an earlier
/// piece; hands out the read's buffer (to be put back) so it can be filled without the lock.
fn claim(shared: &Shared, cookie: u64, start: u64, end: u64) -> Result<Vec<u8>, NbdError> {
    let mut state = shared.lock();
    let pending =
        state.inflight.get_mut(&cookie).ok_or_else(|| NbdError::protocol("lost request"))?;
    let before = pending.pieces.range(..=start).next_back().map(|(&s, &e)| (s, e));
    let after = pending.pieces.range(start..).next().map(|(&s, &e)| (s, e));
    let overlaps = before.is_some_and(|(_, e)| e > start) || after.is_some_and(|(s, _)| s < end);
    if overlaps {
        return Err(NbdError::protocol(format!(
            "read chunk {start}..{end} overlaps an earlier one"
        )));
    }
    // Merge with adjacent pieces so an in-order reply costs one entry.
    let mut merged = (start, end);
    if let Some((s, e)) = before.filter(|&(_, e)| e == start) {
        pending.pieces.remove(&s);
        merged.0 = s;
        debug_assert_eq!(e, start);
    }
    if let Some((s, e)) = after.filter(|&(s, _)| s == end) {
        pending.pieces.remove(&s);
        merged.1 = e;
    }
    pending.pieces.insert(merged.0, merged.1);
    if pending.pieces.len() > READ_PIECE_COUNT_MAX {
        return Err(NbdError::protocol(format!(
            "read reply in more than {READ_PIECE_COUNT_MAX} pieces"
        )));
    }
    pending.covered += end - start;
    Ok(std::mem::take(&mut pending.data))
}

//! `SpanDevice`: one device over several targets (a multi-target image), striped at a fixed
//! unit, with a flush that flushes every target that took writes, in parallel.
//!
//! Layout (docs/FORMAT.md, "Multi-target images"): block 0 of every target is its
//! [`TargetHeader`]; then, on target 0 only, the image's first `lead_blocks` blocks (the log's
//! two superblocks; the same blocks stay unused on the other targets); then `row_count` rows of
//! one stripe of `stripe_blocks` blocks per target. Image block `lead + k` is in stripe
//! `s = k / stripe_blocks`, which lives on target `s % n`, row `s / n`. With the stripe set to
//! the log's segment size, each segment is on one target and consecutive segments on
//! consecutive targets, so the streams' writes spread over the targets.
//!
//! Invariants:
//! - every target was checked at open: same set, in its recorded place, each once, all there,
//!   same block size and striping; the device's geometry is what the headers say;
//! - a write is split at stripe edges and each piece goes to its target on the same stream
//!   (each target keeps a connection per stream); nothing waits between targets: ordering is
//!   in the log's unit headers, not in the order targets complete;
//! - `flush` makes durable every write whose ticket completed (was waited for) before it was
//!   called, on every target: a target is marked dirty when a write is submitted to it and
//!   again when a wait sees one of its writes complete; a flush round takes the dirty marks
//!   and flushes those targets concurrently, and returns only when all have answered. Rounds
//!   are serialised, so a round that skips a target never returns before the round that took
//!   its mark has flushed it; a caller waits for the first round that *starts* after it was
//!   called, and callers arriving during one round share the next (group flush);
//! - fail-stop: the first failed write, wait or flush on any target fails the whole device.

mod header;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

pub use header::{
    random_uuid, uuid_text, HeaderDefect, TargetHeader, TARGET_COUNT_MAX, TARGET_FORMAT_VERSION,
    TARGET_HEADER_BLOCKS, TARGET_HEADER_SIZE, TARGET_MAGIC,
};
/// Field offsets of the target header, for the format document's test.
pub mod offsets {
    pub use super::header::{
        OFF_BLOCK_SIZE, OFF_CRC, OFF_LEAD_BLOCKS, OFF_MAGIC, OFF_ROW_COUNT, OFF_SET_UUID,
        OFF_STRIPE_BLOCKS, OFF_TARGET_COUNT, OFF_TARGET_INDEX, OFF_TARGET_UUID, OFF_TARGET_UUIDS,
        OFF_VERSION,
    };
}

use crate::{
    check_read, check_write, Counters, Device, DeviceStats, Geometry, IoBuf, MediaError, Result,
    Ticket, Write, WriteFlags,
};

/// Why a list of targets is not a multi-target image that can be opened. Positions are
/// 1-based places in the list given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpanError {
    /// Target `position` holds no target header (not formatted as part of any set).
    #[error("target {position} is not part of a multi-target Tally image")]
    NotATarget {
        /// Place in the list.
        position: usize,
    },
    /// Target `position`'s header is damaged.
    #[error("target {position}: damaged target header ({reason})")]
    Damaged {
        /// Place in the list.
        position: usize,
        /// What is wrong.
        reason: &'static str,
    },
    /// Target `position` belongs to another image.
    #[error("target {position} belongs to another image (set {found}, not {expected})")]
    Foreign {
        /// Place in the list.
        position: usize,
        /// The set of the first target.
        expected: String,
        /// Its own set.
        found: String,
    },
    /// Fewer or more targets than the image has; `missing` names the places not given.
    #[error("the image has {recorded} targets, {given} given{}", missing_text(.missing))]
    Count {
        /// Targets the image was made with.
        recorded: usize,
        /// Targets given.
        given: usize,
        /// 1-based places of the image no given target holds.
        missing: Vec<usize>,
    },
    /// Target `position` is the image's target `recorded` (targets given out of order).
    #[error("target {position} is the image's target {recorded}: give the targets in their recorded order")]
    Swapped {
        /// Place in the list.
        position: usize,
        /// 1-based place it was made in.
        recorded: usize,
    },
    /// The same target given twice.
    #[error("targets {first} and {position} are the same target")]
    Repeated {
        /// Earlier place.
        first: usize,
        /// Later place.
        position: usize,
    },
    /// A target whose shape does not fit the header (too small, another block size).
    #[error("target {position}: {reason}")]
    Shape {
        /// Place in the list.
        position: usize,
        /// What does not fit.
        reason: String,
    },
}

fn missing_text(missing: &[usize]) -> String {
    if missing.is_empty() {
        String::new()
    } else {
        let list: Vec<String> = missing.iter().map(ToString::to_string).collect();
        let noun = if missing.len() == 1 { "target" } else { "targets" };
        format!(" (missing: {noun} {})", list.join(", "))
    }
}

fn span_error(source: SpanError) -> MediaError {
    MediaError::Span { source: Box::new(source) }
}

/// How [`SpanDevice::format`] lays out an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanLayout {
    /// Blocks of one stripe (give the log's segment size).
    pub stripe_blocks: u32,
    /// Image blocks before the first stripe, on target 0 (give the log's first segment block).
    pub lead_blocks: u32,
}

/// A deliberately broken flush, for proving the crash tests catch it (effective only with the
/// `mutants` feature).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanMutant {
    /// A flush round flushes target 0 only, as if one flush covered every target.
    FlushFirstOnly,
}

/// Whether this build has the `mutants` feature (else [`SpanDevice::set_mutant`] does nothing).
#[must_use]
pub fn span_mutants_available() -> bool {
    cfg!(feature = "mutants")
}

/// A device striped over several targets.
pub struct SpanDevice {
    targets: Vec<Arc<dyn Device>>,
    headers: Vec<TargetHeader>,
    geometry: Geometry,
    stripe_blocks: u64,
    lead_blocks: u64,
    /// Per target: written since its last flush round took the mark.
    dirty: Vec<AtomicBool>,
    /// Submissions not yet waited for: the targets' tickets.
    pending: Mutex<HashMap<u64, Vec<(usize, Ticket)>>>,
    /// Outcome of tickets waited for that failed (others waited for succeeded).
    failures: Mutex<HashMap<u64, String>>,
    next_ticket: AtomicU64,
    failed: Mutex<Option<String>>,
    rounds: Mutex<Rounds>,
    round_done: Condvar,
    counters: Counters,
    mutant: Option<SpanMutant>,
}

/// Flush rounds started and finished; at most one runs at a time.
#[derive(Debug, Default)]
struct Rounds {
    started: u64,
    finished: u64,
    running: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl SpanDevice {
    /// Make a new multi-target image over `targets` (in this order): write every target's
    /// header (a fresh set uuid and a uuid per target), flush, and open it. What the targets
    /// held is overwritten.
    ///
    /// # Errors
    /// [`MediaError::Span`] for an impossible layout (no targets, too many, a target too small,
    /// different block sizes), and I/O errors.
    pub fn format(targets: Vec<Arc<dyn Device>>, layout: SpanLayout) -> Result<Self> {
        let count = targets.len();
        if count == 0 || count > usize::from(TARGET_COUNT_MAX) {
            return Err(span_error(SpanError::Count {
                recorded: usize::from(TARGET_COUNT_MAX),
                given: count,
                missing: Vec::new(),
            }));
        }
        let shape =
            |position: usize, reason: String| span_error(SpanError::Shape { position, reason });
        let block_size = targets[0].geometry().block_size;
        let stripe = u64::from(layout.stripe_blocks.max(1));
        let mut row_count = u64::MAX;
        for (i, t) in targets.iter().enumerate() {
            let g = t.geometry();
            if g.block_size != block_size {
                return Err(shape(
                    i + 1,
                    format!("block size {} is not {block_size}", g.block_size),
                ));
            }
            let usable = g
                .block_count
                .saturating_sub(TARGET_HEADER_BLOCKS)
                .saturating_sub(u64::from(layout.lead_blocks));
            row_count = row_count.min(usable / stripe);
        }
        if row_count == 0 {
            return Err(shape(1, format!("a target holds no whole stripe of {stripe} blocks")));
        }
        let set_uuid =
            random_uuid().map_err(|source| MediaError::Io { op: "getrandom", source })?;
        let mut target_uuids = Vec::with_capacity(count);
        while target_uuids.len() < count {
            let uuid =
                random_uuid().map_err(|source| MediaError::Io { op: "getrandom", source })?;
            if !target_uuids.contains(&uuid) {
                target_uuids.push(uuid);
            }
        }
        let mut tickets = Vec::with_capacity(count);
        for (i, t) in targets.iter().enumerate() {
            let header = TargetHeader {
                target_index: u16::try_from(i).unwrap_or(u16::MAX),
                set_uuid,
                target_uuids: target_uuids.clone(),
                block_size,
                stripe_blocks: layout.stripe_blocks.max(1),
                lead_blocks: layout.lead_blocks,
                row_count,
            };
            let mut block = IoBuf::zeroed(block_size as usize);
            header.encode(&mut block);
            tickets.push(t.submit(vec![Write::new(0, block)], WriteFlags::NONE)?);
        }
        for (t, ticket) in targets.iter().zip(tickets) {
            t.wait(ticket)?;
        }
        for t in &targets {
            t.flush()?;
        }
        Self::open(targets)
    }

    /// Open the multi-target image on `targets`, checking that they are all of one image, each
    /// in its recorded place.
    ///
    /// # Errors
    /// [`MediaError::Span`] naming the first target that is missing, extra, swapped, repeated,
    /// foreign, damaged or misshapen; I/O errors reading the headers.
    pub fn open(targets: Vec<Arc<dyn Device>>) -> Result<Self> {
        let mut headers = Vec::with_capacity(targets.len());
        for (i, t) in targets.iter().enumerate() {
            headers.push(read_header(t.as_ref(), i + 1)?);
        }
        let first = headers.first().ok_or_else(|| {
            span_error(SpanError::Count { recorded: 0, given: 0, missing: Vec::new() })
        })?;
        let recorded = usize::from(first.target_count());
        for (i, h) in headers.iter().enumerate() {
            if h.set_uuid != first.set_uuid || h.target_uuids != first.target_uuids {
                return Err(span_error(SpanError::Foreign {
                    position: i + 1,
                    expected: uuid_text(&first.set_uuid),
                    found: uuid_text(&h.set_uuid),
                }));
            }
            if let Some(j) = headers[..i].iter().position(|e| e.target_index == h.target_index) {
                return Err(span_error(SpanError::Repeated { first: j + 1, position: i + 1 }));
            }
        }
        if headers.len() != recorded {
            let missing = (0..first.target_count())
                .filter(|&k| headers.iter().all(|h| h.target_index != k))
                .map(|k| usize::from(k) + 1)
                .collect();
            return Err(span_error(SpanError::Count { recorded, given: headers.len(), missing }));
        }
        for (i, h) in headers.iter().enumerate() {
            if usize::from(h.target_index) != i {
                return Err(span_error(SpanError::Swapped {
                    position: i + 1,
                    recorded: usize::from(h.target_index) + 1,
                }));
            }
            let same_layout = (h.block_size, h.stripe_blocks, h.lead_blocks, h.row_count)
                == (first.block_size, first.stripe_blocks, first.lead_blocks, first.row_count);
            if !same_layout {
                let reason = "its header's layout differs from target 1's".to_string();
                return Err(span_error(SpanError::Shape { position: i + 1, reason }));
            }
        }
        let stripe_blocks = u64::from(first.stripe_blocks);
        let lead_blocks = u64::from(first.lead_blocks);
        let count = recorded as u64;
        let per_target = first
            .row_count
            .checked_mul(stripe_blocks)
            .and_then(|b| b.checked_add(lead_blocks))
            .and_then(|b| b.checked_add(TARGET_HEADER_BLOCKS));
        let block_count = first
            .row_count
            .checked_mul(stripe_blocks)
            .and_then(|b| b.checked_mul(count))
            .and_then(|b| b.checked_add(lead_blocks));
        let (Some(per_target), Some(block_count)) = (per_target, block_count) else {
            let reason = "row count overflows".to_string();
            return Err(span_error(SpanError::Shape { position: 1, reason }));
        };
        for (i, t) in targets.iter().enumerate() {
            let g = t.geometry();
            if g.block_size != first.block_size || g.block_count < per_target {
                let reason = format!(
                    "{} blocks of {} bytes; the image needs {per_target} of {}",
                    g.block_count, g.block_size, first.block_size
                );
                return Err(span_error(SpanError::Shape { position: i + 1, reason }));
            }
        }
        let atomic = targets.iter().map(|t| t.geometry().atomic_write_size).min().unwrap_or(512);
        let geometry = Geometry::new(first.block_size, block_count, atomic)?;
        Ok(SpanDevice {
            dirty: targets.iter().map(|_| AtomicBool::new(false)).collect(),
            targets,
            headers,
            geometry,
            stripe_blocks,
            lead_blocks,
            pending: Mutex::new(HashMap::new()),
            failures: Mutex::new(HashMap::new()),
            next_ticket: AtomicU64::new(1),
            failed: Mutex::new(None),
            rounds: Mutex::new(Rounds::default()),
            round_done: Condvar::new(),
            counters: Counters::default(),
            mutant: None,
        })
    }

    /// Break the flush on purpose (only with the `mutants` feature; a no-op otherwise).
    pub fn set_mutant(&mut self, mutant: Option<SpanMutant>) {
        self.mutant = mutant.filter(|_| span_mutants_available());
    }

    /// The targets, in place order.
    #[must_use]
    pub fn targets(&self) -> &[Arc<dyn Device>] {
        &self.targets
    }

    /// The targets' headers, in place order.
    #[must_use]
    pub fn headers(&self) -> &[TargetHeader] {
        &self.headers
    }

    /// Each target's counters, in place order.
    #[must_use]
    pub fn target_stats(&self) -> Vec<DeviceStats> {
        self.targets.iter().map(|t| t.stats()).collect()
    }

    /// Where image block `block` (in range) lives: target, its block there, and how many blocks
    /// from it stay on that target.
    fn locate(&self, block: u64) -> (usize, u64, u64) {
        if block < self.lead_blocks {
            return (0, TARGET_HEADER_BLOCKS + block, self.lead_blocks - block);
        }
        let k = block - self.lead_blocks;
        let (stripe, within) = (k / self.stripe_blocks, k % self.stripe_blocks);
        let count = self.targets.len() as u64;
        let (target, row) = (stripe % count, stripe / count);
        let local = TARGET_HEADER_BLOCKS + self.lead_blocks + row * self.stripe_blocks + within;
        (usize::try_from(target).unwrap_or(0), local, self.stripe_blocks - within)
    }

    /// `(target, local block, byte range of the request)` pieces of `len` bytes at `block`.
    fn pieces(&self, block: u64, len: usize) -> Vec<(usize, u64, std::ops::Range<usize>)> {
        let bs = self.geometry.block_size as usize;
        let mut out = Vec::with_capacity(1);
        let mut at = 0usize;
        while at < len {
            let (target, local, run) = self.locate(block + (at / bs) as u64);
            let take = usize::try_from(run).unwrap_or(usize::MAX).saturating_mul(bs).min(len - at);
            out.push((target, local, at..at + take));
            at += take;
        }
        out
    }

    fn check_usable(&self) -> Result<()> {
        match lock(&self.failed).as_ref() {
            Some(first_error) => Err(MediaError::Failed { first_error: first_error.clone() }),
            None => Ok(()),
        }
    }

    fn fail(&self, error: &MediaError) {
        lock(&self.failed).get_or_insert_with(|| error.to_string());
    }

    fn submit_to(
        &self,
        stream: Option<u16>,
        writes: Vec<Write>,
        flags: WriteFlags,
    ) -> Result<Ticket> {
        check_write(&self.geometry, &writes)?;
        self.check_usable()?;
        self.counters.submission();
        let mut per_target: Vec<Vec<Write>> = self.targets.iter().map(|_| Vec::new()).collect();
        for w in writes {
            self.counters.write(w.data.len(), flags.fua);
            let pieces = self.pieces(w.block, w.data.len());
            if let [(target, local, _)] = pieces[..] {
                per_target[target].push(Write::new(local, w.data));
                continue;
            }
            for (target, local, range) in pieces {
                per_target[target].push(Write::new(local, IoBuf::from_slice(&w.data[range])));
            }
        }
        let mut tickets = Vec::with_capacity(per_target.len());
        for (target, writes) in per_target.into_iter().enumerate() {
            if writes.is_empty() {
                continue;
            }
            self.dirty[target].store(true, Ordering::SeqCst);
            let dev = &self.targets[target];
            let submitted = match stream {
                Some(s) => dev.submit_stream(s, writes, flags),
                None => dev.submit(writes, flags),
            };
            match submitted {
                Ok(t) => tickets.push((target, t)),
                Err(e) => {
                    self.fail(&e);
                    return Err(e);
                }
            }
        }
        let ticket = self.next_ticket.fetch_add(1, Ordering::SeqCst);
        lock(&self.pending).insert(ticket, tickets);
        Ok(Ticket(ticket))
    }

    /// One flush round: take the dirty marks, flush those targets concurrently.
    fn flush_round(&self) -> Result<()> {
        let mut due: Vec<usize> = (0..self.targets.len())
            .filter(|&t| self.dirty[t].swap(false, Ordering::SeqCst))
            .collect();
        if cfg!(feature = "mutants") && self.mutant == Some(SpanMutant::FlushFirstOnly) {
            due.retain(|&t| t == 0);
        }
        let outcome = match due[..] {
            [] => Ok(()),
            [only] => self.flush_target(only),
            _ => std::thread::scope(|scope| {
                let others: Vec<_> =
                    due[1..].iter().map(|&t| scope.spawn(move || self.flush_target(t))).collect();
                let mut outcome = self.flush_target(due[0]);
                for handle in others {
                    let one = handle.join().unwrap_or_else(|_| {
                        Err(MediaError::Failed { first_error: "a flush thread panicked".into() })
                    });
                    if outcome.is_ok() {
                        outcome = one;
                    }
                }
                outcome
            }),
        };
        if let Err(e) = &outcome {
            self.fail(e);
        }
        outcome
    }

    fn flush_target(&self, target: usize) -> Result<()> {
        self.counters.flush();
        self.targets[target].flush()
    }
}

fn read_header(dev: &dyn Device, position: usize) -> Result<TargetHeader> {
    let g = dev.geometry();
    let mut block = vec![0u8; g.block_size as usize];
    dev.read(0, &mut block)?;
    TargetHeader::decode(&block).map_err(|defect| match defect {
        HeaderDefect::NoMagic => span_error(SpanError::NotATarget { position }),
        HeaderDefect::Damaged(reason) => span_error(SpanError::Damaged { position, reason }),
    })
}

/// The target header at block 0 of `dev`, if it holds one (`Ok(None)`: no magic).
///
/// # Errors
/// A damaged header, and I/O errors.
pub fn target_header_of(dev: &dyn Device) -> Result<Option<TargetHeader>> {
    match read_header(dev, 1) {
        Ok(h) => Ok(Some(h)),
        Err(MediaError::Span { source }) if matches!(*source, SpanError::NotATarget { .. }) => {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

impl Device for SpanDevice {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn read(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        check_read(&self.geometry, block, buf)?;
        self.counters.read(buf.len());
        let pieces = self.pieces(block, buf.len());
        let first_target = pieces.first().map(|p| p.0);
        if pieces.iter().all(|p| Some(p.0) == first_target) {
            for (target, local, range) in pieces {
                self.targets[target].read(local, &mut buf[range])?;
            }
            return Ok(());
        }
        // Pieces on several targets: each target's pieces read on their own thread, so the
        // targets serve one large read together.
        let mut by_target: Vec<Vec<(u64, &mut [u8])>> =
            (0..self.targets.len()).map(|_| Vec::new()).collect();
        let mut rest = buf;
        for (target, local, range) in pieces {
            let (piece, tail) = rest.split_at_mut(range.len());
            by_target[target].push((local, piece));
            rest = tail;
        }
        let read_all = |target: usize, parts: Vec<(u64, &mut [u8])>| -> Result<()> {
            parts.into_iter().try_for_each(|(local, piece)| self.targets[target].read(local, piece))
        };
        std::thread::scope(|scope| {
            let mut groups = by_target.into_iter().enumerate().filter(|(_, g)| !g.is_empty());
            let here = groups.next();
            let others: Vec<_> = groups.map(|(t, g)| scope.spawn(move || read_all(t, g))).collect();
            let mut outcome = here.map_or(Ok(()), |(t, g)| read_all(t, g));
            for handle in others {
                let one = handle.join().unwrap_or_else(|_| {
                    Err(MediaError::Failed { first_error: "a read thread panicked".into() })
                });
                if outcome.is_ok() {
                    outcome = one;
                }
            }
            outcome
        })
    }

    fn submit(&self, writes: Vec<Write>, flags: WriteFlags) -> Result<Ticket> {
        self.submit_to(None, writes, flags)
    }

    fn submit_stream(&self, stream: u16, writes: Vec<Write>, flags: WriteFlags) -> Result<Ticket> {
        self.submit_to(Some(stream), writes, flags)
    }

    fn wait(&self, ticket: Ticket) -> Result<()> {
        if ticket.0 == 0 || ticket.0 >= self.next_ticket.load(Ordering::SeqCst) {
            return Err(MediaError::UnknownTicket(ticket.0));
        }
        let parts = lock(&self.pending).get(&ticket.0).cloned();
        let Some(parts) = parts else {
            return match lock(&self.failures).get(&ticket.0) {
                Some(text) => Err(MediaError::Failed { first_error: text.clone() }),
                None => Ok(()),
            };
        };
        for &(target, sub) in &parts {
            if let Err(e) = self.targets[target].wait(sub) {
                self.fail(&e);
                lock(&self.failures).insert(ticket.0, e.to_string());
                lock(&self.pending).remove(&ticket.0);
                return Err(e);
            }
            // Seen complete: the next flush round must cover it on this target.
            self.dirty[target].store(true, Ordering::SeqCst);
        }
        lock(&self.pending).remove(&ticket.0);
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        self.check_usable()?;
        let mut rounds = lock(&self.rounds);
        // The first round that starts after this call covers every write completed before it.
        let needed = rounds.started + 1;
        while rounds.finished < needed {
            if rounds.running {
                rounds = self.round_done.wait(rounds).unwrap_or_else(PoisonError::into_inner);
                continue;
            }
            rounds.running = true;
            rounds.started += 1;
            let this = rounds.started;
            drop(rounds);
            let outcome = self.flush_round();
            rounds = lock(&self.rounds);
            rounds.running = false;
            rounds.finished = this;
            self.round_done.notify_all();
            outcome?;
        }
        drop(rounds);
        // A round run by another caller may have failed.
        self.check_usable()
    }

    fn stats(&self) -> DeviceStats {
        self.counters.snapshot()
    }
}

#[cfg(test)]
mod tests;

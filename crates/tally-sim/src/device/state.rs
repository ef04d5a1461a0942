//! The mutable state of a [`super::CrashDevice`]: durable image, write cache, in-flight writes.
//!
//! Invariants (checked by `check` under `debug_assertions`):
//! - `cache` holds completed, not yet durable block writes in completion order; each has a
//!   `completed_at`, strictly increasing along the vector;
//! - `in_flight` holds submitted, not completed block writes in issue order (`id` increasing),
//!   none with a `completed_at`;
//! - `overlay[b]` is the data of the last write to `b` in `cache`, and exists iff one does;
//! - a submission is `done` iff none of its writes is in flight.

use std::collections::BTreeMap;
use std::sync::Arc;

use tally_media::{Counters, Geometry, Image, MediaError, Result, Ticket, Write, WriteFlags};

use super::fate::BlockWrite;
use super::fault::{flip_bit, FaultPlan, Injected};

/// One `submit` call.
#[derive(Debug, Clone)]
struct Submission {
    fua: bool,
    done: bool,
    /// The injected failure of one of its writes, reported at every `wait`.
    error: Option<Injected>,
}

/// Everything a crash device remembers, behind its lock.
pub(crate) struct State {
    pub(crate) durable: Image,
    pub(crate) cache: Vec<BlockWrite>,
    pub(crate) in_flight: Vec<BlockWrite>,
    overlay: BTreeMap<u64, Arc<[u8]>>,
    submissions: Vec<Submission>,
    /// Logical time: advanced by every submission and every block-write completion.
    clock: u64,
    next_write_id: u64,
    /// Text of the first write or flush failure; `Some` means fail-stop.
    pub(crate) failed: Option<String>,
    pub(crate) faults: FaultPlan,
    pub(crate) rng: fastrand::Rng,
    writes_seen: u64,
    flushes_seen: u64,
    reads_seen: u64,
    pub(crate) reads_of_in_flight: u64,
}

impl State {
    /// State of a device holding `durable`, nothing cached or in flight.
    pub(crate) fn new(durable: Image, faults: FaultPlan, seed: u64) -> Self {
        State {
            durable,
            cache: Vec::new(),
            in_flight: Vec::new(),
            overlay: BTreeMap::new(),
            submissions: Vec::new(),
            clock: 0,
            next_write_id: 0,
            failed: None,
            faults,
            rng: fastrand::Rng::with_seed(seed),
            writes_seen: 0,
            flushes_seen: 0,
            reads_seen: 0,
            reads_of_in_flight: 0,
        }
    }

    fn geometry(&self) -> Geometry {
        self.durable.geometry()
    }

    fn failed_error(&self) -> Option<MediaError> {
        self.failed.as_ref().map(|first| MediaError::Failed { first_error: first.clone() })
    }

    /// See [`tally_media::Device::read`].
    pub(crate) fn read(&mut self, block: u64, buf: &mut [u8], counters: &Counters) -> Result<()> {
        let count = tally_media::check_read(&self.geometry(), block, buf)?;
        counters.read(buf.len());
        self.reads_seen += 1;
        let nth = self.reads_seen;
        if self.faults.read_fails(nth) {
            return Err(Injected { op: "read", nth }.error());
        }
        let end = block + u64::from(count);
        if self.in_flight.iter().any(|w| (block..end).contains(&w.block)) {
            self.reads_of_in_flight += 1;
        }
        let bs = self.geometry().block_size as usize;
        for (i, chunk) in buf.chunks_exact_mut(bs).enumerate() {
            let b = block + i as u64;
            match self.overlay.get(&b) {
                Some(data) => chunk.copy_from_slice(data),
                None => chunk.copy_from_slice(self.durable.block(b)),
            }
        }
        if self.faults.read_flips(nth, &mut self.rng) {
            flip_bit(buf, &mut self.rng);
        }
        Ok(())
    }

    /// See [`tally_media::Device::submit`]: every block of every write goes in flight, except
    /// the blocks of a write chosen to fail.
    pub(crate) fn submit(
        &mut self,
        writes: Vec<Write>,
        flags: WriteFlags,
        counters: &Counters,
    ) -> Result<Ticket> {
        tally_media::check_write(&self.geometry(), &writes)?;
        if let Some(err) = self.failed_error() {
            return Err(err);
        }
        counters.submission();
        self.clock += 1;
        let submitted_at = self.clock;
        let ticket = self.submissions.len() as u64 + 1;
        let mut error = None;
        let bs = self.geometry().block_size as usize;
        for w in &writes {
            counters.write(w.data.len(), flags.fua);
            self.writes_seen += 1;
            if self.faults.write_fails(self.writes_seen) {
                error.get_or_insert(Injected { op: "write", nth: self.writes_seen });
                continue;
            }
            for (i, chunk) in w.data.chunks_exact(bs).enumerate() {
                self.in_flight.push(BlockWrite {
                    id: self.next_write_id,
                    ticket,
                    block: w.block + i as u64,
                    data: chunk.into(),
                    submitted_at,
                    completed_at: None,
                });
                self.next_write_id += 1;
            }
        }
        self.submissions.push(Submission { fua: flags.fua, done: false, error });
        self.check();
        Ok(Ticket(ticket))
    }

    /// Index of a ticket this device issued.
    fn index_of(&self, ticket: Ticket) -> Result<usize> {
        match usize::try_from(ticket.0) {
            Ok(t) if t >= 1 && t <= self.submissions.len() => Ok(t - 1),
            _ => Err(MediaError::UnknownTicket(ticket.0)),
        }
    }

    /// Whether `ticket` is known and still in flight.
    pub(crate) fn is_in_flight(&self, ticket: Ticket) -> Result<bool> {
        let index = self.index_of(ticket)?;
        Ok(!self.submissions[index].done)
    }

    /// The outcome of a completed `ticket`.
    pub(crate) fn outcome(&self, ticket: Ticket) -> Result<()> {
        let index = self.index_of(ticket)?;
        let sub = &self.submissions[index];
        assert!(sub.done, "outcome of a ticket still in flight");
        match sub.error {
            Some(injected) => Err(injected.error()),
            None => Ok(()),
        }
    }

    /// Tickets still in flight, in submission order.
    pub(crate) fn in_flight_tickets(&self) -> Vec<Ticket> {
        let open = self.submissions.iter().enumerate().filter(|(_, s)| !s.done);
        open.map(|(i, _)| Ticket(i as u64 + 1)).collect()
    }

    /// Complete every write of `ticket` (a no-op if it already completed), in issue order.
    /// A FUA write becomes durable now and supersedes cached writes to its block, which all
    /// completed before it.
    pub(crate) fn complete(&mut self, ticket: Ticket) -> Result<()> {
        let index = self.index_of(ticket)?;
        if self.submissions[index].done {
            return Ok(());
        }
        let (mine, rest): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.in_flight).into_iter().partition(|w| w.ticket == ticket.0);
        self.in_flight = rest;
        let fua = self.submissions[index].fua;
        for mut w in mine {
            self.clock += 1;
            w.completed_at = Some(self.clock);
            if fua {
                self.durable.set_block(w.block, Arc::clone(&w.data));
                self.cache.retain(|c| c.block != w.block);
                self.overlay.remove(&w.block);
            } else {
                self.overlay.insert(w.block, Arc::clone(&w.data));
                self.cache.push(w);
            }
        }
        let sub = &mut self.submissions[index];
        sub.done = true;
        if let (Some(injected), None) = (sub.error, &self.failed) {
            self.failed = Some(injected.error().to_string());
        }
        self.check();
        Ok(())
    }

    /// Complete each in-flight submission other than `except` with probability 1/2, in an
    /// order shuffled by `rng`.
    pub(crate) fn complete_random(
        &mut self,
        rng: &mut fastrand::Rng,
        except: Option<Ticket>,
    ) -> Result<()> {
        let mut open = self.in_flight_tickets();
        open.retain(|&t| Some(t) != except);
        rng.shuffle(&mut open);
        for t in open {
            if rng.bool() {
                self.complete(t)?;
            }
        }
        Ok(())
    }

    /// See [`tally_media::Device::flush`], including the injected outcomes.
    pub(crate) fn flush(&mut self, counters: &Counters) -> Result<()> {
        if let Some(err) = self.failed_error() {
            return Err(err);
        }
        counters.flush();
        self.flushes_seen += 1;
        if self.faults.flush_fails(self.flushes_seen) {
            let injected = Injected { op: "flush", nth: self.flushes_seen };
            self.failed = Some(injected.error().to_string());
            return Err(injected.error());
        }
        if self.faults.ignore_flushes {
            return Ok(());
        }
        for w in self.cache.drain(..) {
            self.durable.set_block(w.block, w.data);
        }
        self.overlay.clear();
        self.check();
        Ok(())
    }

    /// Every write applied: durable, then the cache in completion order, then in-flight
    /// writes in issue order.
    pub(crate) fn volatile_image(&self) -> Image {
        let mut image = self.durable.clone();
        for w in self.cache.iter().chain(&self.in_flight) {
            image.set_block(w.block, Arc::clone(&w.data));
        }
        image
    }

    /// The uncertain block writes (cached and in flight), in issue order.
    pub(crate) fn uncertain(&self) -> Vec<BlockWrite> {
        let mut all: Vec<BlockWrite> = self.cache.iter().chain(&self.in_flight).cloned().collect();
        all.sort_by_key(|w| w.id);
        all
    }

    /// Assert the invariants in the module comment (O(n): debug builds only).
    fn check(&self) {
        if !cfg!(debug_assertions) {
            return;
        }
        assert!(self.cache.windows(2).all(|p| p[0].completed_at < p[1].completed_at));
        assert!(self.cache.iter().all(|w| w.completed_at.is_some()));
        assert!(self.in_flight.windows(2).all(|p| p[0].id < p[1].id));
        assert!(self.in_flight.iter().all(|w| w.completed_at.is_none()));
        for (block, data) in &self.overlay {
            let last = self.cache.iter().rev().find(|w| w.block == *block);
            assert!(last.is_some_and(|w| Arc::ptr_eq(&w.data, data)));
        }
        assert!(self.cache.iter().all(|w| self.overlay.contains_key(&w.block)));
        for w in &self.in_flight {
            assert!(!self.submissions[(w.ticket - 1) as usize].done);
        }
    }
}

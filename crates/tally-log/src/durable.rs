//! Durability: one group flush for every waiter that arrived before it began, over a
//! consistent cut of what was committed (the global commit clock keeps a dependency inside
//! the cut with its dependent).

use std::sync::atomic::Ordering;

use tally_media::Ticket;

use crate::engine::{lock, Log};
use crate::format::body::TxId;
use crate::{LogError, Mutant, Result};

impl Log {
    /// Block until transaction `t` (and so everything before it on its stream, and everything
    /// it depends on) is durable. One flush serves every waiter that arrived before it began.
    ///
    /// # Errors
    /// I/O errors (the log is then failed) and an unknown stream.
    pub fn wait_durable(&self, t: TxId) -> Result<()> {
        let st = self
            .streams
            .get(usize::from(t.stream))
            .ok_or_else(|| LogError::Invalid(format!("no stream {}", t.stream)))?;
        loop {
            if lock(st).durable >= t.seq {
                return Ok(());
            }
            self.check_failed()?;
            let mut f = lock(&self.flush);
            if f.flushing {
                let _f = self.flush_cv.wait(f).unwrap_or_else(std::sync::PoisonError::into_inner);
                continue;
            }
            if lock(st).durable >= t.seq {
                return Ok(());
            }
            f.flushing = true;
            drop(f);
            let result = self.flush_round();
            lock(&self.flush).flushing = false;
            self.flush_cv.notify_all();
            result?;
        }
    }

    /// Make everything committed so far durable.
    ///
    /// # Errors
    /// I/O errors.
    pub fn sync(&self) -> Result<()> {
        // Also when everything is durable already: a clean close or a snapshot after a
        // failure (or a panic) must not be written.
        self.check_failed()?;
        for s in 0..self.streams.len() {
            let last = lock(&self.streams[s]).last_seq;
            self.wait_durable(TxId { stream: s as u16, seq: last })?;
        }
        Ok(())
    }

    /// One group flush: take a consistent cut of everything committed (by the global commit
    /// clock, so a dependency is always inside the cut with its dependent), wait for those
    /// writes to complete, flush once, advance every stream's durable watermark.
    pub(crate) fn flush_round(&self) -> Result<()> {
        self.flush_rounds.fetch_add(1, Ordering::Relaxed);
        let cut = self.clock.load(Ordering::SeqCst);
        let mut targets = Vec::with_capacity(self.streams.len());
        for s in 0..self.streams.len() {
            let st = lock(&self.streams[s]);
            let target =
                st.placed.iter().rev().find(|p| p.clock < cut).map_or(st.durable, |p| p.seq);
            targets.push(target.max(st.durable));
        }
        for (s, &target) in targets.iter().enumerate() {
            self.wait_submitted(s, target)?;
            let tickets: Vec<Ticket> = {
                let mut st = lock(&self.streams[s]);
                let (due, rest): (Vec<_>, Vec<_>) =
                    st.inflight.drain(..).partition(|b| b.first <= target);
                st.inflight = rest;
                due.into_iter().map(|b| b.ticket).collect()
            };
            for t in tickets {
                self.dev.wait(t).map_err(|e| self.fail(e))?;
            }
        }
        if !self.mutant(Mutant::FlushSkipped) {
            self.dev.flush().map_err(|e| self.fail(e))?;
        }
        for (s, &target) in targets.iter().enumerate() {
            let mut st = lock(&self.streams[s]);
            st.durable = st.durable.max(target);
        }
        Ok(())
    }

    /// Wait until every transaction of stream `s` up to `target` has been submitted, writing
    /// out the stream's buffer up to it (and no further but the later commits that share the
    /// last batch buffer it writes: the rest stay buffered).
    pub(crate) fn wait_submitted(&self, s: usize, target: u64) -> Result<()> {
        loop {
            self.writer.drive(s, target)?;
            let mut st = lock(&self.streams[s]);
            let untracked = self.mutant(Mutant::OrderlessSubmitUntracked);
            while st.submitting || (st.direct_submits > 0 && !untracked) {
                self.check_failed()?;
                st = self.stream_cv[s].wait(st).unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            // Write-outs go oldest first, so the watermark covers the prefix.
            if self.writer.written(s) >= target || st.pending.first().is_none_or(|p| p.seq > target)
            {
                return Ok(());
            }
        }
    }
}

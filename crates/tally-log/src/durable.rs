//! Durability: a waiter registers what it needs (a transaction: its stream's prefix up to it);
//! a flush round serves the union of the needs registered when it starts, closed over the
//! dependencies those transactions record (transitively, `Stream::waits_on`): for each stream
//! touched, the highest seq the closure needs is written out and waited for on that stream
//! alone; then one device flush, shared by every waiter of the round; then only those
//! streams' durable watermarks advance, each to its target. Other streams' buffered and
//! in-flight writes are not waited for: a small transaction's durability does not wait for an
//! unrelated stream's large writes. A stream's watermark stays a prefix whose dependency
//! closure is durable, so a waiter only compares its own stream's watermark.

use std::sync::atomic::Ordering;

use tally_media::Ticket;

use crate::engine::{lock, FlushState, Log};

/// Longest a round's start waits for more waiters to register (`Log::gather`): 2 ms, so a
/// slow device's long rounds do not make lone callers wait long.
const GATHER_MOST_NS: u64 = 2_000_000;

/// Bounds of how long a round runs before a waiter on other streams starts one beside it
/// (`Log::wait_for`): three average rounds, within these.
const LONG_ROUND_MIN_NS: u64 = 200_000;
const LONG_ROUND_MAX_NS: u64 = 10_000_000;
use crate::format::body::TxId;
use crate::{LogError, Mutant, Result};

impl Log {
    /// Block until transaction `t` (and so everything before it on its stream, and everything
    /// it depends on, transitively) is durable. One flush serves every waiter registered before
    /// it began; streams that `t` neither is on nor depends on are not written out for it.
    ///
    /// # Errors
    /// I/O errors (the log is then failed) and an unknown stream.
    pub fn wait_durable(&self, t: TxId) -> Result<()> {
        if usize::from(t.stream) >= self.streams.len() {
            return Err(LogError::Invalid(format!("no stream {}", t.stream)));
        }
        self.wait_for(&[t])
    }

    /// [`Log::wait_durable`] for several transactions at once, in one round when none is in
    /// progress (a file's last change and the changes every durable wait must take along,
    /// such as the file system's pending namespace changes).
    ///
    /// # Errors
    /// As [`Log::wait_durable`].
    pub fn wait_durable_all(&self, wants: &[TxId]) -> Result<()> {
        if let Some(t) = wants.iter().find(|t| usize::from(t.stream) >= self.streams.len()) {
            return Err(LogError::Invalid(format!("no stream {}", t.stream)));
        }
        self.wait_for(wants)
    }

    /// Make everything committed so far durable (every stream, in one round).
    ///
    /// # Errors
    /// I/O errors.
    pub fn sync(&self) -> Result<()> {
        // Also when everything is durable already: a clean close or a snapshot after a
        // failure (or a panic) must not be written.
        self.check_failed()?;
        let wants: Vec<TxId> = (0..self.streams.len())
            .map(|s| TxId { stream: s as u16, seq: lock(&self.streams[s]).last_seq })
            .collect();
        self.wait_for(&wants)
    }

    /// Block until every transaction of `wants` (valid streams) is durable: register them,
    /// then wait for the round that serves them, or run one. Rounds on disjoint sets of
    /// streams may run at once: a round claims the streams it writes out (`FlushState::busy`),
    /// and a waiter whose streams, or whose needs' dependency closure, meet a claimed stream
    /// waits for that round to end. A waiter on other streams waits for the next round too
    /// while the running one is young, and starts its own beside it once that one has run
    /// long (three average rounds): so an fsync of a small file does not queue behind another
    /// stream's round writing out a large file (issue 16, fsync isolation), and short rounds
    /// still serve many waiters each.
    fn wait_for(&self, wants: &[TxId]) -> Result<()> {
        let unmet = |w: &TxId| lock(&self.streams[usize::from(w.stream)]).durable < w.seq;
        // The round this call is counted in (`FlushState::next_waiters`).
        let mut counted_for = 0u64;
        loop {
            if !wants.iter().any(unmet) {
                return Ok(());
            }
            self.check_failed()?;
            let mut f = lock(&self.flush);
            for w in wants {
                // (Registered again after every wake-up: a stale need only widens a round.)
                if let Some(need) = f.needs.get_mut(usize::from(w.stream)) {
                    *need = (*need).max(w.seq);
                }
            }
            if counted_for != f.started + 1 {
                counted_for = f.started + 1;
                f.next_waiters += 1;
                self.gather_cv.notify_one();
            }
            let claimed = |f: &FlushState, s: usize| f.busy.get(s).copied().unwrap_or(false);
            if f.gathering || wants.iter().any(|w| claimed(&f, usize::from(w.stream))) {
                let _f = self.flush_cv.wait(f).unwrap_or_else(std::sync::PoisonError::into_inner);
                continue;
            }
            // A round running for less than a long round's time (3 average rounds, 0.2 to
            // 10 ms): join the next one rather than start one beside it, so that rounds keep
            // serving many waiters at once. Only past that, a round is one writing out much
            // (a large file's cache) and a waiter on other streams goes ahead of it.
            if let Some(ran) = f.running.iter().map(std::time::Instant::elapsed).max() {
                let long = std::time::Duration::from_nanos(
                    f.round_ns.saturating_mul(3).clamp(LONG_ROUND_MIN_NS, LONG_ROUND_MAX_NS),
                );
                if ran < long {
                    let _f = self
                        .flush_cv
                        .wait_timeout(f, long - ran)
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    continue;
                }
            }
            if !wants.iter().any(unmet) {
                return Ok(());
            }
            // This call's own dependencies on a claimed stream: after that round (it ends
            // with a wake-up of every waiter). Nothing is claimed while no round runs: no
            // closure to compute then.
            if !f.running.is_empty() {
                let mut mine = vec![0u64; self.streams.len()];
                for w in wants {
                    let s = usize::from(w.stream);
                    mine[s] = mine[s].max(w.seq);
                }
                self.close_needs(&mut mine);
                if self.meets_a_claim(&f, &mine) {
                    let _f =
                        self.flush_cv.wait(f).unwrap_or_else(std::sync::PoisonError::into_inner);
                    continue;
                }
            }
            f.gathering = true;
            let mut f = self.gather(f);
            f.gathering = false;
            // The needs of every stream no round has claimed, closed over their dependencies.
            let mut needs = vec![0u64; self.streams.len()];
            for (s, need) in needs.iter_mut().enumerate() {
                if !claimed(&f, s) {
                    *need = std::mem::take(&mut f.needs[s]);
                }
            }
            self.close_needs(&mut needs);
            if self.meets_a_claim(&f, &needs) {
                // Another waiter's dependency is on a stream a round is writing out (one that
                // registered while this one gathered): everything waits for that round, which
                // ends with a wake-up of every waiter.
                for (s, need) in needs.into_iter().enumerate() {
                    f.needs[s] = f.needs[s].max(need);
                }
                let _f = self.flush_cv.wait(f).unwrap_or_else(std::sync::PoisonError::into_inner);
                continue;
            }
            let targets: Vec<(usize, u64)> = needs
                .iter()
                .enumerate()
                .filter(|&(s, &need)| need > lock(&self.streams[s]).durable)
                .map(|(s, &need)| (s, need))
                .collect();
            for &(s, _) in &targets {
                f.busy[s] = true;
            }
            let began = std::time::Instant::now();
            f.running.push(began);
            f.started += 1;
            let waiters = std::mem::take(&mut f.next_waiters);
            drop(f);
            self.flush_cv.notify_all();
            let result = self.flush_round(&targets);
            let took = u64::try_from(began.elapsed().as_nanos()).unwrap_or(u64::MAX);
            let mut f = lock(&self.flush);
            for &(s, _) in &targets {
                f.busy[s] = false;
            }
            if let Some(i) = f.running.iter().position(|&t| t == began) {
                f.running.swap_remove(i);
            }
            // Who registered while the round ran comes back with those it served.
            f.companions = waiters + f.next_waiters;
            f.round_ns = if f.round_ns == 0 { took } else { (f.round_ns * 7 + took) / 8 };
            drop(f);
            self.flush_cv.notify_all();
            result?;
        }
    }

    /// Before a round starts: when fewer waiters have registered for it than waited together
    /// last time (`FlushState::companions`), wait for the others a while — at most half a
    /// round, as long as a round lasts on average — so that one round serves them all instead
    /// of two in a row each serving half. Without it, callers that each commit and then wait
    /// (threads appending and fsyncing their own files) split into two groups that alternate:
    /// one waits in the round running while the other commits, and each round starts the
    /// moment the last ends, with half of them (ext4's journal waits for more handles
    /// likewise, jbd2's batching by average commit time). A lone caller never waits: it waited
    /// alone last time.
    fn gather<'a>(
        &self,
        mut f: std::sync::MutexGuard<'a, FlushState>,
    ) -> std::sync::MutexGuard<'a, FlushState> {
        if f.next_waiters >= f.companions {
            return f;
        }
        let most = std::time::Duration::from_nanos((f.round_ns / 2).min(GATHER_MOST_NS));
        let deadline = std::time::Instant::now() + most;
        self.gathered_waits.fetch_add(1, Ordering::Relaxed);
        while f.next_waiters < f.companions {
            let now = std::time::Instant::now();
            if now >= deadline || self.check_failed().is_err() {
                break;
            }
            f = self
                .gather_cv
                .wait_timeout(f, deadline - now)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        f
    }

    /// Close `needs` (per stream, the highest seq wanted durable; 0: none) over the
    /// dependencies the wanted transactions and their stream predecessors record, transitively:
    /// afterwards every not-yet-durable transaction at or below a stream's need has its
    /// dependencies at or below their streams' needs. Needs are capped at what is placed.
    pub(crate) fn dependency_closure(&self, needs: &mut [u64]) {
        // Per stream, the seq up to which dependencies were gathered.
        let mut scanned = vec![0u64; needs.len()];
        let mut changed = true;
        while changed {
            changed = false;
            for s in 0..needs.len() {
                if needs[s] <= scanned[s] {
                    continue;
                }
                let deps: Vec<TxId> = {
                    let st = lock(&self.streams[s]);
                    needs[s] = needs[s].min(st.last_seq);
                    let from = scanned[s].max(st.durable);
                    if needs[s] <= from {
                        Vec::new()
                    } else {
                        (st.waits_on.range(from + 1..=needs[s]))
                            .flat_map(|(_, d)| d.iter().copied())
                            .collect()
                    }
                };
                scanned[s] = needs[s];
                for d in deps {
                    if let Some(need) = needs.get_mut(usize::from(d.stream)) {
                        if *need < d.seq {
                            *need = d.seq;
                            changed = true;
                        }
                    }
                }
            }
        }
    }

    /// Whether `needs` (closed) wants something not yet durable on a stream a running round
    /// has claimed.
    fn meets_a_claim(&self, f: &FlushState, needs: &[u64]) -> bool {
        needs.iter().enumerate().any(|(s, &need)| {
            need > 0
                && f.busy.get(s).copied().unwrap_or(false)
                && need > lock(&self.streams[s]).durable
        })
    }

    /// Close `needs` (per stream, the highest seq wanted durable) over the dependencies the
    /// wanted transactions record, capped at what is placed (`Log::dependency_closure`).
    fn close_needs(&self, needs: &mut [u64]) {
        if self.mutant(Mutant::DurableClosureSkipped) {
            for (s, need) in needs.iter_mut().enumerate() {
                *need = (*need).min(lock(&self.streams[s]).last_seq);
            }
        } else {
            self.dependency_closure(needs);
        }
    }

    /// One group flush for `targets` (streams and the highest seq of each to make durable,
    /// closed over their dependencies, claimed by this round): write out and wait for each
    /// stream up to its target (those streams' writes only), flush once, advance those
    /// streams' durable watermarks.
    pub(crate) fn flush_round(&self, targets: &[(usize, u64)]) -> Result<()> {
        self.flush_rounds.fetch_add(1, Ordering::Relaxed);
        // Every stream's write-out is submitted before any is waited for: the streams' writes
        // are at the device together, not one stream's round trip after another's.
        for &(s, target) in targets {
            self.wait_submitted(s, target)?;
        }
        let mut tickets: Vec<Ticket> = Vec::new();
        for &(s, target) in targets {
            let mut st = lock(&self.streams[s]);
            let (due, rest): (Vec<_>, Vec<_>) =
                st.inflight.drain(..).partition(|b| b.first <= target);
            st.inflight = rest;
            tickets.extend(due.into_iter().map(|b| b.ticket));
        }
        for t in tickets {
            self.dev.wait(t).map_err(|e| self.fail(e))?;
        }
        if !self.mutant(Mutant::FlushSkipped) {
            self.dev.flush().map_err(|e| self.fail(e))?;
        }
        for &(s, target) in targets {
            let mut st = lock(&self.streams[s]);
            st.durable = st.durable.max(target);
            let durable = st.durable;
            while let Some(e) = st.waits_on.first_entry() {
                if *e.key() > durable {
                    break;
                }
                e.remove();
            }
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

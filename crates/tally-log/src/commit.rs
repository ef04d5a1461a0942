//! Committing a transaction: checked, encoded into units, placed at its stream's end (a new
//! segment when it does not fit), then handed to the write-behind buffer or submitted
//! (orderless), and waited for as its mode asks. Also large transactions' bookkeeping
//! (runs) and the space questions the layer above asks before committing.

use std::sync::atomic::Ordering;

use tally_media::{IoBuf, Write, WriteFlags};

use crate::api::{CommitInfo, CommitMode, DataBytes, RunAsk, Transaction};
use crate::engine::{crc_pad, crc_padded, lock, Log, Placed, Stream};
use crate::format::body::{Body, Run, RunRole, TxId};
use crate::format::unit::{payload_capacity, UnitHeader, UnitKind, FLAG_CLASSIC, UNIT_HEADER_SIZE};
use crate::writeback::{Due, InFlight};
use crate::{LogError, Result};

/// A transaction's body, ready to be encoded into its units, and the blocks it takes.
pub(crate) struct Encoded {
    /// Encoded only into the place its units take (`units_and_data`), never on its own.
    pub body: Body,
    /// Bytes of its encoding.
    pub body_len: usize,
    /// Units the body takes (at least one).
    pub unit_count: u64,
    pub data_count: u64,
    /// Blocks placed: units, data, and a classic commit's commit block.
    pub span: u64,
    pub record_count: u32,
}

/// Where a body's encoding goes: the payloads of consecutive unit blocks (each after its
/// header, `cap` bytes), filled in order.
struct Payloads<'a> {
    units: &'a mut [u8],
    block_size: usize,
    cap: usize,
    /// The unit being filled, and the bytes of its payload filled so far.
    unit: usize,
    at: usize,
}

impl Payloads<'_> {
    /// Append `part`, continuing in the next unit's payload when this one is full.
    fn put(&mut self, mut part: &[u8]) {
        while !part.is_empty() {
            if self.at == self.cap {
                self.unit += 1;
                self.at = 0;
            }
            let n = (self.cap - self.at).min(part.len());
            let from = self.unit * self.block_size + UNIT_HEADER_SIZE + self.at;
            self.units[from..from + n].copy_from_slice(&part[..n]);
            part = &part[n..];
            self.at += n;
        }
    }
}

impl Log {
    /// Commit `tx` ordered and atomic; returns before it is durable (`CommitMode::Ordered`).
    ///
    /// # Errors
    /// See [`Log::commit_with`].
    pub fn commit(&self, tx: Transaction) -> Result<CommitInfo> {
        self.commit_with(tx, CommitMode::Ordered)
    }

    /// [`Log::commit`], leaving the write-out it makes due (its stream's, or every stream's
    /// past the write-behind's memory bound) to a later [`Log::submit_deferred`]: a caller
    /// that commits under a lock of its own (the file system's state lock) submits after
    /// letting go of it, so no device submission — a system call, and on a loop device the
    /// write's own work — happens under that lock (issue 16). Until then the transaction waits
    /// in its stream's buffer as a write-behind one does: a durable wait on it, a later
    /// write-out of its stream or anyone's `submit_deferred` takes it along, and a crash loses
    /// it as it loses any commit not yet durable.
    ///
    /// # Errors
    /// See [`Log::commit_with`].
    pub fn commit_deferred(&self, tx: Transaction) -> Result<CommitInfo> {
        self.commit_inner(tx, CommitMode::Ordered, true)
    }

    /// Start the write-outs that [`Log::commit_deferred`] left (every caller's: cheap when
    /// there are none).
    ///
    /// # Errors
    /// I/O errors (the log is then failed).
    pub fn submit_deferred(&self) -> Result<()> {
        if !self.deferred_any.load(Ordering::Acquire) {
            return Ok(());
        }
        let streams = {
            let mut d = lock(&self.deferred);
            self.deferred_any.store(false, Ordering::Release);
            std::mem::take(&mut *d)
        };
        if streams.contains(&usize::MAX) {
            return self.writer.write_out_all();
        }
        for s in streams {
            self.writer.drive(s, u64::MAX)?;
        }
        Ok(())
    }

    /// [`Log::submit_deferred`] for the committer of a transaction on stream `s`: that
    /// stream's write-out if it is due (and every stream's, when the write-behind's memory
    /// bound made that due), not other streams'. Each committer submits its own, so a small
    /// commit does not drive a stream streaming megabytes, whose submission waits for room in
    /// the device's queue (issue 16); the others stay noted for their committers, a durable
    /// wait or `submit_deferred`.
    ///
    /// # Errors
    /// I/O errors (the log is then failed).
    pub fn submit_deferred_of(&self, s: u16) -> Result<()> {
        if !self.deferred_any.load(Ordering::Acquire) {
            return Ok(());
        }
        let s = usize::from(s);
        let all = {
            let mut d = lock(&self.deferred);
            let all = d.contains(&usize::MAX);
            let before = d.len();
            if all {
                d.clear();
            } else {
                d.retain(|&n| n != s);
            }
            if d.is_empty() {
                self.deferred_any.store(false, Ordering::Release);
            }
            if !all && d.len() == before {
                return Ok(());
            }
            all
        };
        if all {
            return self.writer.write_out_all();
        }
        self.writer.drive(s, u64::MAX)
    }

    /// Note that stream `s`'s write-out (`usize::MAX`: every stream's) is due, for
    /// [`Log::submit_deferred`].
    fn defer_write_out(&self, s: usize) {
        let mut d = lock(&self.deferred);
        if !d.contains(&s) {
            d.push(s);
        }
        self.deferred_any.store(true, Ordering::Release);
    }

    /// Commit `tx` and return once it and everything it depends on are durable.
    ///
    /// # Errors
    /// See [`Log::commit_with`].
    pub fn commit_durable(&self, tx: Transaction) -> Result<CommitInfo> {
        self.commit_with(tx, CommitMode::Count)
    }

    /// Commit `tx` in `mode`.
    ///
    /// # Errors
    /// [`LogError::Failed`] after an earlier I/O error, [`LogError::NoSpace`],
    /// [`LogError::TooLarge`], [`LogError::Invalid`] for a bad stream or data block, and I/O
    /// errors (after which the log is failed).
    pub fn commit_with(&self, tx: Transaction, mode: CommitMode) -> Result<CommitInfo> {
        self.commit_inner(tx, mode, false)
    }

    /// [`Log::commit_with`]; with `defer`, a write-out the commit makes due is left to
    /// [`Log::submit_deferred`].
    fn commit_inner(
        &self,
        mut tx: Transaction,
        mode: CommitMode,
        defer: bool,
    ) -> Result<CommitInfo> {
        self.check_failed()?;
        self.check_commit(&tx, mode)?;
        let s = usize::from(tx.stream);
        let mut enc = self.encode(&mut tx, mode)?;
        let mut st = self.lock_with_seq(s)?;
        if let Some(ask) = tx.run {
            Self::check_run(&st, ask, tx.stream)?;
        }
        self.make_room(&mut st, tx.stream, enc.span)?;
        let header = UnitHeader {
            kind: UnitKind::Body,
            flags: if mode == CommitMode::Classic { FLAG_CLASSIC } else { 0 },
            stream: tx.stream,
            epoch: st.epoch,
            seq: st.next_seq,
            prev_seq: st.last_seq,
            unit_index: 0,
            unit_count: enc.unit_count as u32,
            data_count: tx.data.len() as u32,
            next_segment: st.next_segment,
            durable_watermark: st.durable,
            payload_len: 0,
        };
        if let Some(ask) = tx.run {
            // Same size as the placeholder `encode` counted.
            enc.body.run = Some(Self::open_run(&mut st, ask, tx.stream, header.seq)?);
        }
        let start = self.segment_start(st.segment).saturating_add(u64::from(st.offset));
        let bytes = usize::try_from(enc.unit_count + enc.data_count)
            .ok()
            .and_then(|blocks| blocks.checked_mul(self.block_size as usize))
            .ok_or_else(|| LogError::Invalid("transaction larger than memory".into()))?;
        let info = self.record_placed(&mut st, &header, &enc, start);
        if mode == CommitMode::Orderless {
            // Not zeroed: `units_and_data` writes every byte.
            let mut buf = IoBuf::for_overwrite(bytes);
            self.units_and_data(&enc, &header, &tx.data, &mut buf);
            return self.submit_orderless(st, info, start, buf).map(|()| info);
        }
        let place = (start, header.seq, bytes);
        let due = self.writer.buffer(s, &mut st, place, |room| {
            self.units_and_data(&enc, &header, &tx.data, room);
        });
        drop(st);
        match due {
            // A durable or classic commit is written out by its flush round.
            _ if self.options.write_behind.is_some() && mode != CommitMode::Ordered => {}
            Due::Nothing => {}
            Due::Stream if defer => self.defer_write_out(s),
            Due::Every if defer => self.defer_write_out(usize::MAX),
            Due::Stream => self.writer.drive(s, u64::MAX)?,
            Due::Every => self.writer.write_out_all()?,
        }
        match mode {
            CommitMode::Ordered | CommitMode::Orderless => {}
            CommitMode::Count => self.wait_durable(info.ticket)?,
            CommitMode::Classic => {
                self.wait_durable(info.ticket)?;
                let commit_block = self.encode_commit_block(&header);
                let at = start + enc.unit_count + tx.data.len() as u64;
                self.dev
                    .write_sync(vec![Write::new(at, commit_block)], WriteFlags::FUA)
                    .map_err(|e| self.fail(e))?;
            }
        }
        Ok(info)
    }

    /// Refuse what no mode can commit (before anything is placed): an unknown stream, a data
    /// block larger than a block, counts beyond the format's fields, a large transaction's
    /// part committed other than ordered or count.
    pub(crate) fn check_commit(&self, tx: &Transaction, mode: CommitMode) -> Result<()> {
        if usize::from(tx.stream) >= self.streams.len() {
            return Err(LogError::Invalid(format!("no stream {}", tx.stream)));
        }
        let bs = self.block_size as usize;
        if let Some(d) = tx.data.iter().find(|d| d.len() > bs) {
            return Err(LogError::Invalid(format!(
                "data block of {} bytes > block size {bs}",
                d.len()
            )));
        }
        if tx.deps.len() > usize::from(u16::MAX)
            || tx.records.iter().any(|r| r.len() > u32::MAX as usize)
        {
            return Err(LogError::Invalid("too many dependencies or record too large".into()));
        }
        if tx.run.is_some() && !matches!(mode, CommitMode::Ordered | CommitMode::Count) {
            return Err(LogError::Invalid(format!(
                "a large transaction's parts are committed ordered or count, not {}",
                mode.name()
            )));
        }
        Ok(())
    }

    /// Encode `tx`'s body (its dependencies still worth recording, its data blocks' crcs, its
    /// records, which it takes, and room for its run's place) and size its span; refuse a span
    /// over a segment.
    pub(crate) fn encode(&self, tx: &mut Transaction, mode: CommitMode) -> Result<Encoded> {
        let bs = self.block_size as usize;
        let deps = if mode == CommitMode::Orderless { Vec::new() } else { self.live_deps(tx) };
        debug_assert_eq!(tx.data.len(), tx.data_crcs.len());
        let data_crcs = (tx.data.iter().zip(&tx.data_crcs))
            .map(|(d, known)| match *known {
                Some(crc) => {
                    debug_assert_eq!(crc, crc32c::crc32c(d), "data_with_crc: wrong crc");
                    crc_pad(crc, d.len(), bs)
                }
                None => crc_padded(d, bs),
            })
            .collect();
        let record_count = u32::try_from(tx.records.len())
            .map_err(|_| LogError::Invalid("more than 2^32 records".into()))?;
        // A run's place is known only under the stream lock; the placeholder has its size and
        // is replaced there.
        let placeholder = tx.run.map(|_| Run { role: RunRole::Part, seq: 0, index: 0 });
        // The records move into the body; the caller needs only the data blocks after this.
        let records = std::mem::take(&mut tx.records);
        let body = Body { deps, data_crcs, records, run: placeholder };
        let body_len = body.encoded_len();
        let cap = payload_capacity(self.block_size);
        let unit_count = body_len.div_ceil(cap).max(1) as u64;
        let data_count = tx.data.len() as u64;
        let span = unit_count + data_count + u64::from(mode == CommitMode::Classic);
        if span > u64::from(self.segment_blocks) {
            return Err(LogError::TooLarge { blocks: span, segment_blocks: self.segment_blocks });
        }
        Ok(Encoded { body, body_len, unit_count, data_count, span, record_count })
    }

    /// Lock stream `s` with a sequence number free to take (raising the durable reservation
    /// first when it is used up).
    pub(crate) fn lock_with_seq(&self, s: usize) -> Result<std::sync::MutexGuard<'_, Stream>> {
        let mut st = lock(&self.streams[s]);
        self.check_failed()?;
        while st.next_seq >= st.seq_limit {
            drop(st);
            self.raise_seq_limit(s)?;
            st = lock(&self.streams[s]);
            self.check_failed()?;
        }
        Ok(st)
    }

    /// Move the stream to a fresh segment when `span` blocks do not fit the current one.
    pub(crate) fn make_room(&self, st: &mut Stream, stream: u16, span: u64) -> Result<()> {
        if u64::from(st.offset) + span > u64::from(self.segment_blocks) {
            let next_next = lock(&self.space).alloc().ok_or(LogError::NoSpace { stream })?;
            st.segment = st.next_segment;
            st.next_segment = next_next;
            st.offset = 0;
            let seg = st.segment;
            st.chain.push_back(seg);
        }
        Ok(())
    }

    /// The run a part or close at `seq` belongs to, counted in the stream's open runs.
    pub(crate) fn open_run(st: &mut Stream, ask: RunAsk, stream: u16, seq: u64) -> Result<Run> {
        Ok(match ask {
            RunAsk::Begin => {
                st.runs.insert(seq, 1);
                Run { role: RunRole::Part, seq, index: 0 }
            }
            RunAsk::Part(run) => {
                let n = st.runs.get_mut(&run).ok_or_else(|| Self::no_run(stream, run))?;
                let index = *n;
                *n = n.saturating_add(1);
                Run { role: RunRole::Part, seq: run, index }
            }
            RunAsk::Close(run) => {
                let parts = st.runs.remove(&run).ok_or_else(|| Self::no_run(stream, run))?;
                st.last_close = seq;
                Run { role: RunRole::Close, seq: run, index: parts }
            }
        })
    }

    /// Write the blocks a transaction writes into `out` (exactly their size; every byte is
    /// written, whatever `out` held): its units (the body encoded straight into their
    /// payloads, then each sealed with its header) and then its data blocks, zero-padded.
    pub(crate) fn units_and_data(
        &self,
        enc: &Encoded,
        header: &UnitHeader,
        data: &[DataBytes],
        out: &mut [u8],
    ) {
        let bs = self.block_size as usize;
        let cap = payload_capacity(self.block_size);
        debug_assert_eq!(out.len() as u64, (enc.unit_count + enc.data_count) * bs as u64);
        let (units, blocks) = out.split_at_mut(enc.unit_count as usize * bs);
        let mut payloads = Payloads { units: &mut *units, block_size: bs, cap, unit: 0, at: 0 };
        enc.body.encode_with(|part| payloads.put(part));
        debug_assert_eq!(payloads.unit * cap + payloads.at, enc.body_len, "body length");
        for (i, block) in units.chunks_exact_mut(bs).enumerate() {
            let payload_len = enc.body_len.saturating_sub(i * cap).min(cap);
            let h = UnitHeader { unit_index: i as u32, payload_len: payload_len as u32, ..*header };
            h.seal(&self.uuid, block);
            debug_assert!(UnitHeader::decode(&self.uuid, block, 0, true).is_ok(), "unit sealed");
        }
        for (d, block) in data.iter().zip(blocks.chunks_exact_mut(bs)) {
            // (`check_commit` refused blocks larger than a block.)
            let (bytes, padding) = block.split_at_mut(d.len().min(bs));
            bytes.copy_from_slice(&d[..bytes.len()]);
            padding.fill(0);
        }
    }

    /// Advance the stream past the transaction placed at `start` and remember its place (and
    /// its dependencies, until it is durable: `Stream::waits_on`).
    pub(crate) fn record_placed(
        &self,
        st: &mut Stream,
        header: &UnitHeader,
        enc: &Encoded,
        start: u64,
    ) -> CommitInfo {
        let seq = header.seq;
        // The dependencies the body records (on other streams, not durable when encoded).
        if !enc.body.deps.is_empty() {
            st.waits_on.insert(seq, enc.body.deps.clone());
        }
        st.offset += enc.span as u32;
        st.last_seq = seq;
        st.next_seq = seq + 1;
        st.placed.push_back(Placed {
            seq,
            epoch: st.epoch,
            end_segment: st.segment,
            end_offset: st.offset,
            next_segment: st.next_segment,
            records: enc.record_count,
            dead: 0,
        });
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.placed_blocks.fetch_add(enc.span, Ordering::Relaxed);
        CommitInfo {
            ticket: TxId { stream: header.stream, seq },
            data_start: start + enc.unit_count,
        }
    }

    /// Submit an orderless commit outside the stream lock; until its ticket is in `inflight`,
    /// `direct_submits` keeps a flush round from declaring it durable.
    pub(crate) fn submit_orderless(
        &self,
        mut st: std::sync::MutexGuard<'_, Stream>,
        info: CommitInfo,
        start: u64,
        buf: IoBuf,
    ) -> Result<()> {
        let s = usize::from(info.ticket.stream);
        let blocks = (buf.len() / self.block_size as usize) as u64;
        st.direct_submits += 1;
        drop(st);
        let writes = vec![Write::new(start, buf)];
        let result = self.dev.submit_stream(info.ticket.stream, writes, WriteFlags::NONE);
        let mut st = lock(&self.streams[s]);
        st.direct_submits -= 1;
        self.stream_cv[s].notify_all();
        match result {
            Ok(ticket) => {
                st.inflight.push(InFlight {
                    first: info.ticket.seq,
                    ticket,
                    ranges: vec![(start, blocks)],
                });
                Ok(())
            }
            Err(e) => {
                drop(st);
                Err(self.fail(e))
            }
        }
    }

    /// Refuse a run request that names no open run of the stream (before anything is placed).
    pub(crate) fn check_run(st: &Stream, ask: RunAsk, stream: u16) -> Result<()> {
        match ask {
            RunAsk::Begin => Ok(()),
            RunAsk::Part(run) | RunAsk::Close(run) if st.runs.contains_key(&run) => Ok(()),
            RunAsk::Part(run) | RunAsk::Close(run) => Err(Self::no_run(stream, run)),
        }
    }

    pub(crate) fn no_run(stream: u16, run: u64) -> LogError {
        LogError::Invalid(format!("stream {stream} has no open large transaction {run}"))
    }

    /// Give up the open large transaction `run` of `stream`: it is never closed, so its parts
    /// are left out by every recovery (and by cleaning's reads), and checkpoints may pass
    /// them. Unknown runs are ignored.
    pub fn abandon_run(&self, stream: u16, run: u64) {
        if let Some(st) = self.streams.get(usize::from(stream)) {
            lock(st).runs.remove(&run);
        }
    }

    /// The first part of the oldest open large transaction of `stream`, if any: checkpoints
    /// and cleaning stop before it.
    pub(crate) fn first_open_run(&self, stream: usize) -> Option<u64> {
        self.streams.get(stream).and_then(|st| lock(st).runs.keys().next().copied())
    }

    pub(crate) fn encode_commit_block(&self, header: &UnitHeader) -> IoBuf {
        let mut block = IoBuf::zeroed(self.block_size as usize);
        let h = UnitHeader {
            kind: UnitKind::Commit,
            unit_index: header.unit_count,
            payload_len: 0,
            ..*header
        };
        h.encode_into(&self.uuid, &[], &mut block);
        block
    }

    /// Dependencies still worth recording: on other streams and not yet durable.
    pub(crate) fn live_deps(&self, tx: &Transaction) -> Vec<TxId> {
        let mut deps: Vec<TxId> = tx
            .deps
            .iter()
            .copied()
            .filter(|d| d.stream != tx.stream)
            .filter(|d| {
                self.streams.get(usize::from(d.stream)).is_some_and(|st| lock(st).durable < d.seq)
            })
            .collect();
        deps.sort_unstable();
        deps.dedup();
        deps
    }

    /// Blocks `tx` will take when committed in an ordered or count mode (an upper bound: every
    /// dependency counted, even those that will be dropped as already durable).
    pub(crate) fn planned_span(&self, tx: &Transaction) -> u64 {
        use crate::format::body::{BODY_HEADER_SIZE, DEP_SIZE, RECORD_LEN_SIZE};
        let body_len = BODY_HEADER_SIZE
            + if tx.run.is_some() { crate::format::body::RUN_SEQ_SIZE } else { 0 }
            + tx.deps.len() * DEP_SIZE
            + tx.data.len() * 4
            + tx.records.iter().map(|r| RECORD_LEN_SIZE + r.len()).sum::<usize>();
        let units = body_len.div_ceil(payload_capacity(self.block_size)).max(1);
        (units + tx.data.len()) as u64
    }

    /// Whether spans of `spans` blocks, committed in this order on stream `s` now, fit without
    /// running out of segments.
    pub(crate) fn room_for(&self, s: usize, spans: &[u64]) -> bool {
        let st = lock(&self.streams[s]);
        let free = u64::from(lock(&self.space).free_count());
        let seg = u64::from(self.segment_blocks);
        let mut at = u64::from(st.offset);
        let mut switches = 0;
        for &span in spans {
            if span > seg {
                return false;
            }
            if at + span > seg {
                switches += 1;
                at = 0;
            }
            at += span;
        }
        switches <= free
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tally_media::{Device, MemDevice};

    use crate::{Log, LogConfig, OpenOptions, Transaction};

    fn fresh() -> Arc<MemDevice> {
        let dev = Arc::new(MemDevice::new(4096, 1024).unwrap());
        Log::format(&*dev, &LogConfig { streams: 1, segment_blocks: 64, ..LogConfig::default() })
            .unwrap();
        dev
    }

    /// Blocks handed down with their crc (a whole one, and a short one whose crc the log
    /// extends over the padding) are written and recovered like one the log checksums itself.
    #[test]
    fn a_data_block_with_its_crc_is_recovered() {
        let dev = fresh();
        let (log, _) = Log::open(dev.clone(), OpenOptions::default()).unwrap();
        let full = vec![0x5A; 4096];
        let mut tx = Transaction::new(0);
        tx.record(b"r".to_vec());
        tx.data_with_crc(full.clone(), crc32c::crc32c(&full));
        tx.data(vec![7; 10]);
        tx.data_with_crc(vec![9; 20], crc32c::crc32c(&[9; 20]));
        let info = log.commit_durable(tx).unwrap();
        drop(log);
        let (_log, r) = Log::open(dev.clone(), OpenOptions::default()).unwrap();
        assert_eq!(r.streams[0].txs.len(), 1);
        let mut block = vec![0u8; 4096];
        dev.read(info.data_start, &mut block).unwrap();
        assert_eq!(block, full);
        dev.read(info.data_start + 1, &mut block).unwrap();
        assert!(block[..10].iter().all(|&b| b == 7) && block[10..].iter().all(|&b| b == 0));
        dev.read(info.data_start + 2, &mut block).unwrap();
        assert!(block[..20].iter().all(|&b| b == 9) && block[20..].iter().all(|&b| b == 0));
    }

    /// Bodies encoded straight into their units' payloads (over the junk of a reused buffer)
    /// come back whole at every place a record can cross a unit's end: records that end just
    /// before, at and after it, a record longer than a unit, with dependencies and data.
    #[test]
    fn bodies_spanning_units_are_recovered_whole() {
        let dev = Arc::new(MemDevice::new(4096, 1024).unwrap());
        Log::format(&*dev, &LogConfig { streams: 2, segment_blocks: 64, ..LogConfig::default() })
            .unwrap();
        let (log, _) = Log::open(dev.clone(), OpenOptions::default()).unwrap();
        let other = log.commit(Transaction::new(1)).unwrap().ticket;
        let cap = crate::format::unit::payload_capacity(4096);
        let mut sent = Vec::new();
        for (i, first) in
            [cap - 40, cap - 36, cap - 32, cap, 2 * cap + 5, 9000].into_iter().enumerate()
        {
            // Junk in the pool's buffers of the sizes these transactions take.
            for blocks in 1..=5 {
                let mut junk = tally_media::IoBuf::zeroed(blocks * 4096);
                junk.fill(0xC3);
            }
            let mut tx = Transaction::new(0);
            tx.depend_on(other);
            let records = vec![vec![i as u8 + 1; first], vec![0xEE; 3], Vec::new()];
            for r in &records {
                tx.record(r.clone());
            }
            tx.data(vec![i as u8; 100]);
            log.commit(tx).unwrap();
            sent.push(records);
        }
        log.sync().unwrap();
        drop(log);
        let (_log, r) = Log::open(dev, OpenOptions::default()).unwrap();
        let got: Vec<_> = r.streams[0].txs.iter().map(|t| t.records.clone()).collect();
        assert_eq!(got, sent);
        assert!(r.streams[0].txs.iter().all(|t| t.deps == [other] && t.data_count == 1));
    }

    /// The crc handed down is the one written: a wrong one is a caller's bug that debug builds
    /// stop at commit, and that recovery refuses in release builds (the transaction is lost).
    #[test]
    #[cfg_attr(debug_assertions, should_panic(expected = "wrong crc"))]
    fn a_wrong_crc_handed_down_is_caught() {
        let dev = fresh();
        let (log, _) = Log::open(dev.clone(), OpenOptions::default()).unwrap();
        let full = vec![0x5A; 4096];
        let mut tx = Transaction::new(0);
        tx.record(b"r".to_vec());
        tx.data_with_crc(full.clone(), crc32c::crc32c(&full) ^ 1);
        log.commit_durable(tx).unwrap();
        drop(log);
        let (_log, r) = Log::open(dev, OpenOptions::default()).unwrap();
        assert!(r.streams[0].txs.is_empty(), "a block with a wrong crc was recovered");
    }
}

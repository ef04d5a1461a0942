//! Checkpoints and the superblock: declaring a stream's prefix checkpointed (durably, then
//! freeing the segments before it), reserving sequence numbers, and writing the superblock
//! copies in turn.

use tally_media::{IoBuf, Write, WriteFlags};

use crate::engine::{lock, Log, SbState};
use crate::format::body::TxId;
use crate::format::superblock::{StreamRoot, Superblock, SB_BLOCKS};
use crate::{LogError, Mutant, Result};

impl Log {
    /// Declare every transaction of `stream` up to `seq` checkpointed: the layer above has what
    /// it needs of them elsewhere. Makes them durable first, then durably records the new
    /// starting point, then frees the segments before it.
    ///
    /// # Errors
    /// A `seq` that was never committed, and I/O errors.
    pub fn checkpoint(&self, stream: u16, seq: u64) -> Result<()> {
        let s = usize::from(stream);
        if s >= self.streams.len() {
            return Err(LogError::Invalid(format!("no stream {stream}")));
        }
        self.check_failed()?;
        self.wait_durable(TxId { stream, seq })?;
        let mut sbs = lock(&self.sb);
        let (root, freed) = {
            let mut st = lock(&self.streams[s]);
            let current = sbs.sb.streams[s];
            if seq <= current.checkpoint_seq {
                return Ok(());
            }
            // A run's parts are committed only by its close: a checkpoint past an open run's
            // first part would drop parts a later close needs.
            if let Some(&run) = st.runs.keys().next().filter(|&&run| run <= seq) {
                return Err(LogError::Invalid(format!(
                    "stream {stream}: checkpoint at {seq} would pass open large transaction {run}"
                )));
            }
            let found = st.placed.binary_search_by_key(&seq, |p| p.seq).ok();
            let Some(p) = found.and_then(|i| st.placed.get(i)).copied() else {
                return Err(LogError::Invalid(format!(
                    "stream {stream} has no transaction {seq} to checkpoint"
                )));
            };
            while st.placed.front().is_some_and(|q| q.seq <= seq) {
                st.placed.pop_front();
            }
            // If the checkpointed transaction is the last of its segment and the stream has
            // moved on, the chain resumes at the start of the next segment, and the
            // checkpointed one can be freed too.
            let last_of_segment = st.placed.front().is_none_or(|q| q.end_segment != p.end_segment)
                || self.mutant(Mutant::CheckpointSkipsSegmentTail);
            let moved_on = st
                .chain
                .iter()
                .position(|&seg| seg == p.end_segment)
                .filter(|&i| last_of_segment && i + 1 < st.chain.len());
            let (segment, offset, next) = match moved_on {
                Some(i) => {
                    let after = st.chain.get(i + 2).copied().unwrap_or(st.next_segment);
                    (st.chain[i + 1], 0, after)
                }
                None => (p.end_segment, p.end_offset, p.next_segment),
            };
            let root = StreamRoot {
                checkpoint_seq: p.seq,
                checkpoint_epoch: p.epoch,
                checkpoint_segment: segment,
                checkpoint_offset: offset,
                checkpoint_next_segment: next,
                ..current
            };
            let mut freed = Vec::new();
            while st.chain.front().is_some_and(|&seg| seg != segment) {
                freed.extend(st.chain.pop_front());
            }
            (root, freed)
        };
        let mut sb = sbs.sb.clone();
        sb.streams[s] = root;
        let durable = !self.mutant(Mutant::SegmentsReusedBeforeCheckpointDurable);
        self.write_superblock(&mut sbs, sb, durable)?;
        drop(sbs);
        let mut space = lock(&self.space);
        for seg in freed {
            space.release(seg);
        }
        Ok(())
    }

    /// Reserve the next range of sequence numbers for stream `s`, durably, before any of them is
    /// written (lock order: superblock, then the stream).
    pub(crate) fn raise_seq_limit(&self, s: usize) -> Result<()> {
        let mut sbs = lock(&self.sb);
        let st = lock(&self.streams[s]);
        if st.next_seq < st.seq_limit {
            return Ok(());
        }
        let limit = st.seq_limit.checked_add(self.options.seq_reserve()).ok_or_else(|| {
            LogError::Invalid(format!("stream {s} has used every sequence number"))
        })?;
        // Only this thread raises the limit while the superblock lock is held; the stream lock
        // is not held across the write.
        drop(st);
        let mut sb = sbs.sb.clone();
        sb.streams[s].seq_limit = limit;
        self.write_superblock(&mut sbs, sb, true)?;
        lock(&self.streams[s]).seq_limit = limit;
        Ok(())
    }

    /// Write `sb` into the copy not holding the current one, then (if `durable`) wait and flush.
    pub(crate) fn write_superblock(
        &self,
        state: &mut SbState,
        mut sb: Superblock,
        durable: bool,
    ) -> Result<()> {
        // Only a generation read from the device can be u64::MAX (2^64 updates cannot happen).
        sb.generation = state.sb.generation.checked_add(1).ok_or_else(|| LogError::Corrupted {
            what: "superblock",
            block: SB_BLOCKS.get(state.slot).copied().unwrap_or_default(),
            reason: "generation u64::MAX cannot be incremented".into(),
        })?;
        let slot = 1 - state.slot;
        let buf = IoBuf::from_slice(&sb.encode());
        let w = vec![Write::new(SB_BLOCKS[slot], buf)];
        if durable {
            self.dev.write_sync(w, WriteFlags::NONE).map_err(|e| self.fail(e))?;
            self.dev.flush().map_err(|e| self.fail(e))?;
        } else {
            self.dev.submit(w, WriteFlags::NONE).map_err(|e| self.fail(e))?;
        }
        state.sb = sb;
        state.slot = slot;
        Ok(())
    }
}

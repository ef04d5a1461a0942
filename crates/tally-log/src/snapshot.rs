//! Clean close: a snapshot of the log's stream state and of the layer above's state, so the next
//! open restores both without scanning the log.
//!
//! Invariants:
//! - the snapshot is written to free segments and made durable *before* the superblock points
//!   at it; a crash before that leaves a superblock without a snapshot, and open scans;
//! - open clears the pointer (with the usual epoch bump) durably *before* anything new is
//!   written, so a snapshot is used at most once: after a later crash the log is scanned, never
//!   restored from a stale snapshot;
//! - a close never checkpoints: the log still holds every transaction the snapshot describes,
//!   so a snapshot that fails any check is ignored and the log is scanned instead.

use std::collections::VecDeque;

use tally_media::{IoBuf, Write, WriteFlags};

use crate::engine::{lock, Placed, Stream};
use crate::format::codec::{Reader, Writer};
use crate::format::crc_seeded;
use crate::format::superblock::Superblock;
use crate::{Log, Result};

/// Magic of the snapshot header block.
pub const SNAP_MAGIC: [u8; 8] = *b"TALLYSN1";
/// Snapshot format version.
pub const SNAP_VERSION: u16 = 1;
/// Offsets of the header fields (the first block of the first snapshot segment).
pub mod snap_off {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const SEGMENT_COUNT: usize = 12;
    pub const SB_GENERATION: usize = 16;
    pub const PAYLOAD_LEN: usize = 24;
    pub const PAYLOAD_CRC: usize = 32;
    pub const CRC: usize = 36;
    /// Reserved, zero (and bytes 10..12).
    pub const RESERVED: usize = 40;
    /// The segment list: `segment_count` u32s.
    pub const SEGMENTS: usize = 64;
}

/// Bytes of one encoded `Placed`.
const PLACED_SIZE: usize = 32;

impl Log {
    /// Close the log cleanly: make everything durable, then write a snapshot holding the
    /// streams' state and `payload` (the state of the layer above) to free segments and point
    /// the superblock at it. The next [`Log::open`] restores from it without scanning and hands
    /// `payload` back in [`crate::Recovery::snapshot`].
    ///
    /// Returns `false` (and the log is simply closed) when the snapshot does not fit in the
    /// free segments; the next open then scans.
    ///
    /// # Errors
    /// I/O errors; an earlier failure (fail-stop).
    pub fn close_clean(self, payload: &[u8]) -> Result<bool> {
        self.sync()?;
        let state = self.encode_streams();
        let mut blob = Vec::with_capacity(8 + state.len() + payload.len());
        blob.extend_from_slice(&(state.len() as u64).to_le_bytes());
        blob.extend_from_slice(&state);
        blob.extend_from_slice(payload);

        let bs = self.block_size as usize;
        let seg_blocks = self.segment_blocks as usize;
        let blocks = 1 + blob.len().div_ceil(bs);
        let count = blocks.div_ceil(seg_blocks);
        if snap_off::SEGMENTS + 4 * count > bs {
            tracing::warn!(bytes = blob.len(), "snapshot too large; the next open scans");
            return Ok(false);
        }
        let mut segments = Vec::with_capacity(count);
        {
            let mut space = lock(&self.space);
            for _ in 0..count {
                match space.alloc() {
                    Some(s) => segments.push(s),
                    None => {
                        tracing::warn!("no free segments for the snapshot; the next open scans");
                        return Ok(false);
                    }
                }
            }
        }
        let mut sb_state = lock(&self.sb);
        let mut header = vec![0u8; bs];
        {
            let mut w = Writer::new(&mut header);
            w.put(snap_off::MAGIC, &SNAP_MAGIC);
            w.u16(snap_off::VERSION, SNAP_VERSION);
            w.u32(snap_off::SEGMENT_COUNT, count as u32);
            w.u64(snap_off::SB_GENERATION, sb_state.sb.generation + 1);
            w.u64(snap_off::PAYLOAD_LEN, blob.len() as u64);
            w.u32(snap_off::PAYLOAD_CRC, crc_seeded(&self.uuid, &[&blob]));
            for (i, s) in segments.iter().enumerate() {
                w.u32(snap_off::SEGMENTS + 4 * i, *s);
            }
        }
        let crc = crc_seeded(&self.uuid, &[&header[..snap_off::CRC], &header[snap_off::CRC + 4..]]);
        Writer::new(&mut header).u32(snap_off::CRC, crc);

        // Header, then the blob, block after block through the listed segments.
        let mut bytes = header;
        bytes.extend_from_slice(&blob);
        bytes.resize(blocks * bs, 0);
        let mut writes = Vec::with_capacity(count);
        for (i, chunk) in bytes.chunks(seg_blocks * bs).enumerate() {
            writes.push(Write::new(self.segment_block(segments[i]), IoBuf::from_slice(chunk)));
        }
        self.dev.write_sync(writes, WriteFlags::NONE).map_err(|e| self.fail(e))?;
        self.dev.flush().map_err(|e| self.fail(e))?;
        let mut sb = sb_state.sb.clone();
        sb.snapshot = segments.first().copied();
        self.write_superblock(&mut sb_state, sb, true)?;
        Ok(true)
    }

    fn segment_block(&self, segment: u32) -> u64 {
        self.first_segment_block + u64::from(segment) * u64::from(self.segment_blocks)
    }

    /// Every stream's position and placed transactions.
    fn encode_streams(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for st in &self.streams {
            let st = lock(st);
            out.extend_from_slice(&st.last_seq.to_le_bytes());
            for v in [st.segment, st.offset, st.next_segment, st.chain.len() as u32] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            for seg in &st.chain {
                out.extend_from_slice(&seg.to_le_bytes());
            }
            out.extend_from_slice(&(st.placed.len() as u64).to_le_bytes());
            for p in &st.placed {
                let mut e = [0u8; PLACED_SIZE];
                let mut w = Writer::new(&mut e);
                w.u64(0, p.seq);
                w.u32(8, p.epoch);
                w.u32(12, p.end_segment);
                w.u32(16, p.end_offset);
                w.u32(20, p.next_segment);
                w.u32(24, p.records);
                w.u32(28, p.dead);
                out.extend_from_slice(&e);
            }
        }
        out
    }
}

/// A stream restored from a snapshot.
pub(crate) struct Restored {
    pub last_seq: u64,
    pub segment: u32,
    pub offset: u32,
    pub next_segment: u32,
    pub chain: VecDeque<u32>,
    pub placed: VecDeque<Placed>,
}

impl Restored {
    pub fn into_stream(self, epoch: u32, next_seq: u64) -> Stream {
        Stream {
            epoch,
            last_seq: self.last_seq,
            next_seq,
            segment: self.segment,
            offset: self.offset,
            next_segment: self.next_segment,
            chain: self.chain,
            placed: self.placed,
            pending: Vec::new(),
            submitting: false,
            direct_submits: 0,
            inflight: Vec::new(),
            durable: self.last_seq,
        }
    }
}

/// A snapshot that passed every check.
pub(crate) struct Found {
    pub streams: Vec<Restored>,
    pub payload: Vec<u8>,
    /// Blocks read.
    pub blocks: u64,
}

/// Read and check the snapshot the superblock points at. `Ok(None)`, with a warning, when
/// anything is wrong with it: the caller then scans (the log still holds everything).
pub(crate) fn read(
    dev: &dyn tally_media::Device,
    sb: &Superblock,
    check_generation: bool,
) -> Result<Option<Found>> {
    let Some(first) = sb.snapshot else { return Ok(None) };
    let bs = sb.block_size as usize;
    let seg_blocks = sb.segment_blocks as usize;
    let start = |seg: u32| sb.segment_start(seg);
    let mut header = vec![0u8; bs];
    dev.read(start(first), &mut header)?;
    let give_up = |why: &str| {
        tracing::warn!("ignoring the clean-close snapshot ({why}); scanning the log");
        Ok(None)
    };
    let r = Reader::new(&header);
    let crc = crc_seeded(&sb.uuid, &[&header[..snap_off::CRC], &header[snap_off::CRC + 4..]]);
    if r.array::<8>(snap_off::MAGIC) != Some(SNAP_MAGIC)
        || r.u16(snap_off::VERSION) != Some(SNAP_VERSION)
        || r.u32(snap_off::CRC) != Some(crc)
        || !r.zeros(10, 2)
        || !r.zeros(snap_off::RESERVED, snap_off::SEGMENTS - snap_off::RESERVED)
    {
        return give_up("bad header");
    }
    if check_generation && r.u64(snap_off::SB_GENERATION) != Some(sb.generation) {
        return give_up("written for another superblock generation");
    }
    let count = r.u32(snap_off::SEGMENT_COUNT).unwrap_or(0) as usize;
    let len = r.u64(snap_off::PAYLOAD_LEN).unwrap_or(u64::MAX);
    if count == 0 || snap_off::SEGMENTS + 4 * count > bs {
        return give_up("bad segment count");
    }
    let segments: Vec<u32> = (0..count).filter_map(|i| r.u32(snap_off::SEGMENTS + 4 * i)).collect();
    if segments.first() != Some(&first) || segments.iter().any(|&s| s >= sb.segment_count) {
        return give_up("segment list");
    }
    let room = (count * seg_blocks).saturating_sub(1) as u64 * bs as u64;
    if len > room {
        return give_up("length beyond its segments");
    }
    let len = len as usize;
    let blocks = 1 + len.div_ceil(bs);
    let mut bytes = vec![0u8; blocks * bs];
    for (i, chunk) in bytes.chunks_mut(seg_blocks * bs).enumerate() {
        dev.read(start(segments[i]), chunk)?;
    }
    let blob = &bytes[bs..bs + len];
    if r.u32(snap_off::PAYLOAD_CRC) != Some(crc_seeded(&sb.uuid, &[blob])) {
        return give_up("payload checksum");
    }
    match decode_streams(blob, sb) {
        Some((streams, payload)) => {
            Ok(Some(Found { streams, payload: payload.to_vec(), blocks: blocks as u64 }))
        }
        None => give_up("stream state does not decode"),
    }
}

/// Decode the streams' state; `None` on anything inconsistent.
fn decode_streams<'a>(blob: &'a [u8], sb: &Superblock) -> Option<(Vec<Restored>, &'a [u8])> {
    let mut at = 0usize;
    let mut take = |n: usize| -> Option<&'a [u8]> {
        let s = blob.get(at..at.checked_add(n)?)?;
        at += n;
        Some(s)
    };
    let state_len = usize::try_from(u64::from_le_bytes(take(8)?.try_into().ok()?)).ok()?;
    let state = take(state_len)?;
    let payload = &blob[8 + state_len..];
    let r = Reader::new(state);
    let mut pos = 0usize;
    let mut out = Vec::new();
    let seg_ok = |s: u32| s < sb.segment_count;
    for _ in 0..sb.streams.len() {
        let last_seq = r.u64(pos)?;
        let segment = r.u32(pos + 8)?;
        let offset = r.u32(pos + 12)?;
        let next_segment = r.u32(pos + 16)?;
        let chain_len = r.u32(pos + 20)? as usize;
        pos += 24;
        if chain_len == 0 || chain_len > sb.segment_count as usize {
            return None;
        }
        let chain: VecDeque<u32> =
            (0..chain_len).map(|i| r.u32(pos + 4 * i)).collect::<Option<_>>()?;
        pos += 4 * chain_len;
        let placed_len = usize::try_from(r.u64(pos)?).ok()?;
        pos += 8;
        if placed_len > state.len() / PLACED_SIZE {
            return None;
        }
        let mut placed = VecDeque::with_capacity(placed_len);
        for _ in 0..placed_len {
            placed.push_back(Placed {
                seq: r.u64(pos)?,
                epoch: r.u32(pos + 8)?,
                clock: 0,
                end_segment: r.u32(pos + 12)?,
                end_offset: r.u32(pos + 16)?,
                next_segment: r.u32(pos + 20)?,
                records: r.u32(pos + 24)?,
                dead: r.u32(pos + 28)?,
            });
            pos += PLACED_SIZE;
        }
        if !seg_ok(segment)
            || !seg_ok(next_segment)
            || offset > sb.segment_blocks
            || chain.back() != Some(&segment)
            || chain.iter().any(|&s| !seg_ok(s))
            || chain.contains(&next_segment)
        {
            return None;
        }
        out.push(Restored { last_seq, segment, offset, next_segment, chain, placed });
    }
    (pos == state.len()).then_some((out, payload))
}

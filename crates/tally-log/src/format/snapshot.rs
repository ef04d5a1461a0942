//! The clean-close snapshot: its header (the first block of the first snapshot segment) and its
//! blob (the streams' state, then the layer above's payload), which follows the header block
//! after block through the segments the header lists.
//!
//! Invariants the decoders keep (`docs/FORMAT.md`, "Clean-close snapshot"):
//! - the header's crc is checked before any of its fields is used, and the segment list is
//!   bounded (by the block and by the log's segment count), distinct and inside the log before
//!   its length decides what is read or allocated;
//! - every count in the blob is bounded by the bytes present before anything is allocated.
//!
//! Decoding checks only the bytes; whether the state agrees with the superblock and with itself
//! (chains disjoint, placed transactions inside their chain…) is checked by `crate::snapshot`.

use std::collections::BTreeSet;

use super::codec::{tiles, widen, Appender, Cursor, Reader, Truncated, Writer};
use super::crc_seeded;
use crate::error::corrupted;
use crate::Result;

/// Magic of the snapshot header block.
pub const SNAP_MAGIC: [u8; 8] = *b"TALLYSN1";
/// Snapshot format version.
pub const SNAP_VERSION: u16 = 1;
/// Offsets of the header fields.
pub mod off {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    /// Reserved, zero.
    pub const RESERVED_A: usize = 10;
    pub const SEGMENT_COUNT: usize = 12;
    pub const SB_GENERATION: usize = 16;
    pub const PAYLOAD_LEN: usize = 24;
    pub const PAYLOAD_CRC: usize = 32;
    pub const CRC: usize = 36;
    /// Reserved, zero, up to the segment list.
    pub const RESERVED: usize = 40;
    /// The segment list: `segment_count` u32s. Bytes after it are zero.
    pub const SEGMENTS: usize = 64;
}
/// Bytes of one entry of the segment list.
pub const SNAP_SEGMENT_SIZE: usize = 4;
/// Bytes of a stream's fixed fields in the blob (`last_seq`, `segment`, `offset`,
/// `next_segment`, `chain_len`).
pub const STREAM_STATE_SIZE: usize = 24;
/// Bytes of one placed transaction in the blob.
pub const PLACED_SIZE: usize = 32;

const _: () = assert!(tiles(
    &[
        (off::MAGIC, SNAP_MAGIC.len()),
        (off::VERSION, 2),
        (off::RESERVED_A, 2),
        (off::SEGMENT_COUNT, 4),
        (off::SB_GENERATION, 8),
        (off::PAYLOAD_LEN, 8),
        (off::PAYLOAD_CRC, 4),
        (off::CRC, 4),
        (off::RESERVED, 24),
    ],
    off::SEGMENTS
));

/// A decoded snapshot header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotHeader {
    /// Generation of the superblock that points at the snapshot.
    pub sb_generation: u64,
    /// Bytes of the blob.
    pub payload_len: u64,
    /// crc32c, seeded with the uuid, of the blob.
    pub payload_crc: u32,
    /// Segments holding the snapshot, in order; the header is block 0 of the first.
    pub segments: Vec<u32>,
}

impl SnapshotHeader {
    /// Most segments a header of `block_size` bytes can list.
    #[must_use]
    pub fn segment_count_max(block_size: u32) -> usize {
        usize::try_from(block_size).map_or(0, |bs| bs.saturating_sub(off::SEGMENTS))
            / SNAP_SEGMENT_SIZE
    }

    /// Encode into one block of `block_size` bytes, sealed with the crc.
    ///
    /// # Panics
    /// If the segment list is empty or does not fit the block (the writer checks both first).
    #[must_use]
    pub fn encode(&self, uuid: &[u8; 16], block_size: u32) -> Vec<u8> {
        let count = self.segments.len();
        assert!(
            (1..=Self::segment_count_max(block_size)).contains(&count),
            "{count} snapshot segments in a {block_size}-byte header"
        );
        let mut block = vec![0u8; block_len(block_size)];
        let mut w = Writer::new(&mut block);
        w.put(off::MAGIC, &SNAP_MAGIC);
        w.u16(off::VERSION, SNAP_VERSION);
        w.u32(off::SEGMENT_COUNT, u32::try_from(count).unwrap_or(u32::MAX));
        w.u64(off::SB_GENERATION, self.sb_generation);
        w.u64(off::PAYLOAD_LEN, self.payload_len);
        w.u32(off::PAYLOAD_CRC, self.payload_crc);
        let mut at = off::SEGMENTS;
        for &s in &self.segments {
            w.u32(at, s);
            at = at.saturating_add(SNAP_SEGMENT_SIZE);
        }
        let crc = header_crc(uuid, &block);
        Writer::new(&mut block).u32(off::CRC, crc);
        block
    }

    /// Decode the header block read from `block_no` of a log of `segment_count` segments.
    ///
    /// # Errors
    /// [`crate::LogError::Corrupted`] for any byte the format does not allow.
    pub fn decode(
        uuid: &[u8; 16],
        block: &[u8],
        block_no: u64,
        segment_count: u32,
    ) -> Result<SnapshotHeader> {
        let bad = |reason: String| corrupted("snapshot header", block_no, reason);
        let r = Reader::new(block);
        if r.array::<8>(off::MAGIC) != Some(SNAP_MAGIC) {
            return Err(bad("bad magic".into()));
        }
        let crc_stored = r.u32(off::CRC).ok_or_else(|| bad("truncated".into()))?;
        if block.len() < off::SEGMENTS || crc_stored != header_crc(uuid, block) {
            return Err(bad("crc mismatch".into()));
        }
        // The crc holds: every field below is as the writer put it, unless it was forged.
        let field = |v: Option<u64>| v.ok_or_else(|| bad("truncated".into()));
        let version = field(r.u16(off::VERSION).map(u64::from))?;
        if version != u64::from(SNAP_VERSION) {
            return Err(bad(format!("version {version}, this build reads {SNAP_VERSION}")));
        }
        if !r.zeros(off::RESERVED_A, 2) || !r.zeros(off::RESERVED, off::SEGMENTS - off::RESERVED) {
            return Err(bad("reserved bytes are not zero".into()));
        }
        let count = field(r.u32(off::SEGMENT_COUNT).map(u64::from))?;
        let block_size = u32::try_from(block.len()).unwrap_or(u32::MAX);
        let count_max = widen(Self::segment_count_max(block_size)).min(u64::from(segment_count));
        if count == 0 || count > count_max {
            return Err(bad(format!("{count} segments (1 ..= {count_max} possible)")));
        }
        // `count` <= segment_count_max, so the list and its end are inside the block.
        let list_len = usize::try_from(count).map_err(|_| bad("segment count".into()))?;
        let list_end = list_len
            .checked_mul(SNAP_SEGMENT_SIZE)
            .and_then(|n| n.checked_add(off::SEGMENTS))
            .ok_or_else(|| bad("segment count".into()))?;
        if !r.zeros_from(list_end) {
            return Err(bad("bytes after the segment list are not zero".into()));
        }
        let mut segments = Vec::with_capacity(list_len);
        let mut seen = BTreeSet::new();
        let mut list = Cursor::new(block.get(off::SEGMENTS..list_end).unwrap_or_default());
        for _ in 0..list_len {
            let s = list.u32().map_err(|_| bad("truncated segment list".into()))?;
            if s >= segment_count || !seen.insert(s) {
                return Err(bad(format!("segment {s} outside the log or listed twice")));
            }
            segments.push(s);
        }
        Ok(SnapshotHeader {
            sb_generation: field(r.u64(off::SB_GENERATION))?,
            payload_len: field(r.u64(off::PAYLOAD_LEN))?,
            payload_crc: r.u32(off::PAYLOAD_CRC).ok_or_else(|| bad("truncated".into()))?,
            segments,
        })
    }
}

fn block_len(block_size: u32) -> usize {
    usize::try_from(block_size).unwrap_or(usize::MAX)
}

/// crc32c, seeded with `uuid`, of `block` without its crc field (`block` holds at least the
/// fixed header).
fn header_crc(uuid: &[u8; 16], block: &[u8]) -> u32 {
    let before = block.get(..off::CRC).unwrap_or_default();
    let after = block.get(off::CRC.saturating_add(4)..).unwrap_or_default();
    crc_seeded(uuid, &[before, after])
}

/// A transaction placed in a stream's chain, as the snapshot records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlacedTx {
    /// Its sequence number.
    pub seq: u64,
    /// Its epoch.
    pub epoch: u32,
    /// Segment holding its span.
    pub end_segment: u32,
    /// Block offset just past its span in that segment.
    pub end_offset: u32,
    /// The segment its stream continued in after `end_segment`.
    pub next_segment: u32,
    /// Records it carries.
    pub records: u32,
    /// Of those, records the layer above marked dead.
    pub dead_records: u32,
}

/// One stream's state as the snapshot records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamState {
    /// Sequence number of its last transaction.
    pub last_seq: u64,
    /// Segment it writes in.
    pub segment: u32,
    /// Block offset where its next transaction goes.
    pub offset: u32,
    /// Segment it continues in after `segment` (reserved, not written yet).
    pub next_segment: u32,
    /// Its chain, from the checkpoint segment to `segment`.
    pub chain: Vec<u32>,
    /// Its transactions since the checkpoint, in order.
    pub placed: Vec<PlacedTx>,
}

/// Encode the blob: `u64 state_len`, the streams' state, then `payload`.
#[must_use]
pub fn encode_blob(streams: &[StreamState], payload: &[u8]) -> Vec<u8> {
    let mut blob = blob_prefix(streams);
    blob.extend_from_slice(payload);
    blob
}

/// The blob up to its payload: `u64 state_len` and the streams' state (the payload follows;
/// a snapshot's writer puts the two side by side rather than copying the payload after it).
#[must_use]
pub fn blob_prefix(streams: &[StreamState]) -> Vec<u8> {
    let mut state = Appender::default();
    for st in streams {
        state.u64(st.last_seq);
        state.u32(st.segment);
        state.u32(st.offset);
        state.u32(st.next_segment);
        state.u32(u32::try_from(st.chain.len()).unwrap_or(u32::MAX));
        for &seg in &st.chain {
            state.u32(seg);
        }
        state.len_u64(st.placed.len());
        for p in &st.placed {
            state.u64(p.seq);
            for v in
                [p.epoch, p.end_segment, p.end_offset, p.next_segment, p.records, p.dead_records]
            {
                state.u32(v);
            }
        }
    }
    let state = state.into_vec();
    let mut prefix = Appender::with_capacity(state.len().saturating_add(8));
    prefix.len_u64(state.len());
    prefix.put(&state);
    prefix.into_vec()
}

/// Decode a blob holding `stream_count` streams' state; the payload is what follows it.
///
/// # Errors
/// [`crate::LogError::Corrupted`] when a count or length does not agree with the bytes.
pub fn decode_blob(
    blob: &[u8],
    stream_count: usize,
    block_no: u64,
) -> Result<(Vec<StreamState>, &[u8])> {
    let bad = |reason: &str| corrupted("snapshot stream state", block_no, reason);
    let truncated = |_: Truncated| bad("a count or length reaches past the state");
    let mut c = Cursor::new(blob);
    let state_len = usize::try_from(c.u64().map_err(truncated)?).map_err(|_| bad("length"))?;
    let mut state = Cursor::new(c.take(state_len).map_err(truncated)?);
    let payload = c.rest();
    // Each stream takes at least its fixed fields, one chain segment and a placed count.
    let stream_size_min = STREAM_STATE_SIZE + 4 + 8;
    if stream_count > state.remaining() / stream_size_min {
        return Err(bad("fewer bytes than streams"));
    }
    let mut streams = Vec::with_capacity(stream_count);
    for _ in 0..stream_count {
        let last_seq = state.u64().map_err(truncated)?;
        let segment = state.u32().map_err(truncated)?;
        let offset = state.u32().map_err(truncated)?;
        let next_segment = state.u32().map_err(truncated)?;
        let chain_len = usize::try_from(state.u32().map_err(truncated)?).unwrap_or(usize::MAX);
        if chain_len == 0 || chain_len > state.remaining() / 4 {
            return Err(bad("chain length"));
        }
        let chain = (0..chain_len).map(|_| state.u32()).collect::<Result<Vec<u32>, _>>();
        let chain = chain.map_err(truncated)?;
        let placed_len = state.count(PLACED_SIZE).map_err(truncated)?;
        let mut placed = Vec::with_capacity(placed_len);
        for _ in 0..placed_len {
            let seq = state.u64().map_err(truncated)?;
            let mut v = [0u32; 6];
            for x in &mut v {
                *x = state.u32().map_err(truncated)?;
            }
            let [epoch, end_segment, end_offset, next_segment, records, dead_records] = v;
            placed.push(PlacedTx {
                seq,
                epoch,
                end_segment,
                end_offset,
                next_segment,
                records,
                dead_records,
            });
        }
        streams.push(StreamState { last_seq, segment, offset, next_segment, chain, placed });
    }
    if !state.at_end() {
        return Err(bad("bytes after the last stream"));
    }
    Ok((streams, payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: [u8; 16] = [4; 16];

    fn header() -> SnapshotHeader {
        SnapshotHeader {
            sb_generation: 9,
            payload_len: 5000,
            payload_crc: 0xabcd_ef01,
            segments: vec![7, 3, 11],
        }
    }

    fn streams() -> Vec<StreamState> {
        let p = |seq, end_segment, end_offset, next_segment| PlacedTx {
            seq,
            epoch: 2,
            end_segment,
            end_offset,
            next_segment,
            records: 3,
            dead_records: 1,
        };
        vec![
            StreamState {
                last_seq: 12,
                segment: 4,
                offset: 6,
                next_segment: 5,
                chain: vec![1, 4],
                placed: vec![p(11, 1, 9, 4), p(12, 4, 6, 5)],
            },
            StreamState {
                last_seq: 3,
                segment: 2,
                offset: 0,
                next_segment: 6,
                chain: vec![2],
                placed: vec![],
            },
        ]
    }

    #[test]
    fn header_round_trip() {
        let h = header();
        let block = h.encode(&UUID, 512);
        assert_eq!(block.len(), 512);
        assert_eq!(SnapshotHeader::decode(&UUID, &block, 0, 12).unwrap(), h);
    }

    #[test]
    fn header_every_flipped_byte_and_foreign_uuid_rejected() {
        let block = header().encode(&UUID, 512);
        for i in 0..block.len() {
            for bit in [0x01, 0x80] {
                let mut b = block.clone();
                b[i] ^= bit;
                assert!(SnapshotHeader::decode(&UUID, &b, 0, 12).is_err(), "flip at {i}");
            }
        }
        assert!(SnapshotHeader::decode(&[5; 16], &block, 0, 12).is_err());
        for cut in 0..block.len() {
            assert!(SnapshotHeader::decode(&UUID, &block[..cut], 0, 12).is_err(), "cut {cut}");
        }
    }

    /// Forged but crc-valid headers: the list is bounded, distinct and inside the log.
    #[test]
    fn header_forged_lists_rejected() {
        let forge = |edit: &dyn Fn(&mut Vec<u8>)| {
            let mut b = header().encode(&UUID, 512);
            edit(&mut b);
            let crc = header_crc(&UUID, &b);
            Writer::new(&mut b).u32(off::CRC, crc);
            SnapshotHeader::decode(&UUID, &b, 0, 12)
        };
        assert!(forge(&|_| {}).is_ok());
        // 2 leaves a listed segment after the list; 13 is more than the log has, 113 more than
        // the block holds.
        for count in [0u32, 2, 13, 113, u32::MAX] {
            assert!(forge(&|b| Writer::new(b).u32(off::SEGMENT_COUNT, count)).is_err(), "{count}");
        }
        assert!(forge(&|b| Writer::new(b).u32(off::SEGMENTS + 4, 7)).is_err(), "listed twice");
        assert!(forge(&|b| Writer::new(b).u32(off::SEGMENTS + 4, 12)).is_err(), "outside");
        // A long list of one segment repeated: the allocation bomb of a forged header.
        let repeated = |b: &mut Vec<u8>| {
            let n = SnapshotHeader::segment_count_max(512);
            Writer::new(b).u32(off::SEGMENT_COUNT, u32::try_from(n).unwrap());
            for i in 0..n {
                Writer::new(b).u32(off::SEGMENTS + 4 * i, 7);
            }
        };
        let mut b = header().encode(&UUID, 512);
        repeated(&mut b);
        let crc = header_crc(&UUID, &b);
        Writer::new(&mut b).u32(off::CRC, crc);
        assert!(SnapshotHeader::decode(&UUID, &b, 0, 1 << 20).is_err());
    }

    #[test]
    #[should_panic(expected = "snapshot segments")]
    fn encoding_a_list_that_does_not_fit_is_a_bug() {
        let h = SnapshotHeader { segments: vec![1; 200], ..header() };
        let _ = h.encode(&UUID, 512);
    }

    #[test]
    fn blob_round_trip() {
        let blob = encode_blob(&streams(), b"payload");
        let (back, payload) = decode_blob(&blob, 2, 0).unwrap();
        assert_eq!((back, payload), (streams(), &b"payload"[..]));
        let empty = encode_blob(&streams(), &[]);
        let (back, payload) = decode_blob(&empty, 2, 0).unwrap();
        assert_eq!((back, payload), (streams(), &[][..]));
    }

    #[test]
    fn blob_cut_or_miscounted_is_rejected() {
        let blob = encode_blob(&streams(), b"");
        for cut in 0..blob.len() {
            assert!(decode_blob(&blob[..cut], 2, 0).is_err(), "cut at {cut}");
        }
        assert!(decode_blob(&blob, 1, 0).is_err(), "one stream too few");
        assert!(decode_blob(&blob, 3, 0).is_err(), "one stream too many");
        assert!(decode_blob(&blob, usize::MAX, 0).is_err());
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..5000 {
            let mut b = blob.clone();
            let i = rng.usize(..b.len());
            b[i] = rng.u8(..);
            let _ = decode_blob(&b, 2, 0);
        }
    }
}

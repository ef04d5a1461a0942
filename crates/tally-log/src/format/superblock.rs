//! The superblock: the log's root, kept in two copies (blocks 0 and 1).
//!
//! Invariants:
//! - an update writes the copy that does *not* hold the newest valid state, with `generation`
//!   one higher, and is durable (write + flush) before anything that relies on it is written;
//!   so a torn update leaves the other copy intact;
//! - the valid copy with the highest generation is the superblock.

use std::collections::BTreeSet;
use std::io::{ErrorKind, Read, Seek, SeekFrom};

use tally_media::MediaError;

use super::codec::{tiles, Cursor, Reader, Writer};
use super::{crc_seeded, FORMAT_VERSION};
use crate::error::corrupted;
use crate::{LogError, Result};

/// Magic bytes at offset 0.
pub const SB_MAGIC: [u8; 8] = *b"TALLYSB1";
/// Offset of the per-stream entries.
pub const SB_STREAMS_OFFSET: usize = 128;
/// Size of one per-stream entry.
pub const SB_STREAM_SIZE: usize = 64;
/// Offsets of the header fields.
pub mod off {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const STREAM_COUNT: usize = 10;
    pub const BLOCK_SIZE: usize = 12;
    pub const BLOCK_COUNT: usize = 16;
    pub const GENERATION: usize = 24;
    pub const UUID: usize = 32;
    pub const SEGMENT_BLOCKS: usize = 48;
    pub const SEGMENT_COUNT: usize = 52;
    pub const FIRST_SEGMENT_BLOCK: usize = 56;
    pub const CRC: usize = 64;
    /// Bit 0: a snapshot starts at `SNAPSHOT_SEGMENT`; bit 1: it is a checkpoint snapshot.
    pub const FLAGS: usize = 68;
    pub const SNAPSHOT_SEGMENT: usize = 72;
    /// Generation in a checkpoint snapshot's header (zero without one).
    pub const SNAPSHOT_GENERATION: usize = 76;
    /// Reserved, zero, up to the stream entries.
    pub const RESERVED: usize = 84;
}
/// Offsets inside a per-stream entry.
pub mod stream_off {
    pub const CHECKPOINT_SEQ: usize = 0;
    pub const CHECKPOINT_EPOCH: usize = 8;
    pub const CHECKPOINT_SEGMENT: usize = 12;
    pub const CHECKPOINT_OFFSET: usize = 16;
    pub const CHECKPOINT_NEXT_SEGMENT: usize = 20;
    pub const EPOCH: usize = 24;
    pub const BASE_SEQ: usize = 32;
    pub const RESUME_SEQ: usize = 40;
    /// Sequence numbers of this stream below it may have been written; none at or above it.
    pub const SEQ_LIMIT: usize = 48;
    /// Reserved, zero (and 28..32).
    pub const RESERVED: usize = 56;
}
const _: () = assert!(tiles(
    &[
        (off::MAGIC, SB_MAGIC.len()),
        (off::VERSION, 2),
        (off::STREAM_COUNT, 2),
        (off::BLOCK_SIZE, 4),
        (off::BLOCK_COUNT, 8),
        (off::GENERATION, 8),
        (off::UUID, 16),
        (off::SEGMENT_BLOCKS, 4),
        (off::SEGMENT_COUNT, 4),
        (off::FIRST_SEGMENT_BLOCK, 8),
        (off::CRC, 4),
        (off::FLAGS, 4),
        (off::SNAPSHOT_SEGMENT, 4),
        (off::SNAPSHOT_GENERATION, 8),
        (off::RESERVED, SB_STREAMS_OFFSET - off::RESERVED),
    ],
    SB_STREAMS_OFFSET
));
const _: () = assert!(tiles(
    &[
        (stream_off::CHECKPOINT_SEQ, 8),
        (stream_off::CHECKPOINT_EPOCH, 4),
        (stream_off::CHECKPOINT_SEGMENT, 4),
        (stream_off::CHECKPOINT_OFFSET, 4),
        (stream_off::CHECKPOINT_NEXT_SEGMENT, 4),
        (stream_off::EPOCH, 4),
        (stream_off::EPOCH + 4, 4),
        (stream_off::BASE_SEQ, 8),
        (stream_off::RESUME_SEQ, 8),
        (stream_off::SEQ_LIMIT, 8),
        (stream_off::RESERVED, SB_STREAM_SIZE - stream_off::RESERVED),
    ],
    SB_STREAM_SIZE
));
/// Blocks holding the two superblock copies.
pub const SB_BLOCKS: [u64; 2] = [0, 1];

/// What the superblock says about one stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamRoot {
    /// Every transaction with seq <= this is checkpointed: applied elsewhere, not replayed.
    pub checkpoint_seq: u64,
    /// Epoch of the checkpointed transaction.
    pub checkpoint_epoch: u32,
    /// Segment where the first transaction after the checkpoint is (or will be) written.
    pub checkpoint_segment: u32,
    /// Block offset inside that segment.
    pub checkpoint_offset: u32,
    /// The segment that follows `checkpoint_segment` in the stream's chain.
    pub checkpoint_next_segment: u32,
    /// The stream's current epoch: transactions written since the last recovery carry it.
    pub epoch: u32,
    /// Last transaction recovered before `epoch` began; older-epoch transactions after it are
    /// orphans and never accepted.
    pub base_seq: u64,
    /// First sequence number used in `epoch`.
    pub resume_seq: u64,
    /// Every sequence number ever written on this stream is below this: the running epoch
    /// assigns numbers in `resume_seq..seq_limit` and raises the limit durably before it
    /// passes it, so the next recovery can start above anything that may lie on the device,
    /// seen or not (a number is never reused, so a dependency names one transaction).
    pub seq_limit: u64,
}

/// The decoded superblock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    /// Bumped by every update; the valid copy with the highest wins.
    pub generation: u64,
    /// Random at format time; seeds every crc of the image.
    pub uuid: [u8; 16],
    /// Block size the image was formatted with.
    pub block_size: u32,
    /// Blocks in the image.
    pub block_count: u64,
    /// Blocks per segment.
    pub segment_blocks: u32,
    /// Segments in the image.
    pub segment_count: u32,
    /// Block where segment 0 starts.
    pub first_segment_block: u64,
    /// One root per stream.
    pub streams: Vec<StreamRoot>,
    /// First segment of the snapshot written by a clean close, if the log was closed cleanly
    /// and not opened since.
    pub snapshot: Option<u32>,
    /// When the snapshot is a *checkpoint snapshot* (written online by
    /// [`crate::Log::checkpoint_snapshot`], kept across opens, the log after it scanned): the
    /// generation its header carries (that of the superblock which first pointed at it).
    pub snapshot_generation: Option<u64>,
}

/// `flags` bit: a snapshot is present.
pub const SB_FLAG_SNAPSHOT: u32 = 1;
/// `flags` bit, with bit 0: the snapshot is a checkpoint snapshot.
pub const SB_FLAG_CHECKPOINT_SNAPSHOT: u32 = 2;

impl Superblock {
    /// Most streams a superblock of `block_size` bytes can describe.
    #[must_use]
    pub fn stream_count_max(block_size: u32) -> usize {
        usize::try_from(block_size).map_or(0, |bs| bs.saturating_sub(SB_STREAMS_OFFSET))
            / SB_STREAM_SIZE
    }

    /// Encode into one block of `self.block_size` bytes.
    ///
    /// # Panics
    /// If the streams do not fit the block (the log never has more than `stream_count_max`).
    #[must_use]
    #[expect(
        clippy::arithmetic_side_effects,
        clippy::cast_possible_truncation,
        reason = "offsets and count of at most stream_count_max entries, all inside one block"
    )]
    pub fn encode(&self) -> Vec<u8> {
        assert!(self.streams.len() <= Self::stream_count_max(self.block_size));
        let mut block = vec![0u8; self.block_size as usize];
        let mut w = Writer::new(&mut block);
        w.put(off::MAGIC, &SB_MAGIC);
        w.u16(off::VERSION, FORMAT_VERSION);
        w.u16(off::STREAM_COUNT, self.streams.len() as u16);
        w.u32(off::BLOCK_SIZE, self.block_size);
        w.u64(off::BLOCK_COUNT, self.block_count);
        w.u64(off::GENERATION, self.generation);
        w.put(off::UUID, &self.uuid);
        w.u32(off::SEGMENT_BLOCKS, self.segment_blocks);
        w.u32(off::SEGMENT_COUNT, self.segment_count);
        w.u64(off::FIRST_SEGMENT_BLOCK, self.first_segment_block);
        if let Some(seg) = self.snapshot {
            match self.snapshot_generation {
                Some(g) => {
                    w.u32(off::FLAGS, SB_FLAG_SNAPSHOT | SB_FLAG_CHECKPOINT_SNAPSHOT);
                    w.u64(off::SNAPSHOT_GENERATION, g);
                }
                None => w.u32(off::FLAGS, SB_FLAG_SNAPSHOT),
            }
            w.u32(off::SNAPSHOT_SEGMENT, seg);
        }
        for (i, s) in self.streams.iter().enumerate() {
            let base = SB_STREAMS_OFFSET + i * SB_STREAM_SIZE;
            w.u64(base + stream_off::CHECKPOINT_SEQ, s.checkpoint_seq);
            w.u32(base + stream_off::CHECKPOINT_EPOCH, s.checkpoint_epoch);
            w.u32(base + stream_off::CHECKPOINT_SEGMENT, s.checkpoint_segment);
            w.u32(base + stream_off::CHECKPOINT_OFFSET, s.checkpoint_offset);
            w.u32(base + stream_off::CHECKPOINT_NEXT_SEGMENT, s.checkpoint_next_segment);
            w.u32(base + stream_off::EPOCH, s.epoch);
            w.u64(base + stream_off::BASE_SEQ, s.base_seq);
            w.u64(base + stream_off::RESUME_SEQ, s.resume_seq);
            w.u64(base + stream_off::SEQ_LIMIT, s.seq_limit);
        }
        let crc = sb_crc(&self.uuid, &block);
        Writer::new(&mut block).u32(off::CRC, crc);
        block
    }

    /// Decode one copy read from `block_no`.
    ///
    /// # Errors
    /// [`crate::LogError::Corrupted`] for any byte the format does not allow.
    pub fn decode(bytes: &[u8], block_no: u64) -> Result<Superblock> {
        let bad = |reason: String| corrupted("superblock", block_no, reason);
        let r = Reader::new(bytes);
        if r.array::<8>(off::MAGIC) != Some(SB_MAGIC) {
            return Err(bad("bad magic".into()));
        }
        let field = |v: Option<u64>| v.ok_or_else(|| bad("truncated".into()));
        let field32 = |v: Option<u32>| v.ok_or_else(|| bad("truncated".into()));
        let uuid = r.array::<16>(off::UUID).ok_or_else(|| bad("truncated".into()))?;
        let crc_stored = field32(r.u32(off::CRC))?;
        let crc = sb_crc(&uuid, bytes);
        if crc != crc_stored {
            return Err(bad(format!("crc {crc_stored:#010x} != computed {crc:#010x}")));
        }
        let version = field(r.u16(off::VERSION).map(u64::from))?;
        if version != u64::from(FORMAT_VERSION) {
            return Err(bad(format!(
                "format version {version}, this build reads {FORMAT_VERSION}"
            )));
        }
        if !r.zeros(off::RESERVED, const { SB_STREAMS_OFFSET - off::RESERVED }) {
            return Err(bad("reserved header bytes are not zero".into()));
        }
        let block_size = field32(r.u32(off::BLOCK_SIZE))?;
        if usize::try_from(block_size).ok() != Some(bytes.len()) {
            return Err(bad(format!("block size {block_size} but copy is {} bytes", bytes.len())));
        }
        let stream_count =
            usize::from(r.u16(off::STREAM_COUNT).ok_or_else(|| bad("truncated".into()))?);
        if stream_count == 0 || stream_count > Self::stream_count_max(block_size) {
            return Err(bad(format!("stream count {stream_count} out of range")));
        }
        let mut streams = Vec::with_capacity(stream_count);
        // The entries, one after another: the count is at most what the block holds.
        let mut entries = Cursor::new(bytes.get(SB_STREAMS_OFFSET..).unwrap_or_default());
        for i in 0..stream_count {
            let entry = entries.take(SB_STREAM_SIZE).map_err(|_| bad("truncated".into()))?;
            let e = Reader::new(entry);
            if !e.zeros(const { stream_off::EPOCH + 4 }, 4)
                || !e.zeros(stream_off::RESERVED, const { SB_STREAM_SIZE - stream_off::RESERVED })
            {
                return Err(bad(format!("reserved bytes of stream {i} are not zero")));
            }
            let u32_at = |o: usize| field32(e.u32(o));
            let u64_at = |o: usize| field(e.u64(o));
            streams.push(StreamRoot {
                checkpoint_seq: u64_at(stream_off::CHECKPOINT_SEQ)?,
                checkpoint_epoch: u32_at(stream_off::CHECKPOINT_EPOCH)?,
                checkpoint_segment: u32_at(stream_off::CHECKPOINT_SEGMENT)?,
                checkpoint_offset: u32_at(stream_off::CHECKPOINT_OFFSET)?,
                checkpoint_next_segment: u32_at(stream_off::CHECKPOINT_NEXT_SEGMENT)?,
                epoch: u32_at(stream_off::EPOCH)?,
                base_seq: u64_at(stream_off::BASE_SEQ)?,
                resume_seq: u64_at(stream_off::RESUME_SEQ)?,
                seq_limit: u64_at(stream_off::SEQ_LIMIT)?,
            });
        }
        if entries.rest().iter().any(|&b| b != 0) {
            return Err(bad("bytes after the last stream are not zero".into()));
        }
        let flags = field32(r.u32(off::FLAGS))?;
        let snapshot_segment = field32(r.u32(off::SNAPSHOT_SEGMENT))?;
        let snapshot_generation_field = field(r.u64(off::SNAPSHOT_GENERATION))?;
        let (snapshot, snapshot_generation) = match flags {
            0 if snapshot_segment == 0 && snapshot_generation_field == 0 => (None, None),
            SB_FLAG_SNAPSHOT if snapshot_generation_field == 0 => (Some(snapshot_segment), None),
            f if f == SB_FLAG_SNAPSHOT | SB_FLAG_CHECKPOINT_SNAPSHOT => {
                (Some(snapshot_segment), Some(snapshot_generation_field))
            }
            _ => {
                return Err(bad(format!(
                    "flags {flags:#x} with snapshot segment {snapshot_segment} and generation \
                     {snapshot_generation_field}"
                )))
            }
        };
        let sb = Superblock {
            snapshot,
            snapshot_generation,
            generation: field(r.u64(off::GENERATION))?,
            uuid,
            block_size,
            block_count: field(r.u64(off::BLOCK_COUNT))?,
            segment_blocks: field32(r.u32(off::SEGMENT_BLOCKS))?,
            segment_count: field32(r.u32(off::SEGMENT_COUNT))?,
            first_segment_block: field(r.u64(off::FIRST_SEGMENT_BLOCK))?,
            streams,
        };
        sb.validate().map_err(bad)?;
        Ok(sb)
    }

    /// Cross-field checks: segments fit the device, stream roots point inside it.
    fn validate(&self) -> Result<(), String> {
        if self.segment_blocks < 4 {
            return Err(format!("segment of {} blocks is too small", self.segment_blocks));
        }
        let end = u64::from(self.segment_count)
            .checked_mul(u64::from(self.segment_blocks))
            .and_then(|n| n.checked_add(self.first_segment_block));
        if end.is_none_or(|end| end > self.block_count) || self.first_segment_block < 2 {
            return Err("segments do not fit the device".into());
        }
        if self.snapshot.is_some_and(|seg| seg >= self.segment_count) {
            return Err("snapshot segment outside the log".into());
        }
        for (i, s) in self.streams.iter().enumerate() {
            let seg_ok = |seg: u32| seg < self.segment_count;
            if !seg_ok(s.checkpoint_segment)
                || !seg_ok(s.checkpoint_next_segment)
                || s.checkpoint_offset > self.segment_blocks
                || s.checkpoint_segment == s.checkpoint_next_segment
            {
                return Err(format!("stream {i} root points outside the log"));
            }
            if s.resume_seq <= s.base_seq || s.seq_limit < s.resume_seq {
                return Err(format!("stream {i} sequence numbers are inconsistent"));
            }
        }
        // Chains are disjoint: no two roots (nor the snapshot) name the same segment.
        let mut named = BTreeSet::new();
        let roots =
            self.streams.iter().flat_map(|s| [s.checkpoint_segment, s.checkpoint_next_segment]);
        for seg in roots.chain(self.snapshot) {
            if !named.insert(seg) {
                return Err(format!("segment {seg} is named by two stream roots or the snapshot"));
            }
        }
        Ok(())
    }

    /// First block of `segment`.
    #[must_use]
    pub fn segment_start(&self, segment: u32) -> u64 {
        // Exact for every segment of the log (`validate` checked that they fit the device); a
        // segment past it saturates to a block no device has, so a read of it fails.
        let offset = u64::from(segment).saturating_mul(u64::from(self.segment_blocks));
        self.first_segment_block.saturating_add(offset)
    }
}

/// crc32c, seeded with `uuid`, of a superblock copy without its crc field.
fn sb_crc(uuid: &[u8; 16], block: &[u8]) -> u32 {
    let before = block.get(..off::CRC).unwrap_or_default();
    let after = block.get(off::FLAGS..).unwrap_or_default();
    crc_seeded(uuid, &[before, after])
}

/// Smallest block size [`probe_block_size`] accepts.
pub const PROBE_BLOCK_SIZE_MIN: u32 = 512;
/// Largest block size [`probe_block_size`] accepts.
pub const PROBE_BLOCK_SIZE_MAX: u32 = 1 << 20;

/// The block size an image was formatted with, read from its superblock before the device is
/// opened (the device's geometry must match it, and nothing else says what it is).
///
/// Tries, in order: the copy at offset 0, decoded whole (crc included); the second copy, which
/// sits at offset `block_size`, so each power of two in range is tried as both its offset and
/// its recorded size; then, if neither decodes, the size recorded by a copy with the right magic
/// (so that opening with it reports that copy's damage). [`crate::Log::open`] still decodes and
/// checks everything; this only picks the geometry.
///
/// # Errors
/// [`LogError::NotFormatted`] if neither copy has a plausible header; [`LogError::Media`] if a
/// read fails (reading past the end is not a failure: a short image simply has no copy there).
pub fn probe_block_size<R: Read + Seek>(reader: &mut R) -> Result<u32> {
    let plausible = |bs: u32| {
        bs.is_power_of_two() && (PROBE_BLOCK_SIZE_MIN..=PROBE_BLOCK_SIZE_MAX).contains(&bs)
    };
    let mut recorded = None;
    // The copy at block 0.
    if let Some(bs) = header_block_size(reader, 0)?.filter(|&bs| plausible(bs)) {
        if decodes(reader, 0, bs)? {
            return Ok(bs);
        }
        recorded = Some(bs);
    }
    // The copy at block 1: its offset is the block size it must record.
    let mut bs = PROBE_BLOCK_SIZE_MIN;
    while bs <= PROBE_BLOCK_SIZE_MAX {
        if header_block_size(reader, u64::from(bs))? == Some(bs) {
            if decodes(reader, 1, bs)? {
                return Ok(bs);
            }
            recorded = recorded.or(Some(bs));
        }
        bs <<= 1;
    }
    recorded.ok_or_else(|| LogError::NotFormatted {
        reason: "no superblock magic at block 0 or block 1 for any block size".into(),
    })
}

/// The block size recorded by a header with the superblock magic at `offset`, if there is one.
fn header_block_size<R: Read + Seek>(reader: &mut R, offset: u64) -> Result<Option<u32>> {
    let mut head = [0u8; off::BLOCK_SIZE + 4];
    if !read_at(reader, offset, &mut head)? {
        return Ok(None);
    }
    let r = Reader::new(&head);
    if r.array::<8>(off::MAGIC) != Some(SB_MAGIC) {
        return Ok(None);
    }
    Ok(r.u32(off::BLOCK_SIZE))
}

/// Whether the copy in block `block` of a `bs`-byte geometry decodes.
fn decodes<R: Read + Seek>(reader: &mut R, block: u64, bs: u32) -> Result<bool> {
    let mut buf = vec![0u8; usize::try_from(bs).unwrap_or(0)];
    let offset = block.saturating_mul(u64::from(bs));
    Ok(read_at(reader, offset, &mut buf)? && Superblock::decode(&buf, block).is_ok())
}

/// Fill `buf` from `offset`; `false` if the reader ends first.
fn read_at<R: Read + Seek>(reader: &mut R, offset: u64, buf: &mut [u8]) -> Result<bool> {
    let io = |source| LogError::Media(MediaError::Io { op: "read", source });
    reader.seek(SeekFrom::Start(offset)).map_err(io)?;
    match reader.read_exact(buf) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(io(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> Superblock {
        let root = StreamRoot {
            checkpoint_seq: 3,
            checkpoint_epoch: 1,
            checkpoint_segment: 0,
            checkpoint_offset: 5,
            checkpoint_next_segment: 1,
            epoch: 2,
            base_seq: 4,
            resume_seq: 6,
            seq_limit: 1 << 20,
        };
        Superblock {
            generation: 7,
            uuid: [9; 16],
            block_size: 4096,
            block_count: 1000,
            segment_blocks: 64,
            segment_count: 15,
            first_segment_block: 2,
            streams: vec![
                root,
                StreamRoot { checkpoint_segment: 4, checkpoint_next_segment: 2, ..root },
            ],
            snapshot: Some(3),
            snapshot_generation: None,
        }
    }

    #[test]
    fn round_trip() {
        let sb = sample();
        assert_eq!(Superblock::decode(&sb.encode(), 0).unwrap(), sb);
        let checkpoint = Superblock { snapshot_generation: Some(5), ..sample() };
        assert_eq!(Superblock::decode(&checkpoint.encode(), 0).unwrap(), checkpoint);
        let none = Superblock { snapshot: None, ..sample() };
        assert_eq!(Superblock::decode(&none.encode(), 0).unwrap(), none);
    }

    /// A checkpoint snapshot's generation without its flag, or the flag without a snapshot
    /// segment's flag, is refused.
    #[test]
    fn snapshot_flags_are_checked() {
        let bytes = Superblock { snapshot_generation: Some(5), ..sample() }.encode();
        for flags in [0u32, SB_FLAG_SNAPSHOT, SB_FLAG_CHECKPOINT_SNAPSHOT, 4] {
            let mut b = bytes.clone();
            b[off::FLAGS..off::FLAGS + 4].copy_from_slice(&flags.to_le_bytes());
            let crc = sb_crc(&[9; 16], &b);
            b[off::CRC..off::CRC + 4].copy_from_slice(&crc.to_le_bytes());
            assert!(Superblock::decode(&b, 0).is_err(), "flags {flags:#x} accepted");
        }
    }

    #[test]
    fn every_flipped_byte_is_rejected() {
        let bytes = sample().encode();
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            assert!(Superblock::decode(&b, 0).is_err(), "flip at byte {i} accepted");
        }
        assert!(Superblock::decode(&bytes[..100], 0).is_err());
        assert!(Superblock::decode(&[], 0).is_err());
    }

    /// Both copies of `sample()` formatted with `bs`-byte blocks, as an image.
    fn image(bs: u32) -> Vec<u8> {
        let sb = Superblock { block_size: bs, ..sample() };
        let mut bytes = sb.encode();
        bytes.extend(Superblock { generation: 8, ..sb }.encode());
        bytes.resize(bytes.len() + 2 * bs as usize, 0);
        bytes
    }

    fn probe(bytes: &[u8]) -> Result<u32> {
        probe_block_size(&mut std::io::Cursor::new(bytes))
    }

    #[test]
    fn probe_reads_the_block_size() {
        for bs in [4096, 16384, 65536] {
            assert_eq!(probe(&image(bs)).unwrap(), bs);
        }
    }

    #[test]
    fn probe_falls_back_to_the_second_copy() {
        let bs = 16384;
        // First copy zeroed, as a torn or wiped write leaves it.
        let mut bytes = image(bs);
        bytes[..bs as usize].fill(0);
        assert_eq!(probe(&bytes).unwrap(), bs);
        // First copy claims another block size but fails its crc: the second copy decides.
        let mut bytes = image(bs);
        bytes[off::BLOCK_SIZE..off::BLOCK_SIZE + 4].copy_from_slice(&4096u32.to_le_bytes());
        assert_eq!(probe(&bytes).unwrap(), bs);
        // Both damaged past their header: the recorded size, so open reports the damage.
        let mut bytes = image(bs);
        bytes[off::GENERATION] ^= 1;
        bytes[bs as usize + off::GENERATION] ^= 1;
        assert_eq!(probe(&bytes).unwrap(), bs);
    }

    #[test]
    fn probe_refuses_garbage_without_panicking() {
        let not_formatted =
            |bytes: &[u8]| matches!(probe(bytes), Err(LogError::NotFormatted { .. }));
        assert!(not_formatted(&[]));
        assert!(not_formatted(b"TALLYSB1"));
        assert!(not_formatted(&vec![0u8; 1 << 21]));
        let mut rng = fastrand::Rng::with_seed(5);
        for len in [0usize, 7, 100, 4096, 70_000, 1 << 20] {
            let bytes: Vec<u8> = std::iter::repeat_with(|| rng.u8(..)).take(len).collect();
            assert!(not_formatted(&bytes), "random bytes of length {len}");
        }
        // The magic with an implausible block size (not a power of two, too small, too large).
        for bs in [3000u32, 256, 2 << 20, u32::MAX, 0] {
            let mut bytes = vec![0u8; 1 << 16];
            bytes[..8].copy_from_slice(&SB_MAGIC);
            bytes[off::BLOCK_SIZE..off::BLOCK_SIZE + 4].copy_from_slice(&bs.to_le_bytes());
            assert!(not_formatted(&bytes), "block size {bs} accepted");
        }
    }
}

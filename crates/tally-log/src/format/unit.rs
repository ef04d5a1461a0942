//! Log units: the blocks that carry a transaction's records, and classic commit blocks.
//!
//! A transaction of `unit_count` units and `data_count` data blocks occupies one contiguous
//! *span* of a segment: units `0..unit_count`, then the data blocks, then (classic mode only) one
//! commit block. Every unit header repeats the transaction's identity, so each unit can be
//! checked alone; a transaction is committed iff all its units decode with the same identity and
//! every data block matches the crc the body lists for it (count-based commit: no commit record).

use super::codec::{tiles, Reader, Writer};
use super::{crc_seeded, crc_zeros, FORMAT_VERSION};
use crate::error::corrupted;
use crate::Result;

/// Magic bytes at offset 0 of every unit.
pub const UNIT_MAGIC: [u8; 4] = *b"TLUN";
/// Size of the unit header; the payload follows it.
pub const UNIT_HEADER_SIZE: usize = 64;
/// Offsets of the header fields.
pub mod off {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 4;
    pub const KIND: usize = 6;
    pub const FLAGS: usize = 7;
    pub const STREAM: usize = 8;
    /// Reserved, zero.
    pub const RESERVED: usize = 10;
    pub const EPOCH: usize = 12;
    pub const SEQ: usize = 16;
    pub const PREV_SEQ: usize = 24;
    pub const UNIT_INDEX: usize = 32;
    pub const UNIT_COUNT: usize = 36;
    pub const DATA_COUNT: usize = 40;
    pub const NEXT_SEGMENT: usize = 44;
    pub const DURABLE_WATERMARK: usize = 48;
    pub const PAYLOAD_LEN: usize = 56;
    pub const CRC: usize = 60;
}

const _: () = assert!(tiles(
    &[
        (off::MAGIC, UNIT_MAGIC.len()),
        (off::VERSION, 2),
        (off::KIND, 1),
        (off::FLAGS, 1),
        (off::STREAM, 2),
        (off::RESERVED, 2),
        (off::EPOCH, 4),
        (off::SEQ, 8),
        (off::PREV_SEQ, 8),
        (off::UNIT_INDEX, 4),
        (off::UNIT_COUNT, 4),
        (off::DATA_COUNT, 4),
        (off::NEXT_SEGMENT, 4),
        (off::DURABLE_WATERMARK, 8),
        (off::PAYLOAD_LEN, 4),
        (off::CRC, 4),
    ],
    UNIT_HEADER_SIZE
));

/// What a unit block is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnitKind {
    /// Carries part of a transaction's body.
    Body = 1,
    /// The commit record of a `classic`-mode transaction.
    Commit = 2,
}

/// Flag: the transaction was written in `classic` mode and is committed only with its commit
/// block.
pub const FLAG_CLASSIC: u8 = 1;

/// A unit header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnitHeader {
    /// Body or commit block.
    pub kind: UnitKind,
    /// `FLAG_*` bits.
    pub flags: u8,
    /// Stream of the transaction.
    pub stream: u16,
    /// The stream's epoch when the transaction was written.
    pub epoch: u32,
    /// The transaction's sequence number on its stream.
    pub seq: u64,
    /// Sequence number of the transaction before it on the stream (the chain link).
    pub prev_seq: u64,
    /// Index of this unit in the transaction (`unit_count` for a commit block).
    pub unit_index: u32,
    /// Units in the transaction.
    pub unit_count: u32,
    /// Data blocks after the units.
    pub data_count: u32,
    /// The segment the stream continues in after the current one.
    pub next_segment: u32,
    /// The stream's durable sequence number when the transaction was submitted.
    pub durable_watermark: u64,
    /// Bytes of body carried by this unit.
    pub payload_len: u32,
}

impl UnitHeader {
    /// Blocks of the transaction's span (units, data, commit block).
    #[must_use]
    #[expect(clippy::arithmetic_side_effects, reason = "two u32 counts and one: below 2^33")]
    pub fn span_blocks(&self) -> u64 {
        u64::from(self.unit_count)
            + u64::from(self.data_count)
            + u64::from(self.flags & FLAG_CLASSIC != 0)
    }

    /// Whether `other` belongs to the same transaction.
    #[must_use]
    pub fn same_transaction(&self, other: &UnitHeader) -> bool {
        (self.flags, self.stream, self.epoch, self.seq, self.prev_seq)
            == (other.flags, other.stream, other.epoch, other.seq, other.prev_seq)
            && (self.unit_count, self.data_count, self.next_segment)
                == (other.unit_count, other.data_count, other.next_segment)
    }

    /// Encode this header and `payload` into `block` (one whole block) and seal it with the crc.
    pub fn encode_into(&self, uuid: &[u8; 16], payload: &[u8], block: &mut [u8]) {
        assert!(payload_capacity_of(block.len()) >= payload.len(), "payload exceeds the unit");
        assert_eq!(payload.len(), self.payload_len as usize);
        Writer::new(block).put(UNIT_HEADER_SIZE, payload);
        self.seal(uuid, block);
    }

    /// Seal `block` (one whole block) as this header's unit, its payload (`payload_len` bytes)
    /// already in place after the header: write the header, zero the bytes after the payload
    /// (whatever `block` held there before) and the crc. The same bytes as
    /// [`UnitHeader::encode_into`] with that payload; the crc covers the payload once and
    /// extends over the zeros without reading them.
    pub fn seal(&self, uuid: &[u8; 16], block: &mut [u8]) {
        let end = usize::try_from(self.payload_len)
            .ok()
            .and_then(|len| UNIT_HEADER_SIZE.checked_add(len))
            .filter(|&end| end <= block.len());
        let Some(end) = end else { panic!("payload exceeds the unit") };
        let (head, tail) = block.split_at_mut(end);
        tail.fill(0);
        let mut w = Writer::new(head);
        w.put(off::MAGIC, &UNIT_MAGIC);
        w.u16(off::VERSION, FORMAT_VERSION);
        w.put(off::KIND, &[self.kind as u8, self.flags]);
        w.u16(off::STREAM, self.stream);
        w.put(off::RESERVED, &[0; 2]);
        w.u32(off::EPOCH, self.epoch);
        w.u64(off::SEQ, self.seq);
        w.u64(off::PREV_SEQ, self.prev_seq);
        w.u32(off::UNIT_INDEX, self.unit_index);
        w.u32(off::UNIT_COUNT, self.unit_count);
        w.u32(off::DATA_COUNT, self.data_count);
        w.u32(off::NEXT_SEGMENT, self.next_segment);
        w.u64(off::DURABLE_WATERMARK, self.durable_watermark);
        w.u32(off::PAYLOAD_LEN, self.payload_len);
        let crc = crc_zeros(unit_crc(uuid, head), tail.len());
        Writer::new(head).u32(off::CRC, crc);
    }

    /// Decode a unit block read from `block_no`. With `check_crc` false (mutation testing only)
    /// the crc is ignored.
    ///
    /// # Errors
    /// [`crate::LogError::Corrupted`] when the block is not a well-formed unit of this image.
    pub fn decode<'a>(
        uuid: &[u8; 16],
        block: &'a [u8],
        block_no: u64,
        check_crc: bool,
    ) -> Result<(UnitHeader, &'a [u8])> {
        let bad = |reason: &str| corrupted("log unit", block_no, reason);
        let r = Reader::new(block);
        if r.array::<4>(off::MAGIC) != Some(UNIT_MAGIC) {
            return Err(bad("bad magic"));
        }
        let crc_stored = r.u32(off::CRC).ok_or_else(|| bad("truncated"))?;
        if check_crc && crc_stored != unit_crc(uuid, block) {
            return Err(bad("crc mismatch"));
        }
        if r.u16(off::VERSION) != Some(FORMAT_VERSION) {
            return Err(bad("unknown format version"));
        }
        if !r.zeros(off::RESERVED, 2) {
            return Err(bad("reserved bytes are not zero"));
        }
        let kind = match r.array::<1>(off::KIND) {
            Some([1]) => UnitKind::Body,
            Some([2]) => UnitKind::Commit,
            _ => return Err(bad("unknown unit kind")),
        };
        let get32 = |o| r.u32(o).ok_or_else(|| bad("truncated"));
        let get64 = |o| r.u64(o).ok_or_else(|| bad("truncated"));
        let header = UnitHeader {
            kind,
            flags: r.array::<1>(off::FLAGS).map_or(0, |[f]| f),
            stream: r.u16(off::STREAM).ok_or_else(|| bad("truncated"))?,
            epoch: get32(off::EPOCH)?,
            seq: get64(off::SEQ)?,
            prev_seq: get64(off::PREV_SEQ)?,
            unit_index: get32(off::UNIT_INDEX)?,
            unit_count: get32(off::UNIT_COUNT)?,
            data_count: get32(off::DATA_COUNT)?,
            next_segment: get32(off::NEXT_SEGMENT)?,
            durable_watermark: get64(off::DURABLE_WATERMARK)?,
            payload_len: get32(off::PAYLOAD_LEN)?,
        };
        if header.flags & !FLAG_CLASSIC != 0 {
            return Err(bad("unknown flags"));
        }
        // A seq of u64::MAX is never written (the stream's reservation ends below it), and its
        // successor could not be numbered.
        if header.unit_count == 0 || header.seq <= header.prev_seq || header.seq == u64::MAX {
            return Err(bad("impossible transaction shape"));
        }
        let payload = usize::try_from(header.payload_len)
            .ok()
            .and_then(|len| UNIT_HEADER_SIZE.checked_add(len))
            .and_then(|end| block.get(UNIT_HEADER_SIZE..end))
            .ok_or_else(|| bad("payload longer than the unit"))?;
        if !r.zeros_from(UNIT_HEADER_SIZE.saturating_add(payload.len())) {
            return Err(bad("bytes after the payload are not zero"));
        }
        Ok((header, payload))
    }
}

/// Payload bytes one unit of `block_size` bytes can carry.
#[must_use]
pub fn payload_capacity(block_size: u32) -> usize {
    payload_capacity_of(usize::try_from(block_size).unwrap_or(usize::MAX))
}

fn payload_capacity_of(block_len: usize) -> usize {
    block_len.saturating_sub(UNIT_HEADER_SIZE)
}

/// crc32c, seeded with `uuid`, of `block` without its crc field, the header's last (the caller
/// read the field, so the block is at least a header long).
fn unit_crc(uuid: &[u8; 16], block: &[u8]) -> u32 {
    let before = block.get(..off::CRC).unwrap_or_default();
    let after = block.get(UNIT_HEADER_SIZE..).unwrap_or_default();
    crc_seeded(uuid, &[before, after])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> UnitHeader {
        UnitHeader {
            kind: UnitKind::Body,
            flags: 0,
            stream: 1,
            epoch: 3,
            seq: 10,
            prev_seq: 9,
            unit_index: 0,
            unit_count: 2,
            data_count: 1,
            next_segment: 4,
            durable_watermark: 8,
            payload_len: 5,
        }
    }

    #[test]
    fn round_trip() {
        let uuid = [1; 16];
        let mut block = vec![0u8; 512];
        header().encode_into(&uuid, b"hello", &mut block);
        let (h, payload) = UnitHeader::decode(&uuid, &block, 0, true).unwrap();
        assert_eq!((h, payload), (header(), &b"hello"[..]));
        assert_eq!(h.span_blocks(), 3);
    }

    /// Sealing a block that holds junk (a reused buffer) writes exactly the bytes of encoding
    /// into a zeroed one, at every payload length.
    #[test]
    fn seal_over_junk_equals_encode_into_zeros() {
        let uuid = [7; 16];
        let payload: Vec<u8> = (0..448u32).map(|i| (i * 7 + 1) as u8).collect();
        for len in 0..=payload.len() {
            let h = UnitHeader { payload_len: len as u32, ..header() };
            let mut zeroed = vec![0u8; 512];
            h.encode_into(&uuid, &payload[..len], &mut zeroed);
            let mut junk = vec![0xA5u8; 512];
            junk[UNIT_HEADER_SIZE..UNIT_HEADER_SIZE + len].copy_from_slice(&payload[..len]);
            h.seal(&uuid, &mut junk);
            assert_eq!(junk, zeroed, "payload of {len} bytes");
            assert!(UnitHeader::decode(&uuid, &junk, 0, true).is_ok());
        }
    }

    #[test]
    fn every_flipped_byte_and_foreign_uuid_rejected() {
        let uuid = [1; 16];
        let mut block = vec![0u8; 512];
        header().encode_into(&uuid, b"hello", &mut block);
        for i in 0..block.len() {
            let mut b = block.clone();
            b[i] ^= 1;
            assert!(UnitHeader::decode(&uuid, &b, 0, true).is_err(), "flip at {i} accepted");
        }
        assert!(UnitHeader::decode(&[2; 16], &block, 0, true).is_err());
        assert!(UnitHeader::decode(&uuid, &block[..40], 0, true).is_err());
    }
}

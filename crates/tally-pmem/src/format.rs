//! The persisted structures of a log region, encoder and decoder side by side: the region
//! header (line 0), the three 8-byte words (lines 1–3) and the log unit header. The byte layout
//! is drawn in the crate documentation and `docs/PMEM-LOG.md`; `tests::layout_matches_the_doc`
//! pins the offsets used here.
//!
//! Decoders never panic: every field read from the region is validated before use and a bad
//! one comes back as `None` (a unit) or [`PmemLogError::Corrupted`] (the header). Fields are
//! read and written through the shared little-endian codec (`tally_media::codec`).

use tally_media::codec::{Appender, Cursor, Reader, Writer};

use crate::error::PmemLogError;

/// Magic of a region header: "TALLYPML" little-endian.
pub const REGION_MAGIC: u64 = u64::from_le_bytes(*b"TALLYPML");
/// Format version written by this code.
pub const REGION_VERSION: u32 = 1;
/// Bytes of a cache line: the region's lines and units are aligned to it.
pub const LINE_SIZE: u64 = 64;
/// Byte offset of the region header.
pub const HEADER_OFF: u64 = 0;
/// Bytes of the region header (one line).
pub const HEADER_SIZE: usize = 64;
/// Offset of the head word: lsn of the oldest live unit (line 1).
pub const HEAD_OFF: u64 = 64;
/// Offset of the epoch word: the session number stamped on units (line 2).
pub const EPOCH_OFF: u64 = 128;
/// Offset of the classic commit word: lsn just past the last committed transaction (line 3).
pub const COMMIT_OFF: u64 = 192;
/// Offset of unit slot 0.
pub const UNITS_OFF: u64 = 256;
/// Bytes of a unit header.
pub const UNIT_HEADER_SIZE: usize = 32;
/// Smallest unit: one cache line.
pub const UNIT_SIZE_MIN: u32 = 64;
/// Largest unit: the payload length must fit the header's u16.
pub const UNIT_SIZE_MAX: u32 = 65_536 - 64;
/// Default unit: 4 cache lines.
pub const UNIT_SIZE_DEFAULT: u32 = 256;

/// How a region's transactions commit; fixed at format, because recovery differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitMode {
    /// LOC's eager commit: a transaction is committed iff all its `count` units are present
    /// with valid crcs. Stores, flushes, one fence; no commit record.
    Count,
    /// A redo log with a commit record: units, flush, fence, then the 8-byte commit word,
    /// flush, fence (two fences). Recovery trusts only what the commit word covers.
    Classic,
}

impl CommitMode {
    fn code(self) -> u32 {
        match self {
            CommitMode::Count => 1,
            CommitMode::Classic => 2,
        }
    }

    fn from_code(code: u32) -> Option<Self> {
        match code {
            1 => Some(CommitMode::Count),
            2 => Some(CommitMode::Classic),
            _ => None,
        }
    }

    /// Lower-case name, for reports.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            CommitMode::Count => "count",
            CommitMode::Classic => "classic",
        }
    }
}

/// The region header: what `format` fixed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionHeader {
    /// Bytes per log unit (a multiple of 64).
    pub unit_size: u32,
    /// Unit slots in the ring.
    pub unit_count: u64,
    /// Random identity of this format; seeds every unit's crc, so units of another format
    /// never validate here.
    pub uuid: u64,
    /// How transactions commit.
    pub mode: CommitMode,
}

impl RegionHeader {
    /// The header as its 64 bytes.
    #[must_use]
    pub fn encode(&self) -> [u8; HEADER_SIZE] {
        let mut b = [0u8; HEADER_SIZE];
        let mut w = Writer::new(&mut b);
        w.u64(0, REGION_MAGIC);
        w.u32(8, REGION_VERSION);
        w.u32(12, self.unit_size);
        w.u64(16, self.unit_count);
        w.u64(24, self.uuid);
        w.u32(32, self.mode.code());
        // 36..60 reserved, zero.
        let crc = crc32c::crc32c(&b[..60]);
        Writer::new(&mut b).u32(60, crc);
        b
    }

    /// Decode and validate a header read from a region of `region_len` bytes.
    ///
    /// # Errors
    /// [`PmemLogError::NotFormatted`] without the magic, [`PmemLogError::Corrupted`] for a bad
    /// crc, version, reserved byte or geometry.
    pub fn decode(b: &[u8; HEADER_SIZE], region_len: u64) -> Result<Self, PmemLogError> {
        let corrupted = |what| Err(PmemLogError::Corrupted { at: HEADER_OFF, what });
        let r = Reader::new(b);
        if r.u64(0) != Some(REGION_MAGIC) {
            return Err(PmemLogError::NotFormatted);
        }
        if r.u32(60) != Some(crc32c::crc32c(&b[..60])) {
            return corrupted("region header crc mismatch");
        }
        if r.u32(8) != Some(REGION_VERSION) {
            return corrupted("unknown region format version");
        }
        if !r.zeros(36, 24) {
            return corrupted("reserved header bytes are not zero");
        }
        let Some(mode) = r.u32(32).and_then(CommitMode::from_code) else {
            return corrupted("unknown commit mode");
        };
        // Every field lies inside the 64-byte header: `None` cannot happen.
        let (Some(unit_size), Some(unit_count), Some(uuid)) = (r.u32(12), r.u64(16), r.u64(24))
        else {
            return corrupted("region header field outside the header");
        };
        let header = RegionHeader { unit_size, unit_count, uuid, mode };
        if let Err(why) = header.check_geometry(region_len) {
            return corrupted(why);
        }
        Ok(header)
    }

    /// Whether the unit size and count fit a region of `region_len` bytes.
    ///
    /// # Errors
    /// The reason, as text.
    pub fn check_geometry(&self, region_len: u64) -> Result<(), &'static str> {
        if !(UNIT_SIZE_MIN..=UNIT_SIZE_MAX).contains(&self.unit_size)
            || !u64::from(self.unit_size).is_multiple_of(LINE_SIZE)
        {
            return Err("unit size is not a multiple of 64 between 64 and 65472");
        }
        if self.unit_count < 2 {
            return Err("fewer than 2 unit slots");
        }
        let units_len = self.unit_count.checked_mul(u64::from(self.unit_size));
        match units_len.and_then(|n| n.checked_add(UNITS_OFF)) {
            Some(end) if end <= region_len => Ok(()),
            _ => Err("unit slots reach past the end of the region"),
        }
    }

    /// Payload bytes a unit carries.
    #[must_use]
    pub fn payload_max(&self) -> usize {
        self.unit_size as usize - UNIT_HEADER_SIZE
    }

    /// Byte offset of the slot holding unit `lsn`.
    #[must_use]
    pub fn unit_off(&self, lsn: u64) -> u64 {
        UNITS_OFF + (lsn % self.unit_count) * u64::from(self.unit_size)
    }

    /// The crc seed of this region's units.
    #[must_use]
    pub fn crc_seed(&self) -> u32 {
        crc32c::crc32c(&self.uuid.to_le_bytes())
    }
}

/// The header of one log unit: LOC's `<TxID, TxCnt>` plus position, session and crc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnitHeader {
    /// The unit's position in the log (monotonic; slot = lsn mod unit count).
    pub lsn: u64,
    /// The transaction's sequence number (consecutive from 1).
    pub seq: u64,
    /// The session (epoch word + 1 at the open) that wrote it.
    pub epoch: u32,
    /// Index of this unit in its transaction.
    pub index: u16,
    /// Units in the transaction.
    pub count: u16,
    /// Payload bytes in this unit.
    pub len: u16,
}

impl UnitHeader {
    /// Encode header + `payload` (its `len` bytes) into `out`, crc last; returns the bytes used.
    pub fn encode_into(&self, crc_seed: u32, payload: &[u8], out: &mut Vec<u8>) {
        debug_assert_eq!(payload.len(), usize::from(self.len));
        out.clear();
        out.extend_from_slice(&self.lsn.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.extend_from_slice(&self.epoch.to_le_bytes());
        out.extend_from_slice(&self.index.to_le_bytes());
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(payload);
        let crc = unit_crc(crc_seed, out);
        Writer::new(out).u32(28, crc);
    }

    /// Decode the first 32 bytes of `unit` (a whole slot) without checking the crc; `None` when
    /// a field is out of range for a slot with `payload_max` payload bytes.
    #[must_use]
    pub fn decode_unchecked(unit: &[u8], payload_max: usize) -> Option<Self> {
        let r = Reader::new(unit);
        let h = UnitHeader {
            lsn: r.u64(0)?,
            seq: r.u64(8)?,
            epoch: r.u32(16)?,
            index: r.u16(20)?,
            count: r.u16(22)?,
            len: r.u16(24)?,
        };
        let sane = r.u16(26)? == 0
            && h.count > 0
            && h.index < h.count
            && usize::from(h.len) <= payload_max
            && UNIT_HEADER_SIZE + usize::from(h.len) <= unit.len();
        sane.then_some(h)
    }

    /// Whether the crc stored in `unit` matches its header and payload.
    #[must_use]
    pub fn crc_ok(&self, crc_seed: u32, unit: &[u8]) -> bool {
        let end = UNIT_HEADER_SIZE + usize::from(self.len);
        let Some(bytes) = unit.get(..end) else { return false };
        let mut copy = [0u8; UNIT_HEADER_SIZE];
        copy.copy_from_slice(&bytes[..UNIT_HEADER_SIZE]);
        copy[28..32].fill(0);
        let crc = crc32c::crc32c_append(
            crc32c::crc32c_append(crc_seed, &copy),
            &bytes[UNIT_HEADER_SIZE..],
        );
        Reader::new(bytes).u32(28) == Some(crc)
    }
}

/// crc of an encoded unit whose crc field is still zero.
fn unit_crc(seed: u32, bytes: &[u8]) -> u32 {
    crc32c::crc32c_append(seed, bytes)
}

/// Encode records as a transaction payload: each is `u32 len` + bytes.
///
/// # Panics
/// If a record is 4 GiB or longer: `PmemLog::commit` refuses those first (a bug otherwise).
#[must_use]
pub fn encode_records(records: &[&[u8]]) -> Vec<u8> {
    let mut out = Appender::with_capacity(records.iter().map(|r| r.len() + 4).sum());
    for r in records {
        // Callers refuse records of 4 GiB and more before encoding (a bug otherwise: panics).
        out.bytes_len32(r);
    }
    out.into_vec()
}

/// Decode a transaction payload into records; `None` when a length runs past the end.
#[must_use]
pub fn decode_records(payload: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut records = Vec::new();
    let mut c = Cursor::new(payload);
    while !c.at_end() {
        records.push(c.bytes_len32().ok()?.to_vec());
    }
    Some(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> RegionHeader {
        RegionHeader { unit_size: 256, unit_count: 8, uuid: 0x1234, mode: CommitMode::Count }
    }

    #[test]
    fn header_round_trips_and_rejects_every_flipped_byte() {
        let h = header();
        let b = h.encode();
        assert_eq!(RegionHeader::decode(&b, 4096).unwrap(), h);
        for i in 8..HEADER_SIZE {
            let mut bad = b;
            bad[i] ^= 0x10;
            assert!(
                matches!(RegionHeader::decode(&bad, 4096), Err(PmemLogError::Corrupted { .. })),
                "byte {i}"
            );
        }
        let mut bad = b;
        bad[0] ^= 1;
        assert!(matches!(RegionHeader::decode(&bad, 4096), Err(PmemLogError::NotFormatted)));
        assert!(matches!(
            RegionHeader::decode(&b, 256 + 7 * 256),
            Err(PmemLogError::Corrupted { .. })
        ));
    }

    #[test]
    fn unit_round_trips_and_rejects_every_flipped_byte() {
        let seed = header().crc_seed();
        let uh = UnitHeader { lsn: 9, seq: 3, epoch: 2, index: 1, count: 2, len: 5 };
        let mut b = Vec::new();
        uh.encode_into(seed, b"hello", &mut b);
        b.resize(256, 0xee);
        let d = UnitHeader::decode_unchecked(&b, 224).unwrap();
        assert_eq!(d, uh);
        assert!(d.crc_ok(seed, &b));
        assert!(!d.crc_ok(seed ^ 1, &b), "another region's seed");
        for i in 0..UNIT_HEADER_SIZE + 5 {
            let mut bad = b.clone();
            bad[i] ^= 0x01;
            let ok = UnitHeader::decode_unchecked(&bad, 224).is_some_and(|h| h.crc_ok(seed, &bad));
            assert!(!ok, "byte {i}");
        }
        assert!(UnitHeader::decode_unchecked(&[0u8; 256], 224).is_none(), "count 0");
        assert!(UnitHeader::decode_unchecked(&b[..10], 224).is_none());
    }

    #[test]
    fn records_round_trip_and_truncation_is_rejected() {
        let p = encode_records(&[b"a", b"", b"xyz"]);
        assert_eq!(decode_records(&p).unwrap(), vec![b"a".to_vec(), vec![], b"xyz".to_vec()]);
        for cut in 1..p.len() {
            if let Some(r) = decode_records(&p[..cut]) {
                assert!(r.len() < 3, "a cut payload never yields all records");
            }
        }
        assert!(decode_records(&[0xff, 0xff, 0xff, 0xff, 1]).is_none());
    }

    #[test]
    fn layout_matches_the_doc() {
        // docs/PMEM-LOG.md, "Region layout" and "Unit header".
        assert_eq!((HEAD_OFF, EPOCH_OFF, COMMIT_OFF, UNITS_OFF), (64, 128, 192, 256));
        for off in [HEAD_OFF, EPOCH_OFF, COMMIT_OFF, UNITS_OFF] {
            assert_eq!(off % LINE_SIZE, 0, "each word has a line of its own");
        }
        let b = header().encode();
        let r = Reader::new(&b);
        assert_eq!(&b[0..8], b"TALLYPML");
        assert_eq!(r.u32(8), Some(1));
        assert_eq!(r.u32(12), Some(256));
        assert_eq!(r.u64(16), Some(8));
        assert_eq!(r.u64(24), Some(0x1234));
        assert_eq!(r.u32(32), Some(1));
        let mut u = Vec::new();
        UnitHeader { lsn: 1, seq: 2, epoch: 3, index: 4, count: 5, len: 0 }.encode_into(
            7,
            &[],
            &mut u,
        );
        assert_eq!(u.len(), UNIT_HEADER_SIZE);
        let r = Reader::new(&u);
        assert_eq!((r.u64(0), r.u64(8), r.u32(16)), (Some(1), Some(2), Some(3)));
        let words = (r.u16(20), r.u16(22), r.u16(24), r.u16(26));
        assert_eq!(words, (Some(4), Some(5), Some(0), Some(0)));
        assert_eq!(header().payload_max(), 224);
        assert_eq!(header().unit_off(9), 256 + 256);
    }
}

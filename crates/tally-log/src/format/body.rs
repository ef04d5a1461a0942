//! A transaction's body: the bytes its units carry, concatenated in unit order.
//!
//! ```text
//! 0   u16 dep_count      2 u16 reserved (0)   4 u32 data_count   8 u32 record_count   12 u32 reserved (0)
//! 16  dep_count × { u16 stream, 6 bytes zero, u64 seq }           16 bytes each
//! ..  data_count × u32 crc32c of each data block, in span order
//! ..  record_count × { u32 len, len bytes }
//! ```

use super::codec::{Reader, Writer};
use crate::error::corrupted;
use crate::Result;

/// Size of the fixed body header.
pub const BODY_HEADER_SIZE: usize = 16;
/// Size of one dependency entry.
pub const DEP_SIZE: usize = 16;
/// Size of a record's length prefix.
pub const RECORD_LEN_SIZE: usize = 4;

/// A `(stream, seq)` pair naming a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct TxId {
    /// The stream.
    pub stream: u16,
    /// The sequence number on that stream.
    pub seq: u64,
}

/// A decoded body.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Body {
    /// Transactions of other streams this one depends on.
    pub deps: Vec<TxId>,
    /// crc32c of each data block.
    pub data_crcs: Vec<u32>,
    /// The records, opaque to the log.
    pub records: Vec<Vec<u8>>,
}

impl Body {
    /// Bytes the encoded body takes.
    #[must_use]
    pub fn encoded_len(&self) -> usize {
        BODY_HEADER_SIZE
            + self.deps.len() * DEP_SIZE
            + self.data_crcs.len() * 4
            + self.records.iter().map(|r| RECORD_LEN_SIZE + r.len()).sum::<usize>()
    }

    /// Encode. Counts must fit their fields (the transaction builder bounds them).
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.encoded_len()];
        let mut w = Writer::new(&mut out);
        w.u16(0, self.deps.len() as u16);
        w.u32(4, self.data_crcs.len() as u32);
        w.u32(8, self.records.len() as u32);
        let mut at = BODY_HEADER_SIZE;
        for d in &self.deps {
            w.u16(at, d.stream);
            w.u64(at + 8, d.seq);
            at += DEP_SIZE;
        }
        for &crc in &self.data_crcs {
            w.u32(at, crc);
            at += 4;
        }
        for r in &self.records {
            w.u32(at, r.len() as u32);
            w.put(at + RECORD_LEN_SIZE, r);
            at += RECORD_LEN_SIZE + r.len();
        }
        out
    }

    /// Decode, checking every count against the bytes present.
    ///
    /// # Errors
    /// [`crate::LogError::Corrupted`] when the bytes do not form a body.
    pub fn decode(bytes: &[u8], block_no: u64) -> Result<Body> {
        let bad = |reason: &str| corrupted("transaction body", block_no, reason);
        let r = Reader::new(bytes);
        let dep_count = r.u16(0).ok_or_else(|| bad("truncated header"))? as usize;
        let data_count = r.u32(4).ok_or_else(|| bad("truncated header"))? as usize;
        let record_count = r.u32(8).ok_or_else(|| bad("truncated header"))? as usize;
        if !r.zeros(2, 2) || !r.zeros(12, 4) {
            return Err(bad("reserved bytes are not zero"));
        }
        // Bound counts by the bytes present before allocating anything.
        let fixed = BODY_HEADER_SIZE + dep_count * DEP_SIZE + data_count.saturating_mul(4);
        if fixed > bytes.len() || record_count.saturating_mul(RECORD_LEN_SIZE) > bytes.len() {
            return Err(bad("counts exceed the body"));
        }
        let mut at = BODY_HEADER_SIZE;
        let mut deps = Vec::with_capacity(dep_count);
        for _ in 0..dep_count {
            if !r.zeros(at + 2, 6) {
                return Err(bad("reserved dependency bytes are not zero"));
            }
            let stream = r.u16(at).ok_or_else(|| bad("truncated dependency"))?;
            let seq = r.u64(at + 8).ok_or_else(|| bad("truncated dependency"))?;
            deps.push(TxId { stream, seq });
            at += DEP_SIZE;
        }
        let mut data_crcs = Vec::with_capacity(data_count);
        for _ in 0..data_count {
            data_crcs.push(r.u32(at).ok_or_else(|| bad("truncated data table"))?);
            at += 4;
        }
        let mut records = Vec::with_capacity(record_count);
        for _ in 0..record_count {
            let len = r.u32(at).ok_or_else(|| bad("truncated record"))? as usize;
            let start = at + RECORD_LEN_SIZE;
            let end = start.checked_add(len).filter(|&e| e <= bytes.len());
            let end = end.ok_or_else(|| bad("record longer than the body"))?;
            records.push(bytes[start..end].to_vec());
            at = end;
        }
        if at != bytes.len() {
            return Err(bad("bytes after the last record"));
        }
        Ok(Body { deps, data_crcs, records })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Body {
        Body {
            deps: vec![TxId { stream: 1, seq: 99 }],
            data_crcs: vec![1, 2, 3],
            records: vec![b"abc".to_vec(), vec![], vec![7; 300]],
        }
    }

    #[test]
    fn round_trip() {
        let b = sample();
        assert_eq!(Body::decode(&b.encode(), 0).unwrap(), b);
        assert_eq!(b.encode().len(), b.encoded_len());
    }

    #[test]
    fn truncation_and_garbage_never_panic() {
        let bytes = sample().encode();
        for cut in 0..bytes.len() {
            assert!(Body::decode(&bytes[..cut], 0).is_err(), "truncated at {cut} accepted");
        }
        let mut rng = fastrand::Rng::with_seed(5);
        for _ in 0..2000 {
            let mut b = bytes.clone();
            let i = rng.usize(..b.len());
            b[i] = rng.u8(..);
            let _ = Body::decode(&b, 0);
        }
    }
}

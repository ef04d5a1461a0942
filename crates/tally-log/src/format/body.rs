//! A transaction's body: the bytes its units carry, concatenated in unit order.
//!
//! ```text
//! 0   u16 dep_count      2 u16 reserved (0)   4 u32 data_count   8 u32 record_count   12 u32 reserved (0)
//! 16  dep_count × { u16 stream, 6 bytes zero, u64 seq }           16 bytes each
//! ..  data_count × u32 crc32c of each data block, in span order
//! ..  record_count × { u32 len, len bytes }
//! ```

use super::codec::{Appender, Cursor, Truncated};
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
    #[expect(
        clippy::arithmetic_side_effects,
        reason = "sizes of vectors in memory, each entry encoded in at most its size plus 4 bytes"
    )]
    pub fn encoded_len(&self) -> usize {
        BODY_HEADER_SIZE
            + self.deps.len() * DEP_SIZE
            + self.data_crcs.len() * 4
            + self.records.iter().map(|r| RECORD_LEN_SIZE + r.len()).sum::<usize>()
    }

    /// Encode.
    ///
    /// # Panics
    /// If a count does not fit its field: the transaction builder bounds them (a bug otherwise).
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut a = Appender::with_capacity(self.encoded_len());
        a.u16(count(self.deps.len()));
        a.u16(0);
        a.u32(count(self.data_crcs.len()));
        a.u32(count(self.records.len()));
        a.u32(0);
        for d in &self.deps {
            a.u16(d.stream);
            a.put(&[0; 6]);
            a.u64(d.seq);
        }
        for &crc in &self.data_crcs {
            a.u32(crc);
        }
        for r in &self.records {
            a.bytes_len32(r);
        }
        a.into_vec()
    }

    /// Decode, checking every count against the bytes present.
    ///
    /// # Errors
    /// [`crate::LogError::Corrupted`] when the bytes do not form a body.
    pub fn decode(bytes: &[u8], block_no: u64) -> Result<Body> {
        let bad = |reason: &str| corrupted("transaction body", block_no, reason);
        let short = |reason: &'static str| move |_: Truncated| bad(reason);
        let mut c = Cursor::new(bytes);
        let dep_count = c.u16().map_err(short("truncated header"))?;
        let reserved = c.u16().map_err(short("truncated header"))?;
        let data_count = c.u32().map_err(short("truncated header"))?;
        let record_count = c.u32().map_err(short("truncated header"))?;
        if reserved != 0 || c.u32().map_err(short("truncated header"))? != 0 {
            return Err(bad("reserved bytes are not zero"));
        }
        // Bound counts by the bytes present before allocating anything.
        let entries =
            |n: u32, size: usize| usize::try_from(n).ok().and_then(|n| n.checked_mul(size));
        let fixed = entries(u32::from(dep_count), DEP_SIZE)
            .zip(entries(data_count, 4))
            .and_then(|(d, c)| d.checked_add(c));
        let records_min = entries(record_count, RECORD_LEN_SIZE);
        if fixed.is_none_or(|n| n > c.remaining()) || records_min.is_none_or(|n| n > c.remaining())
        {
            return Err(bad("counts exceed the body"));
        }
        let mut deps = Vec::with_capacity(usize::from(dep_count));
        for _ in 0..dep_count {
            let stream = c.u16().map_err(short("truncated dependency"))?;
            let reserved = c.take(6).map_err(short("truncated dependency"))?;
            if reserved.iter().any(|&b| b != 0) {
                return Err(bad("reserved dependency bytes are not zero"));
            }
            let seq = c.u64().map_err(short("truncated dependency"))?;
            deps.push(TxId { stream, seq });
        }
        let data_crcs = (0..data_count).map(|_| c.u32()).collect::<Result<Vec<u32>, _>>();
        let data_crcs = data_crcs.map_err(short("truncated data table"))?;
        let mut records = Vec::with_capacity(usize::try_from(record_count).unwrap_or(0));
        for _ in 0..record_count {
            let record = c.bytes_len32().map_err(short("record longer than the body"))?;
            records.push(record.to_vec());
        }
        if !c.at_end() {
            return Err(bad("bytes after the last record"));
        }
        Ok(Body { deps, data_crcs, records })
    }
}

/// `n` in a count field of type `T`.
fn count<T: TryFrom<usize>>(n: usize) -> T {
    let Ok(v) = T::try_from(n) else {
        panic!("count {n} does not fit its field");
    };
    v
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

//! A transaction's body: the bytes its units carry, concatenated in unit order.
//!
//! ```text
//! 0   u16 dep_count      2 u16 run_role   4 u32 data_count   8 u32 record_count   12 u32 run_index
//! 16  u64 run_seq                                                  only when run_role != 0
//! ..  dep_count × { u16 stream, 6 bytes zero, u64 seq }           16 bytes each
//! ..  data_count × u32 crc32c of each data block, in span order
//! ..  record_count × { u32 len, len bytes }
//! ```

use super::codec::{Cursor, Truncated};
use crate::error::corrupted;
use crate::Result;

/// Size of the fixed body header.
pub const BODY_HEADER_SIZE: usize = 16;
/// Size of one dependency entry.
pub const DEP_SIZE: usize = 16;
/// Size of a record's length prefix.
pub const RECORD_LEN_SIZE: usize = 4;

/// Size of the run field that follows the body header of a large transaction's part.
pub const RUN_SEQ_SIZE: usize = 8;

/// What a transaction is in a *large transaction* (a run of transactions of one stream that
/// commit together, `docs/FORMAT.md`, "Large transactions").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum RunRole {
    /// A part: committed only if a `Close` of its run survives.
    Part,
    /// The last transaction of the run: it commits the run's parts and itself.
    Close,
}

/// A transaction's place in a large transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Run {
    /// Part or close.
    pub role: RunRole,
    /// Sequence number of the run's first part (the run's name on its stream).
    pub seq: u64,
    /// A part's index in the run (0 for the first); for a close, the number of parts before it.
    pub index: u32,
}

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
    /// Its place in a large transaction, if it is part of one.
    pub run: Option<Run>,
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
            + if self.run.is_some() { RUN_SEQ_SIZE } else { 0 }
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
        let mut bytes = Vec::with_capacity(self.encoded_len());
        self.encode_with(|part| bytes.extend_from_slice(part));
        bytes
    }

    /// Encode, handing the encoding to `put` in pieces, in order (their concatenation is
    /// [`Body::encode`]'s bytes, [`Body::encoded_len`] of them): lets the log write a body
    /// straight into its units' payloads.
    ///
    /// # Panics
    /// As [`Body::encode`].
    pub fn encode_with(&self, mut put: impl FnMut(&[u8])) {
        put(&count::<u16>(self.deps.len()).to_le_bytes());
        let role: u16 = match self.run.map(|r| r.role) {
            None => 0,
            Some(RunRole::Part) => 1,
            Some(RunRole::Close) => 2,
        };
        put(&role.to_le_bytes());
        put(&count::<u32>(self.data_crcs.len()).to_le_bytes());
        put(&count::<u32>(self.records.len()).to_le_bytes());
        put(&self.run.map_or(0, |r| r.index).to_le_bytes());
        if let Some(r) = self.run {
            put(&r.seq.to_le_bytes());
        }
        for d in &self.deps {
            put(&d.stream.to_le_bytes());
            put(&[0; 6]);
            put(&d.seq.to_le_bytes());
        }
        for &crc in &self.data_crcs {
            put(&crc.to_le_bytes());
        }
        for r in &self.records {
            put(&count::<u32>(r.len()).to_le_bytes());
            put(r);
        }
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
        let role = c.u16().map_err(short("truncated header"))?;
        let data_count = c.u32().map_err(short("truncated header"))?;
        let record_count = c.u32().map_err(short("truncated header"))?;
        let index = c.u32().map_err(short("truncated header"))?;
        let role = match role {
            0 if index == 0 => None,
            0 => return Err(bad("run index without a run")),
            1 => Some(RunRole::Part),
            2 if index > 0 => Some(RunRole::Close),
            2 => return Err(bad("a run's close with no part before it")),
            _ => return Err(bad("unknown run role")),
        };
        let run = match role {
            Some(role) => {
                let seq = c.u64().map_err(short("truncated run"))?;
                Some(Run { role, seq, index })
            }
            None => None,
        };
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
        Ok(Body { deps, data_crcs, records, run })
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
            run: None,
        }
    }

    #[test]
    fn run_round_trip_and_bad_roles_rejected() {
        for run in [
            Run { role: RunRole::Part, seq: 7, index: 0 },
            Run { role: RunRole::Part, seq: 7, index: 3 },
            Run { role: RunRole::Close, seq: 7, index: 4 },
        ] {
            let b = Body { run: Some(run), ..sample() };
            assert_eq!(Body::decode(&b.encode(), 0).unwrap(), b);
            assert_eq!(b.encode().len(), b.encoded_len());
        }
        let close = Body { run: Some(Run { role: RunRole::Close, seq: 7, index: 1 }), ..sample() };
        let mut bytes = close.encode();
        bytes[12] = 0; // a close that names no part
        assert!(Body::decode(&bytes, 0).is_err());
        bytes[2] = 3; // unknown role
        assert!(Body::decode(&bytes, 0).is_err());
        let mut plain = sample().encode();
        plain[12] = 1; // an index without a run
        assert!(Body::decode(&plain, 0).is_err());
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

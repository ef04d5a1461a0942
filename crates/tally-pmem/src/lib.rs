//! Tally's log on persistent memory: LOC's eager (count-based) commit at cache-line
//! granularity. A transaction is durable after its units are stored, their lines flushed, and
//! **one** fence — no commit record, no second fence. `docs/PMEM-LOG.md` says the same at
//! length, with the crash cases.
//!
//! # Region layout (all integers little-endian)
//!
//! ```text
//! byte 0    line 0  region header (64 B)
//!             0  u64  magic "TALLYPML"
//!             8  u32  format version (1)
//!            12  u32  unit size in bytes (multiple of 64, 64..=65472; default 256)
//!            16  u64  unit count (slots in the ring)
//!            24  u64  uuid (seeds every unit's crc)
//!            32  u32  commit mode (1 = count, 2 = classic)
//!            36  24 B reserved, zero
//!            60  u32  crc32c of bytes 0..60
//! byte 64   line 1  head word   u64: lsn of the oldest live unit (moved by release_before)
//! byte 128  line 2  epoch word  u64: the number of the last session (bumped by every open)
//! byte 192  line 3  commit word u64: classic mode only, lsn just past the last committed tx
//! byte 256  unit slots: slot i at 256 + i * unit size; unit `lsn` lives in slot lsn % count
//! ```
//!
//! A **unit** is a 32-byte header and up to `unit size - 32` payload bytes:
//!
//! ```text
//!  0 u64 lsn     position in the log (monotonic, never reused within a session)
//!  8 u64 seq     transaction sequence number (consecutive from 1)
//! 16 u32 epoch   session that wrote it (epoch word + 1 at that open)
//! 20 u16 index   unit's index in its transaction
//! 22 u16 count   units in the transaction (LOC's TxCnt)
//! 24 u16 len     payload bytes in this unit (all units but the last are full)
//! 26 u16 zero
//! 28 u32 crc32c  seeded with crc32c(uuid), over bytes 0..28 (crc field zero) and the payload
//! ```
//!
//! A transaction's payload is its records, each `u32 len` + bytes, cut into consecutive units.
//! Only `32 + len` bytes of a unit are stored: the rest of the slot keeps old bytes.
//!
//! # Commit (count mode)
//! Copy each unit (cached stores + `clwb` of its lines, or — for transactions of at least
//! [`Tuning::nt_copy_min`] bytes — non-temporal stores with the unaligned tail stored cached
//! and flushed), then one `sfence`. The transaction is committed iff all `count` units are
//! present with valid crcs: a crash before the fence leaves any subset of its lines, which
//! recovery discards whole because some unit fails its crc (a unit spans several lines, more
//! than the 8-byte failure-atomic unit, so the crc is what makes it atomic).
//!
//! # Commit (classic mode, for comparison)
//! The same units, flush, fence; then the commit word (8-byte atomic store), flush, fence.
//! Recovery trusts exactly the units below the commit word.
//!
//! # Recovery ([`PmemLog::open`])
//! From the head word, read units in lsn order and accept transactions while: every unit's lsn
//! is the one expected (stale slots from an earlier lap fail), its crc is valid, index runs
//! 0..count with one seq, count and epoch, seq is the previous one + 1, and epochs never
//! decrease. The first failure ends the log (LOC's in-order prefix). Commits are synchronous,
//! so only the one in flight at the crash can be incomplete; its leftover units are ruled out
//! once a later session rewrites the slots, because the epoch word is bumped and persisted at
//! every open before any unit of the new session is stored (a torn new unit cannot pair with
//! an old one of the same seq). Then the log continues at the end of the prefix.
//!
//! # Release
//! [`PmemLog::release_before`] moves the head word (one 8-byte atomic store, flushed and
//! fenced before any later commit can reuse the freed slots). The newest transaction is never
//! released: it tells recovery the next sequence number. An empty log with a head other than
//! 0 is therefore corrupt.
//!
//! # Invariants
//! Atomicity (a transaction is recovered whole or not at all, bytes exact), prefix (recovered =
//! a prefix of what was committed since the head), durability (a commit that returned is
//! recovered), recovery never fails or panics on an image a crash can leave, a second open
//! recovers the same transactions, and commits after recovery survive the next crash:
//! `tests/crash.rs` checks them on every (or a seeded sample of every) crash image of
//! `tally-sim`'s `PmemSim` at and inside every commit, with the mutants in [`Mutant`].

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod copy;
mod error;
pub mod format;
mod log;
mod mutant;

pub use copy::LogStats;
pub use error::PmemLogError;
pub use format::{CommitMode, RegionHeader};
pub use log::{LogConfig, PmemLog, RecoveredTx, Tuning};
pub use mutant::{available as mutants_available, Mutant};

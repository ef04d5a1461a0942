//! Tally's multi-stream transactional log.
//!
//! A log holds N *streams*, independent ordering domains. A transaction (records + data blocks +
//! dependencies on other streams' transactions) is appended to one stream and gets the next
//! sequence number there. The guarantees, after any crash and [`Log::open`]:
//!
//! - **atomicity**: a transaction survives whole or not at all (count-based commit: every unit
//!   present with a valid crc, every data block matching its crc; no commit record);
//! - **per-stream prefix**: on each stream, the survivors are a prefix of what was committed
//!   after the last checkpoint;
//! - **dependency closure**: no transaction survives without the transactions it depends on;
//! - **durability on demand**: a transaction whose [`Log::wait_durable`] (or
//!   [`Log::commit_durable`]) returned survives. The wait covers what that needs and no more:
//!   its stream's prefix up to it and, transitively, each dependency's stream prefix up to the
//!   dependency; other streams' buffered writes are not written out or waited for. Waiters
//!   arriving together share one flush round (and one device flush).
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use tally_log::{Log, LogConfig, OpenOptions, Transaction};
//! use tally_media::{FileDevice, FileOptions};
//! # let dir = std::env::temp_dir().join(format!("tally-doc-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir)?;
//! # let path = dir.join("tally.img");
//! # std::fs::File::create(&path)?.set_len(64 << 20)?;
//!
//! let dev = Arc::new(FileDevice::open(&path, FileOptions::default())?);
//! Log::format(&*dev, &LogConfig::default())?; // once
//! let (log, recovered) = Log::open(dev, OpenOptions::default())?; // every start: recovers
//! assert!(recovered.streams.iter().all(|s| s.txs.is_empty()));
//! let mut tx = Transaction::new(0); // stream 0
//! tx.record(b"set x = 1".to_vec());
//! let ticket = log.commit(tx)?.ticket; // ordered + atomic, returns at once
//! log.wait_durable(ticket)?; // one flush, shared with other waiters
//! # drop(log);
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(())
//! # }
//! ```
//!
//! Invariants the implementation keeps:
//! - a stream's transactions are laid out back to back in its segment chain; each unit records
//!   the sequence number of the transaction before it (`prev_seq`), the stream's epoch and the
//!   segment the chain continues in, so recovery follows exactly one chain;
//! - every stream always owns one reserved *next* segment, so a chain never needs a link it
//!   cannot write;
//! - the epoch bump of a recovery is durable before anything new is written; transactions of an
//!   older epoch with a sequence number above the recovered tail are never accepted again;
//! - a segment returns to the free pool only after a durable checkpoint covers all of it;
//! - after a failed write or flush, every commit fails until the log is reopened (fail-stop).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod api;
mod checkpoint;
mod clean;
mod commit;
mod durable;
mod engine;
mod error;
pub mod format;
mod mutant;
mod recover;
pub mod snapshot;
mod space;
mod writeback;

pub use api::{
    CommitInfo, CommitMode, LogConfig, LogStats, OpenOptions, SegmentUsage, Transaction,
};
pub use clean::{CleanPending, CleanReport};
pub use engine::Log;
pub use error::{LogError, Result};
pub use format::body::{Run, RunRole, TxId};
pub use format::superblock::probe_block_size;
pub use mutant::{available as mutants_available, Mutant};
pub use recover::{Damage, RecoveredTx, Recovery, StreamRecovery};
pub use snapshot::CheckpointStart;
pub use writeback::WriteBehind;

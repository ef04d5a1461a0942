//! Tally's file system: a NOVA-style log-structured file system with CFS-style multi-file
//! transactions, on Tally's multi-stream log.
//!
//! - **Everything persistent is a log record** (`docs/FORMAT.md`, "File-system records"): inode
//!   attributes, directory entries, one record per data block (with its crc32c), extended
//!   attributes, and tombstones. Each record carries a version from one file-system clock; the
//!   records of one object form its history, and mount rebuilds the DRAM state (inode table,
//!   block maps, name maps) by applying the surviving records in version order.
//! - **Copy-on-write data**: a write makes new blocks (partial blocks merged in memory), carried
//!   by the same log transaction as the records that point at them. Reads check the crc.
//! - **Every operation is one atomic transaction** (rename across directories, unlink of the last
//!   link, create with its entry). Explicit transactions ([`Fs::begin`], [`Fs::commit`],
//!   [`Fs::commit_durable`], [`Fs::abort`]) group any operations on any files.
//! - **Streams and dependencies**: operations on a file go to stream `ino % streams`; an
//!   operation touching an inode whose last change is on another stream and not yet durable
//!   depends on that change. Write-then-rename is safe by construction.
//! - **fsync(file)** waits for that file's last transaction (and its dependencies) only;
//!   **barrier(file)** orders later operations after it without waiting.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use tally_fs::{Fs, MkfsOptions, MountOptions, Owner, ROOT};
//! use tally_media::MemDevice;
//!
//! let dev: Arc<dyn tally_media::Device> = Arc::new(MemDevice::new(4096, 16384)?);
//! Fs::mkfs(dev.clone(), &MkfsOptions::default())?;
//! let fs = Fs::mount(dev.clone(), MountOptions::default())?;
//! let me = Owner { uid: 1000, gid: 1000 };
//!
//! // Two files updated together, or not at all.
//! let a = fs.create(None, ROOT, b"a", 0o644, me)?;
//! let b = fs.create(None, ROOT, b"b", 0o644, me)?;
//! let tx = fs.begin()?;
//! fs.write(Some(&tx), a.ino, 0, b"debit")?;
//! fs.write(Some(&tx), b.ino, 0, b"credit")?;
//! fs.commit_durable(tx)?; // one flush
//!
//! assert_eq!(fs.read(b.ino, 0, 100)?, b"credit");
//! fs.unmount()?;
//! # Ok(())
//! # }
//! ```
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod clean;
mod error;
mod fs;
mod fsck;
mod live;
mod mutant;
pub mod record;
mod reserve;
mod snapshot;
mod state;
mod sync;
mod txn;
mod types;

pub use clean::{FsCleanReport, MaintainReport, Maintenance};
pub use error::{FsError, IoCause, Result};
pub use fs::{
    Fs, MkfsOptions, MountOptions, MountReport, SnapshotOutcome, StreamPolicy, Txn,
    REPLAY_BUDGET_DEFAULT,
};
pub use fsck::{FsckReport, SegmentLiveness};
pub use live::SpaceUsage;
pub use mutant::{available as mutants_available, FsMutant};
pub use types::*;

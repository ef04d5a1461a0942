//! Tally's FUSE adapter: serves a [`tally_fs::Fs`] to the kernel with `fuser` (pure Rust, no
//! libfuse; as root it mounts with `mount(2)` itself, otherwise through `fusermount3`).
//!
//! The adapter is thin on purpose. Each kernel request is one `tally-fs` call; the errno comes
//! from [`tally_fs::FsError::errno`] through one function; inode numbers are the file system's;
//! an open file handle is a pin on the inode ([`tally_fs::Fs::open`]), so a file unlinked while
//! open stays usable until its last close.
//!
//! What the kernel is asked to do:
//! - **permission checks** (`default_permissions`, always on): the library checks none;
//! - **attribute and entry caching** for [`MountConfig::ttl`] (1 s by default): every change
//!   goes through this mount, and the kernel drops what a change makes stale, so the cache is
//!   only ever behind for changes made without the kernel — none today;
//! - **no writeback cache**: a `write` reaches the file system before it returns, so each write
//!   is a transaction and `fsync` has nothing of the kernel's to flush first. With it, the
//!   kernel would send dirty pages later, merged and in its own order, and a barrier or an
//!   explicit transaction could no longer say which writes it covers;
//! - **several request threads** ([`MountConfig::threads`], one `/dev/fuse` clone each):
//!   `fsync`s wait for the device in parallel while other requests are served.
//!
//! **Transactions for unmodified programs**: the ioctls of the `tally-client` crate (and
//! `include/tally.h`) on any open file or directory of the mount begin a transaction bound to
//! the calling process or to its process tree, and commit, commit durably or abort it; every
//! change a bound process makes goes into it (`txns.rs`; `docs/TRANSACTIONS.md`). A plain
//! request that touches what an open transaction holds waits at most
//! [`MountConfig::txn_wait`], then gets `EBUSY`.
//!
//! While mounted, a [`tally_fs::Maintenance`] thread makes committed changes durable and cleans
//! every [`MountConfig::maintenance_interval`]; the kernel's unmount (or a signal, see
//! [`Mounted::unmount_on_signals`]) ends the session and unmounts the file system cleanly,
//! writing its snapshot.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use tally_fs::{Fs, MountOptions};
//! use tally_media::{FileDevice, FileOptions};
//!
//! tally_fuse::block_termination_signals()?;
//! let dev = Arc::new(FileDevice::open("image", FileOptions::default())?);
//! let fs = Fs::mount(dev, MountOptions::default())?;
//! let mounted = tally_fuse::mount(fs, "/mnt/tally".as_ref(), &tally_fuse::MountConfig::default())?;
//! mounted.unmount_on_signals()?;
//! let outcome = mounted.run()?; // until unmounted
//! println!("{outcome:?}");
//! # Ok(())
//! # }
//! ```
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod adapter;
mod attr;
mod errno;
mod requests;
mod session;
mod txns;

pub use adapter::{TallyFuse, Unmounted};
pub use requests::{Opcode, RequestCounts, RequestSnapshot};
pub use session::{
    block_termination_signals, mount, parse_options, unmount_dir, MountConfig, Mounted,
};
pub use txns::FuseMutant;

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
//! - **caching, long** (a day by default: [`MountConfig::attr_timeout`], `entry_timeout`,
//!   `negative_timeout`): attributes, names, absent names, directory listings
//!   (`FOPEN_CACHE_DIR`), symlink targets (`FUSE_CACHE_SYMLINKS`), and file pages from one
//!   open to the next (`FOPEN_KEEP_CACHE`). Every change goes through the mount and the kernel
//!   drops what it makes stale itself; the adapter tells it about the only changes it does not
//!   see (an abort, and a write that drops a set-user-ID bit: `adapter.rs`, `txns.rs`). A file
//!   written in pieces that split pages is opened without its cached pages once, so it is read
//!   whole rather than a page per gap;
//! - **listings with attributes** (`READDIRPLUS`): no `LOOKUP` per listed name;
//! - **no `FLUSH` at close** (`FOPEN_NOFLUSH`) of a file open only for reading: every write
//!   is a transaction when it returns, and the kernel still sends `RELEASE`, which ends a
//!   transaction its open file owns. A file open for writing in place (not `O_EXCL`,
//!   `O_TRUNC` or `O_APPEND`, through which no atomic write can start) gets `FLUSH`, where an
//!   F2FS atomic write its dying process left open is aborted before the kernel drops the
//!   process's POSIX locks;
//! - **privileges dropped by the file system** (`FUSE_HANDLE_KILLPRIV_V2`): Tally takes
//!   set-user-ID and set-group-ID bits and `security.capability` on write, truncate and chown
//!   (`privs.rs`), and the kernel stops asking `getxattr("security.capability")` before
//!   every write;
//! - **no writeback cache**: a `write` reaches the file system before it returns, so each write
//!   is a transaction and `fsync` has nothing of the kernel's to flush first. With it, the
//!   kernel would send dirty pages later, merged and in its own order, and a barrier or an
//!   explicit transaction could no longer say which writes it covers (measured on untar, clone
//!   and rm -rf, it also sends more requests, not fewer: docs/bench/posix.md);
//! - **direct writes** (`FOPEN_DIRECT_IO`) through a file open for writing only with `O_EXCL`,
//!   `O_TRUNC` or `O_APPEND` (tar, git, cp, redirections, appenders): each `write` is one
//!   `WRITE` whatever its alignment, and no `getxattr("security.capability")` precedes the
//!   first (`adapter.rs`, `TallyFuse::file_open_flags`);
//! - **several request threads** ([`MountConfig::threads`], one `/dev/fuse` clone each, or
//!   ring entries): `fsync`s wait for the device in parallel while other requests are served;
//! - **FUSE over io_uring** where the kernel offers it ([`MountConfig::io_uring`], [`IoUring`]):
//!   per-CPU queues of ring entries, each request answered and the next fetched in one
//!   `io_uring_enter` (`ring.rs`); `/dev/fuse` keeps `INIT`, `FORGET` and `INTERRUPT`, read
//!   by one thread that rests after forgets so that they come in batches. Both
//!   transports call the same operations (`adapter.rs`), which return typed answers.
//!
//! Requests are counted by opcode, and those the ring brought apart ([`Mounted::requests`];
//! logged at unmount and on `SIGUSR1`).
//!
//! **Transactions for unmodified programs**: the ioctls of the `tally-client` crate (and
//! `include/tally.h`) on any open file or directory of the mount begin a transaction bound to
//! the calling process or to its process tree, and commit, commit durably or abort it; every
//! change a bound process makes goes into it (`txns.rs`; `docs/TRANSACTIONS.md`). A plain
//! request that touches what an open transaction holds waits at most
//! [`MountConfig::txn_wait`], then gets `EBUSY`.
//!
//! **F2FS's atomic writes** (`F2FS_IOC_START_ATOMIC_WRITE`, `COMMIT`, `ABORT`,
//! `GET_FEATURES`), which SQLite built with `SQLITE_ENABLE_BATCH_ATOMIC_WRITE` uses to commit
//! with no journal: a transaction owned by one open file, taking the writes through it
//! (`adapter/f2fs.rs`).
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
mod privs;
mod requests;
mod ring;
mod session;
mod txns;

pub use adapter::{TallyFuse, Unmounted};
pub use requests::{Opcode, RequestCounts, RequestSnapshot};
pub use session::{
    block_termination_signals, mount, parse_options, unmount_dir, IoUring, MountConfig, Mounted,
};
pub use txns::FuseMutant;

//! Tally's media layer: everything that touches a storage device goes through [`Device`].
//!
//! Invariants this crate keeps for every backend:
//! - addresses are in logical blocks of [`Geometry::block_size`] bytes; a request that is
//!   misaligned or reaches past the end is refused with a typed error before any I/O;
//! - a [`Ticket`] names one submission; waiting on it reports the first error of any write in it;
//! - `flush` makes durable every write whose ticket completed before `flush` was called — callers
//!   that need a write covered must wait for its ticket first;
//! - after the first failed write or flush the device is *failed*: every later write and flush
//!   returns [`MediaError::Failed`] (fail-stop; a failed flush is never retried as if it worked).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod buf;
pub mod codec;
mod device;
mod error;
mod file;
mod image;
mod mem;
pub mod nbd;
mod overlay;
pub mod pmem;
pub mod span;
mod stats;

pub use buf::IoBuf;
pub use device::{check_read, check_write, Device, Geometry, Ticket, Write, WriteFlags};
pub use error::{MediaError, Result};
pub use file::{
    fallocate, DirectMode, Engine, EngineKind, FileDevice, FileOptions, ATOMIC_WRITE_SIZE_DEFAULT,
    BLOCK_SIZE_DEFAULT,
};
pub use image::Image;
pub use mem::MemDevice;
pub use nbd::{NbdDevice, NbdError, NbdOptions, NbdTarget};
pub use overlay::OverlayDevice;
pub use pmem::{FlushKind, Pmem, PmemDevice, PmemError, PmemMode, PmemOptions, PmemStats};
pub use span::{SpanDevice, SpanError, SpanLayout, SpanMutant, TargetHeader};
pub use stats::{Counters, DeviceStats};

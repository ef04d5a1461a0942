//! Tally's file system library (work in progress; see issue #4).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod error;
pub mod record;
mod types;

pub use error::{FsError, Result};
pub use types::*;

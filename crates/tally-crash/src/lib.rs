//! Crash-state exploration for Tally.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

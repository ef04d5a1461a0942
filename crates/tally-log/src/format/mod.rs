//! The log's on-media format. `docs/FORMAT.md` is its prose; `tests/format_doc.rs` checks that
//! the offsets written there are the constants used here.
//!
//! Every structure is encoded by hand, little-endian, with magic bytes, a version, reserved
//! bytes written as zero and checked, and a crc32c. Decoders never panic: short or hostile
//! bytes come back as [`crate::LogError::Corrupted`]. Indexing, unchecked arithmetic and
//! truncating casts are denied here: each exception says why it cannot fail.
#![cfg_attr(
    not(test),
    deny(
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects,
        clippy::cast_possible_truncation
    )
)]

pub mod body;
/// The shared little-endian codec (it lives in `tally-media`, so that every crate that persists
/// bytes can use it).
pub use tally_media::codec;
pub mod snapshot;
pub mod superblock;
pub mod unit;

/// Format version written by this code and the only one it reads.
pub const FORMAT_VERSION: u16 = 2;

/// crc32c over `parts`, seeded with the image's uuid so that blocks of another image (or bytes a
/// user wrote that imitate a unit) never pass the check.
#[must_use]
pub fn crc_seeded(uuid: &[u8; 16], parts: &[&[u8]]) -> u32 {
    let mut crc = crc32c::crc32c(uuid);
    for part in parts {
        crc = crc32c::crc32c_append(crc, part);
    }
    crc
}

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

/// crc32c's polynomial, bit-reflected (as the `crc32c` crate computes it).
const CRC32C_POLY: u32 = 0x82F6_3B78;
/// Zero bytes per step of [`ZERO_STEPS`].
const ZERO_STEP_BYTES: usize = 64;
/// Steps of [`ZERO_STEPS`]: zeros up to 64 KiB (the largest block) in one multiplication.
const ZERO_STEP_COUNT: usize = 1024;
/// Fewer zeros than this are appended by the hardware crc (faster than a multiplication below
/// about 200 bytes).
const ZERO_HARDWARE_BYTES: usize = 256;
/// What the hardware crc reads for them.
static ZERO_BYTES: [u8; ZERO_HARDWARE_BYTES] = [0; ZERO_HARDWARE_BYTES];
/// `ZERO_STEPS[q]` = x^(8 * 64 * q) mod the crc32c polynomial (bit-reflected): what appending
/// `64 * q` zero bytes multiplies a crc's register by.
static ZERO_STEPS: [u32; ZERO_STEP_COUNT] = zero_steps();

/// `a * b` modulo the crc32c polynomial, both bit-reflected (bit 31 is x^0), in 32 fixed
/// steps.
#[expect(clippy::arithmetic_side_effects, reason = "i < 32: 31 - i and i + 1 stay in range")]
const fn mul_mod_poly(a: u32, b: u32) -> u32 {
    let (mut p, mut b, mut i) = (0u32, b, 0u32);
    while i < 32 {
        // Add b * x^i when a has x^i; then b *= x.
        p ^= b & 0u32.wrapping_sub((a >> (31 - i)) & 1);
        b = (b >> 1) ^ (CRC32C_POLY & 0u32.wrapping_sub(b & 1));
        i += 1;
    }
    p
}

#[expect(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    reason = "const evaluation over a fixed-size table; q < ZERO_STEP_COUNT"
)]
const fn zero_steps() -> [u32; ZERO_STEP_COUNT] {
    // x^(8 * 64) = x^512: x squared nine times.
    let (mut x512, mut i) = (1u32 << 30, 0);
    while i < 9 {
        x512 = mul_mod_poly(x512, x512);
        i += 1;
    }
    let mut table = [0u32; ZERO_STEP_COUNT];
    table[0] = 1 << 31; // x^0
    let mut q = 1;
    while q < ZERO_STEP_COUNT {
        table[q] = mul_mod_poly(table[q - 1], x512);
        q += 1;
    }
    table
}

/// `crc` (a crc32c, as `crc32c::crc32c_append` takes and returns it) extended over `len` zero
/// bytes, without reading them (a block's zero tail, about 5x faster than reading 4 KiB):
/// the hardware crc over fewer than 64 of them, then one multiplication per 64 KiB. Equal to
/// `crc32c_append(crc, &[0; len])`.
#[must_use]
pub fn crc_zeros(crc: u32, len: usize) -> u32 {
    if len < ZERO_HARDWARE_BYTES {
        return crc32c::crc32c_append(crc, ZERO_BYTES.get(..len).unwrap_or_default());
    }
    let (mut steps, rest) = (len / ZERO_STEP_BYTES, len % ZERO_STEP_BYTES);
    let mut crc = crc32c::crc32c_append(crc, ZERO_BYTES.get(..rest).unwrap_or_default());
    while steps > 0 {
        let step = steps.min(ZERO_STEP_COUNT - 1);
        let factor = ZERO_STEPS.get(step).copied().unwrap_or(1 << 31);
        // The register is the crc inverted; appending zeros multiplies it.
        crc = !mul_mod_poly(factor, !crc);
        steps = steps.saturating_sub(step);
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::crc_zeros;

    /// The zeros' crc equals the crc over real zeros, at every length around a step's
    /// boundaries and past the table's end, from any starting crc.
    #[test]
    fn crc_zeros_equals_the_crc_over_zero_bytes() {
        let zeros = vec![0u8; 200_000];
        let mut rng = fastrand::Rng::with_seed(14);
        let mut lens: Vec<usize> = (0..=4200).collect();
        lens.extend([8128, 65_472, 65_536, 65_600, 131_072, 199_999]);
        lens.extend((0..200).map(|_| rng.usize(..200_000)));
        for len in lens {
            for start in [0, 0xFFFF_FFFF, rng.u32(..)] {
                assert_eq!(
                    crc_zeros(start, len),
                    crc32c::crc32c_append(start, &zeros[..len]),
                    "len {len}, crc {start:#x}"
                );
            }
        }
    }
}

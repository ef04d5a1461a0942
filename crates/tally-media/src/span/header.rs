//! The target header: block 0 of every target of a multi-target image (docs/FORMAT.md,
//! "Target header"). It names the set the target belongs to, the target's own uuid and place,
//! every target of the set in order, and the striping, so that opening with a missing, swapped,
//! repeated or foreign target is refused before a byte of the image is read through it.
//!
//! Invariants the decoder keeps: magic, version, crc32c, reserved bytes zero, the rest of the
//! block zero; `1 <= target_count <= TARGET_COUNT_MAX`, `target_index < target_count`; the
//! target's uuid is its own entry of the table, no uuid is zero or repeated, unused table slots
//! are zero; the block size is a power of two `>= 512`, stripes are not empty. Decoding never
//! panics: every field is read through the bounds-checked codec.

use crate::codec::{Reader, Writer};

/// Magic bytes at offset 0.
pub const TARGET_MAGIC: [u8; 8] = *b"TALLYSPN";
/// Version of the target header.
pub const TARGET_FORMAT_VERSION: u32 = 1;
/// Most targets one image may span.
pub const TARGET_COUNT_MAX: u16 = 16;
/// Bytes of the header proper (the rest of its block is zero).
pub const TARGET_HEADER_SIZE: usize = 512;
/// Blocks at the start of every target that the header reserves.
pub const TARGET_HEADER_BLOCKS: u64 = 1;

/// Field offsets (checked against docs/FORMAT.md by `tests/span_format_doc.rs`).
pub const OFF_MAGIC: usize = 0;
/// `format_version` (u32).
pub const OFF_VERSION: usize = 8;
/// `target_index` (u16).
pub const OFF_TARGET_INDEX: usize = 12;
/// `target_count` (u16).
pub const OFF_TARGET_COUNT: usize = 14;
/// `set_uuid` (16 bytes).
pub const OFF_SET_UUID: usize = 16;
/// `target_uuid` (16 bytes).
pub const OFF_TARGET_UUID: usize = 32;
/// `block_size` (u32).
pub const OFF_BLOCK_SIZE: usize = 48;
/// `stripe_blocks` (u32).
pub const OFF_STRIPE_BLOCKS: usize = 52;
/// `lead_blocks` (u32).
pub const OFF_LEAD_BLOCKS: usize = 56;
/// `row_count` (u64), after 4 reserved bytes.
pub const OFF_ROW_COUNT: usize = 64;
/// `target_uuids` (16 × 16 bytes), after 56 reserved bytes.
pub const OFF_TARGET_UUIDS: usize = 128;
/// `crc` (u32) over bytes 0..508, after 124 reserved bytes.
pub const OFF_CRC: usize = 508;

/// Reserved ranges (written zero, checked zero).
const RESERVED: [(usize, usize); 3] = [(60, 4), (72, 56), (384, 124)];

const _: () = assert!(OFF_TARGET_UUIDS + 16 * TARGET_COUNT_MAX as usize == 384);
const _: () = assert!(OFF_CRC + 4 == TARGET_HEADER_SIZE);

/// What block 0 of a target of a multi-target image says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetHeader {
    /// This target's place in the set, from 0.
    pub target_index: u16,
    /// The set's uuid, the same on every target of it.
    pub set_uuid: [u8; 16],
    /// Every target's uuid, in place order; `target_uuids[target_index]` is this target's.
    pub target_uuids: Vec<[u8; 16]>,
    /// Block size of the image (every target is opened in it).
    pub block_size: u32,
    /// Blocks of one stripe (the unit placed on one target; the log's segment size).
    pub stripe_blocks: u32,
    /// Blocks of the image before the first stripe, all on target 0 (the log's superblocks).
    pub lead_blocks: u32,
    /// Stripes on each target.
    pub row_count: u64,
}

/// Why a block is not a valid target header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderDefect {
    /// No magic: not a target of a multi-target image at all.
    NoMagic,
    /// The magic is there but the header is damaged or unknown (the reason).
    Damaged(&'static str),
}

impl TargetHeader {
    /// This target's uuid.
    #[must_use]
    pub fn target_uuid(&self) -> [u8; 16] {
        self.target_uuids.get(usize::from(self.target_index)).copied().unwrap_or([0; 16])
    }

    /// Number of targets in the set.
    #[must_use]
    pub fn target_count(&self) -> u16 {
        u16::try_from(self.target_uuids.len()).unwrap_or(u16::MAX)
    }

    /// Encode into `block` (one whole block, at least [`TARGET_HEADER_SIZE`] bytes).
    ///
    /// # Panics
    /// On a header the encoder was not meant to be given (a bug): too many targets, an index
    /// outside the table, a block shorter than the header.
    pub fn encode(&self, block: &mut [u8]) {
        assert!(
            block.len() >= TARGET_HEADER_SIZE,
            "target header needs {TARGET_HEADER_SIZE} bytes"
        );
        assert!(
            !self.target_uuids.is_empty()
                && self.target_uuids.len() <= usize::from(TARGET_COUNT_MAX)
                && usize::from(self.target_index) < self.target_uuids.len(),
            "target header: bad index or count"
        );
        block.fill(0);
        let mut w = Writer::new(block);
        w.put(OFF_MAGIC, &TARGET_MAGIC);
        w.u32(OFF_VERSION, TARGET_FORMAT_VERSION);
        w.u16(OFF_TARGET_INDEX, self.target_index);
        w.u16(OFF_TARGET_COUNT, self.target_count());
        w.put(OFF_SET_UUID, &self.set_uuid);
        w.put(OFF_TARGET_UUID, &self.target_uuid());
        w.u32(OFF_BLOCK_SIZE, self.block_size);
        w.u32(OFF_STRIPE_BLOCKS, self.stripe_blocks);
        w.u32(OFF_LEAD_BLOCKS, self.lead_blocks);
        w.u64(OFF_ROW_COUNT, self.row_count);
        for (i, uuid) in self.target_uuids.iter().enumerate() {
            w.put(OFF_TARGET_UUIDS + 16 * i, uuid);
        }
        let crc = crc32c::crc32c(&block[..OFF_CRC]);
        Writer::new(block).u32(OFF_CRC, crc);
    }

    /// Decode the header at the start of `block` (the whole block: bytes after the header must
    /// be zero).
    ///
    /// # Errors
    /// [`HeaderDefect::NoMagic`] for a block that is not a target header, else
    /// [`HeaderDefect::Damaged`] with what is wrong.
    pub fn decode(block: &[u8]) -> Result<Self, HeaderDefect> {
        let r = Reader::new(block);
        let damaged = HeaderDefect::Damaged;
        if r.array::<8>(OFF_MAGIC) != Some(TARGET_MAGIC) {
            return Err(HeaderDefect::NoMagic);
        }
        let head = block.get(..OFF_CRC).ok_or(damaged("truncated"))?;
        if r.u32(OFF_CRC) != Some(crc32c::crc32c(head)) {
            return Err(damaged("checksum mismatch"));
        }
        if r.u32(OFF_VERSION) != Some(TARGET_FORMAT_VERSION) {
            return Err(damaged("unknown format version"));
        }
        if RESERVED.iter().any(|&(off, len)| !r.zeros(off, len))
            || !r.zeros_from(TARGET_HEADER_SIZE)
        {
            return Err(damaged("reserved bytes are not zero"));
        }
        let field = |v: Option<u32>| v.ok_or(damaged("truncated"));
        let target_index = r.u16(OFF_TARGET_INDEX).ok_or(damaged("truncated"))?;
        let target_count = r.u16(OFF_TARGET_COUNT).ok_or(damaged("truncated"))?;
        if target_count == 0 || target_count > TARGET_COUNT_MAX || target_index >= target_count {
            return Err(damaged("target index or count out of range"));
        }
        let mut target_uuids = Vec::with_capacity(usize::from(target_count));
        for i in 0..usize::from(TARGET_COUNT_MAX) {
            let uuid = r.array::<16>(OFF_TARGET_UUIDS + 16 * i).ok_or(damaged("truncated"))?;
            if i < usize::from(target_count) {
                if uuid == [0; 16] || target_uuids.contains(&uuid) {
                    return Err(damaged("a target uuid is zero or repeated"));
                }
                target_uuids.push(uuid);
            } else if uuid != [0; 16] {
                return Err(damaged("an unused target slot is not zero"));
            }
        }
        let own = r.array::<16>(OFF_TARGET_UUID).ok_or(damaged("truncated"))?;
        if target_uuids.get(usize::from(target_index)) != Some(&own) {
            return Err(damaged("the target's uuid is not its entry in the table"));
        }
        let set_uuid = r.array::<16>(OFF_SET_UUID).ok_or(damaged("truncated"))?;
        let block_size = field(r.u32(OFF_BLOCK_SIZE))?;
        let stripe_blocks = field(r.u32(OFF_STRIPE_BLOCKS))?;
        let lead_blocks = field(r.u32(OFF_LEAD_BLOCKS))?;
        let row_count = r.u64(OFF_ROW_COUNT).ok_or(damaged("truncated"))?;
        if set_uuid == [0; 16] {
            return Err(damaged("the set uuid is zero"));
        }
        if block_size < 512 || !block_size.is_power_of_two() || stripe_blocks == 0 || row_count == 0
        {
            return Err(damaged("block size, stripe or row count out of range"));
        }
        Ok(TargetHeader {
            target_index,
            set_uuid,
            target_uuids,
            block_size,
            stripe_blocks,
            lead_blocks,
            row_count,
        })
    }
}

/// A uuid in the usual 8-4-4-4-12 hexadecimal form.
#[must_use]
pub fn uuid_text(uuid: &[u8; 16]) -> String {
    let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

/// A random (version 4) uuid from the kernel's generator.
///
/// # Errors
/// The kernel's `getrandom` failed.
pub fn random_uuid() -> std::io::Result<[u8; 16]> {
    let mut uuid = [0u8; 16];
    let mut filled = 0usize;
    while filled < uuid.len() {
        let rest = &mut uuid[filled..];
        // SAFETY: the pointer and length describe `rest`, writable and owned here.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        filled += usize::try_from(n).unwrap_or(0);
    }
    uuid[6] = (uuid[6] & 0x0f) | 0x40;
    uuid[8] = (uuid[8] & 0x3f) | 0x80;
    Ok(uuid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> TargetHeader {
        TargetHeader {
            target_index: 1,
            set_uuid: [7; 16],
            target_uuids: vec![[1; 16], [2; 16], [3; 16]],
            block_size: 4096,
            stripe_blocks: 256,
            lead_blocks: 2,
            row_count: 40,
        }
    }

    #[test]
    fn round_trip() {
        let mut block = vec![0xaau8; 4096];
        header().encode(&mut block);
        assert_eq!(TargetHeader::decode(&block), Ok(header()));
        assert_eq!(header().target_uuid(), [2; 16]);
    }

    #[test]
    fn every_flipped_byte_is_rejected() {
        let mut block = vec![0u8; 4096];
        header().encode(&mut block);
        for i in 0..block.len() {
            let mut bad = block.clone();
            bad[i] ^= 0x10;
            assert!(TargetHeader::decode(&bad).is_err(), "flip at {i} accepted");
        }
    }

    #[test]
    fn hostile_bytes_are_typed_errors() {
        assert_eq!(TargetHeader::decode(&[0u8; 4096]), Err(HeaderDefect::NoMagic));
        assert_eq!(TargetHeader::decode(&TARGET_MAGIC), Err(HeaderDefect::Damaged("truncated")));
        let mut block = vec![0u8; 4096];
        header().encode(&mut block);
        for len in 0..600 {
            let _ = TargetHeader::decode(&block[..len]);
        }
        // A re-sealed header with a bad field is still refused by the field checks.
        let seal = |f: &dyn Fn(&mut [u8])| {
            let mut b = block.clone();
            f(&mut b);
            let crc = crc32c::crc32c(&b[..OFF_CRC]);
            b[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_le_bytes());
            TargetHeader::decode(&b)
        };
        assert!(seal(&|b| b[OFF_TARGET_COUNT] = 0).is_err());
        assert!(seal(&|b| b[OFF_TARGET_INDEX] = 3).is_err());
        assert!(seal(&|b| b[OFF_TARGET_UUIDS + 16..OFF_TARGET_UUIDS + 32].fill(1)).is_err());
        assert!(seal(&|b| b[OFF_TARGET_UUID] = 9).is_err());
        assert!(seal(&|b| b[OFF_BLOCK_SIZE] = 3).is_err());
        assert!(seal(&|b| b[OFF_ROW_COUNT..OFF_ROW_COUNT + 8].fill(0)).is_err());
    }

    #[test]
    fn uuids_are_random_and_versioned() {
        let (a, b) = (random_uuid().unwrap(), random_uuid().unwrap());
        assert_ne!(a, b);
        assert_eq!(a[6] >> 4, 4);
        assert_eq!(uuid_text(&[0xab; 16]).len(), 36);
    }
}

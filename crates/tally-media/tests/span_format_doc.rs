//! docs/FORMAT.md's "Target header" table must describe the bytes `TargetHeader::encode`
//! writes: a header with a distinct value in every field is encoded and each row's bytes are
//! compared with the field's value; the rows must cover the header exactly.

use tally_media::span::{offsets as off, TARGET_HEADER_SIZE, TARGET_MAGIC};
use tally_media::TargetHeader;

/// The `| offset | size | field |` rows of the table under `### heading`.
fn table(doc: &str, heading: &str) -> Vec<(usize, usize, String)> {
    let start =
        doc.find(&format!("### {heading}\n")).unwrap_or_else(|| panic!("no section {heading}"));
    let rest = &doc[start..];
    let end = rest[4..].find("\n#").map_or(rest.len(), |e| e + 4);
    rest[..end]
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| offset") && !l.starts_with("|---"))
        .map(|l| {
            let c: Vec<&str> = l.split('|').map(str::trim).collect();
            (c[1].parse().unwrap(), c[2].parse().unwrap(), c[3].to_string())
        })
        .collect()
}

#[test]
fn target_header_table_matches_the_encoder() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/FORMAT.md"))
        .unwrap();
    let uuids: Vec<[u8; 16]> = (1..=3u8).map(|i| [i * 0x11; 16]).collect();
    let header = TargetHeader {
        target_index: 2,
        set_uuid: [0x5a; 16],
        target_uuids: uuids.clone(),
        block_size: 8192,
        stripe_blocks: 0x0102_0304,
        lead_blocks: 0x0a0b,
        row_count: 0x1122_3344_5566_7788,
    };
    let mut block = vec![0u8; 8192];
    header.encode(&mut block);
    let mut table_bytes = vec![0u8; 256];
    for (i, u) in uuids.iter().enumerate() {
        table_bytes[16 * i..16 * i + 16].copy_from_slice(u);
    }
    let crc = crc_of(&block);
    let fields: Vec<(&str, usize, Vec<u8>)> = vec![
        ("magic", off::OFF_MAGIC, TARGET_MAGIC.to_vec()),
        ("format_version", off::OFF_VERSION, 1u32.to_le_bytes().to_vec()),
        ("target_index", off::OFF_TARGET_INDEX, 2u16.to_le_bytes().to_vec()),
        ("target_count", off::OFF_TARGET_COUNT, 3u16.to_le_bytes().to_vec()),
        ("set_uuid", off::OFF_SET_UUID, vec![0x5a; 16]),
        ("target_uuid", off::OFF_TARGET_UUID, uuids[2].to_vec()),
        ("block_size", off::OFF_BLOCK_SIZE, 8192u32.to_le_bytes().to_vec()),
        ("stripe_blocks", off::OFF_STRIPE_BLOCKS, 0x0102_0304u32.to_le_bytes().to_vec()),
        ("lead_blocks", off::OFF_LEAD_BLOCKS, 0x0a0bu32.to_le_bytes().to_vec()),
        ("reserved", 60, vec![0; 4]),
        ("row_count", off::OFF_ROW_COUNT, 0x1122_3344_5566_7788u64.to_le_bytes().to_vec()),
        ("reserved", 72, vec![0; 56]),
        ("target_uuids", off::OFF_TARGET_UUIDS, table_bytes),
        ("reserved", 384, vec![0; 124]),
        ("crc", off::OFF_CRC, crc.to_le_bytes().to_vec()),
    ];
    let rows = table(&doc, "Target header");
    let names: Vec<&str> = rows.iter().map(|r| r.2.as_str()).collect();
    let want: Vec<&str> = fields.iter().map(|f| f.0).collect();
    assert_eq!(names, want, "Target header: fields");
    let mut end = 0;
    for ((offset, size, name), (_, at, value)) in rows.iter().zip(&fields) {
        assert_eq!(offset, at, "offset of {name}");
        assert_eq!(*size, value.len(), "size of {name}");
        assert_eq!(&block[*offset..offset + size], value.as_slice(), "bytes of {name}");
        assert_eq!(*offset, end, "{name} does not follow the row before it");
        end = offset + size;
    }
    assert_eq!(end, TARGET_HEADER_SIZE, "the rows must cover the header");
    assert!(block[TARGET_HEADER_SIZE..].iter().all(|&b| b == 0), "the rest of the block is zero");
    assert!(doc.contains("The rest of the block after these 512 bytes is zero"));
}

/// crc32c of the header's first 508 bytes, computed here without the crate's helper.
fn crc_of(block: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in &block[..508] {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0x82F6_3B78 } else { crc >> 1 };
        }
    }
    !crc
}

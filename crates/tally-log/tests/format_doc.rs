//! docs/FORMAT.md must agree with the constants the encoders use: every field row of the
//! tables named below is compared, offset and size, with the code.

use tally_log::format::snapshot::{self, PlacedTx, StreamState};
use tally_log::format::{body, superblock, unit};

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
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let offset = cells[1].parse().unwrap_or(usize::MAX);
            (offset, cells[2].parse().unwrap(), cells[3].to_string())
        })
        .collect()
}

fn check(doc: &str, heading: &str, expected: &[(&str, usize, usize)]) {
    let rows = table(doc, heading);
    let got: Vec<(&str, usize, usize)> =
        rows.iter().map(|(o, s, f)| (f.as_str(), *o, *s)).collect();
    assert_eq!(got, expected, "docs/FORMAT.md section {heading:?} disagrees with the code");
}

#[test]
fn format_doc_matches_the_code() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/FORMAT.md"))
        .unwrap();
    use superblock::off as sb;
    check(
        &doc,
        "Superblock header",
        &[
            ("magic", sb::MAGIC, superblock::SB_MAGIC.len()),
            ("version", sb::VERSION, 2),
            ("stream_count", sb::STREAM_COUNT, 2),
            ("block_size", sb::BLOCK_SIZE, 4),
            ("block_count", sb::BLOCK_COUNT, 8),
            ("generation", sb::GENERATION, 8),
            ("uuid", sb::UUID, 16),
            ("segment_blocks", sb::SEGMENT_BLOCKS, 4),
            ("segment_count", sb::SEGMENT_COUNT, 4),
            ("first_segment_block", sb::FIRST_SEGMENT_BLOCK, 8),
            ("crc", sb::CRC, 4),
            ("flags", sb::FLAGS, 4),
            ("snapshot_segment", sb::SNAPSHOT_SEGMENT, 4),
            ("snapshot_generation", sb::SNAPSHOT_GENERATION, 8),
            ("reserved", sb::RESERVED, superblock::SB_STREAMS_OFFSET - sb::RESERVED),
        ],
    );
    assert!(doc.contains(&format!(
        "Entry `i` is at offset {} + {}·i",
        superblock::SB_STREAMS_OFFSET,
        superblock::SB_STREAM_SIZE
    )));
    use superblock::stream_off as st;
    check(
        &doc,
        "Superblock stream entry",
        &[
            ("checkpoint_seq", st::CHECKPOINT_SEQ, 8),
            ("checkpoint_epoch", st::CHECKPOINT_EPOCH, 4),
            ("checkpoint_segment", st::CHECKPOINT_SEGMENT, 4),
            ("checkpoint_offset", st::CHECKPOINT_OFFSET, 4),
            ("checkpoint_next_segment", st::CHECKPOINT_NEXT_SEGMENT, 4),
            ("epoch", st::EPOCH, 4),
            ("reserved", st::EPOCH + 4, st::BASE_SEQ - st::EPOCH - 4),
            ("base_seq", st::BASE_SEQ, 8),
            ("resume_seq", st::RESUME_SEQ, 8),
            ("seq_limit", st::SEQ_LIMIT, 8),
            ("reserved", st::RESERVED, superblock::SB_STREAM_SIZE - st::RESERVED),
        ],
    );
    use snapshot::off as sn;
    check(
        &doc,
        "Snapshot header",
        &[
            ("magic", sn::MAGIC, snapshot::SNAP_MAGIC.len()),
            ("version", sn::VERSION, 2),
            ("reserved", sn::RESERVED_A, sn::SEGMENT_COUNT - sn::RESERVED_A),
            ("segment_count", sn::SEGMENT_COUNT, 4),
            ("sb_generation", sn::SB_GENERATION, 8),
            ("payload_len", sn::PAYLOAD_LEN, 8),
            ("payload_crc", sn::PAYLOAD_CRC, 4),
            ("crc", sn::CRC, 4),
            ("reserved", sn::RESERVED, sn::SEGMENTS - sn::RESERVED),
            ("segment", sn::SEGMENTS, snapshot::SNAP_SEGMENT_SIZE),
        ],
    );
    assert!(doc.contains(&format!(
        "(block_size − {}) / {}",
        sn::SEGMENTS,
        snapshot::SNAP_SEGMENT_SIZE
    )));
    snapshot_state_matches(&doc);
    use unit::off as u;
    check(
        &doc,
        "Log unit header",
        &[
            ("magic", u::MAGIC, unit::UNIT_MAGIC.len()),
            ("version", u::VERSION, 2),
            ("kind", u::KIND, 1),
            ("flags", u::FLAGS, 1),
            ("stream", u::STREAM, 2),
            ("reserved", u::RESERVED, 2),
            ("epoch", u::EPOCH, 4),
            ("seq", u::SEQ, 8),
            ("prev_seq", u::PREV_SEQ, 8),
            ("unit_index", u::UNIT_INDEX, 4),
            ("unit_count", u::UNIT_COUNT, 4),
            ("data_count", u::DATA_COUNT, 4),
            ("next_segment", u::NEXT_SEGMENT, 4),
            ("durable_watermark", u::DURABLE_WATERMARK, 8),
            ("payload_len", u::PAYLOAD_LEN, 4),
            ("crc", u::CRC, unit::UNIT_HEADER_SIZE - u::CRC),
        ],
    );
    assert!(doc.contains(&format!("this {}-byte header", unit::UNIT_HEADER_SIZE)));
    let rows = table(&doc, "Transaction body");
    let fixed: Vec<(usize, usize, &str)> =
        rows[..6].iter().map(|r| (r.0, r.1, r.2.as_str())).collect();
    assert_eq!(
        fixed,
        [
            (0, 2, "dep_count"),
            (2, 2, "run_role"),
            (4, 4, "data_count"),
            (8, 4, "record_count"),
            (12, 4, "run_index"),
            (16, body::RUN_SEQ_SIZE, "run_seq"),
        ]
    );
    assert_eq!(rows[4].0 + rows[4].1, body::BODY_HEADER_SIZE, "body header size");
    assert_eq!((rows[6].1, rows[6].2.as_str()), (body::DEP_SIZE, "dependency"));
    assert_eq!((rows[7].1, rows[7].2.as_str()), (4, "data_crc"));
    assert_eq!((rows[8].1, rows[8].2.as_str()), (body::RECORD_LEN_SIZE, "record_len"));
    body_bytes_match();
}

/// The body's rows against encoded bytes: a close of run 0x0102030405060708 after 3 parts,
/// with one dependency; and the same body without a run, whose dependency starts at 16.
fn body_bytes_match() {
    use body::{Body, Run, RunRole};
    let run = Run { role: RunRole::Close, seq: 0x0102_0304_0506_0708, index: 3 };
    let dep = tally_log::TxId { stream: 1, seq: 0x99 };
    let b =
        Body { deps: vec![dep], data_crcs: vec![7], records: vec![b"r".to_vec()], run: Some(run) };
    let bytes = b.encode();
    assert_eq!(bytes[0..2], 1u16.to_le_bytes(), "dep_count");
    assert_eq!(bytes[2..4], 2u16.to_le_bytes(), "run_role of a close");
    assert_eq!(bytes[4..8], 1u32.to_le_bytes(), "data_count");
    assert_eq!(bytes[8..12], 1u32.to_le_bytes(), "record_count");
    assert_eq!(bytes[12..16], 3u32.to_le_bytes(), "run_index of a close: parts before it");
    assert_eq!(bytes[16..24], run.seq.to_le_bytes(), "run_seq");
    assert_eq!(bytes[24..26], 1u16.to_le_bytes(), "dependency after run_seq");
    let plain = Body { run: None, ..b }.encode();
    assert_eq!(plain[2..4], [0, 0]);
    assert_eq!(plain[12..16], [0, 0, 0, 0]);
    assert_eq!(plain[16..18], 1u16.to_le_bytes(), "dependency at 16 without a run");
}

/// The snapshot's stream state is written in sequence, not at constant offsets: encode one
/// stream with distinct values and compare every row that has an offset with the bytes there.
fn snapshot_state_matches(doc: &str) {
    let placed = PlacedTx {
        seq: 0x1111_2222_3333,
        epoch: 0x44,
        end_segment: 0x55,
        end_offset: 0x66,
        next_segment: 0x77,
        records: 0x88,
        dead_records: 0x99,
    };
    let stream = StreamState {
        last_seq: 0xaaaa_bbbb_cccc,
        segment: 0xdd,
        offset: 0xee,
        next_segment: 0xff,
        chain: vec![0x1234],
        placed: vec![placed],
    };
    let blob = snapshot::encode_blob(&[stream], b"");
    let state = &blob[8..];
    let rows = table(doc, "Snapshot stream state");
    let names: Vec<&str> = rows.iter().map(|r| r.2.as_str()).collect();
    let expected = [
        "last_seq",
        "segment",
        "offset",
        "next_segment",
        "chain_len",
        "chain_segment",
        "placed_len",
        "placed",
    ];
    assert_eq!(names, expected, "Snapshot stream state rows");
    let values: [u64; 6] = [0xaaaa_bbbb_cccc, 0xdd, 0xee, 0xff, 1, 0x1234];
    for ((off, size, name), value) in rows.iter().zip(values) {
        assert_eq!(&state[*off..off + size], &value.to_le_bytes()[..*size], "{name}");
    }
    assert_eq!(rows[4].0 + rows[4].1, snapshot::STREAM_STATE_SIZE, "fixed stream fields");
    // After the one-segment chain: placed_len, then the entry.
    let at = snapshot::STREAM_STATE_SIZE + 4;
    assert_eq!((rows[6].1, rows[7].1), (8, snapshot::PLACED_SIZE));
    assert_eq!(&state[at..at + 8], &1u64.to_le_bytes());
    let entry = &state[at + 8..];
    assert_eq!(entry.len(), snapshot::PLACED_SIZE);

    let rows = table(doc, "Snapshot placed transaction");
    let expected = [
        ("seq", placed.seq),
        ("epoch", u64::from(placed.epoch)),
        ("end_segment", u64::from(placed.end_segment)),
        ("end_offset", u64::from(placed.end_offset)),
        ("next_segment", u64::from(placed.next_segment)),
        ("records", u64::from(placed.records)),
        ("dead_records", u64::from(placed.dead_records)),
    ];
    assert_eq!(rows.len(), expected.len(), "Snapshot placed transaction rows");
    let mut end = 0;
    for ((off, size, name), (field, value)) in rows.iter().zip(expected) {
        assert_eq!((name.as_str(), *off), (field, end), "row {field} out of place");
        assert_eq!(&entry[*off..off + size], &value.to_le_bytes()[..*size], "{field}");
        end = off + size;
    }
    assert_eq!(end, snapshot::PLACED_SIZE);
}

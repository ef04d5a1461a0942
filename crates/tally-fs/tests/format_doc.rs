//! docs/FORMAT.md's file-system record tables must describe the bytes the encoder writes:
//! one record of each kind is encoded with distinct field values and every table row's bytes
//! are compared with the field's value.

use tally_fs::record::Record;
use tally_fs::{Attr, FileKind, Timespec};

/// The `| offset | size | field |` rows of the table under `### heading`.
fn table(doc: &str, heading: &str) -> Vec<(String, String, String)> {
    let start =
        doc.find(&format!("### {heading}\n")).unwrap_or_else(|| panic!("no section {heading}"));
    let rest = &doc[start..];
    let end = rest[4..].find("\n#").map_or(rest.len(), |e| e + 4);
    rest[..end]
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| offset") && !l.starts_with("|---"))
        .map(|l| {
            let c: Vec<&str> = l.split('|').map(str::trim).collect();
            (c[1].to_string(), c[2].to_string(), c[3].to_string())
        })
        .collect()
}

/// Compare each row with `fields` (name → bytes). Offsets may name an earlier length field
/// (`21+name_len`); `var` sizes take the field's length. The rows must cover the record exactly.
fn check(doc: &str, heading: &str, rec: &Record, fields: &[(&str, Vec<u8>)]) {
    let bytes = rec.encode();
    let rows = table(doc, heading);
    let names: Vec<&str> = rows.iter().map(|r| r.2.as_str()).collect();
    let want: Vec<&str> = fields.iter().map(|f| f.0).collect();
    assert_eq!(names, want, "{heading}: fields");
    let mut end = 0;
    for ((off, size, name), (_, value)) in rows.iter().zip(fields) {
        let off = match off.split_once('+') {
            None => off.parse::<usize>().unwrap(),
            Some((base, len_field)) => {
                let (_, v) = fields.iter().find(|f| f.0 == len_field).unwrap();
                base.parse::<usize>().unwrap()
                    + v.iter().rev().fold(0usize, |a, &b| a * 256 + b as usize)
            }
        };
        let size = if size == "var" { value.len() } else { size.parse().unwrap() };
        assert_eq!(size, value.len(), "{heading}: size of {name}");
        assert_eq!(
            &bytes[off..off + size],
            value.as_slice(),
            "{heading}: bytes of {name} at {off}"
        );
        end = end.max(off + size);
    }
    assert_eq!(end, bytes.len(), "{heading}: the rows must cover the whole record");
}

fn le<const N: usize>(v: u64) -> Vec<u8> {
    v.to_le_bytes()[..N].to_vec()
}

#[test]
fn record_tables_match_the_encoder() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/FORMAT.md"))
        .unwrap();
    let ver = 0x0102_0304_0506_0708u64;
    check(
        &doc,
        "FS record: file system (tag 1)",
        &Record::Fs { ver, block_size: 4096 },
        &[
            ("tag", vec![1]),
            ("ver", le::<8>(ver)),
            ("magic", b"TALLYFS1".to_vec()),
            ("format_version", le::<4>(1)),
            ("block_size", le::<4>(4096)),
        ],
    );
    let t = |s: i64, n: u32| Timespec { sec: s, nsec: n };
    let attr = Attr {
        ino: 0x1122,
        kind: FileKind::Symlink,
        perm: 0o1755,
        uid: 501,
        gid: 502,
        nlink: 3,
        size: 0x3344,
        rdev: 0x5566,
        atime: t(11, 12),
        mtime: t(13, 14),
        ctime: t(15, 16),
        crtime: t(17, 18),
    };
    check(
        &doc,
        "FS record: inode (tag 2)",
        &Record::Inode { ver, attr, target: b"tgt".to_vec() },
        &[
            ("tag", vec![2]),
            ("ver", le::<8>(ver)),
            ("ino", le::<8>(0x1122)),
            ("kind", vec![3]),
            ("perm", le::<2>(0o1755)),
            ("uid", le::<4>(501)),
            ("gid", le::<4>(502)),
            ("nlink", le::<4>(3)),
            ("size", le::<8>(0x3344)),
            ("rdev", le::<8>(0x5566)),
            ("atime_sec", le::<8>(11)),
            ("atime_nsec", le::<4>(12)),
            ("mtime_sec", le::<8>(13)),
            ("mtime_nsec", le::<4>(14)),
            ("ctime_sec", le::<8>(15)),
            ("ctime_nsec", le::<4>(16)),
            ("crtime_sec", le::<8>(17)),
            ("crtime_nsec", le::<4>(18)),
            ("target_len", le::<2>(3)),
            ("target", b"tgt".to_vec()),
        ],
    );
    check(
        &doc,
        "FS record: free (tag 3)",
        &Record::Free { ver, ino: 77 },
        &[("tag", vec![3]), ("ver", le::<8>(ver)), ("ino", le::<8>(77))],
    );
    check(
        &doc,
        "FS record: entry (tag 4)",
        &Record::Dentry {
            ver,
            dir: 5,
            name: b"name".to_vec(),
            ino: 9,
            kind: FileKind::Dir,
            cookie: 44,
        },
        &[
            ("tag", vec![4]),
            ("ver", le::<8>(ver)),
            ("dir", le::<8>(5)),
            ("ino", le::<8>(9)),
            ("kind", vec![2]),
            ("cookie", le::<8>(44)),
            ("name_len", vec![4]),
            ("name", b"name".to_vec()),
        ],
    );
    check(
        &doc,
        "FS record: extent (tag 5)",
        &Record::Extent { ver, ino: 6, block: 1 << 33, data: 2, crc: 0xdead_beef },
        &[
            ("tag", vec![5]),
            ("ver", le::<8>(ver)),
            ("ino", le::<8>(6)),
            ("block", le::<8>(1 << 33)),
            ("data", le::<4>(2)),
            ("crc", le::<4>(0xdead_beef)),
        ],
    );
    check(
        &doc,
        "FS record: xattr (tag 6)",
        &Record::Xattr { ver, ino: 8, name: b"user.k".to_vec(), value: Some(b"value".to_vec()) },
        &[
            ("tag", vec![6]),
            ("ver", le::<8>(ver)),
            ("ino", le::<8>(8)),
            ("present", vec![1]),
            ("name_len", vec![6]),
            ("value_len", le::<2>(5)),
            ("name", b"user.k".to_vec()),
            ("value", b"value".to_vec()),
        ],
    );
}

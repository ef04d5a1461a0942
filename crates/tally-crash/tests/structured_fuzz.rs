//! Fuzzing past the checksums: structure-aware mutation of real images.
//!
//! Raw byte flips never reach a decoder: every structure carries a crc32c seeded with the image
//! uuid. So this fuzzer makes real images (log workloads on `tally_log::Log`, file-system
//! workloads on `tally_fs::Fs`; a crash image and a clean-close snapshot image of each), then,
//! one seeded iteration at a time: picks a structure on the image (a superblock copy, a unit
//! header, a transaction body and the file-system records inside it, the snapshot header, the
//! snapshot's stream state and its file-system payload), decodes it with the crates' own
//! decoders, changes one field to a boundary value (0, 1, max, max − 1, the original ± 1,
//! another value found on the image) or edits the body's structure (a record or dependency
//! removed or repeated), re-encodes it with a *valid* crc, and feeds the image to `Log::open`,
//! `Fs::mount`, `Fs::fsck`, reads of every file and a clean unmount.
//!
//! Properties, each a finding when broken:
//! - **no panic** (caught with `catch_unwind`, on any thread of the open);
//! - **no allocation past a bound**: a counting global allocator records the largest single
//!   allocation, which must stay under 16 times the image size;
//! - **no durable transaction dropped without an error**: when the mutated structure belongs to
//!   a transaction `T` whose durability a later unit of its stream proves (its durable
//!   watermark ≥ `T.seq`), `Log::open` either fails or keeps every transaction of the stream up
//!   to that watermark, byte for byte (`T` itself at least by its sequence number).
//!
//! One `u64` seed drives a run (`TALLY_FUZZ_SEED`, default 1; `TALLY_FUZZ_ITERS` iterations,
//! default 12 000); a failure prints the seed, the iteration and the mutation, which replays
//! alone with `TALLY_FUZZ_ONE=<iteration seed>`. Every finding is a named test below.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once, OnceLock};
use std::time::{Duration, Instant};

use tally_fs::{Fs, MkfsOptions, MountOptions, Owner, RenameFlags, XattrSet, ROOT};
use tally_log::format::body::Body;
use tally_log::format::crc_seeded;
use tally_log::format::snapshot::{self as snapfmt, SnapshotHeader};
use tally_log::format::superblock::{self as sbfmt, Superblock};
use tally_log::format::unit::{self as unitfmt, UnitHeader, UnitKind};
use tally_log::{Log, LogConfig, LogError, OpenOptions, Transaction, TxId};
use tally_media::{Device, Image, MemDevice};

// ---------------------------------------------------------------------------------------------
// The allocation bound.

/// Counts the largest single allocation since the last reset.
struct Counting;

static LARGEST_ALLOC: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST_ALLOC.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LARGEST_ALLOC.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, i.e. from `System`, with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST_ALLOC.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: `ptr` came from `System` with `layout`; forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Largest single allocation allowed, as a multiple of the image size.
const ALLOC_FACTOR_MAX: usize = 16;

// ---------------------------------------------------------------------------------------------
// Panics: recorded by a hook (on whichever thread of the open they happen), not printed.

static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// Runs of an image in progress: their panics are recorded, other panics (the tests' own
/// assertions) go to the default hook.
static ARMED: AtomicUsize = AtomicUsize::new(0);

fn quiet_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if ARMED.load(Ordering::SeqCst) == 0 {
                return default(info);
            }
            let msg = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_default();
            let at = info.location().map(|l| format!("{}:{}", l.file(), l.line()));
            let line = format!("'{msg}' at {}", at.unwrap_or_default());
            PANICS.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(line);
        }));
    });
}

fn take_panics() -> Vec<String> {
    std::mem::take(&mut *PANICS.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
}

// ---------------------------------------------------------------------------------------------
// The images.

const LOG_BLOCK: u32 = 512;
const LOG_BLOCKS: u64 = 640;
const LOG_UUID: [u8; 16] = [7; 16];
const FS_BLOCK: u32 = 4096;
const FS_BLOCKS: u64 = 1024;
const FS_UUID: [u8; 16] = [8; 16];

/// Which image a mutation is applied to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum ImageId {
    /// Log workload, then a crash (no snapshot).
    LogCrash,
    /// Log workload, then `close_clean`.
    LogSnapshot,
    /// File-system workload, then a crash.
    FsCrash,
    /// File-system workload, then a clean unmount.
    FsSnapshot,
}

const IMAGE_IDS: [ImageId; 4] =
    [ImageId::LogCrash, ImageId::LogSnapshot, ImageId::FsCrash, ImageId::FsSnapshot];

impl ImageId {
    fn is_fs(self) -> bool {
        matches!(self, ImageId::FsCrash | ImageId::FsSnapshot)
    }
    fn uuid(self) -> [u8; 16] {
        if self.is_fs() {
            FS_UUID
        } else {
            LOG_UUID
        }
    }
}

/// Forty transactions on two streams: one to three records (some longer than a unit, so bodies
/// span units), zero to two data blocks, dependencies on the other stream, most durable, the
/// last few only ordered, and a checkpoint of stream 0 halfway.
fn log_workload(snapshot: bool) -> Image {
    let dev = Arc::new(MemDevice::new(LOG_BLOCK, LOG_BLOCKS).unwrap());
    let cfg = LogConfig { streams: 2, segment_blocks: 32, uuid: LOG_UUID };
    Log::format(&*dev, &cfg).unwrap();
    let (log, _) = Log::open(dev.clone(), OpenOptions::default()).unwrap();
    let mut last: [Option<TxId>; 2] = [None, None];
    for i in 0..40u32 {
        let stream = u16::try_from(i % 2).unwrap();
        let mut tx = Transaction::new(stream);
        for r in 0..=(i % 3) {
            let len = if (i + r) % 7 == 0 { 700 } else { 20 + 13 * r as usize };
            tx.record(vec![u8::try_from((i * 3 + r) % 251).unwrap(); len]);
        }
        for d in 0..(i % 3) {
            tx.data(vec![u8::try_from((i + d) % 253).unwrap(); LOG_BLOCK as usize]);
        }
        if i % 4 == 3 {
            if let Some(other) = last[usize::from(1 - stream)] {
                tx.depend_on(other);
            }
        }
        let info = if i < 34 { log.commit_durable(tx) } else { log.commit(tx) }.unwrap();
        last[usize::from(stream)] = Some(info.ticket);
        if i == 20 {
            log.checkpoint(0, 5).unwrap();
        }
    }
    if snapshot {
        log.sync().unwrap();
        let payload: Vec<u8> = (0..2000u32).map(|i| u8::try_from(i % 256).unwrap()).collect();
        assert!(log.close_clean(&payload).unwrap(), "the log wrote no snapshot");
    } else {
        drop(log);
    }
    dev.image()
}

/// Directories, files with several blocks and partial blocks, xattrs, a symlink, a rename, an
/// unlink, fsyncs and one explicit transaction over two files.
fn fs_workload(snapshot: bool) -> Image {
    let dev = Arc::new(MemDevice::new(FS_BLOCK, FS_BLOCKS).unwrap());
    let ddev: Arc<dyn Device> = dev.clone();
    let opts = MkfsOptions { streams: 2, segment_blocks: 64, uuid: Some(FS_UUID) };
    Fs::mkfs(ddev.clone(), &opts).unwrap();
    let fs = Fs::mount(ddev, MountOptions::default()).unwrap();
    let me = Owner { uid: 1000, gid: 1000 };
    let d1 = fs.mkdir(None, ROOT, b"d1", 0o755, me).unwrap().ino;
    let d2 = fs.mkdir(None, d1, b"d2", 0o700, me).unwrap().ino;
    let mut files = Vec::new();
    for (i, (dir, name)) in
        [(ROOT, &b"a"[..]), (d1, b"b"), (d2, b"c"), (ROOT, b"d"), (d1, b"e")].iter().enumerate()
    {
        let f = fs.create(None, *dir, name, 0o644, me).unwrap().ino;
        let fill = u8::try_from(i + 1).unwrap();
        let len = 1000 + i * 3000;
        fs.write(None, f, 0, &vec![fill; len]).unwrap();
        fs.write(None, f, 100, &[fill + 10; 50]).unwrap();
        if i % 2 == 0 {
            fs.setxattr(None, f, b"user.k", &[fill; 12], XattrSet::Any).unwrap();
            fs.fsync(f).unwrap();
        }
        files.push(f);
    }
    fs.setxattr(None, d1, b"user.dir", b"v", XattrSet::Any).unwrap();
    fs.symlink(None, d2, b"ln", b"../b", me).unwrap();
    fs.rename(None, ROOT, b"d", d2, b"d-moved", RenameFlags::default()).unwrap();
    fs.unlink(None, d1, b"e").unwrap();
    let tx = fs.begin().unwrap();
    fs.write(Some(&tx), files[0], 5000, b"debit").unwrap();
    fs.write(Some(&tx), files[1], 0, b"credit").unwrap();
    fs.commit_durable(tx).unwrap();
    fs.write(None, files[2], 20_000, b"tail").unwrap();
    fs.sync().unwrap();
    fs.write(None, files[3], 0, b"not synced").unwrap();
    if snapshot {
        fs.unmount().unwrap();
    } else {
        drop(fs);
    }
    dev.image()
}

/// The four images, built once per test binary.
fn images() -> &'static BTreeMap<ImageId, Image> {
    static IMAGES: OnceLock<BTreeMap<ImageId, Image>> = OnceLock::new();
    IMAGES.get_or_init(|| {
        BTreeMap::from([
            (ImageId::LogCrash, log_workload(false)),
            (ImageId::LogSnapshot, log_workload(true)),
            (ImageId::FsCrash, fs_workload(false)),
            (ImageId::FsSnapshot, fs_workload(true)),
        ])
    })
}

fn image_bytes(image: &Image) -> usize {
    let g = image.geometry();
    usize::try_from(u64::from(g.block_size) * g.block_count).unwrap()
}

// ---------------------------------------------------------------------------------------------
// Structures on an image: where they are, their fields, and how to write them back sealed.

/// A field of a structure: its name, byte offset inside the structure and width (1, 2, 4, 8).
#[derive(Debug, Clone)]
struct Field {
    name: String,
    off: usize,
    width: usize,
}

fn field(name: impl Into<String>, off: usize, width: usize) -> Field {
    Field { name: name.into(), off, width }
}

/// Where a structure's bytes live and how they are sealed again.
#[derive(Debug, Clone)]
enum Loc {
    /// One superblock copy.
    Superblock(u64),
    /// One unit block (header fields; the payload is the body's).
    Unit(u64),
    /// A transaction's body: the payloads of these units, concatenated.
    Body(Vec<u64>),
    /// The snapshot header block.
    SnapHeader(u64),
    /// The snapshot blob (offsets are inside the blob).
    SnapBlob,
}

/// One structure found on an image.
#[derive(Debug, Clone)]
struct Site {
    /// Stable name, e.g. `unit s0 seq7 #1`, `record s1 seq4 #0 (extent)`.
    key: String,
    loc: Loc,
    fields: Vec<Field>,
    /// The transaction it belongs to.
    tx: Option<TxId>,
    /// Body sites: structural edits (remove / repeat a record or a dependency) are possible.
    body: bool,
}

/// A transaction found on the image (first unit decodes with a valid crc).
#[derive(Debug, Clone)]
struct FoundTx {
    header: UnitHeader,
    units: Vec<(u64, UnitHeader)>,
    body: Option<Body>,
}

/// Everything the walk found on one image.
struct Walk {
    uuid: [u8; 16],
    sb: Superblock,
    txs: Vec<FoundTx>,
    sites: Vec<Site>,
    /// Values found on the image, for "another valid value from elsewhere".
    pool: Vec<u64>,
}

fn read_block(image: &Image, block: u64) -> Vec<u8> {
    image.block(block).to_vec()
}

fn walk(id: ImageId, image: &Image) -> Walk {
    let uuid = id.uuid();
    let bs = image.geometry().block_size as usize;
    let mut sites = Vec::new();
    let mut pool = BTreeSet::new();
    let mut best: Option<Superblock> = None;
    for copy in sbfmt::SB_BLOCKS {
        let Ok(sb) = Superblock::decode(image.block(copy), copy) else { continue };
        use sbfmt::off as o;
        let mut fields = vec![
            field("stream_count", o::STREAM_COUNT, 2),
            field("block_size", o::BLOCK_SIZE, 4),
            field("block_count", o::BLOCK_COUNT, 8),
            field("generation", o::GENERATION, 8),
            field("segment_blocks", o::SEGMENT_BLOCKS, 4),
            field("segment_count", o::SEGMENT_COUNT, 4),
            field("first_segment_block", o::FIRST_SEGMENT_BLOCK, 8),
            field("flags", o::FLAGS, 4),
            field("snapshot_segment", o::SNAPSHOT_SEGMENT, 4),
            field("version", o::VERSION, 2),
        ];
        use sbfmt::stream_off as so;
        for (i, root) in sb.streams.iter().enumerate() {
            let base = sbfmt::SB_STREAMS_OFFSET + i * sbfmt::SB_STREAM_SIZE;
            for (name, off, width) in [
                ("checkpoint_seq", so::CHECKPOINT_SEQ, 8),
                ("checkpoint_epoch", so::CHECKPOINT_EPOCH, 4),
                ("checkpoint_segment", so::CHECKPOINT_SEGMENT, 4),
                ("checkpoint_offset", so::CHECKPOINT_OFFSET, 4),
                ("checkpoint_next_segment", so::CHECKPOINT_NEXT_SEGMENT, 4),
                ("epoch", so::EPOCH, 4),
                ("base_seq", so::BASE_SEQ, 8),
                ("resume_seq", so::RESUME_SEQ, 8),
                ("seq_limit", so::SEQ_LIMIT, 8),
            ] {
                fields.push(field(format!("stream{i}.{name}"), base + off, width));
            }
            pool.extend([root.checkpoint_seq, root.base_seq, root.resume_seq, root.seq_limit]);
            pool.extend([root.checkpoint_segment, root.checkpoint_next_segment].map(u64::from));
        }
        sites.push(Site {
            key: format!("superblock copy{copy}"),
            loc: Loc::Superblock(copy),
            fields,
            tx: None,
            body: false,
        });
        if best.as_ref().is_none_or(|b| b.generation < sb.generation) {
            best = Some(sb);
        }
    }
    let sb = best.expect("a valid superblock");
    // Every unit of every segment that decodes; transactions start at unit 0.
    let mut txs = Vec::new();
    for seg in 0..sb.segment_count {
        let start = sb.segment_start(seg);
        let mut b = start;
        while b < start + u64::from(sb.segment_blocks) {
            let Ok((h, _)) = UnitHeader::decode(&uuid, image.block(b), b, true) else {
                b += 1;
                continue;
            };
            if h.kind != UnitKind::Body || h.unit_index != 0 {
                b += 1;
                continue;
            }
            let mut units = Vec::new();
            let mut payload = Vec::new();
            for u in 0..u64::from(h.unit_count) {
                let Ok((uh, p)) = UnitHeader::decode(&uuid, image.block(b + u), b + u, true) else {
                    break;
                };
                if !uh.same_transaction(&h) {
                    break;
                }
                units.push((b + u, uh));
                payload.extend_from_slice(p);
            }
            let whole = units.len() == h.unit_count as usize;
            let body = if whole { Body::decode(&payload, b).ok() } else { None };
            txs.push(FoundTx { header: h, units, body });
            b += 1;
        }
    }
    for t in &txs {
        let h = &t.header;
        let id = TxId { stream: h.stream, seq: h.seq };
        pool.extend([h.seq, h.prev_seq, h.durable_watermark, u64::from(h.epoch)]);
        pool.extend([h.unit_count, h.data_count, h.next_segment].map(u64::from));
        let tag = format!("s{} seq{} e{}", h.stream, h.seq, h.epoch);
        for (i, (block, _)) in t.units.iter().enumerate() {
            use unitfmt::off as o;
            let fields = [
                ("kind", o::KIND, 1),
                ("flags", o::FLAGS, 1),
                ("stream", o::STREAM, 2),
                ("epoch", o::EPOCH, 4),
                ("seq", o::SEQ, 8),
                ("prev_seq", o::PREV_SEQ, 8),
                ("unit_index", o::UNIT_INDEX, 4),
                ("unit_count", o::UNIT_COUNT, 4),
                ("data_count", o::DATA_COUNT, 4),
                ("next_segment", o::NEXT_SEGMENT, 4),
                ("durable_watermark", o::DURABLE_WATERMARK, 8),
                ("payload_len", o::PAYLOAD_LEN, 4),
            ]
            .into_iter()
            .map(|(n, off, w)| field(n, off, w))
            .collect();
            sites.push(Site {
                key: format!("unit {tag} #{i}"),
                loc: Loc::Unit(*block),
                fields,
                tx: Some(id),
                body: false,
            });
        }
        let Some(body) = &t.body else { continue };
        let units: Vec<u64> = t.units.iter().map(|u| u.0).collect();
        let mut fields =
            vec![field("dep_count", 0, 2), field("data_count", 4, 4), field("record_count", 8, 4)];
        let mut at = 16;
        for (i, d) in body.deps.iter().enumerate() {
            fields.push(field(format!("dep{i}.stream"), at, 2));
            fields.push(field(format!("dep{i}.seq"), at + 8, 8));
            pool.insert(d.seq);
            at += 16;
        }
        for i in 0..body.data_crcs.len() {
            fields.push(field(format!("data_crc{i}"), at, 4));
            at += 4;
        }
        let mut record_sites = Vec::new();
        for (i, r) in body.records.iter().enumerate() {
            fields.push(field(format!("record{i}.len"), at, 4));
            if id_is_fs(r) {
                let (kind, rf) = fs_record_fields(r);
                record_sites.push(Site {
                    key: format!("record {tag} #{i} ({kind})"),
                    loc: Loc::Body(units.clone()),
                    fields: rf
                        .into_iter()
                        .map(|(n, off, w)| field(n, at + 4 + off, w))
                        .filter(|f| f.off + f.width <= at + 4 + r.len())
                        .collect(),
                    tx: Some(id),
                    body: false,
                });
                for (_, off, w) in fs_record_fields(r).1 {
                    if w == 8 && off + 8 <= r.len() && off != 48 && off != 60 && off != 72 {
                        pool.insert(u64::from_le_bytes(r[off..off + 8].try_into().unwrap()));
                    }
                }
            }
            at += 4 + r.len();
        }
        sites.push(Site {
            key: format!("body {tag}"),
            loc: Loc::Body(units),
            fields,
            tx: Some(id),
            body: true,
        });
        sites.extend(record_sites);
    }
    if let Some(first) = sb.snapshot {
        let at = sb.segment_start(first);
        if let Ok(h) = SnapshotHeader::decode(&uuid, image.block(at), at, sb.segment_count) {
            use snapfmt::off as o;
            let mut fields = vec![
                field("segment_count", o::SEGMENT_COUNT, 4),
                field("sb_generation", o::SB_GENERATION, 8),
                field("payload_len", o::PAYLOAD_LEN, 8),
                field("payload_crc", o::PAYLOAD_CRC, 4),
                field("version", o::VERSION, 2),
            ];
            for i in 0..h.segments.len() {
                fields.push(field(format!("segment{i}"), o::SEGMENTS + 4 * i, 4));
            }
            pool.extend(h.segments.iter().map(|&s| u64::from(s)));
            sites.push(Site {
                key: "snapshot header".into(),
                loc: Loc::SnapHeader(at),
                fields,
                tx: None,
                body: false,
            });
            let blob = read_blob(image, &sb, &h, bs);
            let (state_fields, payload_at) = blob_fields(&blob, sb.streams.len());
            sites.push(Site {
                key: "snapshot stream state".into(),
                loc: Loc::SnapBlob,
                fields: state_fields,
                tx: None,
                body: false,
            });
            if id.is_fs() {
                let payload = &blob[payload_at..];
                let fields = fs_snapshot_fields(payload)
                    .into_iter()
                    .map(|f| Field { off: f.off + payload_at, ..f })
                    .collect();
                sites.push(Site {
                    key: "fs snapshot payload".into(),
                    loc: Loc::SnapBlob,
                    fields,
                    tx: None,
                    body: false,
                });
            }
        }
    }
    Walk { uuid, sb, txs, sites, pool: pool.into_iter().collect() }
}

/// Whether a log record looks like a tally-fs record (tags 1..=6 and a version): the log
/// workload's records are filler bytes, never decoded as file-system records.
fn id_is_fs(r: &[u8]) -> bool {
    tally_fs::record::Record::decode(r).is_ok()
}

/// The fields of a file-system record (docs/FORMAT.md, "File-system records").
fn fs_record_fields(r: &[u8]) -> (&'static str, Vec<(String, usize, usize)>) {
    let common = [("tag", 0, 1), ("ver", 1, 8)];
    let (kind, rest): (&str, &[(&str, usize, usize)]) = match r.first() {
        Some(1) => ("fs", &[("format_version", 17, 4), ("block_size", 21, 4)]),
        Some(2) => (
            "inode",
            &[
                ("ino", 9, 8),
                ("kind", 17, 1),
                ("perm", 18, 2),
                ("uid", 20, 4),
                ("nlink", 28, 4),
                ("size", 32, 8),
                ("rdev", 40, 8),
                ("atime_nsec", 56, 4),
                ("mtime_sec", 60, 8),
                ("target_len", 96, 2),
            ],
        ),
        Some(3) => ("free", &[("ino", 9, 8)]),
        Some(4) => (
            "entry",
            &[
                ("dir", 9, 8),
                ("ino", 17, 8),
                ("kind", 25, 1),
                ("cookie", 26, 8),
                ("name_len", 34, 1),
            ],
        ),
        Some(5) => ("extent", &[("ino", 9, 8), ("block", 17, 8), ("data", 25, 4), ("crc", 29, 4)]),
        Some(6) => (
            "xattr",
            &[("ino", 9, 8), ("present", 17, 1), ("name_len", 18, 1), ("value_len", 19, 2)],
        ),
        _ => ("unknown", &[]),
    };
    let fields =
        common.iter().chain(rest).map(|&(n, off, w)| (format!("{kind}.{n}"), off, w)).collect();
    (kind, fields)
}

/// The snapshot blob as the header describes it (header block excluded).
fn read_blob(image: &Image, sb: &Superblock, h: &SnapshotHeader, bs: usize) -> Vec<u8> {
    let mut bytes = Vec::new();
    for &s in &h.segments {
        let start = sb.segment_start(s);
        for b in 0..u64::from(sb.segment_blocks) {
            bytes.extend_from_slice(image.block(start + b));
        }
    }
    let len = usize::try_from(h.payload_len).unwrap();
    bytes[bs..bs + len].to_vec()
}

/// Fields of the blob's stream state (docs/FORMAT.md, "Snapshot stream state"), and where the
/// payload starts.
fn blob_fields(blob: &[u8], streams: usize) -> (Vec<Field>, usize) {
    let (states, payload) = snapfmt::decode_blob(blob, streams, 0).expect("the blob decodes");
    let mut fields = vec![field("state_len", 0, 8)];
    let mut at = 8;
    for (i, st) in states.iter().enumerate() {
        for (n, w) in
            [("last_seq", 8), ("segment", 4), ("offset", 4), ("next_segment", 4), ("chain_len", 4)]
        {
            fields.push(field(format!("stream{i}.{n}"), at, w));
            at += w;
        }
        for c in 0..st.chain.len() {
            fields.push(field(format!("stream{i}.chain{c}"), at, 4));
            at += 4;
        }
        fields.push(field(format!("stream{i}.placed_len"), at, 8));
        at += 8;
        for p in 0..st.placed.len() {
            for (n, w) in [
                ("seq", 8),
                ("epoch", 4),
                ("end_segment", 4),
                ("end_offset", 4),
                ("next_segment", 4),
                ("records", 4),
                ("dead_records", 4),
            ] {
                fields.push(field(format!("stream{i}.placed{p}.{n}"), at, w));
                at += w;
            }
        }
    }
    assert_eq!(at, blob.len() - payload.len(), "the walk of the stream state drifted");
    (fields, at)
}

/// Fields of the file-system snapshot (docs/FORMAT.md, "File-system snapshot"), as far as a
/// plain walk gets; counts and lengths are what matter most.
fn fs_snapshot_fields(p: &[u8]) -> Vec<Field> {
    struct W<'a> {
        p: &'a [u8],
        at: usize,
        fields: Vec<Field>,
    }
    impl W<'_> {
        fn take(&mut self, name: String, w: usize) -> Option<u64> {
            let bytes = self.p.get(self.at..self.at + w)?;
            let mut v = [0u8; 8];
            v[..w].copy_from_slice(bytes);
            self.fields.push(field(name, self.at, w));
            self.at += w;
            Some(u64::from_le_bytes(v))
        }
        fn skip(&mut self, n: u64) -> Option<()> {
            self.at = self.at.checked_add(usize::try_from(n).ok()?)?;
            Some(())
        }
    }
    let mut w = W { p, at: 8, fields: Vec::new() };
    let go = |w: &mut W| -> Option<()> {
        for (n, width) in
            [("version", 4), ("block_size", 4), ("fs_ver", 8), ("next_ino", 8), ("next_ver", 8)]
        {
            w.take(n.into(), width)?;
        }
        let inodes = w.take("inode_count".into(), 8)?;
        for i in 0..inodes.min(64) {
            let len = w.take(format!("inode{i}.len"), 4)?;
            let rec = w.p.get(w.at..w.at.checked_add(usize::try_from(len).ok()?)?)?;
            for (n, off, width) in fs_record_fields(rec).1 {
                if off + width <= rec.len() {
                    w.fields.push(field(format!("inode{i}.{n}"), w.at + off, width));
                }
            }
            w.skip(len)?;
            let blocks = w.take(format!("inode{i}.block_count"), 8)?;
            for b in 0..blocks.min(64) {
                for (n, width) in
                    [("block", 8), ("ver", 8), ("crc", 4), ("addr", 8), ("stream", 2), ("seq", 8)]
                {
                    w.take(format!("inode{i}.b{b}.{n}"), width)?;
                }
            }
            if w.take(format!("inode{i}.is_dir"), 1)? == 1 {
                w.take(format!("inode{i}.parent"), 8)?;
                w.take(format!("inode{i}.next_cookie"), 8)?;
                let n = w.take(format!("inode{i}.entry_count"), 8)?;
                for e in 0..n.min(64) {
                    let len = w.take(format!("inode{i}.e{e}.name_len"), 1)?;
                    w.skip(len)?;
                    for (n, width) in [("ino", 8), ("kind", 1), ("cookie", 8), ("ver", 8)] {
                        w.take(format!("inode{i}.e{e}.{n}"), width)?;
                    }
                }
            }
            let n = w.take(format!("inode{i}.xattr_count"), 4)?;
            for x in 0..n.min(64) {
                let len = w.take(format!("inode{i}.x{x}.name_len"), 1)?;
                w.skip(len)?;
                let len = w.take(format!("inode{i}.x{x}.value_len"), 4)?;
                w.skip(len)?;
                w.take(format!("inode{i}.x{x}.ver"), 8)?;
            }
        }
        w.take("key_count".into(), 8)?;
        Some(())
    };
    let walked = go(&mut w).is_some();
    assert!(walked, "the walk of the file-system snapshot stopped at byte {}", w.at);
    w.fields
}

/// The walk of each image, made once.
fn walks() -> &'static BTreeMap<ImageId, Walk> {
    static WALKS: OnceLock<BTreeMap<ImageId, Walk>> = OnceLock::new();
    WALKS.get_or_init(|| images().iter().map(|(&id, image)| (id, walk(id, image))).collect())
}

// ---------------------------------------------------------------------------------------------
// Mutations.

/// One change to one structure.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Edit {
    /// A field set to a value (then the structure is sealed with a valid crc).
    Set { field: String, value: u64 },
    /// A body re-encoded without its record `i`.
    RemoveRecord(usize),
    /// A body re-encoded with its record `i` twice.
    RepeatRecord(usize),
    /// A body re-encoded without its dependency `i`.
    RemoveDep(usize),
    /// A body re-encoded with one more dependency.
    AddDep(TxId),
}

/// A mutation: which image, which structure (by its stable key), what change.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mutation {
    image: ImageId,
    site: String,
    edit: Edit,
}

impl fmt::Display for Mutation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}: ", self.image, self.site)?;
        match &self.edit {
            Edit::Set { field, value } => write!(f, "{field} = {value} ({value:#x})"),
            e => write!(f, "{e:?}"),
        }
    }
}

fn get_le(buf: &[u8], off: usize, width: usize) -> u64 {
    let mut v = [0u8; 8];
    v[..width].copy_from_slice(&buf[off..off + width]);
    u64::from_le_bytes(v)
}

fn put_le(buf: &mut [u8], off: usize, width: usize, value: u64) {
    buf[off..off + width].copy_from_slice(&value.to_le_bytes()[..width]);
}

fn width_max(width: usize) -> u64 {
    if width == 8 {
        u64::MAX
    } else {
        (1u64 << (8 * width)) - 1
    }
}

/// A boundary value for a field whose value is `v`: never `v` itself (`None` if none found).
fn pick_value(rng: &mut fastrand::Rng, v: u64, width: usize, pool: &[u64]) -> Option<u64> {
    let max = width_max(width);
    for _ in 0..16 {
        let candidate = match rng.u8(0..10) {
            0 => 0,
            1 => 1,
            2 => max,
            3 => max - 1,
            4 => v.wrapping_add(1) & max,
            5 => v.wrapping_sub(1) & max,
            6 => v.wrapping_mul(2) & max,
            7 => v ^ (1 << rng.u32(0..u32::try_from(width * 8).unwrap())),
            8 => rng.u64(..) & max,
            _ => pool.get(rng.usize(..pool.len().max(1))).copied().unwrap_or(0) & max,
        };
        if candidate != v {
            return Some(candidate);
        }
    }
    None
}

fn reseal(loc: &Loc, uuid: &[u8; 16], block: &mut [u8]) {
    let (crc_off, gap_end) = match loc {
        Loc::Superblock(_) => (sbfmt::off::CRC, sbfmt::off::CRC + 4),
        Loc::Unit(_) | Loc::Body(_) => (unitfmt::off::CRC, unitfmt::UNIT_HEADER_SIZE),
        Loc::SnapHeader(_) => (snapfmt::off::CRC, snapfmt::off::CRC + 4),
        Loc::SnapBlob => unreachable!("the blob is sealed through its header"),
    };
    let crc = crc_seeded(uuid, &[&block[..crc_off], &block[gap_end..]]);
    put_le(block, crc_off, 4, u64::from(crc));
}

/// The body of the transaction whose units are `units`, and each unit's payload length.
fn read_body(image: &Image, units: &[u64]) -> (Vec<u8>, Vec<usize>) {
    let mut body = Vec::new();
    let mut lens = Vec::new();
    for &u in units {
        let b = image.block(u);
        let len = get_le(b, unitfmt::off::PAYLOAD_LEN, 4) as usize;
        body.extend_from_slice(&b[unitfmt::UNIT_HEADER_SIZE..unitfmt::UNIT_HEADER_SIZE + len]);
        lens.push(len);
    }
    (body, lens)
}

/// Write `body` over the payloads of `units`, cut at `lens` (the last unit takes the rest), and
/// seal every unit.
fn write_body(image: &mut Image, uuid: &[u8; 16], units: &[u64], body: &[u8], lens: &[usize]) {
    let mut at = 0;
    for (i, (&u, &len)) in units.iter().zip(lens).enumerate() {
        let mut b = read_block(image, u);
        let left = body.len() - at;
        let len = if i + 1 == units.len() { left } else { len.min(left) };
        let h = unitfmt::UNIT_HEADER_SIZE;
        b[h..].fill(0);
        b[h..h + len].copy_from_slice(&body[at..at + len]);
        put_le(&mut b, unitfmt::off::PAYLOAD_LEN, 4, len as u64);
        reseal(&Loc::Unit(u), uuid, &mut b);
        image.set_block(u, b.into());
        at += len;
    }
}

/// The snapshot header block, its decoded header, and the blob.
fn snapshot_parts(image: &Image, w: &Walk) -> (u64, SnapshotHeader, Vec<u8>) {
    let first = w.sb.snapshot.expect("a snapshot");
    let at = w.sb.segment_start(first);
    let h = SnapshotHeader::decode(&w.uuid, image.block(at), at, w.sb.segment_count).unwrap();
    let blob = read_blob(image, &w.sb, &h, image.geometry().block_size as usize);
    (at, h, blob)
}

/// Write `blob` back after the header (same length) and seal the header with its new crc.
fn write_blob(image: &mut Image, w: &Walk, at: u64, h: &SnapshotHeader, blob: &[u8]) {
    let bs = image.geometry().block_size as usize;
    let mut header = read_block(image, at);
    put_le(&mut header, snapfmt::off::PAYLOAD_CRC, 4, u64::from(crc_seeded(&w.uuid, &[blob])));
    reseal(&Loc::SnapHeader(at), &w.uuid, &mut header);
    let mut bytes = header;
    bytes.extend_from_slice(blob);
    bytes.resize(bytes.len().div_ceil(bs) * bs, 0);
    let blocks = h.segments.iter().flat_map(|&s| {
        let start = w.sb.segment_start(s);
        (0..u64::from(w.sb.segment_blocks)).map(move |b| start + b)
    });
    for (chunk, block) in bytes.chunks(bs).zip(blocks) {
        image.set_block(block, chunk.to_vec().into());
    }
}

/// The image with `m` applied, or `None` when the mutation does not apply (unknown site or
/// field, a no-op, a body that no longer fits its units).
fn apply(m: &Mutation) -> Option<Image> {
    let w = &walks()[&m.image];
    let mut image = images()[&m.image].clone();
    let site = w.sites.iter().find(|s| s.key == m.site)?;
    match (&m.edit, &site.loc) {
        (Edit::Set { field, value }, loc) => {
            let f = site.fields.iter().find(|f| &f.name == field)?;
            match loc {
                Loc::Superblock(b) | Loc::Unit(b) | Loc::SnapHeader(b) => {
                    let mut block = read_block(&image, *b);
                    if get_le(&block, f.off, f.width) == *value {
                        return None;
                    }
                    put_le(&mut block, f.off, f.width, *value);
                    reseal(loc, &w.uuid, &mut block);
                    image.set_block(*b, block.into());
                }
                Loc::Body(units) => {
                    let (mut body, lens) = read_body(&image, units);
                    if get_le(&body, f.off, f.width) == *value {
                        return None;
                    }
                    put_le(&mut body, f.off, f.width, *value);
                    write_body(&mut image, &w.uuid, units, &body, &lens);
                }
                Loc::SnapBlob => {
                    let (at, h, mut blob) = snapshot_parts(&image, w);
                    if get_le(&blob, f.off, f.width) == *value {
                        return None;
                    }
                    put_le(&mut blob, f.off, f.width, *value);
                    write_blob(&mut image, w, at, &h, &blob);
                }
            }
        }
        (edit, Loc::Body(units)) => {
            let (bytes, _) = read_body(&image, units);
            let mut body = Body::decode(&bytes, 0).ok()?;
            match edit {
                Edit::RemoveRecord(i) if *i < body.records.len() => {
                    body.records.remove(*i);
                }
                Edit::RepeatRecord(i) if *i < body.records.len() => {
                    let r = body.records[*i].clone();
                    body.records.insert(*i, r);
                }
                Edit::RemoveDep(i) if *i < body.deps.len() => {
                    body.deps.remove(*i);
                }
                Edit::AddDep(d) => body.deps.push(*d),
                _ => return None,
            }
            let bytes = body.encode();
            let cap = unitfmt::payload_capacity(image.geometry().block_size);
            if bytes.len().div_ceil(cap) > units.len() {
                return None;
            }
            let lens = vec![cap; units.len()];
            write_body(&mut image, &w.uuid, units, &bytes, &lens);
        }
        _ => return None,
    }
    Some(image)
}

/// Broad kind of a site, to spread the choice evenly over kinds rather than over sites (units
/// and records far outnumber superblocks).
fn site_kind(key: &str) -> &str {
    key.split(' ').next().unwrap_or(key)
}

/// A random mutation of a random structure.
fn choose(rng: &mut fastrand::Rng) -> Option<Mutation> {
    let image = IMAGE_IDS[rng.usize(..IMAGE_IDS.len())];
    let w = &walks()[&image];
    let kinds: BTreeSet<&str> = w.sites.iter().map(|s| site_kind(&s.key)).collect();
    let kinds: Vec<&str> = kinds.into_iter().collect();
    let kind = kinds[rng.usize(..kinds.len())];
    let sites: Vec<&Site> = w.sites.iter().filter(|s| site_kind(&s.key) == kind).collect();
    let site = sites[rng.usize(..sites.len())];
    if site.body && rng.u8(0..4) == 0 {
        let (bytes, _) = read_body(
            &images()[&image],
            match &site.loc {
                Loc::Body(u) => u,
                _ => unreachable!(),
            },
        );
        let body = Body::decode(&bytes, 0).ok()?;
        let edit = match rng.u8(0..4) {
            0 if !body.records.is_empty() => Edit::RemoveRecord(rng.usize(..body.records.len())),
            1 if !body.records.is_empty() => Edit::RepeatRecord(rng.usize(..body.records.len())),
            2 if !body.deps.is_empty() => Edit::RemoveDep(rng.usize(..body.deps.len())),
            _ => {
                let t = &w.txs[rng.usize(..w.txs.len())].header;
                let seq = if rng.bool() { t.seq } else { t.seq.wrapping_add(rng.u64(0..3)) };
                Edit::AddDep(TxId { stream: t.stream ^ u16::from(rng.bool()), seq })
            }
        };
        return Some(Mutation { image, site: site.key.clone(), edit });
    }
    let f = site.fields.get(rng.usize(..site.fields.len().max(1)))?;
    let current = current_value(image, site, f);
    let value = pick_value(rng, current, f.width, &w.pool)?;
    Some(Mutation {
        image,
        site: site.key.clone(),
        edit: Edit::Set { field: f.name.clone(), value },
    })
}

fn current_value(image: ImageId, site: &Site, f: &Field) -> u64 {
    let img = &images()[&image];
    match &site.loc {
        Loc::Superblock(b) | Loc::Unit(b) | Loc::SnapHeader(b) => {
            get_le(img.block(*b), f.off, f.width)
        }
        Loc::Body(units) => get_le(&read_body(img, units).0, f.off, f.width),
        Loc::SnapBlob => get_le(&snapshot_parts(img, &walks()[&image]).2, f.off, f.width),
    }
}

// ---------------------------------------------------------------------------------------------
// Running an image and judging it.

/// A surviving transaction, compared byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Kept {
    seq: u64,
    records: Vec<Vec<u8>>,
    deps: Vec<TxId>,
    data_count: u32,
}

type Survivors = Vec<Vec<Kept>>;

/// Open the log (twice for a snapshot image: the first open uses the snapshot, the second scans,
/// so what survives can be compared) and return what the last open kept.
fn open_log(id: ImageId, image: Image) -> Result<Survivors, String> {
    let dev = Arc::new(MemDevice::from_image(image));
    let opens = if matches!(id, ImageId::LogSnapshot | ImageId::FsSnapshot) { 2 } else { 1 };
    let mut kept = Vec::new();
    for _ in 0..opens {
        let (log, r) = Log::open(dev.clone(), OpenOptions::default()).map_err(|e| match e {
            LogError::DurableTransactionLost { .. } => format!("lost: {e}"),
            e => e.to_string(),
        })?;
        kept = r
            .streams
            .iter()
            .map(|s| {
                s.txs
                    .iter()
                    .map(|t| Kept {
                        seq: t.id.seq,
                        records: t.records.clone(),
                        deps: t.deps.clone(),
                        data_count: t.data_count,
                    })
                    .collect()
            })
            .collect();
        drop(log);
    }
    Ok(kept)
}

/// Mount, fsck, read everything, unmount cleanly, mount the snapshot and fsck again.
fn exercise_fs(image: Image) -> Result<(), String> {
    let dev: Arc<dyn Device> = Arc::new(MemDevice::from_image(image));
    let fs = Fs::mount(dev.clone(), MountOptions::default()).map_err(|e| e.to_string())?;
    let _ = fs.fsck();
    let mut dirs = vec![ROOT];
    let mut seen = BTreeSet::new();
    let mut visits = 0u32;
    while let Some(dir) = dirs.pop() {
        if !seen.insert(dir) {
            continue;
        }
        let mut offset = 0;
        for _ in 0..64 {
            visits += 1;
            let Ok(entries) = fs.readdir(dir, offset) else { break };
            let Some(last) = entries.last() else { break };
            offset = last.offset;
            for e in entries {
                if e.name == b"." || e.name == b".." || visits > 4096 {
                    continue;
                }
                visits += 1;
                let Ok(attr) = fs.getattr(e.ino) else { continue };
                match attr.kind {
                    tally_fs::FileKind::Dir => dirs.push(e.ino),
                    tally_fs::FileKind::Symlink => {
                        let _ = fs.readlink(e.ino);
                    }
                    _ => {
                        let mut at = 0;
                        while at < attr.size.min(1 << 20) {
                            let _ = fs.read(e.ino, at, 64 << 10);
                            at += 64 << 10;
                        }
                        let _ = fs.read(e.ino, attr.size.saturating_sub(10), 100);
                    }
                }
                for name in fs.listxattr(e.ino).unwrap_or_default() {
                    let _ = fs.getxattr(e.ino, &name);
                }
            }
        }
    }
    fs.unmount().map_err(|e| format!("unmount: {e}"))?;
    let fs = Fs::mount(dev, MountOptions::default()).map_err(|e| format!("remount: {e}"))?;
    let _ = fs.fsck();
    drop(fs);
    Ok(())
}

/// What one run of an image gave.
struct Run {
    log: Result<Survivors, String>,
    fs: Option<Result<(), String>>,
    panics: Vec<String>,
    largest_alloc: usize,
    time: Duration,
}

fn run_image(id: ImageId, image: &Image) -> Run {
    quiet_panics();
    let started = Instant::now();
    let _ = take_panics();
    LARGEST_ALLOC.store(0, Ordering::Relaxed);
    ARMED.fetch_add(1, Ordering::SeqCst);
    let log = catch_unwind(AssertUnwindSafe(|| open_log(id, image.clone())))
        .unwrap_or_else(|_| Err("panicked".into()));
    let fs = id.is_fs().then(|| {
        catch_unwind(AssertUnwindSafe(|| exercise_fs(image.clone())))
            .unwrap_or_else(|_| Err("panicked".into()))
    });
    ARMED.fetch_sub(1, Ordering::SeqCst);
    Run {
        log,
        fs,
        panics: take_panics(),
        largest_alloc: LARGEST_ALLOC.load(Ordering::Relaxed),
        time: started.elapsed(),
    }
}

/// What the unmutated images keep.
fn baselines() -> &'static BTreeMap<ImageId, Survivors> {
    static BASE: OnceLock<BTreeMap<ImageId, Survivors>> = OnceLock::new();
    BASE.get_or_init(|| {
        IMAGE_IDS
            .iter()
            .map(|&id| {
                let run = run_image(id, &images()[&id]);
                assert!(run.panics.is_empty(), "{id:?} unmutated: {:?}", run.panics);
                assert_eq!(run.fs.clone().unwrap_or(Ok(())), Ok(()), "{id:?} unmutated");
                (id, run.log.unwrap_or_else(|e| panic!("{id:?} unmutated: {e}")))
            })
            .collect()
    })
}

/// The highest durable watermark of a unit of `t`'s stream, of a transaction after `t` that
/// the unmutated image keeps: every transaction up to it is proven durable.
fn proven_watermark(id: ImageId, t: TxId) -> u64 {
    let kept: BTreeSet<u64> = baselines()[&id]
        .get(usize::from(t.stream))
        .map(|s| s.iter().map(|k| k.seq).collect())
        .unwrap_or_default();
    walks()[&id]
        .txs
        .iter()
        .filter(|x| x.header.stream == t.stream && x.header.seq > t.seq)
        .filter(|x| kept.contains(&x.header.seq))
        .flat_map(|x| x.units.iter().map(|u| u.1.durable_watermark))
        .max()
        .unwrap_or(0)
}

/// The properties, for image `id` after mutation `m` (`None`: the image as made).
fn judge(id: ImageId, image: &Image, m: Option<&Mutation>) -> Vec<String> {
    let run = run_image(id, image);
    let mut problems: Vec<String> = run.panics.iter().map(|p| format!("panic: {p}")).collect();
    let bound = ALLOC_FACTOR_MAX * image_bytes(image);
    if run.largest_alloc > bound {
        problems.push(format!(
            "allocation of {} bytes (bound {bound}, 16x the image)",
            run.largest_alloc
        ));
    }
    let site = m.and_then(|m| walks()[&id].sites.iter().find(|s| s.key == m.site));
    if let (Some(t), Ok(kept)) = (site.and_then(|s| s.tx), &run.log) {
        let proven = proven_watermark(id, t);
        if proven >= t.seq {
            let base = &baselines()[&id][usize::from(t.stream)];
            let now = kept.get(usize::from(t.stream)).cloned().unwrap_or_default();
            for b in base.iter().filter(|b| b.seq <= proven) {
                let present = if b.seq == t.seq {
                    now.iter().any(|k| k.seq == b.seq)
                } else {
                    now.contains(b)
                };
                if !present {
                    problems.push(format!(
                        "durable transaction s{} seq{} dropped without an error (a later unit \
                         proves seq {proven} durable; the open kept {} transactions)",
                        t.stream,
                        b.seq,
                        now.len()
                    ));
                    break;
                }
            }
        }
    }
    if run.time > Duration::from_secs(10) {
        problems.push(format!("took {:?}", run.time));
    }
    problems
}

/// Apply and judge one mutation; the problems found (empty: every property held).
fn check(m: &Mutation) -> Vec<String> {
    match apply(m) {
        Some(image) => judge(m.image, &image, Some(m)),
        None => Vec::new(),
    }
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Findings of tally-log that are reported and not fixed yet: the bounded run tolerates them
/// (each has an ignored regression test below). Matched on the site kind, the field and the
/// problem's text.
const KNOWN: &[(&str, &str, &str)] = &[];

fn known(m: &Mutation, problem: &str) -> bool {
    let field = match &m.edit {
        Edit::Set { field, .. } => field.as_str(),
        _ => "",
    };
    KNOWN.iter().any(|(kind, f, text)| {
        site_kind(&m.site) == *kind && field.ends_with(f) && problem.contains(text)
    })
}

#[test]
fn structured_fuzz() {
    let seed = env_u64("TALLY_FUZZ_SEED").unwrap_or(1);
    let iters = env_u64("TALLY_FUZZ_ITERS").unwrap_or(12_000);
    let only = env_u64("TALLY_FUZZ_ONE");
    for &id in &IMAGE_IDS {
        let w = &walks()[&id];
        let base = judge(id, &images()[&id], None);
        assert!(base.is_empty(), "{id:?} unmutated: {base:?}");
        println!(
            "{id:?}: {} sites, {} transactions found, kept {:?}",
            w.sites.len(),
            w.txs.len(),
            baselines()[&id].iter().map(Vec::len).collect::<Vec<_>>()
        );
    }
    let started = Instant::now();
    let mut applied = 0u64;
    let mut opened = 0u64;
    let mut by_kind: BTreeMap<String, u64> = BTreeMap::new();
    let mut findings: Vec<String> = Vec::new();
    let mut known_count = 0u64;
    let iter_seeds: Vec<(u64, u64)> = match only {
        Some(s) => vec![(0, s)],
        None => (0..iters).map(|i| (i, splitmix(seed ^ splitmix(i)))).collect(),
    };
    for (i, iter_seed) in iter_seeds {
        let mut rng = fastrand::Rng::with_seed(iter_seed);
        let Some(m) = choose(&mut rng) else { continue };
        let Some(image) = apply(&m) else { continue };
        applied += 1;
        *by_kind.entry(format!("{:?} {}", m.image, site_kind(&m.site))).or_default() += 1;
        let run_log_ok = {
            let problems = judge(m.image, &image, Some(&m));
            for p in &problems {
                let line =
                    format!("seed {seed} iteration {i} (TALLY_FUZZ_ONE={iter_seed}): {m}: {p}");
                if known(&m, p) {
                    known_count += 1;
                } else {
                    println!("FINDING {line}");
                    findings.push(line);
                }
            }
            problems.is_empty()
        };
        opened += u64::from(run_log_ok);
    }
    println!(
        "seed {seed}: {applied} mutations applied in {:?} ({opened} without a problem, {known_count} \
         known findings); by image and structure: {by_kind:?}",
        started.elapsed()
    );
    assert!(findings.is_empty(), "{} findings:\n{}", findings.len(), findings.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// Findings, each replayed exactly (image, structure, field, value).

fn set(image: ImageId, site: &str, field: &str, value: u64) -> Mutation {
    Mutation { image, site: site.into(), edit: Edit::Set { field: field.into(), value } }
}

/// The mutation applies to the image as made, and every property holds after it.
fn assert_holds(m: &Mutation) {
    assert!(apply(m).is_some(), "{m}: does not apply (the workload's image changed?)");
    let problems = check(m);
    assert!(problems.is_empty(), "{m}: {problems:?}");
}

/// Seed 1, iteration 76: an extent record of inode 2^64 − 1 made replay compute the next inode
/// number as `ino + 1` (tally-fs state.rs: overflow panic). Replay now refuses it as corrupted.
#[test]
fn finding_extent_ino_max_overflows_replay() {
    let m = set(ImageId::FsCrash, "record s0 seq16777223 e3 #1 (extent)", "extent.ino", u64::MAX);
    assert_holds(&m);
}

/// Seed 1, iteration 386: a record version of 2^64 − 1 overflowed the version clock in replay
/// (`ver + 1`, tally-fs state.rs).
#[test]
fn finding_extent_ver_max_overflows_replay() {
    let m = set(ImageId::FsCrash, "record s1 seq16777219 e3 #1 (extent)", "extent.ver", u64::MAX);
    assert_holds(&m);
}

/// Seed 1, iteration 1066: an entry's readdir cookie of 2^64 − 1 overflowed `cookie + 1` in
/// `Dir::insert` (tally-fs state.rs), reached from replay and from a snapshot.
#[test]
fn finding_entry_cookie_max_overflows_replay() {
    let m = set(ImageId::FsCrash, "record s1 seq16777217 e3 #2 (entry)", "entry.cookie", u64::MAX);
    assert_holds(&m);
}

/// Seed 1, iterations 907 and 839 (and 59, 84, 344, 1380 on the file-system image): the first
/// unit of a single-unit transaction T that later units prove durable, its `seq` raised (19
/// where T is seq 5 and the stream's last is 20; or far beyond the stream's `seq_limit`).
/// T still chains (`prev_seq` unchanged, `seq > prev_seq`), so recovery keeps it as the tail
/// under the forged number; T's successor names the real seq and is rejected; the damage check
/// only looks at units with a seq above the kept tail — none — so `Log::open` succeeds and
/// silently drops T+1 .. the end, which are proven durable (tally-log recover.rs).
#[test]
fn finding_forged_unit_seq_hides_durable_transactions() {
    assert_holds(&set(ImageId::LogCrash, "unit s1 seq5 e2 #0", "seq", 19));
    assert_holds(&set(ImageId::LogCrash, "unit s1 seq12 e2 #0", "seq", 0xaff2_530e_b6b8_2bd9));
}

/// Seed 1, iterations 3139 and 9205: a forged snapshot (payload crc recomputed) giving a file
/// block the device address 2^64 − 1: the read fails as it should, but formatting the device's
/// `OutOfRange` error computed `block + count` and panicked (tally-media error.rs).
#[test]
fn finding_snapshot_block_addr_max_panics_in_error_message() {
    let m = set(ImageId::FsSnapshot, "fs snapshot payload", "inode6.b2.addr", u64::MAX);
    assert_holds(&m);
}

/// Seed 1, iteration 6238: a forged snapshot entry with cookie 2^64 − 1 reached `readdir`,
/// which computes the next offset as `cookie + 1` (tally-fs fs/read.rs). The snapshot decoder
/// now refuses cookies the file system never hands out (below 3, or the largest).
#[test]
fn finding_snapshot_entry_cookie_max_panics_in_readdir() {
    let m = set(ImageId::FsSnapshot, "fs snapshot payload", "inode2.e2.cookie", u64::MAX);
    assert_holds(&m);
}

//! Hostile-but-valid bytes (issue 12, finding 4): fields edited on the device and every crc
//! recomputed, so only the decoders' and recovery's own checks stand between the bytes and a
//! panic, a wrapped counter, a huge allocation or a lost durable transaction.
//!
//! Each test forges one field the way the finding describes and states what must hold: `open`
//! (and what follows it) never panics, allocates nothing near the size a forged length claims,
//! and either keeps every durable transaction or refuses with a typed error.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

use tally_log::format::body::Body;
use tally_log::format::crc_seeded;
use tally_log::format::superblock::{Superblock, SB_BLOCKS};
use tally_log::format::unit::{UnitHeader, UnitKind};
use tally_log::{Log, LogConfig, LogError, OpenOptions, Recovery, Result, Transaction};
use tally_media::{Device, Image, IoBuf, MemDevice, Write, WriteFlags};

/// Counts, per thread, the largest single allocation: a forged length must not turn into one.
struct Counting;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // `try_with`: the slot is gone while the thread exits; nothing to count then.
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
}

// SAFETY: every call is forwarded unchanged to the system allocator; `note` only records a size
// in a const-initialised thread-local `Cell`, which neither allocates nor unwinds.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller upholds `alloc`'s contract, which `System.alloc` shares.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: `ptr` was allocated by this allocator, that is by `System`, with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// `f`'s result and the largest allocation this thread made while running it.
fn largest_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|l| l.set(0));
    let out = f();
    (out, LARGEST.with(Cell::get))
}

const BS: usize = 4096;
/// 16 MiB, as in the finding.
const BLOCKS: u64 = 4096;
const SEGMENT_BLOCKS: u32 = 64;
const UUID: [u8; 16] = [0x5a; 16];

fn image() -> Arc<MemDevice> {
    let dev = Arc::new(MemDevice::new(BS as u32, BLOCKS).unwrap());
    let config = LogConfig { streams: 2, segment_blocks: SEGMENT_BLOCKS, uuid: UUID };
    Log::format(&*dev, &config).unwrap();
    dev
}

fn open(dev: &Arc<MemDevice>) -> Result<(Log, Recovery)> {
    Log::open(dev.clone(), OpenOptions::default())
}

fn commit(log: &Log, stream: u16, tag: &str) -> Result<u64> {
    let mut t = Transaction::new(stream);
    t.record(tag.as_bytes().to_vec());
    Ok(log.commit_durable(t)?.ticket.seq)
}

/// The records of every stream's recovered transactions, in order.
fn tags(r: &Recovery, stream: usize) -> Vec<String> {
    let txs = &r.streams[stream].txs;
    txs.iter().flat_map(|t| &t.records).map(|r| String::from_utf8_lossy(r).into_owned()).collect()
}

fn read_block(dev: &MemDevice, block: u64) -> Vec<u8> {
    let mut buf = vec![0u8; BS];
    dev.read(block, &mut buf).unwrap();
    buf
}

fn write_block(dev: &MemDevice, block: u64, bytes: &[u8]) {
    dev.write_sync(vec![Write::new(block, IoBuf::from_slice(bytes))], WriteFlags::NONE).unwrap();
    dev.flush().unwrap();
}

/// Both superblock copies that decode, with their block.
fn superblocks(dev: &MemDevice) -> Vec<(Superblock, u64)> {
    let decoded = SB_BLOCKS.iter().map(|&b| (Superblock::decode(&read_block(dev, b), b), b));
    decoded.filter_map(|(sb, b)| Some((sb.ok()?, b))).collect()
}

/// The superblock in force, and its block.
fn winner(dev: &MemDevice) -> (Superblock, u64) {
    superblocks(dev).into_iter().max_by_key(|(sb, _)| sb.generation).unwrap()
}

/// Edit the superblock in force and write it back with a valid crc.
fn forge_superblock(dev: &MemDevice, edit: impl FnOnce(&mut Superblock)) {
    let (mut sb, block) = winner(dev);
    edit(&mut sb);
    write_block(dev, block, &sb.encode());
}

/// A log with durable transactions `s0-0..s0-{n-1}` on stream 0 and one on stream 1, closed by
/// a crash.
fn with_transactions(n: usize) -> Arc<MemDevice> {
    let dev = image();
    let (log, _) = open(&dev).unwrap();
    for i in 0..n {
        commit(&log, 0, &format!("s0-{i}")).unwrap();
    }
    commit(&log, 1, "s1-0").unwrap();
    drop(log);
    dev
}

fn expected(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("s0-{i}")).collect()
}

/// Open after a forged counter: a typed error, or a log whose counters did not wrap: durable
/// commits after the open (unless a typed error refuses them) are still there after a crash. Never a
/// panic, and no superblock copy with a wrapped generation or epoch written (both start at 1
/// once the log was opened).
fn refused_or_unwrapped(dev: &Arc<MemDevice>) {
    match open(dev) {
        Err(e) => eprintln!("refused: {e}"),
        Ok((log, _)) => {
            // Two commits: the second is numbered from the first's successor.
            let done: Vec<String> = ["after-1", "after-2"]
                .into_iter()
                .take_while(|tag| {
                    commit(&log, 0, tag).inspect_err(|e| eprintln!("commit refused: {e}")).is_ok()
                })
                .map(String::from)
                .collect();
            drop(log); // crash
            let (_log, r) = open(dev).expect("reopen after durable commits");
            let kept = tags(&r, 0);
            assert!(kept.ends_with(&done), "lost: {done:?} not all in {kept:?}");
        }
    }
    for (sb, block) in superblocks(dev) {
        assert_ne!(sb.generation, 0, "copy {block}: the generation wrapped");
        assert!(sb.streams.iter().all(|s| s.epoch != 0), "copy {block}: an epoch wrapped to 0");
    }
}

#[test]
fn superblock_generation_at_u64_max_does_not_wrap_and_lose_to_the_stale_copy() {
    let dev = with_transactions(3);
    forge_superblock(&dev, |sb| sb.generation = u64::MAX);
    refused_or_unwrapped(&dev);
    // The forged copy is still the one in force: nothing with a wrapped generation beat it.
    assert_eq!(winner(&dev).0.generation, u64::MAX);
}

/// A generation that cannot be incremented was read from the device (2^64 updates cannot
/// happen): corruption, reported as such, not an invalid argument.
#[test]
fn superblock_generation_at_u64_max_is_corruption() {
    let dev = with_transactions(3);
    forge_superblock(&dev, |sb| sb.generation = u64::MAX);
    let before = dev.image();
    match open(&dev) {
        Err(LogError::Corrupted { what: "superblock", reason, .. }) => {
            assert!(reason.contains("generation"), "{reason}");
        }
        Err(e) => panic!("not reported as corruption: {e}"),
        Ok(_) => panic!("a superblock generation of u64::MAX was accepted"),
    }
    assert_unchanged(&dev, &before);
}

#[test]
fn superblock_epoch_at_u32_max_does_not_wrap() {
    let dev = with_transactions(3);
    forge_superblock(&dev, |sb| sb.streams[0].epoch = u32::MAX);
    refused_or_unwrapped(&dev);
}

#[test]
fn superblock_checkpoint_seq_at_u64_max_does_not_wrap() {
    let dev = with_transactions(3);
    forge_superblock(&dev, |sb| {
        let s = &mut sb.streams[0];
        s.checkpoint_seq = u64::MAX;
        s.base_seq = u64::MAX - 1;
        s.resume_seq = u64::MAX;
        s.seq_limit = u64::MAX;
    });
    refused_or_unwrapped(&dev);
}

#[test]
fn superblock_resume_seq_at_u64_max_does_not_wrap() {
    let dev = with_transactions(3);
    forge_superblock(&dev, |sb| {
        let s = &mut sb.streams[0];
        s.base_seq = u64::MAX - 1;
        s.resume_seq = u64::MAX;
        s.seq_limit = u64::MAX;
    });
    refused_or_unwrapped(&dev);
}

/// A unit numbered `u64::MAX` right where stream 0's chain continues: it is not a transaction
/// (no successor could be numbered), so the chain ends before it and nothing wraps.
#[test]
fn unit_seq_at_u64_max_is_not_a_transaction() {
    let dev = with_transactions(3);
    let (sb, _) = winner(&dev);
    // Stream 0's transactions are one unit each, from its checkpoint on: the fourth block is
    // where the next one goes.
    let root = sb.streams[0];
    let at = sb.segment_start(root.checkpoint_segment) + u64::from(root.checkpoint_offset) + 3;
    let last = read_block(&dev, at - 1);
    let (prev, _) = UnitHeader::decode(&UUID, &last, at - 1, true).unwrap();
    let body = Body::default().encode();
    let forged = UnitHeader {
        kind: UnitKind::Body,
        seq: u64::MAX,
        prev_seq: prev.seq,
        unit_index: 0,
        unit_count: 1,
        data_count: 0,
        payload_len: body.len() as u32,
        ..prev
    };
    let mut block = vec![0u8; BS];
    forged.encode_into(&UUID, &body, &mut block);
    write_block(&dev, at, &block);
    let (log, r) = open(&dev).expect("the forged unit ends the chain; nothing is lost");
    assert_eq!(tags(&r, 0), expected(3));
    assert_eq!(r.streams[0].txs.len(), 3, "the forged unit is not a transaction");
    drop(log);
    refused_or_unwrapped(&dev);
}

// --- The clean-close snapshot ------------------------------------------------------------------
//
// Offsets from docs/FORMAT.md ("Snapshot header", "Snapshot stream state", "Snapshot placed
// transaction"), which `format_doc.rs` checks against the code.

const SNAP_SEGMENT_COUNT: usize = 12;
const SNAP_PAYLOAD_LEN: usize = 24;
const SNAP_PAYLOAD_CRC: usize = 32;
const SNAP_CRC: usize = 36;
const SNAP_SEGMENTS: usize = 64;
const PLACED_SIZE: usize = 32;
const PLACED_END_SEGMENT: usize = 12;
const PLACED_NEXT_SEGMENT: usize = 20;

fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// The snapshot of a log closed cleanly, as bytes to forge.
struct Snap {
    sb: Superblock,
    header_block: u64,
    header: Vec<u8>,
    segments: Vec<u32>,
    blob: Vec<u8>,
}

impl Snap {
    fn read(dev: &MemDevice) -> Snap {
        let (sb, _) = winner(dev);
        let header_block = sb.segment_start(sb.snapshot.expect("a snapshot"));
        let header = read_block(dev, header_block);
        let count = get_u32(&header, SNAP_SEGMENT_COUNT) as usize;
        let segments: Vec<u32> =
            (0..count).map(|i| get_u32(&header, SNAP_SEGMENTS + 4 * i)).collect();
        let len = u64::from_le_bytes(header[SNAP_PAYLOAD_LEN..][..8].try_into().unwrap());
        let mut bytes = Vec::new();
        for &s in &segments {
            for b in 0..u64::from(SEGMENT_BLOCKS) {
                bytes.extend(read_block(dev, sb.segment_start(s) + b));
            }
        }
        let blob = bytes[BS..BS + len as usize].to_vec();
        Snap { sb, header_block, header, segments, blob }
    }

    /// Write the (edited) blob and header back, with both crcs recomputed.
    fn write(&mut self, dev: &MemDevice) {
        put_u64(&mut self.header, SNAP_PAYLOAD_LEN, self.blob.len() as u64);
        put_u32(&mut self.header, SNAP_PAYLOAD_CRC, crc_seeded(&UUID, &[&self.blob]));
        let crc = crc_seeded(&UUID, &[&self.header[..SNAP_CRC], &self.header[SNAP_CRC + 4..]]);
        put_u32(&mut self.header, SNAP_CRC, crc);
        let mut bytes = self.header.clone();
        bytes.extend_from_slice(&self.blob);
        bytes.resize(bytes.len().div_ceil(BS) * BS, 0);
        for (i, block) in bytes.chunks(BS).enumerate() {
            let seg = self.segments[i / SEGMENT_BLOCKS as usize];
            let at = self.sb.segment_start(seg) + (i % SEGMENT_BLOCKS as usize) as u64;
            write_block(dev, at, block);
        }
    }

    /// Offsets in the blob of stream `s`'s chain (and its length) and of its placed entries.
    fn stream(&self, s: usize) -> (usize, usize, usize) {
        let mut at = 8; // u64 state_len
        for i in 0.. {
            let chain_len = get_u32(&self.blob, at + 20) as usize;
            let chain_at = at + 24;
            let placed_len_at = chain_at + 4 * chain_len;
            let placed_len =
                u64::from_le_bytes(self.blob[placed_len_at..][..8].try_into().unwrap());
            let placed_at = placed_len_at + 8;
            if i == s {
                return (chain_at, chain_len, placed_at);
            }
            at = placed_at + PLACED_SIZE * placed_len as usize;
        }
        unreachable!()
    }
}

/// Stream 0 with `n` durable transactions (more than a segment holds when `n` > 64) and stream
/// 1 with `m`, then a clean close; their sequence numbers.
fn closed_cleanly(n: usize, m: usize) -> (Arc<MemDevice>, [Vec<u64>; 2]) {
    let dev = image();
    let (log, _) = open(&dev).unwrap();
    let s0 = (0..n).map(|i| commit(&log, 0, &format!("s0-{i}")).unwrap()).collect();
    let s1 = (0..m).map(|i| commit(&log, 1, &format!("s1-{i}")).unwrap()).collect();
    assert!(log.close_clean(b"payload of the layer above").unwrap());
    (dev, [s0, s1])
}

/// A forged header listing one segment as often as the block allows, with a length to match
/// (4 GiB claimed on a 16 MiB image): refused before anything of that size is allocated.
#[test]
fn snapshot_header_with_a_huge_repeated_segment_list_allocates_nothing_large() {
    let (dev, _) = closed_cleanly(5, 1);
    let mut snap = Snap::read(&dev);
    let first = snap.segments[0];
    let count = (BS - SNAP_SEGMENTS) / 4;
    put_u32(&mut snap.header, SNAP_SEGMENT_COUNT, count as u32);
    for i in 0..count {
        put_u32(&mut snap.header, SNAP_SEGMENTS + 4 * i, first);
    }
    let room = (count * SEGMENT_BLOCKS as usize - 1) * BS;
    put_u64(&mut snap.header, SNAP_PAYLOAD_LEN, room as u64);
    let crc = crc_seeded(&UUID, &[&snap.header[..SNAP_CRC], &snap.header[SNAP_CRC + 4..]]);
    put_u32(&mut snap.header, SNAP_CRC, crc);
    write_block(&dev, snap.header_block, &snap.header);

    let (opened, largest) = largest_allocation(|| open(&dev));
    let (_log, r) = opened.unwrap();
    assert!(largest < 1 << 20, "largest allocation {largest} bytes for a forged snapshot");
    assert_eq!(r.snapshot, None, "the forged snapshot is ignored");
    assert_eq!(tags(&r, 0), expected(5), "the log was scanned instead");
}

/// Stream 0's first placed transaction claims to end in a segment outside its chain: trusted,
/// the checkpoint of that transaction freed the whole chain and the durable transactions after
/// it were lost at the next crash.
#[test]
fn snapshot_end_segment_outside_the_chain_cannot_make_a_checkpoint_free_the_chain() {
    let n = 70; // two segments of stream 0
    let (dev, seqs) = closed_cleanly(n, 1);
    let mut snap = Snap::read(&dev);
    let (chain_at, chain_len, placed_at) = snap.stream(0);
    assert_eq!(chain_len, 2);
    let chain: Vec<u32> = (0..chain_len).map(|i| get_u32(&snap.blob, chain_at + 4 * i)).collect();
    // The last segment of the log: free (segments are allocated lowest first).
    let outside = snap.sb.segment_count - 1;
    assert!(!chain.contains(&outside) && !snap.segments.contains(&outside));
    put_u32(&mut snap.blob, placed_at + PLACED_END_SEGMENT, outside);
    snap.write(&dev);
    checkpoint_first_then_crash(&dev, n, seqs[0][0]);
}

/// Stream 0's first placed transaction claims to end in the last segment of its chain: trusted,
/// its checkpoint freed the segment that holds the transactions after it.
#[test]
fn snapshot_end_segment_later_in_the_chain_cannot_make_a_checkpoint_free_live_segments() {
    let n = 70;
    let (dev, seqs) = closed_cleanly(n, 1);
    let mut snap = Snap::read(&dev);
    let (chain_at, chain_len, placed_at) = snap.stream(0);
    let last = get_u32(&snap.blob, chain_at + 4 * (chain_len - 1));
    // The stream's reserved next segment (`next_segment`, offset 16 of its fixed fields, which
    // end where its chain starts), so that the forged root a checkpoint writes is valid.
    let next = get_u32(&snap.blob, chain_at - 24 + 16);
    put_u32(&mut snap.blob, placed_at + PLACED_END_SEGMENT, last);
    put_u32(&mut snap.blob, placed_at + PLACED_NEXT_SEGMENT, next);
    snap.write(&dev);
    checkpoint_first_then_crash(&dev, n, seqs[0][0]);
}

/// Open the forged image, checkpoint stream 0's first transaction, crash, reopen: every later
/// durable transaction of stream 0 must still be there, and the forged state was not trusted.
fn checkpoint_first_then_crash(dev: &Arc<MemDevice>, n: usize, first: u64) {
    let (log, r) = open(dev).unwrap();
    let restored = r.snapshot.is_some();
    log.checkpoint(0, first).unwrap();
    drop(log); // crash
    let (_log, r) = open(dev).unwrap();
    assert_eq!(tags(&r, 0), expected(n)[1..], "durable transactions after the checkpoint");
    assert_eq!(tags(&r, 1), ["s1-0"]);
    assert!(!restored, "the forged stream state was trusted");
}

/// The limit docs/FORMAT.md states ("What the snapshot checks cannot catch"): a snapshot
/// forged consistently (crcs recomputed, a stream state that passes every check) is trusted,
/// since the crcs are keyed only by the uuid in the superblock. Here the payload of the layer
/// above is replaced: the open restores from the snapshot and hands the forged payload back.
#[test]
fn a_consistently_forged_snapshot_is_trusted_as_documented() {
    let (dev, _) = closed_cleanly(5, 1);
    let mut snap = Snap::read(&dev);
    let state_len = u64::from_le_bytes(snap.blob[..8].try_into().unwrap()) as usize;
    snap.blob.truncate(8 + state_len);
    snap.blob.extend_from_slice(b"another file system");
    snap.write(&dev);
    let (_log, r) = open(&dev).unwrap();
    assert_eq!(r.snapshot.as_deref(), Some(&b"another file system"[..]));
}

/// Stream 1's chain forged to begin with stream 0's first segment: trusted, both streams'
/// checkpoints released that segment, and `space.rs` asserted ("released twice").
#[test]
fn snapshot_chains_shared_by_two_streams_are_refused() {
    let (dev, [s0, s1]) = closed_cleanly(70, 3);
    let mut snap = Snap::read(&dev);
    let (chain0_at, _, _) = snap.stream(0);
    let shared = get_u32(&snap.blob, chain0_at);
    let (chain1_at, chain1_len, _) = snap.stream(1);
    assert_eq!(chain1_len, 1);
    // Stream 1's chain becomes [shared, its own segment]: same length in bytes if its one
    // segment moves back by one entry, so rebuild the state around it.
    let own = get_u32(&snap.blob, chain1_at);
    let mut blob = snap.blob[..chain1_at - 4].to_vec();
    blob.extend_from_slice(&2u32.to_le_bytes());
    blob.extend_from_slice(&shared.to_le_bytes());
    blob.extend_from_slice(&own.to_le_bytes());
    blob.extend_from_slice(&snap.blob[chain1_at + 4..]);
    let state_len = u64::from_le_bytes(blob[..8].try_into().unwrap()) + 4;
    put_u64(&mut blob, 0, state_len);
    snap.blob = blob;
    snap.write(&dev);

    let (log, r) = open(&dev).unwrap();
    let restored = r.snapshot.is_some();
    log.checkpoint(0, *s0.last().unwrap()).unwrap();
    log.checkpoint(1, *s1.last().unwrap()).unwrap();
    drop(log);
    let (_log, r) = open(&dev).unwrap();
    assert!(r.streams.iter().all(|s| s.txs.is_empty()), "everything was checkpointed");
    assert!(!restored, "the forged stream state was trusted");
}

/// Both superblock copies forged so that stream 1's checkpoint segment is stream 0's: trusted,
/// stream 1 wrote its transactions over stream 0's durable ones.
#[test]
fn superblock_roots_shared_by_two_streams_are_refused() {
    let dev = with_transactions(3);
    for (mut sb, block) in superblocks(&dev) {
        sb.streams[1].checkpoint_segment = sb.streams[0].checkpoint_segment;
        sb.streams[1].checkpoint_offset = sb.streams[0].checkpoint_offset;
        write_block(&dev, block, &sb.encode());
    }
    match open(&dev) {
        Err(e) => eprintln!("refused: {e}"),
        Ok((log, r)) => {
            let kept = tags(&r, 0);
            commit(&log, 1, "over").unwrap();
            drop(log);
            let (_log, r) = open(&dev).unwrap();
            assert_eq!(tags(&r, 0), kept, "stream 1 overwrote stream 0");
            assert_eq!(kept, expected(3), "stream 0's durable transactions");
        }
    }
}

/// Stream 0's units in its second segment forged (crcs recomputed) to name stream 1's segment
/// as the one their chain continues in: recovery must not hand one segment to two streams
/// (stream 0 would write over stream 1's durable transactions, and both streams' checkpoints
/// would release it: `space.rs`'s "released twice"). It refuses with a typed error naming the
/// stream and the segment, and writes nothing: no seal, no superblock.
#[test]
fn units_that_lead_a_chain_into_another_streams_segment_are_refused() {
    let dev = image();
    let (log, _) = open(&dev).unwrap();
    // Stream 0 fills segment 0 and goes on in segment 1; stream 1 writes in segment 2.
    for i in 0..70 {
        commit(&log, 0, &format!("s0-{i}")).unwrap();
    }
    for i in 0..3 {
        commit(&log, 1, &format!("s1-{i}")).unwrap();
    }
    drop(log);
    let (sb, _) = winner(&dev);
    let theirs = sb.streams[1].checkpoint_segment;
    let mut forged_count = 0;
    for b in 0..u64::from(SEGMENT_BLOCKS) {
        let at = sb.segment_start(1) + b;
        let block = read_block(&dev, at);
        let Ok((h, payload)) = UnitHeader::decode(&UUID, &block, at, true) else { continue };
        if h.stream != 0 {
            continue;
        }
        let mut forged = vec![0u8; BS];
        UnitHeader { next_segment: theirs, ..h }.encode_into(&UUID, payload, &mut forged);
        write_block(&dev, at, &forged);
        forged_count += 1;
    }
    assert!(forged_count > 0, "stream 0 has units in segment 1");
    let before = dev.image();
    match open(&dev) {
        Err(LogError::Corrupted { what, block, reason }) => {
            eprintln!("refused: {what} at {block}: {reason}");
            assert_eq!(block, sb.segment_start(theirs), "the block of the shared segment");
            let segment = format!("segment {theirs} ");
            assert!(reason.contains(&segment), "names the segment: {reason}");
            assert!(reason.contains("stream 0") && reason.contains("stream 1"), "{reason}");
        }
        Err(e) => panic!("not refused as corruption: {e}"),
        Ok((_log, r)) => panic!("stream 0's chain led into stream 1's segment: {:?}", tags(&r, 1)),
    }
    assert_unchanged(&dev, &before);
}

/// Nothing on `dev` differs from `before`: a refused recovery wrote nothing.
fn assert_unchanged(dev: &MemDevice, before: &Image) {
    let after = dev.image();
    let changed: Vec<u64> = (0..BLOCKS).filter(|&b| before.block(b) != after.block(b)).collect();
    assert!(changed.is_empty(), "a refused recovery wrote blocks {changed:?}");
}

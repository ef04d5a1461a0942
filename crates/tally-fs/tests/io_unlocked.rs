//! No device I/O under the file-system-wide state lock (issue 16 item 1): while a read of the
//! device is stuck, operations on other files go on. A partial-block write reads the block's
//! old bytes with the lock dropped and uses them only if the block is still the one read;
//! fsck reads data blocks against a copy of the block maps; the write-out of data held in
//! memory past the cache limit follows the commit, and its failure is not the operation's.
//!
//! A commit's device submission happens with the lock given up too: while one is held at the
//! device, operations on other files go on.
//!
//! The device here can hold one read, or one submission, until released, and fail flushes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use tally_fs::{Fs, FsError, MkfsOptions, MountOptions, Owner, ROOT};
use tally_media::{Device, DeviceStats, Geometry, MediaError, MemDevice, Ticket, Write};

const ME: Owner = Owner { uid: 1000, gid: 1000 };
const BS: usize = 4096;
/// Longest an operation that must not wait for the stuck read may take.
const PROMPT: Duration = Duration::from_secs(5);

/// A memory device whose reads can be held: once armed, the next read waits (and says it
/// is waiting) until released.
struct Gate {
    inner: MemDevice,
    armed: AtomicBool,
    /// The next submission waits, as an armed read does.
    armed_submit: AtomicBool,
    /// The next flush waits, as an armed read does.
    armed_flush: AtomicBool,
    /// (a read or submission is waiting, released)
    state: Mutex<(bool, bool)>,
    cv: Condvar,
    fail_flush: AtomicBool,
    flushes: AtomicU64,
}

impl Gate {
    fn new(blocks: u64) -> Arc<Gate> {
        Arc::new(Gate {
            inner: MemDevice::new(BS as u32, blocks).unwrap(),
            armed: AtomicBool::new(false),
            armed_submit: AtomicBool::new(false),
            armed_flush: AtomicBool::new(false),
            state: Mutex::new((false, false)),
            cv: Condvar::new(),
            fail_flush: AtomicBool::new(false),
            flushes: AtomicU64::new(0),
        })
    }

    fn arm(&self) {
        *self.state.lock().unwrap() = (false, false);
        self.armed.store(true, Ordering::SeqCst);
    }

    fn arm_submit(&self) {
        *self.state.lock().unwrap() = (false, false);
        self.armed_submit.store(true, Ordering::SeqCst);
    }

    fn arm_flush(&self) {
        *self.state.lock().unwrap() = (false, false);
        self.armed_flush.store(true, Ordering::SeqCst);
    }

    /// Wait until an armed read is held.
    fn held(&self) {
        let g = self.state.lock().unwrap();
        let (g, t) = self.cv.wait_timeout_while(g, PROMPT, |s| !s.0).unwrap();
        assert!(!t.timed_out() && g.0, "no read reached the device");
    }

    /// Say an armed call is waiting, and wait until released.
    fn hold(&self) {
        let mut g = self.state.lock().unwrap();
        g.0 = true;
        self.cv.notify_all();
        while !g.1 {
            g = self.cv.wait(g).unwrap();
        }
    }

    fn release(&self) {
        self.state.lock().unwrap().1 = true;
        self.cv.notify_all();
    }
}

impl Device for Gate {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn read(&self, block: u64, buf: &mut [u8]) -> tally_media::Result<()> {
        if self.armed.swap(false, Ordering::SeqCst) {
            self.hold();
        }
        self.inner.read(block, buf)
    }
    fn submit(
        &self,
        writes: Vec<Write>,
        flags: tally_media::WriteFlags,
    ) -> tally_media::Result<Ticket> {
        if self.armed_submit.swap(false, Ordering::SeqCst) {
            self.hold();
        }
        self.inner.submit(writes, flags)
    }
    fn wait(&self, ticket: Ticket) -> tally_media::Result<()> {
        self.inner.wait(ticket)
    }
    fn flush(&self) -> tally_media::Result<()> {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        if self.armed_flush.swap(false, Ordering::SeqCst) {
            self.hold();
        }
        if self.fail_flush.load(Ordering::SeqCst) {
            return Err(MediaError::Io { op: "flush", source: std::io::Error::other("injected") });
        }
        self.inner.flush()
    }
    fn stats(&self) -> DeviceStats {
        self.inner.stats()
    }
}

fn mount(gate: &Arc<Gate>) -> Arc<Fs> {
    mount_with(gate, MountOptions::default())
}

fn mount_with(gate: &Arc<Gate>, opts: MountOptions) -> Arc<Fs> {
    let dev: Arc<dyn Device> = gate.clone();
    Fs::mkfs(dev.clone(), &MkfsOptions { segment_blocks: 256, ..MkfsOptions::default() }).unwrap();
    Arc::new(Fs::mount(dev, opts).unwrap())
}

/// Run `f` on another thread and fail if it takes longer than [`PROMPT`].
fn promptly<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(PROMPT)
        .unwrap_or_else(|_| panic!("{what} waited for a device call held by another thread"))
}

/// While a device call is held: a getattr of `f`, a whole-block write of `tag`s to `g` and a
/// create of `h` in the root each finish promptly. Returns `h`.
fn others_go_on(fs: &Arc<Fs>, f: u64, g: u64, tag: u8) -> u64 {
    let fs2 = fs.clone();
    promptly("getattr", move || fs2.getattr(f).unwrap());
    let fs2 = fs.clone();
    promptly("a write to another file", move || fs2.write(None, g, 0, &[tag; BS]).unwrap());
    let fs2 = fs.clone();
    promptly("a create", move || fs2.create(None, ROOT, b"h", 0o644, ME).unwrap().ino)
}

/// A file with one durable block (its bytes no longer in memory, so a partial write must
/// read them from the device).
fn durable_file(fs: &Fs, name: &[u8], tag: u8) -> u64 {
    let ino = fs.create(None, ROOT, name, 0o644, ME).unwrap().ino;
    fs.write(None, ino, 0, &[tag; BS]).unwrap();
    fs.fsync(ino).unwrap();
    ino
}

#[test]
fn a_partial_write_reads_its_block_without_holding_others_up() {
    let gate = Gate::new(8192);
    let fs = mount(&gate);
    let f = durable_file(&fs, b"f", 1);
    let g = durable_file(&fs, b"g", 2);
    gate.arm();
    let writer = {
        let fs = fs.clone();
        std::thread::spawn(move || fs.write(None, f, 10, b"partial").unwrap())
    };
    gate.held();
    // The partial write is waiting for its block's old bytes: everything else goes on.
    others_go_on(&fs, f, g, 3);
    gate.release();
    assert_eq!(writer.join().unwrap(), 7);
    let mut want = vec![1u8; BS];
    want[10..17].copy_from_slice(b"partial");
    assert_eq!(fs.read(f, 0, BS).unwrap(), want);
    assert!(fs.fsck().is_clean(), "{:?}", fs.fsck().problems);
}

/// A write's commit is placed under the state lock and submitted to the device after it is
/// given up (`Log::commit_deferred`, `Fs::submit_deferred`): while that submission is held
/// at the device, operations on this file and others go on. Before, the submission happened
/// inside the commit, under the lock, and every one of them waited for it.
#[test]
fn a_commits_submission_holds_no_one_up() {
    let gate = Gate::new(8192);
    let fs = mount(&gate);
    let f = fs.create(None, ROOT, b"f", 0o644, ME).unwrap().ino;
    let g = fs.create(None, ROOT, b"g", 0o644, ME).unwrap().ino;
    gate.arm_submit();
    let writer = {
        let fs = fs.clone();
        std::thread::spawn(move || fs.write(None, f, 0, &[1; BS]).unwrap())
    };
    gate.held();
    others_go_on(&fs, f, g, 2);
    gate.release();
    assert_eq!(writer.join().unwrap(), BS);
    fs.fsync(f).unwrap();
    fs.fsync(g).unwrap();
    assert_eq!(fs.read(f, 0, BS).unwrap(), vec![1u8; BS]);
    assert_eq!(fs.read(g, 0, BS).unwrap(), vec![2u8; BS]);
    assert!(fs.fsck().is_clean(), "{:?}", fs.fsck().problems);
}

/// The block changes while the partial write reads its old bytes: the write is retried on
/// the new block (as if it came after the overwrite), never merged into stale bytes.
#[test]
fn a_block_changed_during_the_read_is_read_again() {
    let gate = Gate::new(8192);
    let fs = mount(&gate);
    let f = durable_file(&fs, b"f", 1);
    gate.arm();
    let writer = {
        let fs = fs.clone();
        std::thread::spawn(move || fs.write(None, f, 100, b"late").unwrap())
    };
    gate.held();
    let fs2 = fs.clone();
    promptly("an overwrite of the block being read", move || {
        fs2.write(None, f, 0, &[9; BS]).unwrap();
        fs2.sync().unwrap(); // durable: its bytes leave memory, so the retry reads again
    });
    gate.release();
    writer.join().unwrap();
    let mut want = vec![9u8; BS];
    want[100..104].copy_from_slice(b"late");
    assert_eq!(fs.read(f, 0, BS).unwrap(), want, "merged into the bytes before the overwrite");
}

#[test]
fn fsck_reads_data_blocks_without_holding_operations_up() {
    let gate = Gate::new(8192);
    let fs = mount(&gate);
    let f = durable_file(&fs, b"f", 1);
    gate.arm();
    let checker = {
        let fs = fs.clone();
        std::thread::spawn(move || fs.fsck())
    };
    gate.held();
    let fs2 = fs.clone();
    promptly("a write during fsck", move || fs2.write(None, f, 0, &[5; BS]).unwrap());
    let fs2 = fs.clone();
    promptly("an unlink during fsck", move || fs2.create(None, ROOT, b"x", 0o644, ME).unwrap());
    gate.release();
    let report = checker.join().unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    assert_eq!(report.data_blocks, 1);
}

/// The write that takes the data held in memory past the cache limit is committed before
/// the write-out; a failing flush there makes the file system read-only, but that write
/// returns what it wrote (it was an error before, for a write that had committed). The same
/// for the checkpoint snapshot due after 64 MiB of log (the replay budget), whose failing
/// flush deadlocked the operation (its error path took the state lock again).
#[test]
fn a_failed_write_out_is_not_the_committed_writes_error() {
    for budget in [Some(0), None] {
        let gate = Gate::new(40_000);
        let fs =
            mount_with(&gate, MountOptions { replay_budget: budget, ..MountOptions::default() });
        let f = fs.create(None, ROOT, b"big", 0o644, ME).unwrap().ino;
        gate.fail_flush.store(true, Ordering::SeqCst);
        let chunk = vec![7u8; 256 << 10];
        // 64 MiB is the limit: the write crossing it is among these.
        let mut stopped = false;
        for i in 0..(80u64 << 20) / chunk.len() as u64 {
            let fs2 = fs.clone();
            let part = chunk.clone();
            match promptly("a write", move || fs2.write(None, f, i * part.len() as u64, &part)) {
                Ok(n) => assert_eq!(n, chunk.len()),
                Err(FsError::ReadOnly { .. }) => {
                    // The cache limit counts data (64 MiB); the replay budget the log's blocks,
                    // the writes' records with their data.
                    let least = if budget.is_some() { 64 << 20 } else { 60 << 20 };
                    assert!(i * chunk.len() as u64 >= least, "{budget:?}: read-only after {i}");
                    assert!(gate.flushes.load(Ordering::Relaxed) > 0);
                    stopped = true;
                    break;
                }
                Err(e) => panic!("budget {budget:?}, write {i}: {e}"),
            }
        }
        assert!(stopped, "budget {budget:?}: the failed write-out did not stop the file system");
    }
}

/// Past the cache limit, the writer whose stream holds the data pays for it (issue 16): while
/// a file streaming writes waits for the write-out of its 64 MiB (its flush held at the
/// device), a 4 KiB write to a file on another stream, and a create, go on. Before, every
/// operation past the limit wrote out and waited for all of the data held.
#[test]
fn a_light_writer_does_not_wait_for_a_heavy_ones_cache() {
    let gate = Gate::new(60_000);
    let fs =
        mount_with(&gate, MountOptions { replay_budget: Some(1 << 40), ..MountOptions::default() });
    let big = fs.create(None, ROOT, b"big", 0o644, ME).unwrap().ino;
    let small = fs.create(None, ROOT, b"small", 0o644, ME).unwrap().ino;
    let mib = vec![7u8; 1 << 20];
    for i in 0..63u64 {
        fs.write(None, big, i << 20, &mib).unwrap();
    }
    gate.arm_flush();
    let streamer = {
        let fs = fs.clone();
        let mib = mib.clone();
        std::thread::spawn(move || {
            for i in 63..66u64 {
                fs.write(None, big, i << 20, &mib).unwrap();
            }
        })
    };
    gate.held();
    let fs2 = fs.clone();
    promptly("a small write beside the write-out", move || {
        for i in 0..8u64 {
            fs2.write(None, small, i * BS as u64, &[3; BS]).unwrap();
        }
    });
    let fs2 = fs.clone();
    promptly("a create beside the write-out", move || {
        fs2.create(None, ROOT, b"h", 0o644, ME).unwrap();
    });
    gate.release();
    streamer.join().unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.read(small, 0, 8 * BS).unwrap(), vec![3u8; 8 * BS]);
    assert_eq!(fs.read(big, 65 << 20, 1 << 20).unwrap(), mib);
    assert!(fs.fsck().is_clean(), "{:?}", fs.fsck().problems);
}

/// A checkpoint snapshot is written with the state lock given up (issue 16 item 1): while its
/// write is held at the device, operations on other files go on; they follow the positions the
/// checkpoint took, so a crash after it replays them on top of it. Before, the snapshot's
/// encoding, write, flush and superblock write all held the lock.
#[test]
fn a_checkpoints_snapshot_write_holds_no_one_up() {
    let gate = Gate::new(8192);
    let fs = mount_with(&gate, MountOptions { replay_budget: Some(0), ..MountOptions::default() });
    let f = durable_file(&fs, b"f", 1);
    let g = durable_file(&fs, b"g", 2);
    // Everything durable: the first submission of the checkpoint is its snapshot's write.
    fs.sync().unwrap();
    gate.arm_submit();
    let checkpointer = {
        let fs = fs.clone();
        std::thread::spawn(move || fs.checkpoint().unwrap())
    };
    gate.held();
    let h = others_go_on(&fs, f, g, 3);
    gate.release();
    assert!(checkpointer.join().unwrap(), "the checkpoint was not written");
    fs.sync().unwrap();
    assert!(fs.fsck().is_clean(), "{:?}", fs.fsck().problems);
    // A crash: no unmount. The mount starts from the checkpoint and replays what followed.
    drop(fs);
    let dev: Arc<dyn Device> = gate.clone();
    let fs = Fs::mount(dev, MountOptions::default()).unwrap();
    assert!(fs.mount_report().from_checkpoint, "{:?}", fs.mount_report());
    assert_eq!(fs.read(f, 0, BS).unwrap(), vec![1u8; BS]);
    assert_eq!(fs.read(g, 0, BS).unwrap(), vec![3u8; BS], "the write during the checkpoint");
    assert_eq!(fs.lookup(ROOT, b"h").unwrap().ino, h, "the create during the checkpoint");
    assert!(fs.fsck().is_clean(), "{:?}", fs.fsck().problems);
}

//! FUSE over io_uring (Linux 6.14 and later, `CONFIG_FUSE_IO_URING`, the `fuse` module's
//! `enable_uring` parameter on): the kernel hands requests to ring entries the daemon
//! registered, one queue per possible CPU, instead of through `read`/`write` on `/dev/fuse`.
//!
//! Hand-written on the `io-uring` crate because fuser (0.18) has no such transport and keeps
//! its request and reply types private, and no maintained crate offers one that a fuser
//! session can use: `fractal-fuse` has the transport but is a whole FUSE library of its own
//! (its own mount, an async trait on the compio runtime), so adopting it would replace fuser
//! for both transports. The protocol is the kernel's (`fs/fuse/dev_uring.c`,
//! `include/uapi/linux/fuse.h`):
//!
//! - after `INIT` (answered on `/dev/fuse`, with `FUSE_OVER_IO_URING` taken), each entry is
//!   registered with `FUSE_IO_URING_CMD_REGISTER`: an `IORING_OP_URING_CMD` on a 128-byte SQE
//!   whose command area holds `struct fuse_uring_cmd_req` (flags, commit id, queue id) and
//!   whose `addr`/`len` give two iovecs: the header buffer and the payload buffer;
//! - the kernel uses the ring only once every queue has an entry; until then, and always for
//!   `FORGET` and `INTERRUPT`, requests still come through `/dev/fuse` (fuser's loop keeps
//!   serving them), and notifications still go out through it;
//! - a request arrives as the completion of an entry's command, in that entry's buffers
//!   (`ring/wire.rs`); the answer is written into the same buffers and sent with
//!   `FUSE_IO_URING_CMD_COMMIT_AND_FETCH` (commit id = the request's `unique`), which also
//!   hands the entry back for the next request;
//! - the kernel completes a command the entry must run in the task that submitted it, so each
//!   thread owns its io_uring and registers its own entries;
//! - at unmount (or abort) the kernel completes every command with `-ENOTCONN`: a thread ends
//!   when all its entries are ended;
//! - each thread runs on its queue's CPU where it may (as libfuse's do), and sleeps between
//!   requests. The kernel hands a request to the queue entry committed last (its list of
//!   available entries is last in, first out), on the queue of the caller's CPU, so a caller
//!   issuing one request at a time and the thread answering it can hand that CPU to each
//!   other with no inter-processor interrupt. The answer's wake-up would still move the
//!   caller to an idle CPU (the thread is running when it commits); a thread therefore waits
//!   for requests at `SCHED_IDLE` when no other request is being served, and serves them at
//!   its normal policy (`ring/handoff.rs`). Polling for the next request instead of sleeping
//!   was tried and lost (docs/bench/mount.md, "polling the ring's queues"): a thread polling
//!   on the caller's CPU keeps the caller off it, and one polling on another CPU makes every
//!   answer wake the caller across CPUs — untar and rm -rf 4-5x slower on a 2-vCPU VM.
//!
//! Invariants: an entry's buffers never move while registered (boxed or mapped, never resized); an
//! entry always has exactly one command with the kernel or is ended; answers are written only
//! while the entry is the daemon's (between a completion and its commit).

mod dispatch;
mod handoff;
pub(crate) mod wire;

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use io_uring::{cqueue, opcode, squeue::Entry128, types, IoUring};

use crate::adapter::TallyFuse;
use wire::HEADER_SIZE;

/// `/dev/fuse` threads while the ring serves: it carries only `FORGET` and `INTERRUPT` then
/// (and the few requests sent before every queue had entries).
pub(crate) const DEV_FUSE_THREADS_BESIDE_RING: usize = 1;

/// How long that thread rests after forgets before it reads again. The kernel queues a
/// `FORGET` for each inode it drops (one per entry of an `rm -rf`) and wakes a reader waiting
/// on `/dev/fuse` for each; woken on another CPU, as the scheduler mostly places it, each
/// wake cost the caller an inter-processor interrupt: about 15 us more per create+unlink on
/// a 2-vCPU VM (docs/bench/mount.md). A resting reader is not waiting, so the forgets queue
/// without a wake and the next read takes them in one `BATCH_FORGET`; an `INTERRUPT` waits
/// this long at most.
pub(crate) const FORGET_REST: Duration = Duration::from_millis(2);

/// `FUSE_IO_URING_CMD_REGISTER`.
const CMD_REGISTER: u32 = 1;
/// `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`.
const CMD_COMMIT_AND_FETCH: u32 = 2;

/// How the ring is laid out.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    /// Queues: the kernel's number of possible CPUs (it queues a request on the queue of the
    /// CPU its caller runs on).
    pub queue_count: u16,
    /// Threads per queue, one entry each: a request that waits (an `fsync`, a transaction)
    /// holds one thread, and the queue's other requests go to the others. The kernel never
    /// moves a request to another queue, so a queue needs as many entries as its CPU's
    /// callers may have waiting at once: varmail's 16 threads on 2 CPUs went from 0.37x to
    /// 0.73x ext4's operations/s between 2 and 16 a queue (docs/bench/mount.md).
    pub threads_per_queue: u16,
    /// Bytes of each entry's payload buffer: at least the kernel's largest request or answer
    /// (`max(max_write, max_pages × page size)`), or registration fails.
    pub payload_size: usize,
    /// Commit answers with the CPU handed to the caller (`ring/handoff.rs`; `-o
    /// cpu_handoff=on|off`), where the process may.
    pub handoff: bool,
}

impl Layout {
    /// The layout for this machine: `threads` as `MountConfig::threads` asks, spread over
    /// the queues (at least two a queue on a small machine, at most
    /// [`THREADS_PER_QUEUE_MAX`]), and payloads for `max_write`.
    pub(crate) fn for_machine(threads: usize, max_write: u32, handoff: bool) -> Layout {
        // SAFETY: sysconf has no preconditions. The kernel has one queue per possible CPU;
        // _SC_NPROCESSORS_CONF counts those configured (libfuse uses the same).
        let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
        let queue_count = u16::try_from(cpus).ok().filter(|&n| n > 0).unwrap_or(1);
        let per_queue = threads_per_queue(threads, queue_count);
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
            .ok()
            .filter(|&p| p > 0)
            .unwrap_or(4096);
        let limit_pages = std::fs::read_to_string("/proc/sys/fs/fuse/max_pages_limit")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .unwrap_or(256);
        let payload_size = usize::try_from(max_write)
            .unwrap_or(usize::MAX)
            .max(limit_pages.saturating_mul(page))
            .max(8192);
        let handoff = handoff && handoff::available();
        if !handoff {
            tracing::debug!("ring threads answer without handing their CPU to the caller");
        }
        Layout { queue_count, threads_per_queue: per_queue, payload_size, handoff }
    }
}

/// Most threads (entries) a queue gets: each holds a payload buffer of `max_write` or more
/// (virtual memory, touched only as far as requests fill it) and a thread's stack.
pub(crate) const THREADS_PER_QUEUE_MAX: u16 = 16;

/// `threads` spread over `queue_count` queues: at least 2 a queue up to 4 queues (a waiting
/// request must leave one for the rest), 1 beyond, at most [`THREADS_PER_QUEUE_MAX`].
fn threads_per_queue(threads: usize, queue_count: u16) -> u16 {
    let floor = if queue_count <= 4 { 2 } else { 1 };
    let per_queue = threads.div_ceil(usize::from(queue_count.max(1)));
    u16::try_from(per_queue).unwrap_or(u16::MAX).clamp(floor, THREADS_PER_QUEUE_MAX)
}

/// Start the ring: `fd` is the session's `/dev/fuse` (a duplicate), after an `INIT` that took
/// `FUSE_OVER_IO_URING`. Returns the threads, which end at unmount.
///
/// # Errors
/// A thread could not start (those started end at unmount all the same).
pub(crate) fn start(
    ops: Arc<TallyFuse>,
    fd: OwnedFd,
    layout: Layout,
) -> io::Result<Vec<JoinHandle<()>>> {
    let fd = Arc::new(fd);
    let serving = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut threads = Vec::new();
    for qid in 0..layout.queue_count {
        for t in 0..layout.threads_per_queue {
            let (ops, fd, serving) = (ops.clone(), fd.clone(), serving.clone());
            let name = format!("tally-ring-{qid}.{t}");
            threads.push(
                std::thread::Builder::new()
                    .name(name)
                    .spawn(move || serve_queue(&ops, &fd, qid, layout, serving))?,
            );
        }
    }
    tracing::info!(
        queues = layout.queue_count,
        threads_per_queue = layout.threads_per_queue,
        payload_kib = layout.payload_size / 1024,
        handoff = layout.handoff,
        "FUSE over io_uring: a thread and ring entry per queue slot started"
    );
    Ok(threads)
}

/// One ring entry: its two buffers and the iovecs that name them to the kernel.
struct Slot {
    header: Box<[u8; HEADER_SIZE]>,
    payload: Payload,
    iov: Box<[libc::iovec; 2]>,
}

impl Slot {
    fn new(payload_size: usize) -> io::Result<Slot> {
        let mut header = Box::new([0u8; HEADER_SIZE]);
        let mut payload = Payload::map(payload_size)?;
        let iov = Box::new([
            libc::iovec { iov_base: header.as_mut_ptr().cast(), iov_len: HEADER_SIZE },
            libc::iovec { iov_base: payload.as_mut_ptr().cast(), iov_len: payload.len() },
        ]);
        Ok(Slot { header, payload, iov })
    }
}

/// An entry's payload buffer (`max_write`: 16 MiB), mapped for it alone: its pages stay the
/// kernel's zero page until a request fills them, so it costs what requests use of it. From
/// the allocator it did not always: a buffer below glibc's (dynamic) mmap threshold comes
/// from the thread's arena, which zeroes it whole — 12 of 32 entries held 16 MiB resident
/// each, 220 MB for an idle mount.
struct Payload {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

impl Payload {
    fn map(len: usize) -> io::Result<Payload> {
        // SAFETY: a new private anonymous mapping at an address the kernel picks: it aliases
        // nothing; the result is checked before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = std::ptr::NonNull::new(p.cast::<u8>())
            .ok_or_else(|| io::Error::other("mmap returned a null mapping"))?;
        Ok(Payload { ptr, len })
    }
}

impl std::ops::Deref for Payload {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` is a live mapping of `len` readable bytes (zero until written) until
        // drop, and borrows of `self` bound the slice's life.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for Payload {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes this the only borrow.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Payload {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once; no borrow of it outlives `self`.
        // A slot the kernel may still hold is leaked, never dropped (`serve_queue`).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// The command for one entry: `struct fuse_uring_cmd_req` is flags (u64), commit id (u64),
/// queue id (u16), padding.
fn command(fd: i32, op: u32, qid: u16, commit_id: u64, slot: &Slot, user_data: u64) -> Entry128 {
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
    let iov_addr = slot.iov.as_ptr() as u64;
    let sqe = opcode::UringCmd80::new(types::Fd(fd), op)
        .cmd(cmd)
        .addr(Some(iov_addr))
        .build()
        .user_data(user_data);
    with_len(sqe, 2)
}

const _: () = assert!(std::mem::size_of::<Entry128>() == 128);

/// Set the SQE's `len` (the io-uring crate's `UringCmd80` has no setter for it; the kernel
/// reads the iovec count of `FUSE_IO_URING_CMD_REGISTER` there).
fn with_len(sqe: Entry128, len: u32) -> Entry128 {
    // SAFETY: `Entry128` is `repr(C)`: the kernel's 64-byte `struct io_uring_sqe` followed by
    // the 64 extra bytes of a 128-byte SQE, integers only, no drop glue, so its bytes can be
    // taken and any bytes make a valid one. `len` is the u32 at byte 24 of `io_uring_sqe`
    // (kernel ABI).
    let mut bytes: [u8; 128] = unsafe { std::mem::transmute::<Entry128, [u8; 128]>(sqe) };
    bytes[24..28].copy_from_slice(&len.to_ne_bytes());
    // SAFETY: as above.
    unsafe { std::mem::transmute::<[u8; 128], Entry128>(bytes) }
}

/// Serve queue `qid` with one entry until the kernel ends it.
fn serve_queue(
    ops: &TallyFuse,
    fd: &OwnedFd,
    qid: u16,
    layout: Layout,
    serving: Arc<std::sync::atomic::AtomicUsize>,
) {
    // The kernel queues a request on the queue of its caller's CPU: a thread on that CPU is
    // woken there, its caller's data still in the CPU's cache (untar 0.73x the time of
    // unpinned threads, docs/bench/posix.md). Where the daemon may not run on that CPU, the
    // thread runs anywhere.
    if !pin_to(qid) {
        tracing::debug!(qid, "ring thread not pinned to its queue's CPU");
    }
    let mut slot = match Slot::new(layout.payload_size) {
        Ok(slot) => Box::new(slot),
        Err(e) => {
            tracing::error!(qid, "FUSE over io_uring: no payload buffer for an entry: {e}");
            return;
        }
    };
    let handoff = handoff::Handoff::new(layout.handoff, serving);
    match serve_entry(ops, fd.as_raw_fd(), qid, &mut slot, handoff) {
        Ok(()) => drop(slot),
        Err(e) => {
            // The kernel may still hold the entry's buffers (its command was not ended):
            // they are left allocated rather than freed under it.
            Box::leak(slot);
            tracing::error!(qid, "FUSE over io_uring queue stopped: {e}");
        }
    }
}

/// Register `slot` on queue `qid` and answer the requests it receives until the kernel ends
/// it (`Ok`), or a command fails otherwise (`Err`; the entry may still be the kernel's).
/// `handoff` says when an answer is committed with the CPU handed to its caller.
fn serve_entry(
    ops: &TallyFuse,
    fd: i32,
    qid: u16,
    slot: &mut Slot,
    mut handoff: handoff::Handoff,
) -> io::Result<()> {
    let mut ring: IoUring<Entry128, cqueue::Entry> = IoUring::builder().build(2)?;
    let mut last = command(fd, CMD_REGISTER, qid, 0, slot, 0);
    push(&mut ring, &last)?;
    let mut again_count = 0u32;
    loop {
        handoff.before_wait(qid);
        let waited = ring.submit_and_wait(1);
        handoff.after_wait(qid);
        match waited {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => return Err(e),
        }
        let completions: Vec<i32> = ring.completion().map(|c| c.result()).collect();
        for result in completions {
            if result < 0 {
                match -result {
                    // Not yet (the kernel initialises the connection), or interrupted: again,
                    // a bounded number of times.
                    libc::EAGAIN | libc::EINTR if again_count < 1000 => {
                        again_count += 1;
                        std::thread::sleep(Duration::from_millis(1));
                        push(&mut ring, &last)?;
                    }
                    // The connection ended: unmount, abort, or the daemon's own teardown.
                    libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED | libc::ENODEV => {
                        tracing::debug!(qid, "ring entry ended");
                        return Ok(());
                    }
                    errno => {
                        return Err(io::Error::other(format!(
                            "the kernel refused a ring command: {}",
                            io::Error::from_raw_os_error(errno)
                        )));
                    }
                }
                continue;
            }
            again_count = 0;
            handoff.serving();
            let served = dispatch::serve(ops, &mut slot.header, &mut slot.payload);
            handoff.served();
            let Some(commit_id) = served else {
                return Err(io::Error::other("a ring request without its commit id"));
            };
            last = command(fd, CMD_COMMIT_AND_FETCH, qid, commit_id, slot, 0);
            push(&mut ring, &last)?;
        }
    }
}

/// Run the calling thread on CPU `cpu` only; false (nothing changed) if the thread may not
/// run there now (a cpuset, an offline CPU) or the kernel refuses.
fn pin_to(cpu: u16) -> bool {
    let cpu = usize::from(cpu);
    if cpu >= libc::CPU_SETSIZE as usize {
        return false;
    }
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: a zeroed cpu_set_t is an empty set; `cpu` is below CPU_SETSIZE, so CPU_SET and
    // CPU_ISSET stay inside it; both calls get the set's real size.
    unsafe {
        let mut allowed: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size, &mut allowed) != 0 || !libc::CPU_ISSET(cpu, &allowed) {
            return false;
        }
        let mut only: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut only);
        libc::sched_setaffinity(0, size, &only) == 0
    }
}

/// Queue one command (the queue has room: each entry has at most one command out).
fn push(ring: &mut IoUring<Entry128, cqueue::Entry>, sqe: &Entry128) -> io::Result<()> {
    // SAFETY: the command names the entry's buffers and iovecs, which live (boxed, in the
    // thread's `Slot`) until the thread ends, after the kernel has ended the command.
    let pushed = unsafe { ring.submission().push(sqe) };
    pushed.map_err(|_| io::Error::other("ring submission queue full"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_threads_give_a_small_machine_room_for_waiting_requests() {
        let default = crate::MountConfig::default().threads;
        // Up to 4 CPUs, a queue holds at least 8 requests at once with the defaults (16
        // varmail threads on 2 CPUs: 8 a queue); 2 before, when an fsync or a transaction's
        // waiter held half a queue.
        for queues in 1..=4u16 {
            assert!(threads_per_queue(default, queues) >= 8, "{queues} queues");
        }
        assert_eq!(threads_per_queue(default, 2), 16);
        assert_eq!(threads_per_queue(default, 64), 1);
    }

    /// Pages of `buf` resident in memory (mincore), whole pages it overlaps counted.
    fn resident_pages(buf: &[u8]) -> usize {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap();
        let start = buf.as_ptr() as usize / page * page;
        let len = buf.as_ptr() as usize + buf.len() - start;
        let mut vec = vec![0u8; len.div_ceil(page)];
        // SAFETY: [start, start + len) covers `buf`'s pages, all mapped while `buf` lives; `vec`
        // has a byte per page.
        let r = unsafe { libc::mincore(start as *mut libc::c_void, len, vec.as_mut_ptr()) };
        assert_eq!(r, 0, "mincore: {}", io::Error::last_os_error());
        vec.iter().filter(|&&b| b & 1 != 0).count()
    }

    #[test]
    fn an_idle_entry_holds_no_memory() {
        const SIZE: usize = 16 << 20;
        // As in the daemon: a large buffer freed earlier raises glibc's mmap threshold, and
        // an entry is made on a thread whose arena holds memory used before.
        drop(std::hint::black_box(vec![1u8; 20 << 20]));
        let (mapped, allocated) = std::thread::spawn(|| {
            drop(std::hint::black_box(vec![1u8; SIZE]));
            let mut slot = Slot::new(SIZE).unwrap();
            slot.payload[..5].copy_from_slice(b"fill!");
            let allocated = vec![0u8; SIZE]; // what an entry's buffer was
            (resident_pages(&slot.payload), resident_pages(std::hint::black_box(&allocated)))
        })
        .join()
        .unwrap();
        assert!(mapped <= 1, "{mapped} pages of an idle entry resident");
        // The scenario is the one that cost memory: with glibc the buffer made the old way is
        // resident whole (the arena zeroes reused memory). Other allocators may map afresh.
        if cfg!(target_env = "gnu") {
            assert!(allocated >= SIZE / 4096 / 2, "{allocated} pages: the scenario changed");
        }
    }

    #[test]
    fn threads_per_queue_stays_within_its_bounds() {
        assert_eq!(threads_per_queue(1, 2), 2);
        assert_eq!(threads_per_queue(1, 8), 1);
        assert_eq!(threads_per_queue(9, 4), 3);
        assert_eq!(threads_per_queue(usize::MAX, 1), THREADS_PER_QUEUE_MAX);
        assert_eq!(threads_per_queue(5, 0), 5);
    }
}

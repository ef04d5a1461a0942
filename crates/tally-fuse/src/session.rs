//! Mounting: options, the fuser session, signals, and unmounting a directory.
//!
//! Lifecycle: [`block_termination_signals`] (before any thread starts), mount the file system,
//! [`mount`] it on a directory, then [`Mounted::run`] serves requests on several threads until
//! the kernel ends the connection — after `tally umount`, `umount`, `fusermount3 -u`, or
//! SIGTERM/SIGINT/SIGHUP when [`Mounted::unmount_on_signals`] was called. The file system is
//! then unmounted (snapshot written) before `run` returns.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use fuser::{Config, MountOption, SessionACL};
use tally_fs::Fs;

use crate::adapter::fuser_glue::{FuserGlue, RingThreads};
use crate::adapter::{OutcomeSlot, TallyFuse, Unmounted};
use crate::requests::RequestCounts;
use crate::txns::{FuseMutant, Txns};

/// How to mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountConfig {
    /// Let other users than the one mounting use the mount (`allow_other`).
    pub allow_other: bool,
    /// Threads reading requests from the kernel (through `/dev/fuse`; over io_uring, spread
    /// over the queues, and `/dev/fuse` gets one). A request that waits (an `fsync` for the
    /// device, a request for a transaction's file) holds one, so this bounds how many can
    /// wait at once while the rest are served; [`THREADS_DEFAULT`] by default.
    pub threads: usize,
    /// How long the kernel may trust attributes it was given (`-o attr_timeout=S`). Long:
    /// every change goes through the mount, which tells the kernel what a change makes stale
    /// (the kernel drops it itself, or the adapter notifies it: an abort, privileges dropped
    /// by a write).
    pub attr_timeout: Duration,
    /// How long the kernel may trust a name it looked up (`-o entry_timeout=S`). Long, for
    /// the same reason.
    pub entry_timeout: Duration,
    /// How long the kernel may remember that a name does not exist (`-o negative_timeout=S`;
    /// 0: not at all). Long: a name comes into being only through the kernel (which replaces
    /// its negative entry) or by an abort (which the adapter notifies).
    pub negative_timeout: Duration,
    /// How long a request outside transactions waits for one holding what it changes before
    /// it gets `EBUSY` (`-o txn_wait_ms=N`). Bounded, because a waiting request holds one of
    /// the [`MountConfig::threads`] the transaction's own requests need.
    pub txn_wait: Duration,
    /// A deliberately broken variant of the adapter (needs the `mutants` feature).
    pub mutant: Option<FuseMutant>,
    /// Answer F2FS's atomic-write ioctls (`-o no_atomic_write` to refuse them with `ENOTTY`,
    /// as a file system without them does: SQLite then journals; for comparisons).
    pub atomic_writes: bool,
    /// How often the maintenance thread makes changes durable and cleans.
    pub maintenance_interval: Duration,
    /// How long a change may wait in memory before the log writes it to the device
    /// (`-o commit_ms=N`; write-behind, [`tally_log::WriteBehind`]); zero writes each change
    /// out as it commits. Whoever mounts the [`Fs`] applies it
    /// ([`MountConfig::write_behind`]); it does not make changes durable (`fsync`, `sync`
    /// and the maintenance round do).
    pub commit_interval: Duration,
    /// MiB of log a crash may leave to replay before the file system writes a checkpoint
    /// snapshot (`-o replay_budget_mib=N`; `None`: the library's default,
    /// [`tally_fs::REPLAY_BUDGET_DEFAULT`]; 0: no online checkpoints). Whoever mounts the
    /// [`Fs`] applies it ([`MountConfig::replay_budget`]).
    pub replay_budget_mib: Option<u64>,
    /// The kernel's read-ahead for the mount, in KiB (`-o read_ahead_kb=N`; 0 leaves the
    /// kernel's default, 128). Set through the mount's `/sys/class/bdi/MAJ:MIN/read_ahead_kb`
    /// by [`mount`], once the kernel has taken the daemon's `INIT` reply (a FUSE `INIT` can
    /// only lower it) and before any program can open a file there.
    /// Large, so a sequential read reaches the daemon in requests of `max_pages` (1 MiB) and
    /// the daemon reads the device in runs as large (`tally_fs::Fs::read`).
    pub read_ahead_kb: u32,
    /// Which transport carries requests (`-o io_uring=auto|on|off`): FUSE over io_uring
    /// when the kernel offers it ([`IoUring::Auto`]), or `/dev/fuse` alone.
    pub io_uring: IoUring,
    /// Over io_uring, commit an answer with the CPU handed to its caller (`-o
    /// cpu_handoff=on|off`, on by default): when no other request is being served, the
    /// answering thread commits and waits for its next request at `SCHED_IDLE`, so the kernel
    /// wakes the caller on the same CPU instead of an idle one (`ring/handoff.rs`). Used only
    /// where the process may take the thread back to its normal policy.
    pub cpu_handoff: bool,
    /// Source shown in `/proc/mounts` (the image path).
    pub fsname: String,
    /// Other kernel mount options (`noatime`, `nodev`, …), as [`parse_options`] accepted them.
    pub options: Vec<String>,
}

impl Default for MountConfig {
    fn default() -> Self {
        MountConfig {
            allow_other: false,
            threads: THREADS_DEFAULT,
            attr_timeout: CACHE_TIMEOUT_DEFAULT,
            entry_timeout: CACHE_TIMEOUT_DEFAULT,
            negative_timeout: CACHE_TIMEOUT_DEFAULT,
            txn_wait: Duration::from_millis(100),
            mutant: None,
            atomic_writes: true,
            maintenance_interval: Duration::from_secs(5),
            commit_interval: tally_log::WriteBehind::INTERVAL_DEFAULT,
            replay_budget_mib: None,
            read_ahead_kb: READ_AHEAD_KB_DEFAULT,
            io_uring: IoUring::Auto,
            cpu_handoff: true,
            fsname: "tally".into(),
            options: Vec::new(),
        }
    }
}

/// Whether requests come over FUSE over io_uring (Linux 6.14 and later built with
/// `CONFIG_FUSE_IO_URING`, and the `fuse` module's `enable_uring` parameter on) or through
/// `/dev/fuse` alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoUring {
    /// The ring when the kernel offers it at `INIT`, `/dev/fuse` otherwise.
    Auto,
    /// The ring, or the mount fails saying how to enable it.
    On,
    /// `/dev/fuse` alone.
    Off,
}

/// Where the kernel's switch for FUSE over io_uring is.
const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

impl MountConfig {
    /// The log's write-behind for [`MountConfig::commit_interval`] (give it to
    /// `tally_fs::MountOptions::write_behind`); `None` for a zero interval.
    #[must_use]
    pub fn write_behind(&self) -> Option<tally_log::WriteBehind> {
        (!self.commit_interval.is_zero())
            .then(|| tally_log::WriteBehind::with_interval(self.commit_interval))
    }

    /// The replay budget in bytes for `tally_fs::MountOptions::replay_budget`.
    #[must_use]
    pub fn replay_budget(&self) -> Option<u64> {
        self.replay_budget_mib.map(|mib| mib << 20)
    }
}

/// How long the kernel caches attributes, names and absent names unless told otherwise: a
/// day, as virtiofsd's `cache=always` (the cache is never wrong for longer than a change it
/// was not told about, and there is none).
pub const CACHE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(86_400);

/// Request threads unless told otherwise (`--threads`): enough for a mail server's worth of
/// concurrent `fsync`s on a small machine (varmail's 16 threads on 2 CPUs: 0.37x ext4's
/// operations/s with the 2 of the old default, 0.73x with 32, docs/bench/mount.md).
/// An idle thread costs its stack and, on the ring, a payload buffer, both touched only as far
/// as they are used.
pub const THREADS_DEFAULT: usize = 32;

/// Read-ahead unless told otherwise (`-o read_ahead_kb=N`): 1 MiB, the largest request
/// `fs.fuse.max_pages_limit` lets the kernel send by default, so one read-ahead is one request.
pub const READ_AHEAD_KB_DEFAULT: u32 = 1024;

/// The longest timeout `-o attr_timeout=` and its kin accept (a year): the kernel counts in
/// jiffies, and nothing is gained beyond.
const CACHE_TIMEOUT_MAX: Duration = Duration::from_secs(365 * 86_400);

/// Kernel mount flags passed through unchanged.
const PASSED_THROUGH: &[&str] = &[
    "dev", "nodev", "suid", "nosuid", "exec", "noexec", "atime", "noatime", "sync", "async",
    "dirsync", "rw",
];

/// Apply a comma-separated `-o` list to `cfg`. `default_permissions` is accepted and always
/// on (the adapter checks no permissions itself); `allow_other` opens the mount to every user;
/// `allow_root` is taken as `allow_other` (root passes the kernel's checks anyway);
/// `attr_timeout=S`, `entry_timeout=S` and `negative_timeout=S` (seconds, fractions allowed,
/// as libfuse has them) set how long the kernel caches.
///
/// # Errors
/// An unknown or unsupported option, named.
pub fn parse_options(list: &str, cfg: &mut MountConfig) -> Result<(), String> {
    for opt in list.split(',').map(str::trim).filter(|o| !o.is_empty()) {
        match opt {
            "default_permissions" => {}
            "allow_other" | "allow_root" => cfg.allow_other = true,
            "ro" => return Err("read-only mounts are not supported yet".into()),
            "no_atomic_write" => cfg.atomic_writes = false,
            o if o.starts_with("txn_wait_ms=") => {
                let ms = o["txn_wait_ms=".len()..]
                    .parse::<u64>()
                    .map_err(|_| format!("{o:?}: txn_wait_ms takes milliseconds, e.g. 100"))?;
                cfg.txn_wait = Duration::from_millis(ms);
            }
            o if o.starts_with("commit_ms=") => {
                let ms = o["commit_ms=".len()..].parse::<u64>().map_err(|_| {
                    format!("{o:?}: commit_ms takes milliseconds, e.g. 5000 (0: no write-behind)")
                })?;
                cfg.commit_interval = Duration::from_millis(ms);
            }
            o if o.starts_with("replay_budget_mib=") => {
                let mib = o["replay_budget_mib=".len()..]
                    .parse::<u64>()
                    .ok()
                    .filter(|&mib| mib <= 1 << 20)
                    .ok_or_else(|| {
                        format!("{o:?}: replay_budget_mib takes MiB up to 1048576, e.g. 64 (0: no online checkpoints)")
                    })?;
                cfg.replay_budget_mib = Some(mib);
            }
            o if o.starts_with("read_ahead_kb=") => {
                cfg.read_ahead_kb = o["read_ahead_kb=".len()..]
                    .parse::<u32>()
                    .ok()
                    .filter(|&kb| kb <= 1 << 20)
                    .ok_or_else(|| {
                        format!("{o:?}: read_ahead_kb takes KiB up to 1048576, e.g. 1024 (0: the kernel's)")
                    })?;
            }
            o if o.starts_with("io_uring=") => {
                cfg.io_uring = match &o["io_uring=".len()..] {
                    "auto" => IoUring::Auto,
                    "on" => IoUring::On,
                    "off" => IoUring::Off,
                    _ => return Err(format!("{o:?}: io_uring takes auto, on or off")),
                };
            }
            o if o.starts_with("cpu_handoff=") => {
                cfg.cpu_handoff = match &o["cpu_handoff=".len()..] {
                    "on" => true,
                    "off" => false,
                    _ => return Err(format!("{o:?}: cpu_handoff takes on or off")),
                };
            }
            o if o.starts_with("attr_timeout=") => cfg.attr_timeout = timeout(o)?,
            o if o.starts_with("entry_timeout=") => cfg.entry_timeout = timeout(o)?,
            o if o.starts_with("negative_timeout=") => cfg.negative_timeout = timeout(o)?,
            o if PASSED_THROUGH.contains(&o) => cfg.options.push(o.to_owned()),
            o => {
                return Err(format!(
                    "unknown mount option {o:?} (known: default_permissions, allow_other, \
                     txn_wait_ms=N, commit_ms=N, replay_budget_mib=N, no_atomic_write, read_ahead_kb=N, io_uring=auto|on|off, cpu_handoff=on|off, attr_timeout=S, entry_timeout=S, negative_timeout=S, {})",
                    PASSED_THROUGH.join(", ")
                ));
            }
        }
    }
    Ok(())
}

/// The seconds of a `NAME=S` cache timeout option.
fn timeout(opt: &str) -> Result<Duration, String> {
    let (name, value) = opt.split_once('=').unwrap_or((opt, ""));
    let max = CACHE_TIMEOUT_MAX.as_secs();
    value
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && (0.0..=max as f64).contains(s))
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("{opt:?}: {name} takes seconds from 0 to {max}, e.g. 1 or 0.5"))
}

fn mount_option(o: &str) -> MountOption {
    match o {
        "dev" => MountOption::Dev,
        "nodev" => MountOption::NoDev,
        "suid" => MountOption::Suid,
        "nosuid" => MountOption::NoSuid,
        "exec" => MountOption::Exec,
        "noexec" => MountOption::NoExec,
        "atime" => MountOption::Atime,
        "noatime" => MountOption::NoAtime,
        "sync" => MountOption::Sync,
        "async" => MountOption::Async,
        "dirsync" => MountOption::DirSync,
        "rw" => MountOption::RW,
        other => MountOption::CUSTOM(other.to_owned()),
    }
}

/// A mounted file system, not yet serving requests.
pub struct Mounted {
    session: fuser::Session<FuserGlue>,
    outcome: OutcomeSlot,
    dir: PathBuf,
    requests: Arc<RequestCounts>,
    /// The image's device, for its counters (device submissions per request).
    device: Arc<dyn tally_media::Device>,
}

/// Mount `fs` on `dir`. The kernel sees the mount when this returns; requests wait until
/// [`Mounted::run`]. On failure the file system is unmounted cleanly (snapshot written).
///
/// # Errors
/// The kernel's or fusermount's refusal (no `/dev/fuse`, not a directory, no permission).
pub fn mount(fs: Fs, dir: &Path, cfg: &MountConfig) -> io::Result<Mounted> {
    if cfg.mutant.is_some() && !cfg!(feature = "mutants") {
        if let Err(e) = fs.unmount() {
            tracing::error!("unmount after a refused mount: {e}");
        }
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a mutant needs a build with the `mutants` feature",
        ));
    }
    let outcome: OutcomeSlot = Arc::new(Mutex::new(None));
    let notifier = Arc::new(OnceLock::new());
    let txns = Txns::new(notifier.clone(), cfg.mutant);
    let requests = Arc::new(RequestCounts::default());
    let device = fs.log().device().clone();
    let ops = Arc::new(TallyFuse::new(
        fs,
        cfg,
        txns,
        outcome.clone(),
        requests.clone(),
        notifier.clone(),
    ));
    let ring_threads = RingThreads::default();
    let adapter = FuserGlue { ops: ops.clone(), ring_threads: ring_threads.clone() };
    let mut options = vec![
        MountOption::FSName(cfg.fsname.clone()),
        MountOption::Subtype("tally".into()),
        MountOption::DefaultPermissions,
    ];
    options.extend(cfg.options.iter().map(|o| mount_option(o)));
    let mut config = Config::default();
    config.mount_options = options;
    config.acl = if cfg.allow_other { SessionACL::All } else { SessionACL::Owner };
    let dev_fuse_thread_count = dev_fuse_threads(cfg);
    config.n_threads = Some(dev_fuse_thread_count);
    config.clone_fd = true;
    let session = fuser::Session::new(adapter, dir, &config)?;
    // Set before any request is served (run() has not started): aborts can invalidate.
    let _ = notifier.set(session.notifier());
    // On failure the session is dropped: it unmounts the directory and the file system.
    start_transport(&session, &ops, &ring_threads, cfg, dev_fuse_thread_count)?;
    if cfg.read_ahead_kb > 0 {
        set_read_ahead(dir, cfg.read_ahead_kb);
    }
    Ok(Mounted { session, outcome, dir: dir.to_path_buf(), requests, device })
}

/// Threads for the `/dev/fuse` loop: [`MountConfig::threads`], or only
/// [`crate::ring::DEV_FUSE_THREADS_BESIDE_RING`] when the ring will serve. Decided before the
/// session exists (fuser takes it then): the kernel offers the ring at `INIT` exactly when its
/// `enable_uring` switch is on, and the adapter takes it unless `-o io_uring=off`.
fn dev_fuse_threads(cfg: &MountConfig) -> usize {
    let switch_on = std::fs::read_to_string(ENABLE_URING).is_ok_and(|s| s.trim() == "Y");
    if cfg.io_uring != IoUring::Off && switch_on {
        crate::ring::DEV_FUSE_THREADS_BESIDE_RING
    } else {
        cfg.threads.max(1)
    }
}

/// Start FUSE over io_uring if `cfg` and the kernel agree (the `INIT` exchange is done), and
/// say which transport serves.
fn start_transport(
    session: &fuser::Session<FuserGlue>,
    ops: &Arc<TallyFuse>,
    ring_threads: &RingThreads,
    cfg: &MountConfig,
    dev_fuse_thread_count: usize,
) -> io::Result<()> {
    use std::os::fd::AsFd;
    let switch = std::fs::read_to_string(ENABLE_URING)
        .map_or_else(|e| format!("unreadable: {e}"), |s| s.trim().to_owned());
    if cfg.io_uring == IoUring::Off {
        tracing::info!("requests through /dev/fuse (-o io_uring=off)");
        return Ok(());
    }
    if !ops.ring_accepted() {
        let why = format!(
            "the kernel did not offer FUSE over io_uring: it needs Linux 6.14 or later built \
             with CONFIG_FUSE_IO_URING, and the fuse module's enable_uring parameter on (as \
             root: echo 1 > {ENABLE_URING}; it reads {switch:?} now)"
        );
        if cfg.io_uring == IoUring::On {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("-o io_uring=on: {why}"),
            ));
        }
        tracing::info!("requests through /dev/fuse: {why}");
        if dev_fuse_thread_count < cfg.threads {
            tracing::warn!(
                "only {dev_fuse_thread_count} /dev/fuse thread(s): {ENABLE_URING} was on when \
                 the session began; remount for {} threads",
                cfg.threads
            );
        }
        return Ok(());
    }
    let layout = crate::ring::Layout::for_machine(cfg.threads, ops.max_write(), cfg.cpu_handoff);
    let fd = session.as_fd().try_clone_to_owned()?;
    let threads = crate::ring::start(ops.clone(), fd, layout)?;
    ring_threads.lock().unwrap_or_else(PoisonError::into_inner).extend(threads);
    tracing::info!(
        "requests over FUSE over io_uring ({} queues{}); FORGET and INTERRUPT through /dev/fuse",
        layout.queue_count,
        if layout.handoff { ", answers hand the CPU to the caller" } else { "" }
    );
    Ok(())
}

impl Mounted {
    /// The kernel's requests to this mount so far, by opcode (live: read them at any time,
    /// during or after [`Mounted::run`]).
    pub fn requests(&self) -> Arc<RequestCounts> {
        self.requests.clone()
    }

    /// Unmount the directory when SIGTERM, SIGINT or SIGHUP arrives, and log the request
    /// counts and the device's counters so far when SIGUSR1 does (a thread waits for them;
    /// [`block_termination_signals`] must have run before any thread started, or the signal
    /// may be delivered elsewhere).
    ///
    /// # Errors
    /// The thread could not start.
    pub fn unmount_on_signals(&self) -> io::Result<()> {
        let dir = self.dir.clone();
        let requests = self.requests.clone();
        let device = self.device.clone();
        std::thread::Builder::new().name("tally-signals".into()).spawn(move || loop {
            let signal = wait_termination_signal();
            if signal == libc::SIGUSR1 {
                tracing::info!("FUSE requests since mount: {}", requests.snapshot());
                let d = device.stats();
                tracing::info!(
                    "device since open: submissions {}, writes {}, flushes {}, bytes written {}, submit syscalls {}, reads {}, bytes read {}",
                    d.submissions,
                    d.writes,
                    d.flushes,
                    d.bytes_written,
                    d.submit_syscalls,
                    d.reads,
                    d.bytes_read
                );
                continue;
            }
            tracing::info!(signal, "unmounting {} on signal", dir.display());
            // Open files keep a plain unmount busy; a signal means stop, so detach lazily.
            match unmount_dir(&dir, false).or_else(|_| unmount_dir(&dir, true)) {
                Ok(()) => return,
                Err(e) => tracing::error!("unmount of {} failed: {e}", dir.display()),
            }
        })?;
        Ok(())
    }

    /// Serve requests until the kernel ends the connection, then unmount the file system.
    ///
    /// # Errors
    /// The session failed (the file system is unmounted all the same; see its outcome in the
    /// log).
    pub fn run(self) -> io::Result<Unmounted> {
        let Mounted { session, outcome, .. } = self;
        session.run()?;
        let taken = outcome.lock().unwrap_or_else(PoisonError::into_inner).take();
        Ok(taken.unwrap_or(Unmounted::WithoutSnapshot("destroy did not run".into())))
    }
}

/// Set the mount's read-ahead to `kb` KiB. Called once fuser's `Session::new` has made the
/// `INIT` exchange: the kernel applies `INIT`'s answer (which can only lower read-ahead) while
/// the daemon's write of it returns (`process_init_reply`, in the writer's own call), so the
/// raise made here stays, and it is in place before `tally mount` says the file system is
/// mounted. It used to be made from a thread once the first request arrived, and a program's
/// first `open` then often came before it: a file's read-ahead is fixed when it is opened, so
/// `cat` of a large file right after `tally mount` read in 128 KiB requests (`bench/largeio.sh`
/// measured 2,048 `READ`s for 256 MiB, and a first read 1.4-1.6x slower than with 1 MiB
/// requests; docs/bench/posix.md, 28 Nov).
///
/// Makes no request to the mount itself (no request thread serves yet, so one would wait
/// forever): [`device_of_mount`] asks for no attribute. Failing (not root, no sysfs) leaves
/// the kernel's and says so.
fn set_read_ahead(dir: &Path, kb: u32) {
    let dev = match device_of_mount(dir) {
        Ok(dev) => dev,
        Err(e) => return tracing::info!("read-ahead left as it is: statx of the mount: {e}"),
    };
    let path = format!("/sys/class/bdi/{}:{}/read_ahead_kb", libc::major(dev), libc::minor(dev));
    match std::fs::write(&path, format!("{kb}\n")) {
        Ok(()) => tracing::info!("read-ahead {kb} KiB ({path})"),
        Err(e) => tracing::info!("read-ahead left as it is: {path}: {e}"),
    }
}

/// The device number of the file system mounted on `dir`, with no request to it: a `statx`
/// that asks for no field, which FUSE answers from the superblock alone.
fn device_of_mount(dir: &Path) -> io::Result<libc::dev_t> {
    let path = CString::new(dir.as_os_str().as_bytes())?;
    // SAFETY: an all-zero statx is a valid value for the kernel to fill.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and a statx the call may write.
    let rc = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::AT_STATX_DONT_SYNC | libc::AT_SYMLINK_NOFOLLOW,
            0,
            &mut stx,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(libc::makedev(stx.stx_dev_major, stx.stx_dev_minor))
}

/// The signals that end a mount, and SIGUSR1 (log the request counts).
fn termination_set() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise and fill the set they are given; the set is a
    // plain value owned here.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGUSR1] {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Block SIGTERM, SIGINT, SIGHUP and SIGUSR1 in the calling thread and every thread it starts
/// later, so that [`Mounted::unmount_on_signals`] receives them (and SIGUSR1 never kills the
/// daemon). Call before any thread starts.
///
/// # Errors
/// `pthread_sigmask` failed.
pub fn block_termination_signals() -> io::Result<()> {
    let set = termination_set();
    // SAFETY: `set` is initialised; a null old set is allowed.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(rc))
    }
}

/// Wait for one of the signals of [`termination_set`]; returns its number.
fn wait_termination_signal() -> i32 {
    let set = termination_set();
    loop {
        let mut signal = 0;
        // SAFETY: `set` is initialised and `signal` is a valid place for the result.
        if unsafe { libc::sigwait(&set, &mut signal) } == 0 {
            return signal;
        }
    }
}

/// Unmount a FUSE mount at `dir`: `umount2` as root, `fusermount3 -u` (or `fusermount -u`)
/// otherwise; `lazy` detaches it even while files are open (`MNT_DETACH`, `-z`).
///
/// # Errors
/// Not mounted, busy (when not lazy), no permission.
pub fn unmount_dir(dir: &Path, lazy: bool) -> io::Result<()> {
    let c = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path with a NUL byte"))?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: `c` is a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() != Some(libc::EPERM) {
        return Err(err);
    }
    let mut last = err;
    for tool in ["fusermount3", "fusermount"] {
        let mut cmd = Command::new(tool);
        cmd.arg(if lazy { "-uz" } else { "-u" }).arg(dir);
        match cmd.output() {
            Ok(out) if out.status.success() => return Ok(()),
            Ok(out) => {
                let text = String::from_utf8_lossy(&out.stderr).trim().to_owned();
                return Err(io::Error::other(format!("{tool}: {text}")));
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_and_refuse_the_unknown() {
        let mut cfg = MountConfig::default();
        parse_options("default_permissions,allow_other, noatime,txn_wait_ms=7", &mut cfg).unwrap();
        assert_eq!(cfg.commit_interval, tally_log::WriteBehind::INTERVAL_DEFAULT);
        assert!(cfg.write_behind().is_some());
        assert!(cfg.allow_other);
        assert_eq!(cfg.txn_wait, Duration::from_millis(7));
        assert!(parse_options("txn_wait_ms=soon", &mut cfg).is_err());
        parse_options("read_ahead_kb=4096", &mut cfg).unwrap();
        assert_eq!(cfg.read_ahead_kb, 4096);
        parse_options("read_ahead_kb=0", &mut cfg).unwrap();
        assert_eq!(cfg.read_ahead_kb, 0);
        assert!(parse_options("read_ahead_kb=2000000", &mut cfg).is_err());
        assert!(parse_options("read_ahead_kb=1M", &mut cfg).is_err());
        assert_eq!(MountConfig::default().read_ahead_kb, READ_AHEAD_KB_DEFAULT);
        assert!(MountConfig::default().cpu_handoff);
        parse_options("cpu_handoff=off", &mut cfg).unwrap();
        assert!(!cfg.cpu_handoff);
        parse_options("cpu_handoff=on", &mut cfg).unwrap();
        assert!(cfg.cpu_handoff);
        assert!(parse_options("cpu_handoff=idle", &mut cfg).is_err());
        parse_options("replay_budget_mib=16", &mut cfg).unwrap();
        assert_eq!(cfg.replay_budget(), Some(16 << 20));
        assert!(parse_options("replay_budget_mib=lots", &mut cfg).is_err());
        parse_options("commit_ms=250", &mut cfg).unwrap();
        assert_eq!(cfg.write_behind().and_then(|w| w.interval), Some(Duration::from_millis(250)));
        parse_options("commit_ms=0", &mut cfg).unwrap();
        assert!(cfg.write_behind().is_none());
        assert!(parse_options("commit_ms=-1", &mut cfg).is_err());
        assert_eq!(cfg.attr_timeout, CACHE_TIMEOUT_DEFAULT);
        parse_options("attr_timeout=1,entry_timeout=0.5,negative_timeout=0", &mut cfg).unwrap();
        assert_eq!(cfg.attr_timeout, Duration::from_secs(1));
        assert_eq!(cfg.entry_timeout, Duration::from_millis(500));
        assert_eq!(cfg.negative_timeout, Duration::ZERO);
        for bad in
            ["attr_timeout=", "entry_timeout=-1", "negative_timeout=NaN", "attr_timeout=1e99"]
        {
            let e = parse_options(bad, &mut cfg).unwrap_err();
            assert!(e.contains("seconds"), "{e}");
        }
        assert_eq!(cfg.options, ["noatime"]);
        assert!(parse_options("ro", &mut cfg).is_err());
        assert_eq!(cfg.io_uring, IoUring::Auto);
        parse_options("io_uring=off", &mut cfg).unwrap();
        assert_eq!(cfg.io_uring, IoUring::Off);
        parse_options("io_uring=on", &mut cfg).unwrap();
        assert_eq!(cfg.io_uring, IoUring::On);
        assert!(parse_options("io_uring=yes", &mut cfg).is_err());
        let e = parse_options("bogus", &mut cfg).unwrap_err();
        assert!(e.contains("bogus"), "{e}");
    }
}

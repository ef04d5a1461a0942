//! `tally mount IMAGE DIR` and `tally umount DIR`: serve a Tally image through FUSE.
//!
//! The daemon (the default) forks before any thread starts; the parent waits on a pipe until
//! the child has mounted (or failed), prints the outcome and exits with its code. The daemon
//! holds an exclusive `flock` on the image while it runs: a second mount of the same image is
//! refused, and `tally umount` waits on the same lock, so it returns only once the daemon has
//! written its snapshot and exited.

use std::fs::{File, OpenOptions};
use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::FileTypeExt as _;
use std::os::unix::io::{AsRawFd as _, FromRawFd as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tally_fs::{Fs, MountOptions};
use tally_fuse::{MountConfig, Unmounted};
use tally_media::{FileDevice, FileOptions};

use crate::{EXIT_BAD_INPUT, EXIT_IO_FAILURE};

/// Arguments of `tally mount`.
#[derive(Debug, clap::Args)]
#[command(after_long_help = "\
Examples:
  tally mount /var/tmp/tally.img /mnt/t                  daemon; `tally umount /mnt/t` ends it
  tally mount img /mnt/t --foreground                    stay in the terminal; Ctrl-C unmounts
  tally mount img /mnt/t -o allow_other,noatime          other users may use the mount
  tally mount nbd://storage.example/tally /mnt/t         an image on an NBD export

Mount options (-o, comma-separated, repeatable):
  default_permissions   the kernel checks permissions from the mode bits (always on)
  allow_other           users other than the one mounting may use the mount
  txn_wait_ms=N         milliseconds a change waits for a transaction holding what it
                        changes before it fails with EBUSY (100)
  commit_ms=N           milliseconds a change may wait in memory before it is written to the
                        device (5000, as ext4's commit=5); fsync, sync and a full buffer
                        write sooner; 0 writes each change at once
  read_ahead_kb=N       the kernel's read-ahead for the mount, KiB (1024: one 1 MiB request;
                        0: the kernel's 128), set through sysfs (needs root)
  io_uring=auto|on|off  how requests travel: FUSE over io_uring (per-CPU queues, Linux 6.14+
                        with the fuse module's enable_uring on) or /dev/fuse. auto (default):
                        the ring when the kernel offers it; on: the ring or the mount fails;
                        off: /dev/fuse. Root enables the ring with
                        `echo 1 > /sys/module/fuse/parameters/enable_uring`
  cpu_handoff=on|off    over io_uring, a thread answering while no other request is served
                        hands its CPU to the caller, so the kernel wakes the caller on the
                        same CPU, not an idle one (on; used where the daemon may raise a
                        thread back to its nice value; off for machines always busy)
  attr_timeout=S        seconds the kernel may cache attributes (default 86400: every change
                        goes through the mount, and the kernel is told what an abort undoes)
  entry_timeout=S       seconds the kernel may cache names (86400)
  negative_timeout=S    seconds the kernel may remember that a name is absent (86400; 0: never)
  noatime, nodev, nosuid, noexec, dirsync, sync, ...   passed to the kernel

The daemon logs to --log (default: $XDG_STATE_HOME/tally/ or ~/.local/state/tally/, \
named after the mount directory); RUST_LOG=debug logs every failed request. The kernel's \
requests to the mount, counted by opcode, are logged at unmount and whenever the daemon gets \
SIGUSR1. SIGTERM, SIGINT and SIGHUP unmount cleanly (the snapshot is written, so the next mount \
needs no scan). After \
a daemon is killed with SIGKILL the next mount recovers from the log: everything fsync'd is \
there, and the rest is a consistent prefix of what was done.

Exit codes: 0 mounted (daemon) or unmounted cleanly (--foreground); 1 I/O error or an \
unclean unmount; 2 bad arguments, an image in use, or not a Tally image.")]
pub struct MountArgs {
    /// Image file, block device or NBD export (`nbd://host[:port]/export`,
    /// `nbd+unix:///export?socket=PATH`) made by `tally mkfs`; for a multi-target image, every
    /// target in the order mkfs was given them.
    #[arg(value_name = "IMAGE", required = true, num_args = 1..)]
    images: Vec<PathBuf>,
    /// Directory to mount it on.
    dir: PathBuf,
    /// Stay in the foreground, logging to stderr.
    #[arg(long, short = 'f')]
    foreground: bool,
    /// Mount options, e.g. -o allow_other,noatime (see below).
    #[arg(short = 'o', value_name = "OPTIONS")]
    options: Vec<String>,
    /// Threads serving kernel requests through /dev/fuse (default: 32; a waiting fsync holds
    /// one); with FUSE over io_uring, spread over the ring's queues (at least 2 a queue up to
    /// 4 queues, at most 16).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=64))]
    threads: Option<u16>,
    /// Log file of the daemon.
    #[arg(long, value_name = "FILE")]
    log: Option<PathBuf>,
}

/// Arguments of `tally umount`.
#[derive(Debug, clap::Args)]
#[command(after_long_help = "\
Unmounts the directory, then waits until the daemon serving it has made everything durable, \
written its snapshot and exited, and says whether the snapshot was written (it is not when the \
daemon found no room for it: a warning, exit 0, and the next mount scans the log).

Exit codes: 0 unmounted and the daemon finished; 1 busy, failed, or the daemon still running \
at --timeout; 2 not a mount.")]
pub struct UmountArgs {
    /// The mount directory.
    dir: PathBuf,
    /// Detach now even if files are open; the daemon finishes when the last one closes.
    #[arg(long)]
    lazy: bool,
    /// Seconds to wait for the daemon to finish.
    #[arg(long, default_value_t = 120)]
    timeout: u64,
}

/// A failure with its exit code.
struct Stop {
    code: u8,
    text: String,
}

fn bad(text: impl Into<String>) -> Stop {
    Stop { code: EXIT_BAD_INPUT, text: text.into() }
}

fn io_failure(text: impl Into<String>) -> Stop {
    Stop { code: EXIT_IO_FAILURE, text: text.into() }
}

/// Run `tally mount`.
pub fn run_mount(args: &MountArgs) -> ExitCode {
    match prepare(args) {
        Ok((image, dir, cfg)) => {
            limit_malloc_arenas();
            let notify = if args.foreground {
                Notify::Foreground
            } else {
                let (log, log_file) = match open_log(args.log.as_deref(), &dir) {
                    Ok(opened) => opened,
                    Err(stop) => return exit(&stop),
                };
                match daemonise(&log, log_file, &image, &dir) {
                    Ok(Some(notify)) => notify,
                    Ok(None) => return ExitCode::SUCCESS, // the parent, after a good mount
                    Err(stop) => return exit(&stop),
                }
            };
            init_logging(args.foreground);
            serve(&image, &dir, cfg, notify)
        }
        Err(stop) => exit(&stop),
    }
}

/// As many malloc arenas as cores, not glibc's eight per core. The daemon serves requests
/// from many threads (a ring's queues, the `/dev/fuse` loop, maintenance); with an arena each,
/// a data block freed once durable went back to the arena of the thread that wrote it, and
/// the next writes on other threads grew their own arenas onto fresh pages the kernel had to
/// zero: the daemon's minor faults during a `git clone` halved with two arenas on two cores
/// (`docs/bench/mount.md`, 27 Nov 2026 sections). Called before the fork and before any
/// thread starts. glibc only; a no-op elsewhere.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let cores = std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get);
        let arenas = libc::c_int::try_from(cores.max(2)).unwrap_or(libc::c_int::MAX);
        // SAFETY: mallopt only sets a tunable of the allocator; no thread is running yet.
        let set = unsafe { libc::mallopt(libc::M_ARENA_MAX, arenas) };
        if set != 1 {
            eprintln!("tally mount: warning: could not limit malloc arenas to {arenas}");
        }
    }
}

fn exit(stop: &Stop) -> ExitCode {
    eprintln!("tally mount: error: {}", stop.text);
    ExitCode::from(stop.code)
}

/// Check the arguments before forking, so mistakes are reported in the terminal.
fn prepare(args: &MountArgs) -> Result<(PathBuf, PathBuf, MountConfig), Stop> {
    let mut cfg = MountConfig::default();
    for list in &args.options {
        tally_fuse::parse_options(list, &mut cfg).map_err(bad)?;
    }
    if let Some(t) = args.threads {
        cfg.threads = usize::from(t);
    }
    // An NBD export is checked here (the URI) and opened by the daemon, after the fork; so
    // are the targets of a multi-target image (passed on as one space-separated list).
    let joined = crate::image::join_images(&args.images).map_err(bad)?;
    let image = if let Some(remote) = crate::image::remote(&joined).map_err(bad)? {
        PathBuf::from(remote.to_string())
    } else {
        let image = std::fs::canonicalize(&joined)
            .map_err(|e| bad(format!("image {}: {e}", joined.display())))?;
        let meta =
            std::fs::metadata(&image).map_err(|e| bad(format!("{}: {e}", image.display())))?;
        if !meta.is_file() && !meta.file_type().is_block_device() {
            return Err(bad(format!("{} is not a file or a block device", image.display())));
        }
        image
    };
    let dir = std::fs::canonicalize(&args.dir)
        .map_err(|e| bad(format!("mount directory {}: {e}", args.dir.display())))?;
    if !dir.is_dir() {
        return Err(bad(format!("{} is not a directory", dir.display())));
    }
    cfg.fsname = image.display().to_string();
    Ok((image, dir, cfg))
}

/// `$XDG_STATE_HOME/tally/<dir>.log`, else `~/.local/state/tally/…`, else the temp dir.
fn default_log(dir: &Path) -> PathBuf {
    let base = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
        .unwrap_or_else(std::env::temp_dir)
        .join("tally");
    let name: String = dir
        .to_string_lossy()
        .trim_start_matches('/')
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' { c } else { '_' })
        .collect();
    base.join(format!("mount-{name}.log"))
}

/// Open the daemon's log for appending: the one asked for, else the default, else the same
/// name in the temporary directory (a user without a writable home).
fn open_log(asked: Option<&Path>, dir: &Path) -> Result<(PathBuf, File), Stop> {
    let open = |log: &Path| -> Result<File, Stop> {
        if let Some(parent) = log.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| io_failure(format!("log directory {}: {e}", parent.display())))?;
        }
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| io_failure(format!("log file {}: {e}", log.display())))
    };
    if let Some(log) = asked {
        return Ok((log.to_path_buf(), open(log)?));
    }
    let log = default_log(dir);
    match open(&log) {
        Ok(file) => Ok((log, file)),
        Err(first) => {
            let name = log.file_name().map(PathBuf::from).unwrap_or_default();
            // SAFETY: getuid has no preconditions.
            let uid = unsafe { libc::getuid() };
            let fallback = std::env::temp_dir().join(format!("tally-{uid}")).join(name);
            open(&fallback).map(|file| (fallback, file)).map_err(|_| first)
        }
    }
}

/// How the daemon tells whoever started it that it is serving, or why not.
enum Notify {
    /// `--foreground`: print to stderr.
    Foreground,
    /// The write end of the parent's pipe.
    Pipe(File),
}

impl Notify {
    fn ready(self, image: &Path, dir: &Path) {
        match self {
            Notify::Foreground => eprintln!(
                "tally mount: {} mounted on {}; Ctrl-C or `tally umount {}` unmounts",
                image.display(),
                dir.display(),
                dir.display()
            ),
            Notify::Pipe(mut pipe) => {
                let _ = pipe.write_all(b"ok\n");
            }
        }
    }

    fn failed(self, stop: &Stop) -> ExitCode {
        tracing::error!("{}", stop.text);
        match self {
            Notify::Foreground => exit(stop),
            Notify::Pipe(mut pipe) => {
                let _ = writeln!(pipe, "{} {}", stop.code, stop.text);
                ExitCode::from(stop.code)
            }
        }
    }
}

/// Fork. The parent waits for the child's word, prints it and returns `None` (or the error);
/// the child detaches (new session, stdin and stdout on /dev/null, stderr on the log) and
/// returns how to notify the parent.
fn daemonise(log: &Path, log_file: File, image: &Path, dir: &Path) -> Result<Option<Notify>, Stop> {
    let null = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|e| io_failure(format!("/dev/null: {e}")))?;
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the two-element array it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io_failure(format!("pipe: {}", io::Error::last_os_error())));
    }
    // SAFETY: the descriptors were just created by pipe2 and are owned by nothing else.
    let (mut read_end, write_end) =
        unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
    // SAFETY: no thread has been started yet (the command line is parsed, nothing else), so
    // the child is a complete copy of this single-threaded process.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io_failure(format!("fork: {}", io::Error::last_os_error())));
    }
    if pid > 0 {
        drop(write_end);
        let mut word = String::new();
        let _ = read_end.read_to_string(&mut word);
        let word = word.trim();
        if word == "ok" {
            println!(
                "tally mount: {} mounted on {} (daemon pid {pid}, log {})",
                image.display(),
                dir.display(),
                log.display()
            );
            return Ok(None);
        }
        if word.is_empty() {
            return Err(io_failure(format!(
                "the daemon (pid {pid}) exited before mounting; see {}",
                log.display()
            )));
        }
        let (code, text) = word.split_once(' ').unwrap_or(("1", word));
        return Err(Stop { code: code.parse().unwrap_or(EXIT_IO_FAILURE), text: text.into() });
    }
    drop(read_end);
    // SAFETY: plain system calls on descriptors owned by this process; dup2 targets are the
    // standard descriptors, which stay open (fuser refuses to run with them closed).
    unsafe {
        libc::setsid();
        libc::dup2(null.as_raw_fd(), 0);
        libc::dup2(null.as_raw_fd(), 1);
        libc::dup2(log_file.as_raw_fd(), 2);
    }
    let _ = std::env::set_current_dir("/");
    Ok(Some(Notify::Pipe(write_end)))
}

/// What the daemon logs unless RUST_LOG says otherwise. fuser's session warns on every clean
/// unmount that its own second unmount of the directory failed (the kernel had already
/// unmounted it); that one line is noise.
const LOG_FILTER_DEFAULT: &str = "info,fuser::session=error";

fn init_logging(foreground: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(LOG_FILTER_DEFAULT));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(foreground && std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// Lock the image for this process's lifetime; `None` if another process holds it.
fn lock_image(image: &Path) -> Result<Option<crate::image::Lock>, Stop> {
    if let Some(remote) = crate::image::remote(image).map_err(bad)? {
        return crate::image::lock_remote(&remote, true).map_err(io_failure);
    }
    let file = File::open(image).map_err(|e| io_failure(format!("{}: {e}", image.display())))?;
    // SAFETY: flock on a descriptor owned by `file`.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(Some(file.into()));
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(None)
    } else {
        Err(io_failure(format!("cannot lock {}: {e}", image.display())))
    }
}

/// The image's device: a file or block device, or an NBD export (one connection per stream).
fn open_device(image: &Path) -> Result<Arc<dyn tally_media::Device>, Stop> {
    if let Some(remote) = crate::image::remote(image).map_err(bad)? {
        return match crate::image::open_remote(&remote) {
            Ok(dev) => Ok(dev),
            Err(e) if crate::image::nbd_is_bad_input(&e) => {
                Err(bad(format!("cannot use {remote}: {e}")))
            }
            Err(e) => Err(io_failure(format!("cannot open {remote}: {e}"))),
        };
    }
    let block_size = crate::image::block_size_of(image).map_err(io_failure)?;
    let dev = FileDevice::open(image, FileOptions { block_size, ..FileOptions::default() })
        .map_err(|e| io_failure(format!("cannot open {}: {e}", image.display())))?;
    Ok(Arc::new(dev))
}

/// Mount and serve until unmounted.
fn serve(image: &Path, dir: &Path, cfg: MountConfig, notify: Notify) -> ExitCode {
    if let Err(e) = tally_fuse::block_termination_signals() {
        return notify.failed(&io_failure(format!("cannot block signals: {e}")));
    }
    let _lock = match lock_image(image) {
        Ok(Some(lock)) => lock,
        Ok(None) => {
            let text = format!("{} is in use: another tally mount serves it", image.display());
            return notify.failed(&bad(text));
        }
        Err(stop) => return notify.failed(&stop),
    };
    let dev = match open_device(image) {
        Ok(dev) => dev,
        Err(stop) => return notify.failed(&stop),
    };
    let opts = MountOptions {
        write_behind: cfg.write_behind(),
        replay_budget: cfg.replay_budget(),
        ..MountOptions::default()
    };
    let fs = match Fs::mount(dev, opts) {
        Ok(fs) => fs,
        Err(e @ tally_fs::FsError::Log(tally_log::LogError::DurableTransactionLost { .. })) => {
            let text = format!(
                "cannot mount {image}: {e}; `tally fsck {image}` shows the damage, `tally fsck \
                 --salvage --force {image}` keeps what is safe and drops the rest",
                image = image.display()
            );
            return notify.failed(&bad(text));
        }
        Err(e @ (tally_fs::FsError::Corrupted { .. } | tally_fs::FsError::Log(_))) => {
            let text = format!("cannot mount {} (is it a Tally image?): {e}", image.display());
            return notify.failed(&bad(text));
        }
        Err(e) => {
            return notify.failed(&io_failure(format!("cannot mount {}: {e}", image.display())));
        }
    };
    let r = fs.mount_report();
    tracing::info!(
        image = %image.display(),
        from_snapshot = r.from_snapshot,
        blocks_read = r.blocks_read,
        transactions_replayed = r.transactions_replayed,
        inodes = r.inodes,
        orphans_freed = r.orphans_freed,
        "file system ready in {:?}",
        r.time
    );
    let mounted = match tally_fuse::mount(fs, dir, &cfg) {
        Ok(m) => m,
        Err(e) => {
            let mut text = format!("cannot mount on {}: {e}", dir.display());
            // SAFETY: geteuid has no preconditions.
            if e.raw_os_error() == Some(libc::EACCES) && unsafe { libc::geteuid() } != 0 {
                text.push_str(
                    " (users mount through /dev/fuse, which distributions make mode 0666, and \
                     fusermount3 from the fuse3 package; or mount as root)",
                );
            }
            return notify.failed(&io_failure(text));
        }
    };
    if let Err(e) = mounted.unmount_on_signals() {
        return notify.failed(&io_failure(format!("cannot start the signal thread: {e}")));
    }
    tracing::info!(dir = %dir.display(), threads = cfg.threads, "serving");
    notify.ready(image, dir);
    match mounted.run() {
        Ok(Unmounted::Clean) => {
            tracing::info!("{} unmounted cleanly", dir.display());
            ExitCode::SUCCESS
        }
        Ok(Unmounted::WithoutSnapshot(why)) => {
            tracing::warn!(
                "{} unmounted; everything is durable, but no snapshot was written: {why}",
                dir.display()
            );
            ExitCode::SUCCESS
        }
        Ok(other) => {
            tracing::error!("{} unmounted: {other:?}", dir.display());
            ExitCode::from(EXIT_IO_FAILURE)
        }
        Err(e) => {
            tracing::error!("the FUSE session failed: {e}");
            ExitCode::from(EXIT_IO_FAILURE)
        }
    }
}

/// Run `tally umount`.
pub fn run_umount(args: &UmountArgs) -> ExitCode {
    match umount(args) {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(stop) => {
            eprintln!("tally umount: error: {}", stop.text);
            ExitCode::from(stop.code)
        }
    }
}

fn umount(args: &UmountArgs) -> Result<String, Stop> {
    let dir = std::fs::canonicalize(&args.dir)
        .map_err(|e| bad(format!("{}: {e}", args.dir.display())))?;
    let (source, fstype) =
        find_mount(&dir).ok_or_else(|| bad(format!("{} is not a mount point", dir.display())))?;
    if fstype != "fuse" && fstype != "fuse.tally" {
        return Err(bad(format!("{} is a {fstype} mount, not a Tally one", dir.display())));
    }
    // The last references to files a process just closed can be dropped a moment after the
    // close returns (the kernel defers the final release of a file, e.g. one closed by an
    // exiting thread or an aborted connection's requests): a busy mount is asked again for up
    // to a second before it is reported busy. CI saw one such EBUSY right after a test closed
    // its files.
    let mut tries = 0;
    let unmounted = loop {
        match tally_fuse::unmount_dir(&dir, args.lazy) {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && tries < 10 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            other => break other,
        }
    };
    unmounted.map_err(|e| {
        if e.raw_os_error() == Some(libc::EBUSY) {
            io_failure(format!(
                "{} is busy (open files, or a process inside it): close them, or give --lazy",
                dir.display()
            ))
        } else {
            io_failure(format!("cannot unmount {}: {e}", dir.display()))
        }
    })?;
    // The daemon holds a lock on its image (an NBD export's lock file) until it has written
    // the snapshot and exited.
    let image = PathBuf::from(&source);
    let lock_path = match crate::image::remote(&image) {
        Ok(Some(remote)) => crate::image::remote_lock_path(&remote),
        _ => image.clone(),
    };
    let Ok(file) = File::open(&lock_path) else {
        return Ok(format!(
            "unmounted {} (source {source:?} is not a file to wait on)",
            dir.display()
        ));
    };
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    loop {
        // SAFETY: flock on a descriptor owned by `file`.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            drop(file);
            let done = format!(
                "unmounted {}; the daemon has made {} durable",
                dir.display(),
                image.display()
            );
            return Ok(match snapshot_written(&image) {
                Some(Snapshot::Clean) => format!("{done}, written its snapshot and exited"),
                Some(found) => {
                    // Not "made durable": a daemon killed before the unmount made nothing
                    // durable at exit (what it acknowledged as durable is on the image). A
                    // checkpoint snapshot in force is one the daemon wrote while serving, not
                    // the clean unmount's.
                    let next = if found == Snapshot::Checkpoint {
                        "the next mount reads its last checkpoint snapshot and replays the log \
                         after it"
                    } else {
                        "the next mount scans the log"
                    };
                    eprintln!(
                        "tally umount: warning: the daemon wrote no snapshot at unmount (no room \
                         for it, or the daemon was killed: its log says which); {next}"
                    );
                    format!("unmounted {}; the daemon exited without a snapshot", dir.display())
                }
                None => format!("{done} and exited"),
            });
        }
        if Instant::now() >= deadline {
            return Err(io_failure(format!(
                "unmounted {}, but the daemon still holds {} after {} s",
                dir.display(),
                image.display(),
                args.timeout
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The snapshot the image's superblock in force points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Snapshot {
    /// A clean unmount's: written by the daemon as it exited.
    Clean,
    /// A checkpoint snapshot, written while the daemon served (flag bit 1): it says nothing
    /// about how the daemon ended.
    Checkpoint,
    /// None.
    Absent,
}

/// Which snapshot the image's superblock in force points at (`None`: it cannot be read, e.g.
/// another mount took it meanwhile).
fn snapshot_written(image: &Path) -> Option<Snapshot> {
    let opened = crate::fsck::open_image(image, "umount", true).ok()?;
    let best =
        opened.copies.iter().filter_map(|(_, sb)| sb.as_ref()).max_by_key(|sb| sb.generation);
    best.map(|sb| match (sb.snapshot, sb.snapshot_generation) {
        (Some(_), None) => Snapshot::Clean,
        (Some(_), Some(_)) => Snapshot::Checkpoint,
        (None, _) => Snapshot::Absent,
    })
}

/// Source and type of the mount at `dir`, from `/proc/self/mounts` (the last one wins: it
/// is the one on top).
fn find_mount(dir: &Path) -> Option<(String, String)> {
    let table = std::fs::read_to_string("/proc/self/mounts").ok()?;
    let want = dir.to_string_lossy();
    table.lines().rev().find_map(|line| {
        let mut f = line.split(' ');
        let (source, point, fstype) = (f.next()?, f.next()?, f.next()?);
        (unescape(point) == want).then(|| (unescape(source), fstype.to_owned()))
    })
}

/// The mount points of every FUSE mount this process can see, in the order of
/// `/proc/self/mounts` (a Tally mount's type is plain `fuse`: the kernel records the subtype
/// only when a mount helper passes `fuse.tally`; which of them are Tally's, only an ioctl tells).
pub(crate) fn fuse_mounts() -> Vec<PathBuf> {
    let table = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    table
        .lines()
        .filter_map(|line| {
            let mut f = line.split(' ');
            let (_source, point, fstype) = (f.next()?, f.next()?, f.next()?);
            (fstype == "fuse" || fstype.starts_with("fuse."))
                .then(|| PathBuf::from(unescape(point)))
        })
        .collect()
}

/// Undo the octal escapes of `/proc/self/mounts` (`\040` for a space, …).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .and_then(|d| d.iter().try_fold(0u8, |v, c| v.checked_mul(8)?.checked_add(c - b'0')));
        match (bytes[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_table_escapes() {
        assert_eq!(unescape(r"/mnt/with\040space"), "/mnt/with space");
        assert_eq!(unescape(r"/plain"), "/plain");
        assert_eq!(unescape(r"/odd\\x"), r"/odd\\x");
    }

    #[test]
    fn default_log_is_named_after_the_directory() {
        let p = default_log(Path::new("/mnt/my tally"));
        assert!(p.to_string_lossy().ends_with("tally/mount-mnt_my_tally.log"), "{}", p.display());
    }
}

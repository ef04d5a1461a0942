//! `NbdDevice` against real servers: `nbdkit` (memory plugin, with the error, delay and
//! blocksize-policy filters) and `qemu-nbd` (an image file), started and killed by the tests on
//! Unix sockets or loopback TCP.
//!
//! A missing server program skips a test on a developer's machine and fails it when `CI` is
//! set (`.ci/run` installs both).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tally_log::{CommitMode, Log, LogConfig, OpenOptions, Transaction};
use tally_media::nbd::NbdError;
use tally_media::{Device, IoBuf, MediaError, NbdDevice, NbdOptions, NbdTarget, Write, WriteFlags};

/// Whether `program` can run; panics when it cannot and `CI` is set.
fn have(program: &str) -> bool {
    let ok = Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "{program} is not installed and CI is set: the NBD tests need it (.ci/run installs it)"
        );
        eprintln!("skipping: {program} is not installed");
    }
    ok
}

/// A scratch directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("tally-nbd-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A server process, killed on drop.
struct Server {
    child: Child,
    uri: String,
}

impl Server {
    /// Start `program args` and wait until `ready` exists (its pid file).
    fn start(program: &str, args: &[String], ready: &Path, uri: String) -> Server {
        let mut child = Command::new(program)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {program}: {e}"));
        let deadline = Instant::now() + Duration::from_secs(20);
        while !ready.exists() {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("{program} {args:?} exited before it was ready: {status}");
            }
            assert!(Instant::now() < deadline, "{program} not ready after 20 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        // The pid file can appear a moment before the file is complete; the socket is bound
        // before it is written.
        std::thread::sleep(Duration::from_millis(50));
        Server { child, uri }
    }

    /// `nbdkit` on a Unix socket in `dir`: `plugin_and_params` after any `--filter=`s.
    fn nbdkit(dir: &Scratch, filters: &[&str], plugin_and_params: &[&str]) -> Server {
        let socket = dir.path("nbdkit.sock");
        let pid = dir.path("nbdkit.pid");
        let _ = std::fs::remove_file(&pid);
        let mut args: Vec<String> = ["-f", "--exit-with-parent", "-U"].map(String::from).to_vec();
        args.push(socket.display().to_string());
        args.push("-P".into());
        args.push(pid.display().to_string());
        args.extend(filters.iter().map(|f| format!("--filter={f}")));
        args.extend(plugin_and_params.iter().map(|s| (*s).to_string()));
        let uri = format!("nbd+unix:///?socket={}", socket.display());
        Server::start("nbdkit", &args, &pid, uri)
    }

    /// `nbdkit` on loopback TCP.
    fn nbdkit_tcp(dir: &Scratch, plugin_and_params: &[&str]) -> Server {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let pid = dir.path("nbdkit-tcp.pid");
        let mut args: Vec<String> =
            ["-f", "--exit-with-parent", "-i", "127.0.0.1", "-p"].map(String::from).to_vec();
        args.push(port.to_string());
        args.push("-P".into());
        args.push(pid.display().to_string());
        args.extend(plugin_and_params.iter().map(|s| (*s).to_string()));
        Server::start("nbdkit", &args, &pid, format!("nbd://127.0.0.1:{port}/"))
    }

    /// `qemu-nbd` serving the raw image `image` as export `name` on a Unix socket.
    fn qemu_nbd(dir: &Scratch, image: &Path, name: &str) -> Server {
        let socket = dir.path("qemu.sock");
        let pid = dir.path("qemu.pid");
        let _ = std::fs::remove_file(&pid);
        let _ = std::fs::remove_file(&socket);
        let args: Vec<String> = vec![
            "-k".into(),
            socket.display().to_string(),
            "--pid-file".into(),
            pid.display().to_string(),
            "-f".into(),
            "raw".into(),
            "-t".into(),
            "-e".into(),
            "4".into(),
            "--cache=writeback".into(),
            "-x".into(),
            name.into(),
            image.display().to_string(),
        ];
        let uri = format!("nbd+unix:///{name}?socket={}", socket.display());
        Server::start("qemu-nbd", &args, &pid, uri)
    }

    fn open(&self, options: NbdOptions) -> NbdDevice {
        NbdDevice::open_uri(&self.uri, options).unwrap_or_else(|e| panic!("open {}: {e}", self.uri))
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

fn options(timeout_ms: u64) -> NbdOptions {
    NbdOptions { timeout: Duration::from_millis(timeout_ms), ..NbdOptions::default() }
}

fn pattern(seed: u64, len: usize) -> IoBuf {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut buf = IoBuf::zeroed(len);
    rng.fill(&mut buf);
    buf
}

fn read_back(dev: &impl Device, block: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    dev.read(block, &mut buf).unwrap();
    buf
}

/// `assert_eq!` on buffers without printing them whole.
#[track_caller]
fn assert_same(got: &[u8], want: &[u8], what: &str) {
    let first = got.iter().zip(want).position(|(a, b)| a != b);
    assert!(
        got.len() == want.len() && first.is_none(),
        "{what}: lengths {} / {}, first difference at {first:?}",
        got.len(),
        want.len()
    );
}

fn nbd_source(error: &MediaError) -> &NbdError {
    match error {
        MediaError::Nbd { source, .. } => source,
        other => panic!("expected an NBD error, got {other:?}"),
    }
}

#[test]
fn writes_reads_fua_flush_and_trim_over_a_unix_socket() {
    if !have("nbdkit") {
        return;
    }
    let dir = Scratch::new();
    let server = Server::nbdkit(&dir, &[], &["memory", "64M"]);
    let dev = server.open(options(10_000));
    let g = dev.geometry();
    assert_eq!((g.block_size, g.block_count), (4096, 64 * 256));
    let export = *dev.export();
    assert!(export.structured_replies && export.negotiated_with_go, "{export:?}");
    // Many submissions in flight at once, several writes each, waited in reverse order.
    let mut tickets = Vec::new();
    for i in 0..32u64 {
        let writes = vec![
            Write::new(i * 8, pattern(i, 4096)),
            Write::new(i * 8 + 1, pattern(i + 100, 8192)),
        ];
        let flags = if i % 5 == 0 { WriteFlags::FUA } else { WriteFlags::NONE };
        tickets.push(dev.submit(writes, flags).unwrap());
    }
    for ticket in tickets.iter().rev() {
        dev.wait(*ticket).unwrap();
    }
    dev.flush().unwrap();
    for i in 0..32u64 {
        assert_same(&read_back(&dev, i * 8, 4096), &pattern(i, 4096)[..], "block i * 8, 4096");
        assert_same(
            &read_back(&dev, i * 8 + 1, 8192),
            &pattern(i + 100, 8192)[..],
            "block i * 8 + 1, 8192",
        );
    }
    let stats = dev.stats();
    assert_eq!((stats.submissions, stats.writes, stats.flushes), (32, 64, 1));
    assert_eq!(stats.fua_writes, 14);
    dev.trim(1000, 16).unwrap();
    assert!(matches!(dev.trim(g.block_count, 1), Err(MediaError::OutOfRange { .. })));
    // A fresh connection sees the same bytes (the server holds them, not the client).
    drop(dev);
    let again = server.open(options(10_000));
    assert_same(&read_back(&again, 8, 4096), &pattern(1, 4096)[..], "block 8, 4096");
}

#[test]
fn large_requests_are_split_at_the_servers_maximum_payload_over_tcp() {
    if !have("nbdkit") {
        return;
    }
    let dir = Scratch::new();
    // The policy filter advertises a 64 KiB maximum and fails any request above it.
    let server = Server::nbdkit_tcp(
        &dir,
        &[
            "--filter=blocksize-policy",
            "memory",
            "16M",
            "blocksize-minimum=512",
            "blocksize-preferred=4096",
            "blocksize-maximum=65536",
            "blocksize-error-policy=error",
        ],
    );
    let dev = server.open(options(10_000));
    let sizes = dev.export().block_sizes.expect("the filter advertises block sizes");
    assert_eq!((sizes.minimum, sizes.maximum), (512, 65536));
    let big = pattern(7, 1 << 20);
    dev.write_sync(vec![Write::new(3, big.clone())], WriteFlags::NONE).unwrap();
    dev.flush().unwrap();
    assert_same(&read_back(&dev, 3, 1 << 20), &big[..], "block 3, 1 << 20");
    assert_eq!(dev.stats().submit_syscalls, 16, "one request per 64 KiB piece");
}

#[test]
fn replies_out_of_order_are_matched_by_cookie() {
    if !have("nbdkit") {
        return;
    }
    let dir = Scratch::new();
    let server = Server::nbdkit(&dir, &["delay"], &["memory", "16M", "delay-write=800ms"]);
    let dev = server.open(options(10_000));
    let start = Instant::now();
    let slow = dev.submit(vec![Write::new(1, pattern(1, 4096))], WriteFlags::NONE).unwrap();
    // Sent after the write, answered before it: a later request completes first.
    let zero = read_back(&dev, 2, 4096);
    let read_done = start.elapsed();
    dev.wait(slow).unwrap();
    let write_done = start.elapsed();
    assert!(zero.iter().all(|&b| b == 0));
    assert!(read_done < Duration::from_millis(600), "read waited behind the write: {read_done:?}");
    assert!(write_done >= Duration::from_millis(800), "{write_done:?}");
    assert_same(&read_back(&dev, 1, 4096), &pattern(1, 4096)[..], "block 1, 4096");
}

#[test]
fn the_log_formats_commits_and_recovers_over_nbd() {
    if !have("nbdkit") {
        return;
    }
    let dir = Scratch::new();
    let server = Server::nbdkit(&dir, &[], &["memory", "32M"]);
    let config = LogConfig { streams: 2, segment_blocks: 64, uuid: [9; 16] };
    {
        let dev: Arc<dyn Device> = Arc::new(server.open(options(10_000)));
        Log::format(&*dev, &config).unwrap();
        let (log, recovery) = Log::open(dev, OpenOptions::default()).unwrap();
        assert!(recovery.streams.iter().all(|s| s.txs.is_empty()));
        for i in 0..50u32 {
            let mut tx = Transaction::new((i % 2) as u16);
            tx.record(format!("tx{i}").into_bytes());
            if i % 7 == 0 {
                tx.data(vec![i as u8; 4000]);
            }
            let mode = if i % 3 == 0 { CommitMode::Count } else { CommitMode::Ordered };
            log.commit_with(tx, mode).unwrap();
        }
        log.sync().unwrap();
    }
    let dev: Arc<dyn Device> = Arc::new(server.open(options(10_000)));
    let (_log, recovery) = Log::open(dev, OpenOptions::default()).unwrap();
    for stream in 0..2usize {
        let got: Vec<String> = recovery.streams[stream]
            .txs
            .iter()
            .map(|t| String::from_utf8_lossy(&t.records[0]).into_owned())
            .collect();
        let want: Vec<String> =
            (0..50).filter(|i| i % 2 == stream as u32).map(|i| format!("tx{i}")).collect();
        assert_eq!(got, want, "stream {stream}");
    }
}

#[test]
fn qemu_nbd_serves_an_image_that_survives_a_server_restart() {
    if !have("qemu-nbd") {
        return;
    }
    let dir = Scratch::new();
    let image = dir.path("disk.img");
    std::fs::File::create(&image).unwrap().set_len(16 << 20).unwrap();
    let config = LogConfig { streams: 2, segment_blocks: 32, uuid: [3; 16] };
    {
        let server = Server::qemu_nbd(&dir, &image, "disk");
        let dev = server.open(NbdOptions { connection_count: 2, ..options(10_000) });
        assert!(dev.connection_count() >= 1);
        let dev: Arc<dyn Device> = Arc::new(dev);
        Log::format(&*dev, &config).unwrap();
        let (log, _) = Log::open(dev, OpenOptions::default()).unwrap();
        for i in 0..20u32 {
            let mut tx = Transaction::new((i % 2) as u16);
            tx.record(format!("q{i}").into_bytes());
            log.commit_durable(tx).unwrap();
        }
        // An unknown export is refused with the server's reason, not a hang or a panic.
        let wrong = server.uri.replace("/disk?", "/nosuch?");
        let error = NbdDevice::open_uri(&wrong, options(5_000)).unwrap_err();
        assert!(
            matches!(nbd_source(&error), NbdError::Refused { reply, .. } if reply == "NBD_REP_ERR_UNKNOWN"),
            "{error}"
        );
    }
    let server = Server::qemu_nbd(&dir, &image, "disk");
    let dev: Arc<dyn Device> = Arc::new(server.open(options(10_000)));
    let (_log, recovery) = Log::open(dev, OpenOptions::default()).unwrap();
    let count: usize = recovery.streams.iter().map(|s| s.txs.len()).sum();
    assert_eq!(count, 20);
}

#[test]
fn several_connections_to_a_multi_conn_server() {
    if !have("nbdkit") {
        return;
    }
    let dir = Scratch::new();
    let server = Server::nbdkit(&dir, &[], &["memory", "16M"]);
    let dev = Arc::new(server.open(NbdOptions { connection_count: 4, ..options(10_000) }));
    assert_eq!(dev.connection_count(), 4, "nbdkit's memory plugin allows multi-conn");
    let threads: Vec<_> = (0..4u64)
        .map(|queue| {
            let dev = Arc::clone(&dev);
            std::thread::spawn(move || {
                for i in 0..16u64 {
                    let block = queue * 100 + i;
                    let t = dev.submit_on(
                        queue as usize,
                        vec![Write::new(block, pattern(block, 4096))],
                        WriteFlags::NONE,
                    );
                    dev.wait(t.unwrap()).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // One flush, on any connection, covers the writes of all of them (multi-conn).
    dev.flush().unwrap();
    for block in (0..4u64).flat_map(|q| (0..16).map(move |i| q * 100 + i)) {
        assert_same(&read_back(&*dev, block, 4096), &pattern(block, 4096)[..], "block block, 4096");
    }
}

#[test]
fn server_errors_are_io_errors_and_a_failed_write_or_flush_fails_the_device() {
    if !have("nbdkit") {
        return;
    }
    let dir = Scratch::new();
    let write_switch = dir.path("fail-writes");
    let read_switch = dir.path("fail-reads");
    let server = Server::nbdkit(
        &dir,
        &["error"],
        &[
            "memory",
            "16M",
            "error-pwrite=EIO",
            "error-pwrite-rate=100%",
            &format!("error-pwrite-file={}", write_switch.display()),
            "error-pread=EIO",
            "error-pread-rate=100%",
            &format!("error-pread-file={}", read_switch.display()),
        ],
    );
    // A read error is reported and leaves the device usable, as for a local disk.
    let dev = server.open(options(10_000));
    dev.write_sync(vec![Write::new(0, pattern(0, 4096))], WriteFlags::NONE).unwrap();
    std::fs::write(&read_switch, b"").unwrap();
    let mut buf = vec![0u8; 4096];
    let error = dev.read(0, &mut buf).unwrap_err();
    assert!(matches!(nbd_source(&error), NbdError::Server { errno: 5, .. }), "{error}");
    std::fs::remove_file(&read_switch).unwrap();
    assert_same(&read_back(&dev, 0, 4096), &pattern(0, 4096)[..], "block 0, 4096");

    // A failed write: its ticket reports the server's error; then everything is refused.
    std::fs::write(&write_switch, b"").unwrap();
    let ticket = dev.submit(vec![Write::new(1, pattern(1, 4096))], WriteFlags::NONE).unwrap();
    let error = dev.wait(ticket).unwrap_err();
    assert!(matches!(nbd_source(&error), NbdError::Server { errno: 5, .. }), "{error}");
    assert!(matches!(dev.wait(ticket), Err(MediaError::Nbd { .. })), "the same outcome again");
    std::fs::remove_file(&write_switch).unwrap();
    assert!(matches!(
        dev.submit(vec![Write::new(2, pattern(2, 4096))], WriteFlags::NONE),
        Err(MediaError::Failed { .. })
    ));
    assert!(matches!(dev.flush(), Err(MediaError::Failed { .. })));
    drop(dev);
}

#[test]
fn a_failed_flush_fails_the_device_and_is_not_retried() {
    if !have("nbdkit") {
        return;
    }
    let dir = Scratch::new();
    let flush_switch = dir.path("fail-flushes");
    // The error filter of nbdkit 1.32 cannot fail flushes; a shell-script export can.
    let flush = format!(
        "if [ -e '{}' ]; then echo 'EIO injected flush failure' >&2; exit 1; fi",
        flush_switch.display()
    );
    let server = Server::nbdkit(
        &dir,
        &[],
        &[
            "eval",
            "get_size=echo 16777216",
            "pread=dd if=/dev/zero count=$3 iflag=count_bytes status=none",
            "pwrite=cat >/dev/null",
            "can_write=exit 0",
            "can_flush=exit 0",
            &format!("flush={flush}"),
        ],
    );
    let dev = server.open(options(10_000));
    assert!(dev.export().flags & 4 != 0, "the export offers flush");
    dev.write_sync(vec![Write::new(3, pattern(3, 4096))], WriteFlags::NONE).unwrap();
    dev.flush().unwrap();
    std::fs::write(&flush_switch, b"").unwrap();
    let error = dev.flush().unwrap_err();
    assert!(matches!(nbd_source(&error), NbdError::Server { errno: 5, .. }), "{error}");
    std::fs::remove_file(&flush_switch).unwrap();
    assert!(matches!(dev.flush(), Err(MediaError::Failed { .. })), "never retried");
    let refused = dev.submit(vec![Write::new(4, pattern(4, 4096))], WriteFlags::NONE);
    assert!(matches!(refused, Err(MediaError::Failed { .. })));
}

#[test]
fn a_server_killed_mid_request_is_an_error_within_the_timeout() {
    if !have("nbdkit") {
        return;
    }
    let dir = Scratch::new();
    let mut server = Server::nbdkit(&dir, &["delay"], &["memory", "16M", "delay-write=20"]);
    let dev = server.open(options(5_000));
    let ticket = dev.submit(vec![Write::new(1, pattern(1, 4096))], WriteFlags::NONE).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let start = Instant::now();
    server.kill();
    let error = dev.wait(ticket).unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(3), "took {:?}", start.elapsed());
    assert!(matches!(nbd_source(&error), NbdError::Disconnected { .. }), "{error}");
    let mut buf = vec![0u8; 4096];
    assert!(dev.read(0, &mut buf).is_err(), "reads fail too, at once");
    assert!(matches!(dev.flush(), Err(MediaError::Failed { .. })));
}

#[test]
fn a_stalled_server_times_out_instead_of_hanging() {
    if !have("nbdkit") {
        return;
    }
    let dir = Scratch::new();
    let server = Server::nbdkit(&dir, &["delay"], &["memory", "16M", "delay-write=30"]);
    let dev = server.open(options(1_000));
    let start = Instant::now();
    let ticket = dev.submit(vec![Write::new(1, pattern(1, 4096))], WriteFlags::NONE).unwrap();
    let error = dev.wait(ticket).unwrap_err();
    let waited = start.elapsed();
    assert!(matches!(nbd_source(&error), NbdError::Timeout { .. }), "{error}");
    assert!(waited >= Duration::from_secs(1) && waited < Duration::from_secs(4), "{waited:?}");
    assert!(matches!(dev.flush(), Err(MediaError::Failed { .. })));
    // Closing does not wait for the stalled server either.
    let start = Instant::now();
    drop(dev);
    assert!(start.elapsed() < Duration::from_secs(3), "close took {:?}", start.elapsed());
}

#[test]
fn unreachable_servers_and_bad_uris_fail_fast_with_clear_errors() {
    let dir = Scratch::new();
    let missing = format!("nbd+unix:///?socket={}", dir.path("none.sock").display());
    let error = NbdDevice::open_uri(&missing, options(2_000)).unwrap_err();
    assert!(matches!(nbd_source(&error), NbdError::Connect { .. }), "{error}");
    assert!(error.to_string().contains("none.sock"), "{error}");
    let error = NbdDevice::open_uri("nbds://host/x", options(2_000)).unwrap_err();
    assert!(matches!(nbd_source(&error), NbdError::BadUri { .. }), "{error}");
    let target = NbdTarget::parse(&missing).unwrap();
    assert_eq!(target.to_string(), missing);
}

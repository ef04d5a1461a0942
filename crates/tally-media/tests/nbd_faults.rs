//! Faults of a remote target under the log (issue 18, "Faults"): a real `nbdkit` whose `error`
//! filter fails writes or reads on demand, a shell-script export over a file whose flush fails
//! on demand (nbdkit 1.32's error filter cannot fail flushes), and a server killed while a
//! durable commit is in flight. Each time: the log fails stop (the commit in progress fails,
//! and every later commit, durable commit or sync fails; nothing is acknowledged after the
//! fault), and once the fault is gone a new open recovers every commit acknowledged durable
//! before it, each stream a prefix of what was committed, every record as written. A read
//! error during recovery fails the open (it is never taken for the end of the log) and the
//! next open, without the error, loses nothing.
//!
//! The same on a three-target image whose target 1 alone fails: the whole device fails stop.
//! And with `qemu-nbd`: three servers of a multi-target image killed at random moments of a
//! workload, five times: the workload fails at once, and each restart recovers everything
//! acknowledged durable.

mod nbd_common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nbd_common::{have, Nbdkit, QemuNbd, Scratch};
use tally_log::{Log, LogConfig, LogError, OpenOptions, Transaction};
use tally_media::{Device, NbdDevice, NbdOptions, SpanDevice, SpanLayout};

const STREAMS: u16 = 2;
const SEGMENT_BLOCKS: u32 = 16;

fn record(stream: u16, n: u64) -> Vec<u8> {
    let mut r = vec![0u8; 40];
    r[..2].copy_from_slice(&stream.to_le_bytes());
    r[2..10].copy_from_slice(&n.to_le_bytes());
    for (i, b) in r.iter_mut().enumerate().skip(10) {
        *b = (n as u8).wrapping_mul(13).wrapping_add(i as u8) ^ stream as u8;
    }
    r
}

fn options() -> NbdOptions {
    NbdOptions {
        connection_count: u32::from(STREAMS),
        timeout: Duration::from_secs(30),
        ..NbdOptions::default()
    }
}

/// The image: one export, or a span over several (whose open reads every target's header).
fn try_device(servers: &[Nbdkit], format: bool) -> tally_media::Result<Arc<dyn Device>> {
    let open = |s: &Nbdkit| -> Arc<dyn Device> {
        Arc::new(NbdDevice::open_uri(&s.uri, options()).expect("open the export"))
    };
    if let [one] = servers {
        return Ok(open(one));
    }
    let targets = servers.iter().map(open).collect();
    let layout = SpanLayout { stripe_blocks: SEGMENT_BLOCKS, lead_blocks: 2 };
    let span = if format { SpanDevice::format(targets, layout) } else { SpanDevice::open(targets) };
    Ok(Arc::new(span?))
}

fn device(servers: &[Nbdkit], format: bool) -> Arc<dyn Device> {
    try_device(servers, format).expect("the targets")
}

fn format(dev: &dyn Device) {
    let config = LogConfig { streams: STREAMS, segment_blocks: SEGMENT_BLOCKS, uuid: [9; 16] };
    Log::format(dev, &config).expect("format");
}

/// What the workload committed: per stream, the count tried (a commit that failed may still
/// have reached the device), the count committed and the count acknowledged durable (commits
/// are numbered from 0 on each stream).
#[derive(Debug, Default, Clone)]
struct Committed {
    tried: Vec<u64>,
    committed: Vec<u64>,
    durable: Vec<u64>,
}

impl Committed {
    fn new() -> Self {
        let zeros = vec![0; usize::from(STREAMS)];
        Committed { tried: zeros.clone(), committed: zeros.clone(), durable: zeros }
    }
}

/// Commit `n` transactions alternately on both streams, every third durable, the rest
/// ordered; then sync. Stops at the first error, which it returns.
fn commit_some(log: &Log, seen: &mut Committed, n: u64) -> Result<(), LogError> {
    for i in 0..n {
        let stream = (i % u64::from(STREAMS)) as u16;
        let s = usize::from(stream);
        let mut tx = Transaction::new(stream);
        tx.record(record(stream, seen.committed[s]));
        tx.data(vec![stream as u8 ^ 0x5A; 4096]);
        seen.tried[s] = seen.committed[s] + 1;
        if i % 3 == 2 {
            log.commit_durable(tx)?;
            seen.committed[s] += 1;
            seen.durable[s] = seen.committed[s];
        } else {
            log.commit(tx)?;
            seen.committed[s] += 1;
        }
    }
    log.sync()?;
    seen.durable = seen.committed.clone();
    Ok(())
}

/// After a fault: the log refuses everything, so nothing more is acknowledged.
fn assert_failed_stop(log: &Log, seen: &Committed) {
    let mut tx = Transaction::new(0);
    tx.record(record(0, seen.committed[0]));
    assert!(log.commit_durable(tx).is_err(), "a durable commit acknowledged after the fault");
    assert!(log.sync().is_err(), "a sync acknowledged after the fault");
    let mut tx = Transaction::new(1);
    tx.record(record(1, seen.committed[1]));
    assert!(log.commit(tx).is_err(), "an ordered commit accepted after the fault");
}

/// Open the image again and check: every durable commit is there, each stream a prefix of
/// what was tried, every record as written.
fn assert_recovers(dev: Arc<dyn Device>, seen: &Committed) {
    recover_and_check(dev, seen);
}

/// [`assert_recovers`], returning the log and, per stream, how many transactions it recovered.
fn recover_and_check(dev: Arc<dyn Device>, seen: &Committed) -> (Log, Vec<u64>) {
    let (log, rec) = Log::open(dev, OpenOptions::default()).expect("recovery after the fault");
    for (s, stream) in rec.streams.iter().enumerate() {
        let got = stream.txs.len() as u64;
        assert!(
            got >= seen.durable[s] && got <= seen.tried[s],
            "stream {s}: recovered {got}, durable {}, committed {}, tried {}",
            seen.durable[s],
            seen.committed[s],
            seen.tried[s]
        );
        for (n, tx) in stream.txs.iter().enumerate() {
            assert_eq!(tx.records, vec![record(s as u16, n as u64)], "stream {s} tx {n}");
        }
    }
    let counts = rec.streams.iter().map(|s| s.txs.len() as u64).collect();
    (log, counts)
}

fn file_server(dir: &Scratch, name: &str, switches: Option<(&Path, &Path)>) -> Nbdkit {
    let image = dir.path(&format!("{name}.img"));
    if !image.exists() {
        std::fs::File::create(&image).unwrap().set_len(16 << 20).unwrap();
    }
    let socket = dir.path(&format!("{name}.sock"));
    let file = format!("file={}", image.display());
    match switches {
        None => Nbdkit::start(&socket, &[], &["file", &file]),
        Some((writes, reads)) => {
            let w = format!("error-pwrite-file={}", writes.display());
            let r = format!("error-pread-file={}", reads.display());
            let params = [
                "file",
                &file,
                "error-pwrite=EIO",
                "error-pwrite-rate=100%",
                &w,
                "error-pread=EIO",
                "error-pread-rate=100%",
                &r,
            ];
            Nbdkit::start(&socket, &["error"], &params)
        }
    }
}

/// `targets` file exports in `dir`, export `failing` behind the error filter: it fails every
/// write while the first switch file returned exists, every read while the second does.
fn fault_servers(
    dir: &Scratch,
    targets: usize,
    failing: usize,
) -> (Vec<Nbdkit>, std::path::PathBuf, std::path::PathBuf) {
    let (wsw, rsw) = (dir.path("fail-writes"), dir.path("fail-reads"));
    let servers = (0..targets)
        .map(|i| {
            let name = format!("t{i}");
            file_server(dir, &name, (i == failing).then_some((wsw.as_path(), rsw.as_path())))
        })
        .collect();
    (servers, wsw, rsw)
}

/// Write errors on `failing` of `targets` exports: fail-stop, then recovery once they stop.
fn write_errors(targets: usize, failing: usize) {
    let dir = Scratch::new("nbd-faults-w");
    let (servers, wsw, _) = fault_servers(&dir, targets, failing);
    let dev = device(&servers, true);
    format(&*dev);
    let (log, _) = Log::open(dev, OpenOptions::default()).unwrap();
    let mut seen = Committed::new();
    commit_some(&log, &mut seen, 30).expect("commits before the fault");
    std::fs::write(&wsw, b"").unwrap();
    let error = commit_some(&log, &mut seen, 30).expect_err("writes fail");
    println!("write error ({targets} targets): {error}");
    assert_failed_stop(&log, &seen);
    drop(log);
    std::fs::remove_file(&wsw).unwrap();
    assert_recovers(device(&servers, false), &seen);
}

#[test]
fn write_errors_fail_the_log_stop_and_a_new_open_recovers_every_durable_commit() {
    if !have("nbdkit") {
        return;
    }
    write_errors(1, 0);
}

#[test]
fn write_errors_on_one_target_of_three_fail_the_whole_image_stop() {
    if !have("nbdkit") {
        return;
    }
    write_errors(3, 1);
}

/// A read error while recovering fails the open; the next open, without it, loses nothing.
#[test]
fn read_errors_fail_recovery_instead_of_cutting_the_log_and_a_new_open_recovers() {
    if !have("nbdkit") {
        return;
    }
    for (targets, failing) in [(1, 0), (3, 2)] {
        let dir = Scratch::new("nbd-faults-r");
        let (servers, _, rsw) = fault_servers(&dir, targets, failing);
        let dev = device(&servers, true);
        format(&*dev);
        let (log, _) = Log::open(dev, OpenOptions::default()).unwrap();
        let mut seen = Committed::new();
        // Enough to reach every target: 2 blocks a transaction, 16-block segments.
        commit_some(&log, &mut seen, 80).expect("commits");
        drop(log);
        // The targets' headers are read before the switch: the reads that fail are the log's.
        let dev = device(&servers, false);
        std::fs::write(&rsw, b"").unwrap();
        let opened = Log::open(dev, OpenOptions::default());
        match opened {
            Ok(_) => panic!("recovery succeeded while every read of target {failing} failed"),
            Err(e) => println!("read error at recovery ({targets} targets): {e}"),
        }
        std::fs::remove_file(&rsw).unwrap();
        assert_recovers(device(&servers, false), &seen);
    }
}

/// The flush fails: an eval export over a file whose flush fails while a switch file exists.
#[test]
fn a_failed_flush_fails_the_log_stop_and_a_new_open_recovers_every_durable_commit() {
    if !have("nbdkit") {
        return;
    }
    let dir = Scratch::new("nbd-faults-f");
    let image = dir.path("t.img");
    std::fs::File::create(&image).unwrap().set_len(4 << 20).unwrap();
    let switch = dir.path("fail-flushes");
    let (img, sw) = (image.display(), switch.display());
    let params = [
        "eval".to_string(),
        "get_size=echo 4194304".into(),
        format!("pread=dd if='{img}' skip=$4 count=$3 iflag=skip_bytes,count_bytes status=none"),
        format!("pwrite=dd of='{img}' seek=$4 oflag=seek_bytes conv=notrunc status=none"),
        "can_write=exit 0".into(),
        "can_flush=exit 0".into(),
        format!("flush=if [ -e '{sw}' ]; then echo 'EIO injected' >&2; exit 1; fi; sync '{img}'"),
    ];
    let params: Vec<&str> = params.iter().map(String::as_str).collect();
    let server = Nbdkit::start(&dir.path("t.sock"), &[], &params);
    let one = || -> Arc<dyn Device> {
        let o = NbdOptions { connection_count: 1, ..options() };
        Arc::new(NbdDevice::open_uri(&server.uri, o).expect("open the export"))
    };
    let dev = one();
    format(&*dev);
    let (log, _) = Log::open(dev, OpenOptions::default()).unwrap();
    let mut seen = Committed::new();
    commit_some(&log, &mut seen, 12).expect("commits before the fault");
    std::fs::write(&switch, b"").unwrap();
    let error = commit_some(&log, &mut seen, 12).expect_err("the flush fails");
    println!("flush error: {error}");
    assert_failed_stop(&log, &seen);
    drop(log);
    std::fs::remove_file(&switch).unwrap();
    assert_recovers(one(), &seen);
}

/// The server dies while a durable commit waits for its write: the commit fails at once (not
/// after the 30 s timeout), the log fails stop, and the restarted server's image recovers.
#[test]
fn a_connection_cut_mid_commit_fails_at_once_and_a_new_open_recovers() {
    if !have("nbdkit") {
        return;
    }
    let dir = Scratch::new("nbd-faults-cut");
    let image = dir.path("t.img");
    std::fs::File::create(&image).unwrap().set_len(16 << 20).unwrap();
    let socket = dir.path("t.sock");
    let file = format!("file={}", image.display());
    let mut slow = Nbdkit::start(&socket, &["delay"], &["file", &file, "delay-write=3"]);
    let dev: Arc<dyn Device> = Arc::new(NbdDevice::open_uri(&slow.uri, options()).unwrap());
    format(&*dev);
    let (log, _) = Log::open(dev, OpenOptions::default()).unwrap();
    let mut seen = Committed::new();
    commit_some(&log, &mut seen, 2).expect("commits before the cut");
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        slow.kill();
    });
    let start = Instant::now();
    let error = commit_some(&log, &mut seen, 3).expect_err("the connection was cut");
    let took = start.elapsed();
    killer.join().unwrap();
    println!("cut mid-commit: {error} after {took:?}");
    assert!(took < Duration::from_secs(3), "the cut was seen after {took:?}");
    assert!(error.to_string().contains("connection lost"), "not a clear error: {error}");
    assert_failed_stop(&log, &seen);
    drop(log);
    let server = Nbdkit::start(&socket, &[], &["file", &file]);
    let dev: Arc<dyn Device> = Arc::new(NbdDevice::open_uri(&server.uri, options()).unwrap());
    assert_recovers(dev, &seen);
}

/// qemu-nbd: a three-target image whose servers are all killed at a random moment of the
/// workload, five times. Each time the workload fails at once with a clear error, and the
/// restarted servers' images recover every commit acknowledged durable, each stream a prefix.
#[test]
fn qemu_nbd_targets_killed_mid_workload_fail_at_once_and_recover_every_durable_commit() {
    if !have("qemu-nbd") {
        return;
    }
    let dir = Scratch::new("nbd-faults-qemu");
    let sockets: Vec<_> = (0..3).map(|i| dir.path(&format!("q{i}.sock"))).collect();
    let images: Vec<_> = (0..3).map(|i| dir.path(&format!("q{i}.img"))).collect();
    for image in &images {
        std::fs::File::create(image).unwrap().set_len(16 << 20).unwrap();
    }
    let start = || -> Vec<QemuNbd> {
        sockets.iter().zip(&images).map(|(s, i)| QemuNbd::start(s, i)).collect()
    };
    let open = |servers: &[QemuNbd], format: bool| -> Arc<dyn Device> {
        let targets = servers
            .iter()
            .map(|s| {
                Arc::new(NbdDevice::open_uri(&s.uri, options()).expect("open qemu-nbd"))
                    as Arc<dyn Device>
            })
            .collect();
        let layout = SpanLayout { stripe_blocks: SEGMENT_BLOCKS, lead_blocks: 2 };
        let span =
            if format { SpanDevice::format(targets, layout) } else { SpanDevice::open(targets) };
        Arc::new(span.expect("the qemu-nbd targets"))
    };
    let mut servers = start();
    let dev = open(&servers, true);
    format(&*dev);
    let (mut log, _) = Log::open(dev, OpenOptions::default()).unwrap();
    let mut seen = Committed::new();
    let mut rng = fastrand::Rng::with_seed(18);
    for cycle in 0..5 {
        let pids: Vec<u32> = servers.iter().map(QemuNbd::pid).collect();
        let wait = Duration::from_millis(rng.u64(50..400));
        let killer = std::thread::spawn(move || {
            std::thread::sleep(wait);
            for pid in pids {
                let _ = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status();
            }
            Instant::now()
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        let error = loop {
            if let Err(e) = commit_some(&log, &mut seen, 10) {
                break e;
            }
            assert!(Instant::now() < deadline, "cycle {cycle}: the workload never failed");
        };
        let failed_at = Instant::now();
        let killed_at = killer.join().unwrap();
        let late = failed_at.saturating_duration_since(killed_at);
        println!("cycle {cycle}: {error} ({late:?} after the kill), {seen:?}");
        assert!(late < Duration::from_secs(3), "cycle {cycle}: the kill was seen after {late:?}");
        assert_failed_stop(&log, &seen);
        drop(log);
        for s in &mut servers {
            s.kill();
        }
        servers = start();
        let (recovered, counts) = recover_and_check(open(&servers, false), &seen);
        log = recovered;
        seen = Committed { tried: counts.clone(), committed: counts.clone(), durable: counts };
    }
}

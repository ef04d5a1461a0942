//! Recovery time of a log spread over several NBD targets against the same log on a local file
//! (issue 18's benchmark): write a log of `--mib` MiB of ordered transactions (one 4 KiB data
//! block and a small record each, over `--streams` streams from as many threads: two blocks of
//! log per transaction, its data and its unit, so `--mib 1024` is 131,072 transactions and
//! about 1 GiB written, which the JSON reports as `written_mib`), make them durable, drop
//! the log without a clean close (so opening it scans the whole log, as after a crash), then
//! time `Log::open` `--repeat` times. The device is a local file (`--file PATH`, read through
//! the page cache like nbdkit's file plugin reads its file, so the comparison is of the
//! protocol and the striping, not of O_DIRECT against cached reads) or NBD URIs (one export, or
//! a multi-target image striped a segment per target, or `--stripe BLOCKS`).
//!
//! ```text
//! cargo run --release -p tally-media --example recovery_time -- --mib 1024 --file /var/tmp/r.img
//! cargo run --release -p tally-media --example recovery_time -- --mib 1024 URI URI URI
//! ```
//!
//! Prints one JSON object (times in seconds; `read_mib`: what the last recovery read). The
//! device needs about twice `--mib` (the segments the log fills, rounded, and spare ones).
//! Overwrites the file or exports.

use std::sync::Arc;
use std::time::Instant;

use tally_log::{CommitMode, Log, LogConfig, OpenOptions, Transaction};
use tally_media::{
    DirectMode, FileDevice, FileOptions, NbdDevice, NbdOptions, SpanDevice, SpanLayout,
};

const SEGMENT_BLOCKS: u32 = 1024;

fn main() {
    let (mut mib, mut streams, mut repeat, mut file, mut uris) =
        (1024u64, 4u16, 3u32, None, vec![]);
    // Blocks of a stripe of a multi-target image: a segment by default (as `tally mkfs`).
    let mut stripe = SEGMENT_BLOCKS;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().expect("a value after the option");
        match arg.as_str() {
            "--mib" => mib = value().parse().expect("--mib N"),
            "--streams" => streams = value().parse().expect("--streams N"),
            "--repeat" => repeat = value().parse().expect("--repeat N"),
            "--file" => file = Some(value()),
            "--stripe" => stripe = value().parse().expect("--stripe BLOCKS"),
            _ => uris.push(arg),
        }
    }
    let open = || -> Arc<dyn tally_media::Device> {
        if let Some(path) = &file {
            let options = FileOptions { direct: DirectMode::Off, ..FileOptions::default() };
            return Arc::new(FileDevice::open(path, options).expect("open the file"));
        }
        let options = NbdOptions { connection_count: u32::from(streams), ..NbdOptions::default() };
        let nbd: Vec<Arc<dyn tally_media::Device>> = uris
            .iter()
            .map(|u| {
                Arc::new(NbdDevice::open_uri(u, options).expect("open the export"))
                    as Arc<dyn tally_media::Device>
            })
            .collect();
        if nbd.len() == 1 {
            return nbd[0].clone();
        }
        Arc::new(SpanDevice::open(nbd).expect("open the targets"))
    };
    // Format.
    if file.is_none() && uris.len() > 1 {
        let options = NbdOptions::default();
        let nbd = uris
            .iter()
            .map(|u| {
                Arc::new(NbdDevice::open_uri(u, options).expect("open the export"))
                    as Arc<dyn tally_media::Device>
            })
            .collect();
        let layout = SpanLayout { stripe_blocks: stripe, lead_blocks: 2 };
        drop(SpanDevice::format(nbd, layout).expect("format the targets"));
    }
    let dev = open();
    let config = LogConfig { streams, segment_blocks: SEGMENT_BLOCKS, ..LogConfig::default() };
    Log::format(&*dev, &config).expect("format the log");
    let written_before = dev.stats().bytes_written;
    let (log, _) = Log::open(dev.clone(), OpenOptions::default()).expect("open the log");
    // Two blocks of log per transaction: its data block and its unit.
    let tx_per_stream = mib * 256 / 2 / u64::from(streams);
    let write_started = Instant::now();
    std::thread::scope(|scope| {
        for s in 0..streams {
            let log = &log;
            scope.spawn(move || {
                for i in 0..tx_per_stream {
                    let mut tx = Transaction::new(s);
                    tx.data(vec![(i as u8) ^ (s as u8); 4096]);
                    tx.record(i.to_le_bytes().to_vec());
                    log.commit_with(tx, CommitMode::Ordered).expect("commit");
                }
                // Before the thread exits: io_uring cancels a buffered write still queued on
                // the io-wq of a task that has exited (seen as ECANCELED without this).
                log.sync().expect("sync");
            });
        }
    });
    log.sync().expect("sync");
    let write_s = write_started.elapsed().as_secs_f64();
    drop(log);
    let written_mib = dev.stats().bytes_written.saturating_sub(written_before) as f64 / 1048576.0;
    drop(dev);
    let mut read_mib = 0.0;
    let mut times = Vec::new();
    let mut recovered = 0u64;
    for _ in 0..repeat {
        let dev = open();
        let read_before = dev.stats().bytes_read;
        let started = Instant::now();
        let (log, recovery) = Log::open(dev.clone(), OpenOptions::default()).expect("recover");
        times.push(started.elapsed().as_secs_f64());
        read_mib = dev.stats().bytes_read.saturating_sub(read_before) as f64 / 1048576.0;
        recovered = recovery.streams.iter().map(|s| s.txs.len() as u64).sum();
        drop(log);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "{{\"device\": \"{}\", \"mib\": {mib}, \"streams\": {streams}, \"transactions\": {recovered}, \
         \"written_mib\": {written_mib:.0}, \"read_mib\": {read_mib:.0}, \"write_s\": {write_s:.2}, \"recovery_s\": {times:?}, \"recovery_median_s\": {:.3}}}",
        if file.is_some() { "local file".to_string() } else { format!("{} NBD target(s)", uris.len()) },
        times[times.len() / 2]
    );
}

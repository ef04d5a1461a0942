//! The "Linux-style" ordering baseline of issue 18's benchmark (what RIO is measured against):
//! each thread writes a transaction's blocks (a unit and `--blocks` data blocks, default 1, as
//! `tally bench tx --blocks`), waits for them,
//! flushes, and only then sends the next: order by waiting for durability, one flush per
//! ordered write. Run over one NBD export or a multi-target image of several (a `SpanDevice`
//! striped at `--stripe` blocks; thread `t` writes in stripe `t`, so threads spread over the
//! targets), with one connection per thread on each target.
//!
//! ```text
//! cargo run --release -p tally-media --example flush_per_write -- \
//!     --threads 8 --seconds 2 'nbd+unix:///?socket=/tmp/a.sock' 'nbd+unix:///?socket=/tmp/b.sock'
//! ```
//!
//! Prints one JSON object: transactions, tx/s, flushes per transaction (requests the targets
//! received), CPU µs per transaction. Overwrites the exports.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tally_media::{
    Device, IoBuf, NbdDevice, NbdOptions, SpanDevice, SpanLayout, Write, WriteFlags,
};

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is always valid.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(usage.ru_utime) + t(usage.ru_stime)
}

fn main() {
    let mut threads = 1u16;
    let mut seconds = 2.0f64;
    let mut stripe = 256u32;
    let mut blocks = 1u32;
    let mut uris = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().expect("a value after the option");
        match arg.as_str() {
            "--threads" => threads = value().parse().expect("--threads N"),
            "--seconds" => seconds = value().parse().expect("--seconds S"),
            "--stripe" => stripe = value().parse().expect("--stripe BLOCKS"),
            "--blocks" => blocks = value().parse().expect("--blocks N (data blocks a transaction)"),
            _ => uris.push(arg),
        }
    }
    assert!(!uris.is_empty(), "give one NBD URI or several");
    let options = NbdOptions { connection_count: u32::from(threads), ..NbdOptions::default() };
    let nbd: Vec<Arc<NbdDevice>> = uris
        .iter()
        .map(|u| Arc::new(NbdDevice::open_uri(u, options).expect("open the export")))
        .collect();
    let (dev, lead): (Arc<dyn Device>, u64) = if let [one] = &nbd[..] {
        (one.clone(), 0)
    } else {
        let targets = nbd.iter().map(|d| d.clone() as Arc<dyn Device>).collect();
        let layout = SpanLayout { stripe_blocks: stripe, lead_blocks: 2 };
        (Arc::new(SpanDevice::format(targets, layout).expect("format the targets")), 2)
    };
    let flushes_before: u64 = nbd.iter().map(|d| d.stats().flushes).sum();
    let block_size = dev.geometry().block_size as usize;
    let txs = AtomicU64::new(0);
    let cpu_before = cpu_seconds();
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    std::thread::scope(|scope| {
        for t in 0..threads {
            let (dev, txs) = (&dev, &txs);
            scope.spawn(move || {
                let base = lead + u64::from(t) * u64::from(stripe);
                let per_tx = u64::from(blocks) + 1;
                let slots = (u64::from(stripe) / per_tx).max(1);
                let data = IoBuf::from_slice(&vec![t as u8 ^ 0x5a; per_tx as usize * block_size]);
                let mut i = 0u64;
                while Instant::now() < deadline {
                    let write = Write::new(base + per_tx * (i % slots), data.clone());
                    let ticket = dev.submit_stream(t, vec![write], WriteFlags::NONE).unwrap();
                    dev.wait(ticket).unwrap();
                    dev.flush().unwrap();
                    i += 1;
                }
                txs.fetch_add(i, Ordering::Relaxed);
            });
        }
    });
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu_before;
    let tx = txs.load(Ordering::Relaxed);
    let flushes: u64 = nbd.iter().map(|d| d.stats().flushes).sum::<u64>() - flushes_before;
    let per_tx = |x: f64| if tx == 0 { 0.0 } else { x / tx as f64 };
    println!(
        "{{\"targets\": {}, \"threads\": {threads}, \"blocks\": {blocks}, \"tx\": {tx}, \"tx_per_sec\": {:.1}, \
         \"flushes_per_tx\": {:.3}, \"cpu_us_per_tx\": {:.1}}}",
        nbd.len(),
        tx as f64 / elapsed,
        per_tx(flushes as f64),
        per_tx(cpu * 1e6)
    );
}

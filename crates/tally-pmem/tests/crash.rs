//! Crash exploration of the log on `tally-sim`'s cache-line simulator (`PmemSim`).
//!
//! Each workload is a few commits of 64 B – 1 KiB records (and releases, so the ring wraps),
//! run on a small region. At every crash point — before every flush (units stored, not
//! flushed), before every fence (flushed, not fenced: also inside release and inside the epoch
//! bump at open), and after every commit and release returns — every crash image (or a seeded
//! sample when too many) is opened and checked:
//! - **I1 atomicity**: every recovered transaction has exactly the committed records;
//! - **I2 prefix**: recovered seqs are consecutive, start at the head (old or new while a
//!   release is in flight) and go no further than the commit in flight (no phantom);
//! - **I3 durability**: every commit that returned is recovered;
//! - **I4 recovery works**: open succeeds on every legal image;
//! - **I5 idempotence**: a second open recovers the same transactions;
//! - **I6 forward progress**: a commit after recovery works and is recovered by the next open.
//!
//! The mutants (feature `mutants`) must each produce violations; the correct protocol none.

use std::sync::Mutex;

use tally_media::pmem::{Pmem, PmemError};
use tally_pmem::{CommitMode, LogConfig, Mutant, PmemLog, PmemLogError, RecoveredTx, Tuning};
use tally_sim::{PmemCrashOptions, PmemSim};

/// One step of a workload.
#[derive(Debug, Clone)]
enum Op {
    /// Commit a transaction with records of these sizes.
    Commit(Vec<usize>),
    /// Release every transaction but the newest.
    Release,
}

#[derive(Debug, Clone, Copy)]
struct Setup {
    name: &'static str,
    mode: CommitMode,
    unit_size: u32,
    nt_copy_min: u32,
    /// Slots in the simulated region: small, so workloads wrap the ring, yet room for the
    /// largest transaction (2 KiB) next to the newest one, which a release keeps.
    unit_slots: u64,
    mutant: Option<Mutant>,
}

impl Setup {
    fn tuning(&self) -> Tuning {
        Tuning { nt_copy_min: self.nt_copy_min, unordered: false, mutant: self.mutant }
    }
}

#[derive(Debug, Default, Clone)]
struct Counts {
    workloads: u64,
    points: u64,
    images: u64,
    sampled_points: u64,
    violations: u64,
    first: Vec<String>,
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        self.workloads += o.workloads;
        self.points += o.points;
        self.images += o.images;
        self.sampled_points += o.sampled_points;
        self.violations += o.violations;
        for f in &o.first {
            if self.first.len() < 5 {
                self.first.push(f.clone());
            }
        }
    }
}

/// What the program committed, for judging images.
#[derive(Default)]
struct Oracle {
    /// Records of every transaction by seq - 1, including the one in flight.
    committed: Vec<Vec<Vec<u8>>>,
    /// Commits that returned.
    acked: u64,
    /// Oldest live seq once the last release returned, and the one a release in flight sets.
    head_durable: u64,
    head_pending: u64,
    /// Check at flushes and fences (off during format).
    armed: bool,
    point: String,
}

/// A `Pmem` that checks every crash image at each flush and fence before passing it on.
struct Probe<'s> {
    sim: &'s PmemSim,
    setup: Setup,
    options: PmemCrashOptions,
    oracle: Mutex<Oracle>,
    counts: Mutex<Counts>,
    workload: String,
}

impl Probe<'_> {
    fn check_point(&self, what: &str) {
        let oracle = self.oracle.lock().unwrap();
        if !oracle.armed {
            return;
        }
        let point = format!("{} {what}", oracle.point);
        let images = self.sim.crash_images(&self.options);
        let exhaustive = images.is_exhaustive();
        let mut local =
            Counts { points: 1, sampled_points: u64::from(!exhaustive), ..Counts::default() };
        for (i, image) in images.enumerate() {
            local.images += 1;
            if let Err(why) = judge(&self.setup, &oracle, image) {
                local.violations += 1;
                if local.first.len() < 3 {
                    local.first.push(format!(
                        "[{}] workload {} at {point}, image {i}: {why}",
                        self.setup.name, self.workload
                    ));
                }
            }
        }
        self.counts.lock().unwrap().add(&local);
    }
}

impl Pmem for Probe<'_> {
    fn len(&self) -> u64 {
        self.sim.len()
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), PmemError> {
        self.sim.read(off, buf)
    }
    fn write(&self, off: u64, bytes: &[u8]) -> Result<(), PmemError> {
        self.sim.store(off, bytes)
    }
    fn memcpy_nt(&self, off: u64, src: &[u8]) -> Result<(), PmemError> {
        self.sim.store_nt(off, src)
    }
    fn store_u64_atomic(&self, off: u64, value: u64) -> Result<(), PmemError> {
        self.sim.store_u64_atomic(off, value)
    }
    fn flush(&self, off: u64, len: u64) -> Result<(), PmemError> {
        self.check_point("before a flush");
        self.sim.flush(off, len)
    }
    fn fence(&self) {
        self.check_point("before a fence");
        self.sim.fence();
    }
}

/// Deterministic record bytes: distinct per seq, record and position.
fn record(seq: u64, index: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (seq as usize * 31 + index * 7 + i * 13 + (i >> 8)) as u8).collect()
}

/// A `Pmem` that, once armed, collects the crash images before every fence: a second crash
/// inside the first commit after recovery.
struct SecondCrash<'s> {
    sim: &'s PmemSim,
    armed: Mutex<bool>,
    images: Mutex<Vec<Vec<u8>>>,
}

impl Pmem for SecondCrash<'_> {
    fn len(&self) -> u64 {
        self.sim.len()
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), PmemError> {
        self.sim.read(off, buf)
    }
    fn write(&self, off: u64, bytes: &[u8]) -> Result<(), PmemError> {
        self.sim.store(off, bytes)
    }
    fn memcpy_nt(&self, off: u64, src: &[u8]) -> Result<(), PmemError> {
        self.sim.store_nt(off, src)
    }
    fn store_u64_atomic(&self, off: u64, value: u64) -> Result<(), PmemError> {
        self.sim.store_u64_atomic(off, value)
    }
    fn flush(&self, off: u64, len: u64) -> Result<(), PmemError> {
        self.sim.flush(off, len)
    }
    fn fence(&self) {
        if *self.armed.lock().unwrap() {
            let options = PmemCrashOptions { images_max: 256, samples: 16, ..options() };
            self.images.lock().unwrap().extend(self.sim.crash_images(&options));
        }
        self.sim.fence();
    }
}

/// Judge one crash image against the oracle: I1–I6, then a second crash inside the first
/// commit after recovery.
fn judge(setup: &Setup, oracle: &Oracle, image: Vec<u8>) -> Result<(), String> {
    let sim = PmemSim::from_image(image);
    let txs = {
        let (_log, txs) =
            PmemLog::open(&sim, setup.tuning()).map_err(|e| format!("I4 open failed: {e}"))?;
        txs
    };
    check_recovered(oracle, &txs)?;
    let second = SecondCrash { sim: &sim, armed: Mutex::new(false), images: Mutex::default() };
    let (mut log, again) =
        PmemLog::open(&second, setup.tuning()).map_err(|e| format!("I5 reopen failed: {e}"))?;
    if again != txs {
        return Err(format!("I5 reopen recovered {} txs, first open {}", again.len(), txs.len()));
    }
    // The same record sizes as the newest transaction (so the same unit count: a torn new
    // commit lands on the slots of a torn old one), other bytes.
    let sizes = oracle.committed.last().map_or(vec![77], |r| r.iter().map(Vec::len).collect());
    let fwd: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &n)| record(1000, i, n)).collect();
    let refs: Vec<&[u8]> = fwd.iter().map(Vec::as_slice).collect();
    let mut recovered = txs.clone();
    if log.free_units() < log.units_for(&refs) {
        if let Some(newest) = log.newest_seq() {
            log.release_before(newest).map_err(|e| format!("I6 release failed: {e}"))?;
            recovered.retain(|t| t.seq >= newest);
        }
    }
    *second.armed.lock().unwrap() = true;
    let seq = log.commit(&refs).map_err(|e| format!("I6 commit after recovery failed: {e}"))?;
    *second.armed.lock().unwrap() = false;
    let expected_seq = txs.last().map_or(1, |t| t.seq + 1);
    if seq != expected_seq {
        return Err(format!("I6 commit after recovery got seq {seq}, expected {expected_seq}"));
    }
    drop(log);
    let after = PmemSim::from_image(sim.durable_image());
    let (_log, last) =
        PmemLog::open(&after, setup.tuning()).map_err(|e| format!("I6 open failed: {e}"))?;
    match last.last() {
        Some(t) if t.seq == seq && t.records == fwd => {}
        _ => return Err("I6 the commit after recovery was not recovered".into()),
    }
    // Second crash, inside that commit: the recovered transactions (from the head, which a
    // release may have moved) and the new one whole or absent.
    for image in second.images.lock().unwrap().drain(..) {
        let sim = PmemSim::from_image(image);
        let (_log, got) = PmemLog::open(&sim, setup.tuning())
            .map_err(|e| format!("I4 open after a second crash failed: {e}"))?;
        let tail = &got[got.len().min(recovered.len())..];
        let whole = match tail {
            [] => true,
            [t] => t.seq == seq && t.records == fwd,
            _ => false,
        };
        if got[..got.len().min(recovered.len())] != recovered[..got.len().min(recovered.len())]
            || got.len() < recovered.len()
            || !whole
        {
            return Err(format!(
                "I1/I2 second crash inside the commit after recovery: {} txs, expected {} (+1)",
                got.len(),
                recovered.len()
            ));
        }
    }
    Ok(())
}

fn check_recovered(oracle: &Oracle, txs: &[RecoveredTx]) -> Result<(), String> {
    let Some(first) = txs.first() else {
        return if oracle.acked == 0 {
            Ok(())
        } else {
            Err(format!("I3 nothing recovered, {} commits returned", oracle.acked))
        };
    };
    if first.seq < oracle.head_durable || first.seq > oracle.head_pending {
        return Err(format!(
            "I2 recovery starts at seq {}, head is {}..={}",
            first.seq, oracle.head_durable, oracle.head_pending
        ));
    }
    for (i, tx) in txs.iter().enumerate() {
        if tx.seq != first.seq + i as u64 {
            return Err(format!("I2 seq {} after {}", tx.seq, first.seq + i as u64 - 1));
        }
        let Some(expected) = oracle.committed.get((tx.seq - 1) as usize) else {
            return Err(format!("I2 phantom transaction {}", tx.seq));
        };
        if &tx.records != expected {
            return Err(format!("I1 transaction {} recovered with other bytes", tx.seq));
        }
    }
    let last = txs[txs.len() - 1].seq;
    if last < oracle.acked {
        return Err(format!("I3 recovered up to seq {last}, {} commits returned", oracle.acked));
    }
    Ok(())
}

fn run_workload(setup: Setup, ops: &[Op], options: PmemCrashOptions) -> Counts {
    let len = 256 + setup.unit_slots * u64::from(setup.unit_size);
    let sim = PmemSim::new(len as usize);
    let probe = Probe {
        sim: &sim,
        setup,
        options,
        oracle: Mutex::new(Oracle { head_durable: 1, head_pending: 1, ..Oracle::default() }),
        counts: Mutex::new(Counts { workloads: 1, ..Counts::default() }),
        workload: format!("{ops:?}"),
    };
    let config = LogConfig { unit_size: setup.unit_size, mode: setup.mode, uuid: 0xfeed };
    let mut log = PmemLog::format(&probe, &config, setup.tuning()).unwrap();
    probe.oracle.lock().unwrap().armed = true;
    for (step, op) in ops.iter().enumerate() {
        match op {
            Op::Commit(sizes) => {
                let seq = {
                    let mut o = probe.oracle.lock().unwrap();
                    let seq = o.committed.len() as u64 + 1;
                    let records = sizes.iter().enumerate().map(|(i, &n)| record(seq, i, n));
                    o.committed.push(records.collect());
                    o.point = format!("step {step} (commit {seq})");
                    seq
                };
                let records = probe.oracle.lock().unwrap().committed[(seq - 1) as usize].clone();
                let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
                if log.free_units() < log.units_for(&refs) {
                    release(&probe, &mut log, step);
                }
                assert_eq!(log.commit(&refs).unwrap(), seq);
                let mut o = probe.oracle.lock().unwrap();
                o.acked = seq;
                o.point = format!("step {step} after commit {seq}");
            }
            Op::Release => release(&probe, &mut log, step),
        }
        probe.check_point("returned");
    }
    let counts = probe.counts.lock().unwrap().clone();
    counts
}

fn release(probe: &Probe<'_>, log: &mut PmemLog<'_>, step: usize) {
    let Some(newest) = log.newest_seq() else { return };
    {
        let mut o = probe.oracle.lock().unwrap();
        o.head_pending = newest;
        o.point = format!("step {step} (release before {newest})");
    }
    log.release_before(newest).unwrap();
    probe.oracle.lock().unwrap().head_durable = newest;
}

/// The fixed workloads: single and multi-unit, odd sizes (unaligned tails), several records
/// per transaction, and releases that make later commits wrap the ring.
fn fixed_workloads() -> Vec<Vec<Op>> {
    use Op::{Commit as C, Release as R};
    vec![
        vec![C(vec![64])],
        vec![C(vec![64]), C(vec![64])],
        vec![C(vec![100, 7]), C(vec![333])],
        vec![C(vec![1024])],
        vec![C(vec![64]), C(vec![1000]), C(vec![200, 20, 2])],
        vec![C(vec![500]), C(vec![700]), R, C(vec![900]), C(vec![64])],
        vec![C(vec![1024]), C(vec![1024]), C(vec![1024]), C(vec![333])],
    ]
}

/// Seeded random workloads of 3–5 ops.
fn random_workloads(seed: u64, n: usize) -> Vec<Vec<Op>> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let sizes = [64, 65, 100, 256, 333, 512, 777, 1000, 1024];
    (0..n)
        .map(|_| {
            (0..rng.usize(3..=5))
                .map(|_| {
                    if rng.u8(..10) == 0 {
                        Op::Release
                    } else {
                        Op::Commit(
                            (0..rng.usize(1..=2))
                                .map(|_| sizes[rng.usize(..sizes.len())])
                                .collect(),
                        )
                    }
                })
                .collect()
        })
        .collect()
}

fn options() -> PmemCrashOptions {
    PmemCrashOptions { images_max: 4096, line_choices_max: 4096, samples: 48, seed: 7 }
}

const SETUPS: [Setup; 4] = [
    Setup {
        name: "count/cached",
        mode: CommitMode::Count,
        unit_size: 256,
        nt_copy_min: 1024,
        unit_slots: 22,
        mutant: None,
    },
    Setup {
        name: "count/nt",
        mode: CommitMode::Count,
        unit_size: 256,
        nt_copy_min: 0,
        unit_slots: 22,
        mutant: None,
    },
    Setup {
        name: "count/128",
        mode: CommitMode::Count,
        unit_size: 128,
        nt_copy_min: 512,
        unit_slots: 46,
        mutant: None,
    },
    Setup {
        name: "classic",
        mode: CommitMode::Classic,
        unit_size: 256,
        nt_copy_min: 1024,
        unit_slots: 22,
        mutant: None,
    },
];

fn explore(setup: Setup, workloads: &[Vec<Op>]) -> Counts {
    let mut total = Counts::default();
    for w in workloads {
        total.add(&run_workload(setup, w, options()));
    }
    total
}

fn print(label: &str, c: &Counts) {
    println!(
        "{label}: {} workloads, {} crash points ({} sampled), {} images, {} violations",
        c.workloads, c.points, c.sampled_points, c.images, c.violations
    );
    for f in &c.first {
        println!("  {f}");
    }
}

#[test]
fn correct_protocol_has_no_violations() {
    let mut workloads = fixed_workloads();
    workloads.extend(random_workloads(0x5eed, 12));
    let mut all = Counts::default();
    for setup in SETUPS {
        let c = explore(setup, &workloads);
        print(setup.name, &c);
        assert_eq!(c.violations, 0, "{:?}", c.first);
        assert!(c.images > c.points, "every point has images beyond the durable one");
        all.add(&c);
    }
    print("total", &all);
}

#[cfg(feature = "mutants")]
fn caught(mutant: Mutant, base: Setup) -> Counts {
    let setup = Setup { mutant: Some(mutant), name: mutant.name(), ..base };
    let mut workloads = fixed_workloads();
    workloads.extend(random_workloads(0x5eed, 12));
    let c = explore(setup, &workloads);
    print(mutant.name(), &c);
    let correct = explore(Setup { mutant: None, ..setup }, &workloads);
    print(&format!("{} (same setup, correct code)", mutant.name()), &correct);
    assert_eq!(correct.violations, 0, "{:?}", correct.first);
    assert!(c.violations > 0, "mutant {} was not caught", mutant.name());
    c
}

#[cfg(feature = "mutants")]
#[test]
fn mutant_missing_fence_before_watermark_is_caught() {
    caught(Mutant::MissingFenceBeforeWatermark, SETUPS[3]);
}

#[cfg(feature = "mutants")]
#[test]
fn mutant_nt_copy_skips_unaligned_tail_is_caught() {
    caught(Mutant::NtCopySkipsUnalignedTail, SETUPS[1]);
}

#[cfg(feature = "mutants")]
#[test]
fn mutant_unit_larger_than_atomic_without_crc_is_caught() {
    caught(Mutant::UnitLargerThanAtomicWithoutCrc, SETUPS[0]);
}

#[test]
fn mutants_are_refused_without_the_feature() {
    let sim = PmemSim::new(4096);
    let tuning = Tuning { mutant: Some(Mutant::NtCopySkipsUnalignedTail), ..Tuning::default() };
    let r = PmemLog::format(&sim, &LogConfig::default(), tuning);
    assert_eq!(r.is_ok(), tally_pmem::mutants_available());
    if !tally_pmem::mutants_available() {
        assert!(matches!(r, Err(PmemLogError::BadConfig(_))));
    }
    assert_eq!(
        Mutant::from_name("nt-copy-skips-unaligned-tail"),
        Some(Mutant::NtCopySkipsUnalignedTail)
    );
}

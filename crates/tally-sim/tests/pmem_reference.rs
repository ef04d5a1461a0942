//! `PmemSim` against an independent brute-force reference on random small programs, and its
//! sampler against the same reference.
//!
//! The reference does not share the simulator's incremental state: it takes the program as a
//! list of operations, cuts every store into per-word units, decides which units a fence forced
//! durable, then tries every subset of the other units, keeps those where each line's cached
//! units persisted as a prefix, and applies the kept units to the start image in program order.

use std::collections::BTreeSet;

use tally_media::pmem::PmemError;
use tally_sim::{PmemCrashOptions, PmemSim};

const REGION: usize = 192;
const FREE_UNITS_MAX: usize = 14;

#[derive(Debug, Clone)]
enum Op {
    Store(u64, Vec<u8>),
    Nt(u64, Vec<u8>),
    Atomic(u64, u64),
    Flush(u64, u64),
    Fence,
}

/// One store's bytes inside one 8-byte word.
#[derive(Debug)]
struct Unit {
    op: usize,
    nt: bool,
    line: u64,
    bytes: Vec<(usize, u8)>,
}

fn units_of(ops: &[Op]) -> Vec<Unit> {
    let mut units = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let (off, data, nt) = match op {
            Op::Store(off, data) => (*off, data.clone(), false),
            Op::Nt(off, data) => (*off, data.clone(), true),
            Op::Atomic(off, v) => (*off, v.to_le_bytes().to_vec(), false),
            _ => continue,
        };
        let mut current: Option<Unit> = None;
        for (k, &b) in data.iter().enumerate() {
            let at = off as usize + k;
            if current.as_ref().is_some_and(|u| u.bytes[0].0 / 8 != at / 8) {
                units.extend(current.take());
            }
            let unit =
                current.get_or_insert(Unit { op: i, nt, line: at as u64 / 64, bytes: vec![] });
            unit.bytes.push((at, b));
        }
        units.extend(current);
    }
    units
}

/// Is unit `u` durable whatever the crash: an NT unit with a fence after it, or a cached unit
/// whose line is flushed after it with a fence after that flush.
fn forced(ops: &[Op], u: &Unit) -> bool {
    let fence_after = |i: usize| ops[i + 1..].iter().any(|o| matches!(o, Op::Fence));
    if u.nt {
        return fence_after(u.op);
    }
    ops.iter().enumerate().skip(u.op + 1).any(|(i, o)| match o {
        Op::Flush(off, len) => {
            *len > 0 && off / 64 <= u.line && u.line <= (off + len - 1) / 64 && fence_after(i)
        }
        _ => false,
    })
}

fn reference_images(ops: &[Op], start: &[u8]) -> Option<BTreeSet<Vec<u8>>> {
    let units = units_of(ops);
    let is_forced: Vec<bool> = units.iter().map(|u| forced(ops, u)).collect();
    let free: Vec<usize> = (0..units.len()).filter(|&i| !is_forced[i]).collect();
    if free.len() > FREE_UNITS_MAX {
        return None;
    }
    let mut images = BTreeSet::new();
    for mask in 0u32..1 << free.len() {
        let mut kept = is_forced.clone();
        for (bit, &i) in free.iter().enumerate() {
            kept[i] = mask >> bit & 1 == 1;
        }
        // Cached units of one line persist as a prefix (units are already in program order).
        let prefix_ok = units.iter().enumerate().all(|(j, later)| {
            !kept[j]
                || later.nt
                || units[..j]
                    .iter()
                    .enumerate()
                    .all(|(i, e)| e.nt || e.line != later.line || kept[i])
        });
        if !prefix_ok {
            continue;
        }
        let mut image = start.to_vec();
        for (unit, _) in units.iter().zip(&kept).filter(|(_, k)| **k) {
            for &(at, b) in &unit.bytes {
                image[at] = b;
            }
        }
        images.insert(image);
    }
    Some(images)
}

/// A random program; operations the simulator refuses (outside its model) are left out.
fn random_program(rng: &mut fastrand::Rng, sim: &PmemSim) -> Vec<Op> {
    let mut ops = Vec::new();
    for _ in 0..rng.usize(2..8) {
        let len = rng.usize(1..20);
        let off = rng.u64(0..(REGION - len) as u64);
        let data: Vec<u8> = (0..len).map(|_| rng.u8(1..=255)).collect();
        let op = match rng.u8(0..10) {
            0..=3 => Op::Store(off, data),
            4 => Op::Nt(off, data),
            5 => Op::Atomic(rng.u64(0..24) * 8, rng.u64(1..u64::MAX)),
            6 | 7 => Op::Flush(rng.u64(0..REGION as u64), rng.u64(0..80)),
            _ => Op::Fence,
        };
        let done = match &op {
            Op::Store(off, data) => sim.store(*off, data),
            Op::Nt(off, data) => sim.store_nt(*off, data),
            Op::Atomic(off, v) => sim.store_u64_atomic(*off, *v),
            Op::Flush(off, len) => sim.flush(*off, *len),
            Op::Fence => {
                sim.fence();
                Ok(())
            }
        };
        match done {
            Ok(()) => ops.push(op),
            Err(PmemError::Unmodelled { .. } | PmemError::OutOfRange { .. }) => {}
            Err(other) => panic!("unexpected error {other}"),
        }
    }
    ops
}

#[test]
fn simulator_matches_brute_force_reference_on_random_programs() {
    let mut compared = 0;
    let mut images_total = 0;
    for seed in 0..600u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let start: Vec<u8> = (0..REGION).map(|_| rng.u8(..)).collect();
        let sim = PmemSim::from_image(start.clone());
        let ops = random_program(&mut rng, &sim);
        let Some(expected) = reference_images(&ops, &start) else { continue };
        let all = sim.crash_images(&PmemCrashOptions::default());
        assert!(all.is_exhaustive(), "seed {seed}");
        let got: Vec<Vec<u8>> = all.collect();
        let got_set: BTreeSet<Vec<u8>> = got.iter().cloned().collect();
        assert_eq!(got_set.len(), got.len(), "seed {seed}: duplicate images");
        assert!(
            got_set == expected,
            "seed {seed}: {ops:?}: {} vs {} images",
            got.len(),
            expected.len()
        );
        assert_eq!(expected.first().map(|_| got[0].clone()), Some(sim.durable_image()));
        compared += 1;
        images_total += got.len();
    }
    assert!(compared >= 500, "only {compared} programs were small enough to compare");
    assert!(images_total >= 2 * compared, "programs too trivial: {images_total} images");
}

#[test]
fn sampler_draws_only_legal_images_reproducibly() {
    for seed in 0..200u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let start = vec![0u8; REGION];
        let sim = PmemSim::from_image(start.clone());
        let ops = random_program(&mut rng, &sim);
        let Some(expected) = reference_images(&ops, &start) else { continue };
        let options =
            PmemCrashOptions { images_max: 0, samples: 64, seed, ..PmemCrashOptions::default() };
        let sampled = sim.crash_images(&options);
        assert!(!sampled.is_exhaustive());
        let sampled: Vec<Vec<u8>> = sampled.collect();
        assert!(sampled.iter().all(|i| expected.contains(i)), "seed {seed}: {ops:?}");
        assert_eq!(sampled[0], sim.durable_image());
        let again: Vec<Vec<u8>> = sim.crash_images(&options).collect();
        assert_eq!(sampled, again, "seed {seed}");
        if expected.len() <= 4 {
            // Few images: 64 draws find them all.
            assert_eq!(sampled.len(), expected.len(), "seed {seed}: {ops:?}");
        }
    }
}

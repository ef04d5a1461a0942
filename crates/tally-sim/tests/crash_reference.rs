//! `CrashDevice` against a naive reference of the crash model, on seeded random histories.
//!
//! The reference knows nothing of caches or durable images: it keeps every block write ever
//! made with its logical submission and completion times, calls a write certain when it
//! completed with FUA or before a successful flush, and builds every image by trying every
//! fate of every uncertain write and every permutation of the present writes of each block
//! (certain ones included) that respects precedence. Exhaustive enumeration must equal that
//! set exactly; sampled images must all belong to it (with tearing: to the set where a torn
//! write keeps any strict subset of its units).

mod common;

use std::collections::BTreeSet;

use common::{geometry, tags};
use tally_media::{Device, IoBuf, Ticket, Write, WriteFlags};
use tally_sim::{CrashConfig, CrashDevice, CrashOptions};

const BLOCKS: u64 = 3;
const UNITS: usize = 4;
const UNIT: usize = 512;

/// One block write as the reference sees it.
#[derive(Debug, Clone)]
struct Rec {
    block: u64,
    value: u8,
    submitted_at: u64,
    completed_at: Option<u64>,
    certain: bool,
}

/// Per block, per unit, the byte there.
type Tags = Vec<Vec<u8>>;

fn precedes(x: &Rec, y: &Rec) -> bool {
    x.completed_at.is_some_and(|cx| y.submitted_at > cx || y.completed_at.is_some_and(|cy| cy > cx))
}

/// Drive `dev` through a random history; return the reference's records.
fn history(dev: &CrashDevice, rng: &mut fastrand::Rng, ops: usize) -> Vec<Rec> {
    let mut recs: Vec<Rec> = Vec::new();
    let mut tickets: Vec<(Ticket, Vec<usize>, bool)> = Vec::new(); // in flight
    let mut clock = 0u64;
    let mut value = 0u8;
    let complete = |recs: &mut Vec<Rec>, members: &[usize], fua: bool, clock: &mut u64| {
        for &m in members {
            *clock += 1;
            recs[m].completed_at = Some(*clock);
            recs[m].certain = fua;
        }
    };
    for _ in 0..ops {
        match rng.u8(..10) {
            0..=5 => {
                let fua = rng.u8(..4) == 0;
                let mut writes = Vec::new();
                let mut members = Vec::new();
                clock += 1;
                for _ in 0..rng.usize(1..=2) {
                    let start = rng.u64(..BLOCKS);
                    let len = rng.u64(1..=(BLOCKS - start).min(2));
                    let mut data = Vec::new();
                    for b in start..start + len {
                        value += 1;
                        data.extend(std::iter::repeat_n(value, 2048));
                        members.push(recs.len());
                        recs.push(Rec {
                            block: b,
                            value,
                            submitted_at: clock,
                            completed_at: None,
                            certain: false,
                        });
                    }
                    writes.push(Write::new(start, IoBuf::from_slice(&data)));
                }
                let flags = if fua { WriteFlags::FUA } else { WriteFlags::NONE };
                tickets.push((dev.submit(writes, flags).unwrap(), members, fua));
            }
            6..=7 if !tickets.is_empty() => {
                let (t, members, fua) = tickets.remove(rng.usize(..tickets.len()));
                dev.wait(t).unwrap();
                complete(&mut recs, &members, fua, &mut clock);
            }
            8 => {
                dev.complete_all();
                for (_, members, fua) in tickets.drain(..) {
                    complete(&mut recs, &members, fua, &mut clock);
                }
            }
            _ => {
                dev.flush().unwrap();
                for r in &mut recs {
                    r.certain |= r.completed_at.is_some();
                }
            }
        }
    }
    recs
}

/// The fates of one uncertain write as unit masks (0 = absent).
fn fates(tearing: bool, any_subset: bool) -> Vec<u32> {
    let full = (1u32 << UNITS) - 1;
    if !tearing {
        return vec![0, full];
    }
    if any_subset {
        return (0..=full).collect();
    }
    let mut f = vec![0, full];
    for k in 1..UNITS {
        f.push((1 << k) - 1);
        f.push(((1 << k) - 1) << (UNITS - k));
    }
    f
}

/// Every image the model allows after a crash now.
fn reference(recs: &[Rec], tearing: bool, any_subset: bool) -> BTreeSet<Tags> {
    let uncertain: Vec<usize> = (0..recs.len()).filter(|&i| !recs[i].certain).collect();
    let fate_list = fates(tearing, any_subset);
    let full = (1u32 << UNITS) - 1;
    let mut out = BTreeSet::new();
    let mut digits = vec![0usize; uncertain.len()];
    loop {
        let mut mask: Vec<u32> = recs.iter().map(|r| if r.certain { full } else { 0 }).collect();
        for (d, &u) in digits.iter().zip(&uncertain) {
            mask[u] = fate_list[*d];
        }
        // Per block, every legal order of its present writes.
        let mut per_block: Vec<BTreeSet<Vec<u8>>> = Vec::new();
        for b in 0..BLOCKS {
            let present: Vec<usize> =
                (0..recs.len()).filter(|&i| recs[i].block == b && mask[i] != 0).collect();
            let mut outcomes = BTreeSet::new();
            for perm in permutations(&present) {
                let legal = (0..perm.len()).all(|i| {
                    (i + 1..perm.len()).all(|j| !precedes(&recs[perm[j]], &recs[perm[i]]))
                });
                if legal {
                    let mut units = vec![0u8; UNITS];
                    for &p in &perm {
                        for (u, unit) in units.iter_mut().enumerate() {
                            if mask[p] >> u & 1 == 1 {
                                *unit = recs[p].value;
                            }
                        }
                    }
                    outcomes.insert(units);
                }
            }
            per_block.push(outcomes);
        }
        let mut images: Vec<Tags> = vec![Vec::new()];
        for outcomes in &per_block {
            images = images
                .iter()
                .flat_map(|img| {
                    outcomes.iter().map(move |o| {
                        let mut next = img.clone();
                        next.push(o.clone());
                        next
                    })
                })
                .collect();
        }
        out.extend(images);
        let mut carry = true;
        for d in digits.iter_mut() {
            if !carry {
                break;
            }
            *d += 1;
            carry = *d == fate_list.len();
            if carry {
                *d = 0;
            }
        }
        if carry {
            break;
        }
    }
    out
}

fn permutations(items: &[usize]) -> Vec<Vec<usize>> {
    if items.is_empty() {
        return vec![Vec::new()];
    }
    let mut out = Vec::new();
    for i in 0..items.len() {
        let mut rest = items.to_vec();
        let first = rest.remove(i);
        for mut p in permutations(&rest) {
            p.insert(0, first);
            out.push(p);
        }
    }
    out
}

fn device_set(dev: &CrashDevice, options: CrashOptions) -> (Vec<Tags>, bool) {
    let mut images = dev.crash_images(options);
    let list: Vec<Tags> = images.by_ref().map(|i| tags(&i, BLOCKS, UNIT)).collect();
    (list, images.report().exhaustive)
}

/// Check one seeded history; false when it was too large for the reference.
fn check_seed(seed: u64, tearing: bool) -> bool {
    let mut rng = fastrand::Rng::with_seed(seed);
    let dev = CrashDevice::new(geometry(2048, BLOCKS, 512), CrashConfig::with_seed(seed));
    let ops = rng.usize(1..=8);
    let recs = history(&dev, &mut rng, ops);
    let uncertain = recs.iter().filter(|r| !r.certain).count();
    // The device forgets uncertain writes that must land before a certain one to their block.
    let moot = |r: &Rec| recs.iter().any(|c| c.certain && c.block == r.block && precedes(r, c));
    let live = recs.iter().filter(|r| !r.certain && !moot(r)).count();
    assert_eq!(dev.uncertain_count(), live, "seed {seed}");
    if uncertain > if tearing { 3 } else { 7 } {
        return false; // keep the naive reference fast
    }
    let options = CrashOptions { tearing, ..CrashOptions::default() };
    let (list, exhaustive) = device_set(&dev, options.clone());
    assert!(exhaustive, "seed {seed}");
    let got: BTreeSet<Tags> = list.iter().cloned().collect();
    assert_eq!(got.len(), list.len(), "seed {seed}: duplicate image");
    assert_eq!(got, reference(&recs, tearing, false), "seed {seed} tearing {tearing}: {recs:?}");

    let sampled = CrashOptions { exhaustive_max: 0, samples: 64, ..options };
    let (list, exhaustive) = device_set(&dev, sampled);
    assert!(!exhaustive || live == 0);
    let legal = reference(&recs, tearing, true);
    for image in &list {
        assert!(legal.contains(image), "seed {seed}: illegal sampled image {image:?}: {recs:?}");
    }
    true
}

#[test]
fn exhaustive_images_equal_the_reference_without_tearing() {
    let checked = (0..400).filter(|&seed| check_seed(seed, false)).count();
    assert!(checked >= 300, "only {checked} histories checked");
}

#[test]
fn exhaustive_images_equal_the_reference_with_tearing() {
    let checked = (1000..1300).filter(|&seed| check_seed(seed, true)).count();
    assert!(checked >= 100, "only {checked} histories checked");
}

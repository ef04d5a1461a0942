//! The cache-line crash model of `PmemSim`, pinned by exact image sets on small programs
//! (docs/PMEM-CRASH-MODEL.md lists these tests).

use std::collections::BTreeSet;

use tally_media::pmem::{Pmem, PmemError};
use tally_sim::{PmemCrashOptions, PmemSim};

/// Every image, asserting the enumeration was exhaustive and yielded no duplicate.
fn images(sim: &PmemSim) -> Vec<Vec<u8>> {
    let all = sim.crash_images(&PmemCrashOptions::default());
    assert!(all.is_exhaustive());
    let count = all.combinations().unwrap();
    let images: Vec<Vec<u8>> = all.collect();
    assert_eq!(images.len() as u64, count);
    assert_eq!(images.iter().collect::<BTreeSet<_>>().len(), images.len(), "images are distinct");
    assert_eq!(images[0], sim.durable_image(), "the first image is the durable one");
    assert!(images.contains(&sim.volatile_image()));
    images
}

/// The images as sets of the given windows' bytes, for readable assertions.
fn windows(images: &[Vec<u8>], ranges: &[(usize, usize)]) -> BTreeSet<Vec<Vec<u8>>> {
    images.iter().map(|i| ranges.iter().map(|&(s, e)| i[s..e].to_vec()).collect()).collect()
}

fn set(items: &[&[&[u8]]]) -> BTreeSet<Vec<Vec<u8>>> {
    items.iter().map(|w| w.iter().map(|b| b.to_vec()).collect()).collect()
}

const A: &[u8] = &[0xaa; 8];
const B: &[u8] = &[0xbb; 8];
const Z: &[u8] = &[0; 8];

#[test]
fn two_stores_to_two_unflushed_lines_leave_4_images() {
    let sim = PmemSim::new(128);
    sim.store(0, A).unwrap();
    sim.store(64, B).unwrap();
    let all = images(&sim);
    assert_eq!(all.len(), 4);
    assert_eq!(windows(&all, &[(0, 8), (64, 72)]), set(&[&[Z, Z], &[A, Z], &[Z, B], &[A, B]]));
}

#[test]
fn two_stores_to_one_line_leave_3_prefixes() {
    let sim = PmemSim::new(64);
    sim.store(0, A).unwrap();
    sim.store(8, B).unwrap();
    let all = images(&sim);
    assert_eq!(all.len(), 3);
    // The later store never persists without the earlier one.
    assert_eq!(windows(&all, &[(0, 8), (8, 16)]), set(&[&[Z, Z], &[A, Z], &[A, B]]));
    // Same word twice: old, first, second.
    let sim = PmemSim::new(64);
    sim.store(0, A).unwrap();
    sim.store(0, B).unwrap();
    assert_eq!(windows(&images(&sim), &[(0, 8)]), set(&[&[Z], &[A], &[B]]));
}

#[test]
fn flush_without_fence_is_still_uncertain() {
    let sim = PmemSim::new(128);
    sim.store(0, A).unwrap();
    sim.store(64, B).unwrap();
    sim.flush(0, 128).unwrap();
    assert_eq!(images(&sim).len(), 4);
    assert_eq!(sim.durable_image(), vec![0; 128]);
}

#[test]
fn flush_then_fence_is_durable() {
    let sim = PmemSim::new(128);
    sim.store(0, A).unwrap();
    sim.store(64, B).unwrap();
    sim.flush(0, 1).unwrap();
    sim.fence();
    // Line 0 was flushed and fenced; line 1 was not.
    assert_eq!(windows(&images(&sim), &[(0, 8), (64, 72)]), set(&[&[A, Z], &[A, B]]));
    sim.flush(64, 64).unwrap();
    sim.fence();
    let all = images(&sim);
    assert_eq!(all.len(), 1);
    assert_eq!((&all[0][0..8], &all[0][64..72]), (A, B));
}

#[test]
fn a_fence_covers_only_stores_before_the_flush() {
    let sim = PmemSim::new(64);
    sim.store(0, A).unwrap();
    sim.flush(0, 64).unwrap();
    sim.store(8, B).unwrap();
    sim.fence();
    assert_eq!(windows(&images(&sim), &[(0, 8), (8, 16)]), set(&[&[A, Z], &[A, B]]));
    // A fence without a flush makes nothing durable.
    let sim = PmemSim::new(64);
    sim.store(0, A).unwrap();
    sim.fence();
    sim.fence();
    assert_eq!(images(&sim).len(), 2);
}

#[test]
fn atomic_8_byte_store_is_never_torn() {
    let sim = PmemSim::new(64);
    sim.store_u64_atomic(8, 0x1122_3344_5566_7788).unwrap();
    let all = images(&sim);
    assert_eq!(all.len(), 2);
    let new = 0x1122_3344_5566_7788u64.to_le_bytes();
    assert_eq!(windows(&all, &[(8, 16)]), set(&[&[Z], &[&new]]));
    assert!(matches!(
        sim.store_u64_atomic(12, 1),
        Err(PmemError::Misaligned { off: 12, align: 8 })
    ));
}

#[test]
fn sixteen_byte_store_tears_only_at_the_word_boundary_as_a_prefix() {
    let sim = PmemSim::new(64);
    sim.store(16, &[0xcc; 16]).unwrap();
    let all = images(&sim);
    assert_eq!(all.len(), 3);
    let c: &[u8] = &[0xcc; 8];
    assert_eq!(windows(&all, &[(16, 24), (24, 32)]), set(&[&[Z, Z], &[c, Z], &[c, c]]));
    // Unaligned: three pieces (4 + 8 + 4 bytes), so four prefixes; never the middle alone.
    let sim = PmemSim::new(64);
    sim.store(4, &[0xcc; 16]).unwrap();
    let all = images(&sim);
    assert_eq!(all.len(), 4);
    assert!(all.iter().all(|i| i[8] == 0 || i[4] == 0xcc), "a later word implies the earlier");
}

#[test]
fn store_across_two_lines_tears_in_any_combination() {
    let sim = PmemSim::new(128);
    sim.store(56, &[0xdd; 16]).unwrap();
    let d: &[u8] = &[0xdd; 8];
    assert_eq!(
        windows(&images(&sim), &[(56, 64), (64, 72)]),
        set(&[&[Z, Z], &[d, Z], &[Z, d], &[d, d]])
    );
}

#[test]
fn non_temporal_words_persist_independently_until_a_fence() {
    let sim = PmemSim::new(64);
    sim.store_nt(0, &[0xee; 16]).unwrap();
    let e: &[u8] = &[0xee; 8];
    assert_eq!(
        windows(&images(&sim), &[(0, 8), (8, 16)]),
        set(&[&[Z, Z], &[e, Z], &[Z, e], &[e, e]])
    );
    sim.fence(); // no flush needed
    assert_eq!(images(&sim), vec![sim.volatile_image()]);
}

#[test]
fn non_temporal_store_over_a_pending_cached_store_lands_after_it() {
    let sim = PmemSim::new(64);
    sim.store(0, A).unwrap();
    sim.store_nt(0, B).unwrap();
    // Before the fence: old, A, or B (B over A when both persist) — 3 images.
    assert_eq!(windows(&images(&sim), &[(0, 8)]), set(&[&[Z], &[A], &[B]]));
    sim.fence();
    // The NT store is durable and the older cached store can no longer land over it.
    assert_eq!(windows(&images(&sim), &[(0, 8)]), set(&[&[B]]));
    // The reverse (cached over unfenced NT) is outside the model and refused.
    sim.store_nt(8, A).unwrap();
    assert!(matches!(sim.store(12, &[1]), Err(PmemError::Unmodelled { off: 8, .. })));
}

#[test]
fn many_lines_switch_to_reproducible_sampling() {
    let sim = PmemSim::new(64 * 20);
    for line in 0..20u64 {
        sim.store(line * 64, &[line as u8 + 1; 8]).unwrap();
    }
    let options = PmemCrashOptions { samples: 300, seed: 7, ..PmemCrashOptions::default() };
    let sampled = sim.crash_images(&options);
    assert!(!sampled.is_exhaustive());
    assert_eq!((sampled.combinations(), sampled.pending_line_count()), (Some(1 << 20), 20));
    let first: Vec<Vec<u8>> = sampled.collect();
    // The structured strategies repeat themselves on one-store lines; the uniform ones do not.
    assert!(first.len() >= 100 && first.len() <= 300, "{} distinct of 300 draws", first.len());
    assert_eq!(first[0], sim.durable_image());
    assert_eq!(first[1], sim.volatile_image());
    assert_eq!(first.iter().collect::<BTreeSet<_>>().len(), first.len());
    let again: Vec<Vec<u8>> = sim.crash_images(&options).collect();
    assert_eq!(first, again, "same seed, same images in the same order");
    let other = PmemCrashOptions { seed: 8, ..options };
    let other: Vec<Vec<u8>> = sim.crash_images(&other).collect();
    assert_ne!(first, other, "another seed draws other images");
    // Raising the limit makes the same state exhaustive.
    let wide = PmemCrashOptions { images_max: 1 << 20, ..options };
    assert!(sim.crash_images(&wide).is_exhaustive());
}

/// Copy a record non-temporally and publish it with an 8-byte tail at offset 0, through the
/// `Pmem` trait, stopping just after the tail store. `fence_before_tail: false` is the bug of a
/// missing fence before a watermark store.
fn publish(pm: &dyn Pmem, off: u64, payload: &[u8], fence_before_tail: bool) {
    pm.memcpy_nt(off, payload).unwrap();
    if fence_before_tail {
        pm.fence();
    }
    pm.store_u64_atomic(0, off + payload.len() as u64).unwrap();
}

/// Crash images where the tail says the record is there but its bytes are not.
fn torn_publications(sim: &PmemSim, payload: &[u8]) -> usize {
    sim.crash_images(&PmemCrashOptions::default())
        .filter(|image| {
            let tail = u64::from_le_bytes(image[0..8].try_into().unwrap()) as usize;
            tail != 0 && &image[tail - payload.len()..tail] != payload
        })
        .count()
}

#[test]
fn missing_fence_before_the_tail_store_is_caught() {
    let payload = [0x5a; 40];
    for fence_before_tail in [true, false] {
        let sim = PmemSim::new(256);
        publish(&sim, 100, &payload, fence_before_tail);
        let torn = torn_publications(&sim, &payload);
        if fence_before_tail {
            assert_eq!(torn, 0, "with the fence every published record is whole");
        } else {
            // 40 bytes at 100 are 6 NT pieces (4 + 4 * 8 + 4 bytes) over lines 1 and 2: with
            // the tail present, every subset of them but the full one is a torn publication.
            assert_eq!(torn, 63, "without the fence images publish a missing record");
        }
        sim.flush(0, 8).unwrap();
        sim.fence();
        assert_eq!(torn_publications(&sim, &payload), 0, "after the tail's fence all is durable");
    }
}

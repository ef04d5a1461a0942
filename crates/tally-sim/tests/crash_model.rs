//! The crash model of `CrashDevice`, pinned by exact sets of post-crash images.

mod common;

use std::collections::BTreeSet;

use common::{
    block_tag_set, block_tags, device, fill, geometry, opts, set_of, tags, w, write_sync,
};
use tally_media::{Device, Write, WriteFlags};
use tally_sim::{CompletionPolicy, CrashConfig, CrashDevice, CrashOptions};

const NONE: WriteFlags = WriteFlags::NONE;
const FUA: WriteFlags = WriteFlags::FUA;

#[test]
fn three_completed_writes_give_exactly_the_eight_subsets() {
    let dev = device();
    write_sync(&dev, 1, 0xA, NONE);
    write_sync(&dev, 2, 0xB, NONE);
    write_sync(&dev, 3, 0xC, NONE);
    let mut images = dev.crash_images(opts());
    let first = images.next().unwrap();
    assert_eq!(first, dev.durable_image(), "the first image loses everything");
    let mut all = vec![block_tags(&first, 4)];
    all.extend(images.by_ref().map(|i| block_tags(&i, 4)));
    let got: BTreeSet<Vec<u8>> = all.iter().cloned().collect();
    assert_eq!(got.len(), all.len());
    let mut want = BTreeSet::new();
    for mask in 0..8u8 {
        let bit = |i: u8, v: u8| if mask >> i & 1 == 1 { v } else { 0 };
        want.insert(vec![0, bit(0, 0xA), bit(1, 0xB), bit(2, 0xC)]);
    }
    assert_eq!(got, want);
    let r = images.report();
    assert_eq!((r.uncertain_writes, r.exhaustive), (3, true));
    assert_eq!((r.candidates, r.images_yielded, r.duplicates_dropped), (8, 8, 0));
}

#[test]
fn flush_covers_exactly_the_writes_completed_before_it() {
    let dev = device();
    write_sync(&dev, 0, 1, NONE); // completed before the flush: durable
    let in_flight = dev.submit(vec![w(&dev, 1, 2)], NONE).unwrap(); // in flight at the flush
    dev.flush().unwrap();
    dev.wait(in_flight).unwrap(); // completed after the flush was issued: not covered
    write_sync(&dev, 2, 3, NONE); // after the flush: uncertain
    assert_eq!(block_tags(&dev.durable_image(), 3), vec![1, 0, 0]);
    assert_eq!(block_tags(&dev.volatile_image(), 3), vec![1, 2, 3]);
    let got = block_tag_set(dev.crash_images(opts()), 3);
    assert_eq!(got, set_of(&[[1, 0, 0], [1, 2, 0], [1, 0, 3], [1, 2, 3]]));
    dev.flush().unwrap();
    assert_eq!(block_tag_set(dev.crash_images(opts()), 3), set_of(&[[1, 2, 3]]));
}

#[test]
fn in_flight_writes_stay_uncertain_across_a_flush() {
    let dev = device();
    let t = dev.submit(vec![w(&dev, 0, 7)], NONE).unwrap();
    dev.flush().unwrap();
    dev.flush().unwrap();
    assert_eq!(dev.in_flight_count(), 1);
    assert_eq!(block_tag_set(dev.crash_images(opts()), 1), set_of(&[[0], [7]]));
    dev.wait(t).unwrap();
    dev.flush().unwrap();
    assert_eq!(block_tag_set(dev.crash_images(opts()), 1), set_of(&[[7]]));
}

#[test]
fn fua_write_is_durable_at_completion_not_before() {
    let dev = device();
    let t = dev.submit(vec![w(&dev, 0, 9)], FUA).unwrap();
    assert_eq!(block_tag_set(dev.crash_images(opts()), 1), set_of(&[[0], [9]]));
    dev.wait(t).unwrap();
    assert_eq!(dev.uncertain_count(), 0);
    assert_eq!(block_tags(&dev.durable_image(), 1), vec![9]);
    assert_eq!(block_tag_set(dev.crash_images(opts()), 1), set_of(&[[9]]));
}

#[test]
fn fua_makes_only_its_own_write_durable() {
    let dev = device();
    write_sync(&dev, 0, 1, NONE);
    write_sync(&dev, 1, 2, FUA);
    let got = block_tag_set(dev.crash_images(opts()), 2);
    assert_eq!(got, set_of(&[[0, 2], [1, 2]]));
}

#[test]
fn two_writes_to_one_block_leave_old_first_or_second() {
    // Both completed, unflushed: W2 completed last, so W1 never lands over it.
    let dev = device();
    write_sync(&dev, 0, 1, NONE);
    write_sync(&dev, 0, 2, NONE);
    let mut images = dev.crash_images(opts());
    let got: BTreeSet<Vec<u8>> = images.by_ref().map(|i| block_tags(&i, 1)).collect();
    assert_eq!(got, set_of(&[[0], [1], [2]]));
    let r = images.report();
    assert_eq!((r.candidates, r.images_yielded, r.duplicates_dropped), (4, 3, 1));
    // Both in flight together: either may land last.
    let dev = device();
    let t1 = dev.submit(vec![w(&dev, 0, 1)], NONE).unwrap();
    let t2 = dev.submit(vec![w(&dev, 0, 2)], NONE).unwrap();
    assert_eq!(block_tag_set(dev.crash_images(opts()), 1), set_of(&[[0], [1], [2]]));
    dev.wait(t2).unwrap();
    dev.wait(t1).unwrap();
    // Completed in the order t2, t1: now W1 is the newest.
    let mut buf = fill(4096, 1, 0);
    dev.read(0, &mut buf).unwrap();
    assert_eq!(buf[0], 1);
    assert_eq!(block_tags(&dev.volatile_image(), 1), vec![1]);
}

#[test]
fn flush_and_fua_order_writes_to_one_block() {
    // W1 flushed, then a FUA W2: nothing but W2 can survive.
    let dev = device();
    write_sync(&dev, 0, 1, NONE);
    dev.flush().unwrap();
    write_sync(&dev, 0, 2, FUA);
    assert_eq!(block_tag_set(dev.crash_images(opts()), 1), set_of(&[[2]]));
    // W1 cached (unflushed), then a FUA W2 to the same block: W1 completed first, so it cannot
    // land after W2; it is superseded.
    let dev = device();
    write_sync(&dev, 0, 1, NONE);
    write_sync(&dev, 0, 2, FUA);
    assert_eq!(dev.uncertain_count(), 0);
    assert_eq!(block_tag_set(dev.crash_images(opts()), 1), set_of(&[[2]]));
    // FUA W1, then a cached W2: W1 or W2, never the old content.
    let dev = device();
    write_sync(&dev, 0, 1, FUA);
    write_sync(&dev, 0, 2, NONE);
    assert_eq!(block_tag_set(dev.crash_images(opts()), 1), set_of(&[[1], [2]]));
    // A write in flight while a FUA write to its block completes may still land after it.
    let dev = device();
    let t1 = dev.submit(vec![w(&dev, 0, 1)], NONE).unwrap();
    write_sync(&dev, 0, 2, FUA);
    assert_eq!(block_tag_set(dev.crash_images(opts()), 1), set_of(&[[1], [2]]));
    dev.wait(t1).unwrap();
    assert_eq!(block_tag_set(dev.crash_images(opts()), 1), set_of(&[[1], [2]]));
}

#[test]
fn a_multi_block_write_persists_any_subset_of_its_blocks() {
    let dev = device();
    let data = [1u8, 2, 3].iter().flat_map(|&b| vec![b; 4096]).collect::<Vec<u8>>();
    dev.write_sync(vec![Write::new(1, tally_media::IoBuf::from_slice(&data))], NONE).unwrap();
    let mut images = dev.crash_images(opts());
    let got: BTreeSet<Vec<u8>> = images.by_ref().map(|i| block_tags(&i, 5)).collect();
    let mut want = BTreeSet::new();
    for mask in 0..8u8 {
        let bit = |i: u8| if mask >> i & 1 == 1 { i + 1 } else { 0 };
        want.insert(vec![0, bit(0), bit(1), bit(2), 0]);
    }
    assert_eq!(got, want);
    assert_eq!(images.report().uncertain_writes, 3);
}

/// Tearing on a 2 KiB block of four 512 B units.
fn torn_device(atomic: u32) -> CrashDevice {
    let dev = CrashDevice::new(geometry(2048, 4, atomic), CrashConfig::with_seed(3));
    write_sync(&dev, 0, 5, NONE);
    dev
}

fn unit_sets(dev: &CrashDevice, options: CrashOptions) -> BTreeSet<Vec<u8>> {
    let list: Vec<Vec<u8>> =
        dev.crash_images(options).map(|i| tags(&i, 1, 512).remove(0)).collect();
    let set: BTreeSet<Vec<u8>> = list.iter().cloned().collect();
    assert_eq!(set.len(), list.len());
    set
}

#[test]
fn torn_variants_appear_only_when_enabled() {
    let dev = torn_device(512);
    assert_eq!(unit_sets(&dev, opts()), set_of(&[[0, 0, 0, 0], [5, 5, 5, 5]]));
    let tearing = CrashOptions { tearing: true, ..opts() };
    let want = set_of(&[
        [0, 0, 0, 0],
        [5, 5, 5, 5],
        [5, 0, 0, 0],
        [5, 5, 0, 0],
        [5, 5, 5, 0],
        [0, 0, 0, 5],
        [0, 0, 5, 5],
        [0, 5, 5, 5],
    ]);
    assert_eq!(unit_sets(&dev, tearing.clone()), want);
    // A coarser torn unit tears only at its own boundaries.
    let coarse = CrashOptions { torn_unit: 1024, ..tearing.clone() };
    let want = set_of(&[[0, 0, 0, 0], [5, 5, 5, 5], [5, 5, 0, 0], [0, 0, 5, 5]]);
    assert_eq!(unit_sets(&dev, coarse), want);
    // The geometry's atomic unit wins over a finer torn unit.
    assert_eq!(unit_sets(&torn_device(1024), tearing.clone()), want);
    // A block that is one atomic unit never tears.
    let whole = set_of(&[[0, 0, 0, 0], [5, 5, 5, 5]]);
    assert_eq!(unit_sets(&torn_device(2048), tearing), whole);
}

#[test]
fn torn_writes_show_which_orders_are_legal() {
    // Units [1, 2, 2, 0] need W2 (prefix 3) to land before W1 (prefix 1): impossible when W1
    // completed first, possible when both were in flight together.
    let tearing = CrashOptions { tearing: true, ..opts() };
    let needs_w2_first = vec![1, 2, 2, 0];
    let dev = CrashDevice::new(geometry(2048, 4, 512), CrashConfig::with_seed(3));
    write_sync(&dev, 0, 1, NONE);
    write_sync(&dev, 0, 2, NONE);
    let cached = unit_sets(&dev, tearing.clone());
    assert!(!cached.contains(&needs_w2_first));
    assert!(cached.contains(&vec![2, 2, 2, 1]), "W1 whole, then W2 prefix 3");
    let dev = CrashDevice::new(geometry(2048, 4, 512), CrashConfig::with_seed(3));
    let _t1 = dev.submit(vec![w(&dev, 0, 1)], NONE).unwrap();
    let _t2 = dev.submit(vec![w(&dev, 0, 2)], NONE).unwrap();
    let in_flight = unit_sets(&dev, tearing);
    assert!(in_flight.contains(&needs_w2_first));
    assert!(in_flight.is_superset(&cached));
    // Without tearing the last present write decides alone: both sets are {old, W1, W2}.
}

#[test]
fn torn_images_mix_old_and_new_at_unit_boundaries_when_sampled() {
    let dev = CrashDevice::new(geometry(4096, 32, 512), CrashConfig::with_seed(4));
    for b in 0..20 {
        write_sync(&dev, b, 0x10 + b as u8, NONE);
    }
    let options = CrashOptions { tearing: true, samples: 200, ..opts() };
    let mut torn_blocks = 0;
    for image in dev.crash_images(options) {
        for (b, units) in tags(&image, 20, 512).into_iter().enumerate() {
            let new = 0x10 + b as u8;
            assert!(units.iter().all(|&u| u == 0 || u == new), "block {b}: {units:?}");
            if units.contains(&0) && units.contains(&new) {
                torn_blocks += 1;
            }
        }
    }
    assert!(torn_blocks > 0, "sampling with tearing produced no torn block");
}

#[test]
fn exhaustive_up_to_twelve_writes_sampled_beyond() {
    let dev = CrashDevice::new(geometry(4096, 16, 4096), CrashConfig::with_seed(5));
    for b in 0..12 {
        write_sync(&dev, b, b as u8 + 1, NONE);
    }
    let mut images = dev.crash_images(opts());
    let set: BTreeSet<Vec<u8>> = images.by_ref().map(|i| block_tags(&i, 12)).collect();
    assert_eq!(set.len(), 4096);
    assert!(set.iter().all(|t| t.iter().enumerate().all(|(b, &x)| x == 0 || x == b as u8 + 1)));
    let r = images.report();
    assert_eq!((r.uncertain_writes, r.exhaustive, r.images_yielded), (12, true, 4096));

    write_sync(&dev, 12, 13, NONE);
    let mut images = dev.crash_images(opts());
    let list: Vec<Vec<u8>> = images.by_ref().map(|i| block_tags(&i, 13)).collect();
    let r = images.report();
    assert_eq!((r.uncertain_writes, r.exhaustive, r.candidates), (13, false, 256));
    assert_eq!(r.images_yielded + r.duplicates_dropped, 256);
    assert_eq!(r.images_yielded as usize, list.len());
    let set: BTreeSet<Vec<u8>> = list.iter().cloned().collect();
    assert_eq!(set.len(), list.len(), "sampled images are distinct");
    assert_eq!(list[0], vec![0; 13], "the first draw loses every write");
    assert_eq!(list[1], (1..=13).collect::<Vec<u8>>(), "the second keeps every write");
    assert!(set.iter().all(|t| t.iter().enumerate().all(|(b, &x)| x == 0 || x == b as u8 + 1)));
}

#[test]
fn tearing_beyond_the_image_bound_falls_back_to_sampling() {
    let dev = CrashDevice::new(geometry(4096, 16, 512), CrashConfig::with_seed(6));
    let tearing = CrashOptions { tearing: true, ..opts() };
    // 16 fates per write (absent, whole, 7 prefixes, 7 suffixes): 16^4 images fit the bound.
    for b in 0..4 {
        write_sync(&dev, b, 1, NONE);
    }
    let r = dev.crash_images(tearing.clone()).report();
    assert_eq!((r.exhaustive, r.candidates, r.duplicates_dropped), (true, 1 << 16, 0));
    // 16^5 do not, unless the bound is raised.
    write_sync(&dev, 4, 1, NONE);
    assert!(!dev.crash_images(tearing.clone()).report().exhaustive);
    let raised = CrashOptions { exhaustive_images_max: 1 << 20, ..tearing };
    let r = dev.crash_images(raised).report();
    assert_eq!((r.exhaustive, r.candidates), (true, 1 << 20));
}

#[test]
fn sampler_is_reproducible_from_its_seed() {
    let dev = CrashDevice::new(geometry(4096, 32, 512), CrashConfig::with_seed(7));
    for b in 0..24 {
        write_sync(&dev, b % 20, b as u8 + 1, NONE);
    }
    let run = |seed: Option<u64>, tearing: bool| -> Vec<Vec<Vec<u8>>> {
        let options = CrashOptions { seed, tearing, samples: 64, ..opts() };
        dev.crash_images(options).map(|i| tags(&i, 20, 512)).collect()
    };
    for tearing in [false, true] {
        assert_eq!(run(Some(11), tearing), run(Some(11), tearing));
        assert_ne!(run(Some(11), tearing), run(Some(12), tearing));
        assert_eq!(run(None, tearing), run(None, tearing), "default seed is fixed by the device");
    }
    let seed = dev.crash_images(opts()).report().seed;
    assert_eq!(run(None, false), run(Some(seed), false), "the reported seed replays the run");
}

#[test]
fn duplicate_images_are_dropped_and_counted() {
    // A write of the content already there changes nothing.
    let dev = device();
    write_sync(&dev, 0, 0, NONE);
    write_sync(&dev, 1, 4, NONE);
    let mut images = dev.crash_images(opts());
    let got: BTreeSet<Vec<u8>> = images.by_ref().map(|i| block_tags(&i, 2)).collect();
    assert_eq!(got, set_of(&[[0, 0], [0, 4]]));
    let r = images.report();
    assert_eq!((r.candidates, r.images_yielded, r.duplicates_dropped), (4, 2, 2));
    // Sampling three writes 256 times: at most 8 distinct images, the rest counted.
    let dev = device();
    for b in 0..3 {
        write_sync(&dev, b, 1, NONE);
    }
    let mut images = dev.crash_images(CrashOptions { exhaustive_max: 0, ..opts() });
    let got: BTreeSet<Vec<u8>> = images.by_ref().map(|i| block_tags(&i, 3)).collect();
    let r = images.report();
    assert!(!r.exhaustive);
    assert_eq!(r.images_yielded as usize, got.len());
    assert_eq!(got.len(), 8, "256 draws reach all 8 subsets");
    assert_eq!(r.duplicates_dropped, 256 - 8);
}

#[test]
fn reads_see_completed_writes_but_not_in_flight_ones() {
    let dev = device();
    write_sync(&dev, 0, 1, NONE);
    let t = dev.submit(vec![w(&dev, 1, 2)], NONE).unwrap();
    let mut buf = fill(4096, 2, 0xFF);
    dev.read(0, &mut buf).unwrap();
    assert_eq!((buf[0], buf[4096]), (1, 0));
    assert_eq!(dev.reads_of_in_flight(), 1);
    dev.wait(t).unwrap();
    dev.read(0, &mut buf).unwrap();
    assert_eq!((buf[0], buf[4096]), (1, 2));
    assert_eq!(dev.reads_of_in_flight(), 1);
    let s = dev.stats();
    assert_eq!((s.writes, s.submissions, s.reads, s.submit_syscalls), (2, 2, 2, 0));
}

#[test]
fn waiting_reports_unknown_tickets_and_repeats_outcomes() {
    let dev = device();
    assert!(matches!(
        dev.wait(tally_media::Ticket(1)),
        Err(tally_media::MediaError::UnknownTicket(1))
    ));
    let t = dev.submit(vec![w(&dev, 0, 1)], NONE).unwrap();
    dev.wait(t).unwrap();
    dev.wait(t).unwrap();
    assert!(matches!(
        dev.wait(tally_media::Ticket(0)),
        Err(tally_media::MediaError::UnknownTicket(0))
    ));
    assert!(dev.submit(vec![Write::new(16, fill(4096, 1, 0))], NONE).is_err());
    assert_eq!(dev.stats().writes, 1, "a refused submission is not counted");
}

#[test]
fn shuffled_completion_is_reproducible_by_seed() {
    // Eight submissions to one block, then wait on the last: the block shows the write that
    // completed last, and the rest of the order shows in what is still in flight.
    let run = |seed: u64| {
        let config =
            CrashConfig { completion: CompletionPolicy::Shuffle, ..CrashConfig::with_seed(seed) };
        let dev = CrashDevice::new(geometry(4096, 16, 4096), config);
        let tickets: Vec<_> = (0..8u8)
            .map(|i| {
                dev.submit(vec![w(&dev, u64::from(i), i + 1), w(&dev, 15, i + 1)], NONE).unwrap()
            })
            .collect();
        dev.wait(tickets[3]).unwrap();
        let mut buf = fill(4096, 16, 0);
        dev.read(0, &mut buf).unwrap();
        let view: Vec<u8> = buf.chunks(4096).map(|c| c[0]).collect();
        (view, dev.in_flight_count())
    };
    let runs: Vec<_> = (0..8).map(run).collect();
    assert_eq!(runs, (0..8).map(run).collect::<Vec<_>>(), "same seed, same completions");
    assert!(runs.iter().any(|r| r != &runs[0]), "different seeds complete differently");
    for (view, in_flight) in &runs {
        assert_eq!(view[3], 4, "the waited ticket completed");
        assert_eq!(view.iter().take(8).filter(|&&x| x != 0).count() * 2 + in_flight, 16);
    }
    let out_of_order =
        |view: &Vec<u8>| view[4..8].iter().any(|&x| x != 0) && view[..3].contains(&0);
    assert!(runs.iter().any(|(view, _)| out_of_order(view)), "some seed completes out of order");
    // In order: only the waited ticket completes.
    let dev = device();
    let t1 = dev.submit(vec![w(&dev, 0, 1)], NONE).unwrap();
    let t2 = dev.submit(vec![w(&dev, 1, 2)], NONE).unwrap();
    dev.wait(t2).unwrap();
    assert_eq!(dev.in_flight_count(), 1);
    dev.wait(t1).unwrap();
    assert_eq!(dev.in_flight_count(), 0);
}

#[test]
fn explicit_completion_helpers() {
    let dev = device();
    for b in 0..6 {
        dev.submit(vec![w(&dev, b, 1)], NONE).unwrap();
    }
    let mut rng = fastrand::Rng::with_seed(3);
    dev.complete_some(&mut rng);
    let after_some = dev.in_flight_count();
    assert!(after_some < 6, "seed 3 completes something");
    dev.complete_all();
    assert_eq!((dev.in_flight_count(), dev.uncertain_count()), (0, 6));
}

#[test]
fn a_crash_image_boots_a_new_device() {
    let dev = device();
    write_sync(&dev, 2, 8, NONE);
    let image = dev.crash_images(opts()).last().unwrap();
    let again = CrashDevice::from_image(image, CrashConfig::with_seed(dev.seed()));
    assert_eq!(again.uncertain_count(), 0);
    assert_eq!(block_tags(&again.durable_image(), 3), vec![0, 0, 8]);
    let mem = tally_media::MemDevice::from_image(again.volatile_image());
    let mut buf = fill(4096, 1, 0);
    mem.read(2, &mut buf).unwrap();
    assert_eq!(buf[0], 8);
}

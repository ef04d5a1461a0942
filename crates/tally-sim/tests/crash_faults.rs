//! Fault injection of `CrashDevice`: EIO on writes, flushes and reads, bit flips, fail-stop,
//! and ignored flushes.

mod common;

use std::collections::BTreeSet;

use common::{block_tag_set, block_tags, device, fill, geometry, opts, set_of, w, write_sync};
use tally_media::{Device, MediaError, WriteFlags};
use tally_sim::{CrashConfig, CrashDevice, FaultPlan};

const NONE: WriteFlags = WriteFlags::NONE;

fn faulty(plan: FaultPlan) -> CrashDevice {
    let config = CrashConfig { faults: plan, ..CrashConfig::with_seed(21) };
    CrashDevice::new(geometry(4096, 16, 4096), config)
}

fn is_failed(r: Result<impl std::fmt::Debug, MediaError>) -> bool {
    matches!(r, Err(MediaError::Failed { .. }))
}

#[test]
fn eio_on_the_nth_write_fails_its_submission_and_the_write_never_lands() {
    let dev = faulty(FaultPlan { write_eio_nth: Some(2), ..FaultPlan::none() });
    write_sync(&dev, 0, 1, NONE); // write #1
    let t = dev.submit(vec![w(&dev, 1, 2), w(&dev, 2, 3)], NONE).unwrap(); // #2 fails, #3 lands
    assert!(!dev.is_failed(), "the failure shows when the submission completes");
    let err = dev.wait(t);
    assert!(matches!(err, Err(MediaError::Injected { op: "write", nth: 2 })), "{err:?}");
    assert!(matches!(dev.wait(t), Err(MediaError::Injected { op: "write", nth: 2 })));
    assert!(dev.is_failed());
    assert_eq!(block_tags(&dev.volatile_image(), 3), vec![1, 0, 3]);
    let got = block_tag_set(dev.crash_images(opts()), 3);
    assert_eq!(got, set_of(&[[0, 0, 0], [1, 0, 0], [0, 0, 3], [1, 0, 3]]));
    // Fail-stop: no more writes or flushes; reads and crash images still work.
    assert!(is_failed(dev.submit(vec![w(&dev, 5, 9)], NONE)));
    assert!(is_failed(dev.flush()));
    let mut buf = fill(4096, 1, 0);
    dev.read(2, &mut buf).unwrap();
    assert_eq!(buf[0], 3);
    assert_eq!(dev.stats().writes, 3, "refused requests are not counted");
}

#[test]
fn eio_on_the_nth_flush_makes_nothing_durable_and_fails_the_device() {
    let dev = faulty(FaultPlan { flush_eio_nth: Some(2), ..FaultPlan::none() });
    write_sync(&dev, 0, 1, NONE);
    dev.flush().unwrap();
    write_sync(&dev, 1, 2, NONE);
    let err = dev.flush();
    assert!(matches!(err, Err(MediaError::Injected { op: "flush", nth: 2 })), "{err:?}");
    assert!(dev.is_failed());
    // The write the failed flush would have covered is still uncertain, and still readable.
    assert_eq!(block_tags(&dev.durable_image(), 2), vec![1, 0]);
    assert_eq!(block_tag_set(dev.crash_images(opts()), 2), set_of(&[[1, 0], [1, 2]]));
    let mut buf = fill(4096, 1, 0);
    dev.read(1, &mut buf).unwrap();
    assert_eq!(buf[0], 2);
    // Never retried as if it had worked.
    assert!(is_failed(dev.flush()));
    assert!(is_failed(dev.submit(vec![w(&dev, 3, 3)], NONE)));
    assert_eq!(block_tag_set(dev.crash_images(opts()), 2), set_of(&[[1, 0], [1, 2]]));
}

#[test]
fn eio_on_the_nth_read_fails_that_read_only() {
    let dev = faulty(FaultPlan { read_eio_nth: Some(2), ..FaultPlan::none() });
    write_sync(&dev, 0, 1, NONE);
    let mut buf = fill(4096, 1, 0xEE);
    dev.read(0, &mut buf).unwrap();
    buf.fill(0xEE);
    let err = dev.read(0, &mut buf);
    assert!(matches!(err, Err(MediaError::Injected { op: "read", nth: 2 })), "{err:?}");
    assert_eq!(buf[0], 0xEE, "a failed read leaves the buffer alone");
    dev.read(0, &mut buf).unwrap();
    assert_eq!(buf[0], 1);
    assert!(!dev.is_failed(), "a read error is not fail-stop");
    write_sync(&dev, 1, 2, NONE);
}

fn flipped_bits(a: &[u8], b: &[u8]) -> u32 {
    a.iter().zip(b).map(|(x, y)| (x ^ y).count_ones()).sum()
}

#[test]
fn bit_flip_on_the_nth_read_changes_one_bit_of_that_buffer_only() {
    let dev = faulty(FaultPlan { read_flip_nth: Some(2), ..FaultPlan::none() });
    write_sync(&dev, 0, 0x5A, NONE);
    let clean = vec![0x5Au8; 4096];
    let mut buf = fill(4096, 1, 0);
    dev.read(0, &mut buf).unwrap();
    assert_eq!(flipped_bits(&buf, &clean), 0);
    dev.read(0, &mut buf).unwrap();
    assert_eq!(flipped_bits(&buf, &clean), 1);
    dev.read(0, &mut buf).unwrap();
    assert_eq!(flipped_bits(&buf, &clean), 0, "the media was not changed");
    assert_eq!(block_tags(&dev.volatile_image(), 1), vec![0x5A]);
}

#[test]
fn bit_flips_by_probability_are_seeded() {
    let run = |seed: u64| {
        let plan = FaultPlan { read_flip_probability: 0.5, ..FaultPlan::none() };
        let config = CrashConfig { faults: plan, ..CrashConfig::with_seed(seed) };
        let dev = CrashDevice::new(geometry(4096, 4, 4096), config);
        let mut bufs = Vec::new();
        for _ in 0..32 {
            let mut buf = fill(4096, 1, 0);
            dev.read(0, &mut buf).unwrap();
            assert!(flipped_bits(&buf, &[0; 4096]) <= 1);
            bufs.push(buf.to_vec());
        }
        bufs
    };
    let flips = run(1).iter().filter(|b| b.iter().any(|&x| x != 0)).count();
    assert!(flips > 4 && flips < 28, "{flips} of 32 reads flipped at p = 0.5");
    assert_eq!(run(1), run(1));
    assert_ne!(run(1), run(2));
}

#[test]
fn ignored_flushes_lose_data_at_a_crash() {
    let honest = device();
    let liar = faulty(FaultPlan { ignore_flushes: true, ..FaultPlan::none() });
    for dev in [&honest, &liar] {
        write_sync(dev, 0, 1, NONE);
        dev.flush().unwrap();
    }
    assert_eq!(block_tag_set(honest.crash_images(opts()), 1), set_of(&[[1]]));
    let lost: BTreeSet<Vec<u8>> = block_tag_set(liar.crash_images(opts()), 1);
    assert_eq!(lost, set_of(&[[0], [1]]), "the flushed write may be lost");
    assert_eq!(liar.stats().flushes, 1, "the ignored flush is still counted");
}

#[test]
fn faults_can_be_set_while_running() {
    let dev = device();
    write_sync(&dev, 0, 1, NONE);
    let next = dev.stats().writes + 1;
    dev.set_faults(FaultPlan { write_eio_nth: Some(next), ..FaultPlan::none() });
    assert_eq!(dev.faults().write_eio_nth, Some(next));
    let err = dev.write_sync(vec![w(&dev, 1, 2)], NONE);
    assert!(matches!(err, Err(MediaError::Injected { op: "write", nth: 2 })), "{err:?}");
    assert!(is_failed(dev.flush()));
}

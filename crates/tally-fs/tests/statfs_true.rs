//! `statfs` tells the truth (issue 15 part 3): free = capacity − live − reserved, where live is
//! what the files hold (their blocks, and the records describing them, packed as cleaning
//! packs them). A deleted file's blocks count as free at once, before cleaning reclaims
//! them; at every sample of a write/delete loop the used space is within 1 % of the size of
//! the files plus the records accounted for exactly; and what `statfs` calls free can be
//! written (cleaning reclaims the dead space as it is needed).

use std::sync::Arc;

use tally_fs::{Fs, FsError, MkfsOptions, MountOptions, Owner, ROOT};
use tally_media::{Device, MemDevice};

const ME: Owner = Owner { uid: 1000, gid: 1000 };
const BS: u64 = 4096;

fn mount(blocks: u64) -> (Arc<dyn Device>, Fs) {
    let dev: Arc<dyn Device> = Arc::new(MemDevice::new(BS as u32, blocks).unwrap());
    Fs::mkfs(dev.clone(), &MkfsOptions { streams: 4, segment_blocks: 256, uuid: None }).unwrap();
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    (dev, fs)
}

fn write_file(fs: &Fs, name: &str, bytes: u64, seed: u8) -> u64 {
    let ino = fs.create(None, ROOT, name.as_bytes(), 0o644, ME).unwrap().ino;
    let chunk = vec![seed; 256 << 10];
    let mut off = 0;
    while off < bytes {
        let n = (bytes - off).min(chunk.len() as u64) as usize;
        fs.write(None, ino, off, &chunk[..n]).unwrap();
        off += n as u64;
    }
    ino
}

/// Used blocks as statfs says, against the files' blocks plus their records packed.
fn check_truth(fs: &Fs, files_bytes: u64, when: &str) {
    let s = fs.statfs();
    let u = fs.space().unwrap();
    assert_eq!(s.blocks_free, u.free_blocks, "{when}");
    let used = u.capacity_blocks - u.reserved_blocks - s.blocks_free;
    let truth = files_bytes.div_ceil(BS) + u.live_blocks - u.data_blocks;
    assert_eq!(u.data_blocks, files_bytes / BS, "{when}: data blocks");
    let off = used.abs_diff(truth) as f64 / u.capacity_blocks as f64;
    assert!(off <= 0.01, "{when}: used {used} blocks, the files and records {truth}");
}

#[test]
fn a_deleted_file_is_free_space_at_once() {
    let (_dev, fs) = mount(65_536); // 256 MiB
    let before = fs.statfs().blocks_free;
    let big = 160 << 20;
    write_file(&fs, "big", big, 1);
    fs.sync().unwrap();
    let full = fs.statfs().blocks_free;
    assert!(
        // The records: a unit per 31 data blocks once cleaning has packed them (3.2 %), and
        // the unmount snapshot's room, which grows with the state.
        before - full >= big / BS && before - full <= big / BS * 105 / 100,
        "writing 160 MiB took {} blocks",
        before - full
    );
    fs.unlink(None, ROOT, b"big").unwrap();
    // No sync, no cleaning: the blocks are still in the log, dead.
    let after = fs.statfs().blocks_free;
    assert!(after.abs_diff(before) <= before / 100, "free {before} before, {after} after");
    assert!(fs.space().unwrap().free_segment_blocks < after, "nothing was cleaned yet");
    check_truth(&fs, 0, "after the delete");
    // And the space statfs reports can be used: write it again, and more.
    write_file(&fs, "again", big, 2);
    write_file(&fs, "more", 32 << 20, 3);
    fs.sync().unwrap();
    check_truth(&fs, big + (32 << 20), "after writing it again");
    let r = fs.fsck();
    assert!(r.is_clean(), "{:?}", r.problems);
}

#[test]
fn statfs_follows_a_write_delete_loop_within_one_percent() {
    let (_dev, fs) = mount(32_768); // 128 MiB
    let mut rng = fastrand::Rng::with_seed(15);
    let mut files: Vec<(String, u64)> = Vec::new();
    for n in 0..300 {
        if files.len() > 3 && rng.u8(..3) == 0 {
            let (name, _) = files.swap_remove(rng.usize(..files.len()));
            fs.unlink(None, ROOT, name.as_bytes()).unwrap();
        } else {
            let bytes = rng.u64(1..64) * BS * rng.u64(1..8);
            let live: u64 = files.iter().map(|f| f.1).sum();
            if (live + bytes) / BS > fs.statfs().blocks_free * 9 / 10 + live / BS {
                continue;
            }
            let name = format!("f{n}");
            write_file(&fs, &name, bytes, n as u8);
            files.push((name, bytes));
        }
        let live: u64 = files.iter().map(|f| f.1).sum();
        check_truth(&fs, live, &format!("step {n}"));
    }
}

/// What statfs calls free is there: a file system filled until statfs says it is nearly
/// full never says ENOSPC before, whatever the dead space in the log when filling started.
#[test]
fn what_statfs_calls_free_can_be_written() {
    let (_dev, fs) = mount(16_384); // 64 MiB
                                    // Dead space scattered through the log: files written, then every other one deleted.
    for n in 0..40 {
        write_file(&fs, &format!("d{n}"), 1 << 20, n as u8);
    }
    for n in (0..40).step_by(2) {
        fs.unlink(None, ROOT, format!("d{n}").as_bytes()).unwrap();
    }
    let mut n = 0;
    loop {
        let free = fs.statfs().blocks_free;
        // The last 2 % of the capacity (what statfs says): packs cut at segment ends take a
        // few more units than the accounting's dense estimate, and every pass over a log
        // that full rewrites all of it.
        if free < fs.space().unwrap().capacity_blocks / 50 {
            break;
        }
        let bytes = (free / 2).clamp(1, 256) * BS;
        let ino = match fs.create(None, ROOT, format!("w{n}").as_bytes(), 0o644, ME) {
            Ok(a) => a.ino,
            Err(e) => {
                let l = fs.segment_liveness().unwrap();
                let segs = l.len();
                let live: u64 = l.iter().map(|x| x.live_bytes).sum::<u64>() / BS;
                let used: u64 = l.iter().map(|x| x.bytes).sum::<u64>() / BS;
                let min = l.iter().map(|x| x.live_bytes * 100 / (256 * BS)).min();
                panic!("create with statfs saying {free} blocks free: {e}, {:?}; chains {segs} segments, bytes {used} blocks, live {live} blocks, least live head {min:?} %", fs.space())
            }
        };
        match fs.write(None, ino, 0, &vec![9u8; bytes as usize]) {
            Ok(_) => {}
            Err(FsError::NoSpace) => {
                panic!("ENOSPC with statfs saying {free} blocks free (writing {})", bytes / BS)
            }
            Err(e) => panic!("{e}"),
        }
        n += 1;
    }
    let r = fs.fsck();
    assert!(r.is_clean(), "{:?}", r.problems);
}

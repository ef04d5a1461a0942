//! `fsck`: verify every checksum and every cross-reference of a mounted file system.

use std::collections::{HashMap, HashSet};

use crate::clean::live;
use crate::fs::lock;
use crate::record::{Record, DATA_HOLE};
use crate::state::{Block, Key};
use crate::types::{FileKind, Ino, ROOT};
use crate::{Fs, Result};

/// How live one segment of a stream's log is: bytes of records and data blocks written in it
/// since the stream's checkpoint, and of those the bytes still live (current records, their
/// data blocks, tombstones that still hide older records), as cleaning judges them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SegmentLiveness {
    /// The stream whose chain holds the segment.
    pub stream: u16,
    /// The segment.
    pub segment: u32,
    /// Transactions whose spans end in it.
    pub transactions: u64,
    /// Bytes of records and data blocks in those transactions.
    pub bytes: u64,
    /// Of those, bytes still live.
    pub live_bytes: u64,
}

/// Data blocks checked between two progress reports.
const PROGRESS_EVERY_BLOCKS: u64 = 1024;

/// What [`Fs::fsck`] found. `problems` empty means clean.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct FsckReport {
    /// Inodes checked.
    pub inodes: u64,
    /// Directory entries checked.
    pub entries: u64,
    /// Data blocks read and checked against their crc.
    pub data_blocks: u64,
    /// Each problem, in words.
    pub problems: Vec<String>,
}

impl FsckReport {
    /// No problem found.
    #[must_use]
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

impl Fs {
    /// How live each segment of each stream's chain is, measured by reading every transaction
    /// since the checkpoints (as cleaning measures a stream's oldest segment). For `tally
    /// inspect`; reads the whole log after the checkpoints.
    ///
    /// # Errors
    /// I/O errors, a record that does not decode.
    pub fn segment_liveness(&self) -> Result<Vec<SegmentLiveness>> {
        let st = lock(&self.state)?;
        let bs = u64::from(self.bs);
        let mut out = Vec::new();
        for stream in 0..self.streams {
            let first = out.len();
            out.extend(self.log.segment_usage(stream)?.iter().map(|u| SegmentLiveness {
                stream,
                segment: u.segment,
                ..SegmentLiveness::default()
            }));
            for (segment, tx) in self.log.stream_transactions(stream)? {
                let Some(u) = out[first..].iter_mut().find(|u| u.segment == segment) else {
                    continue;
                };
                u.transactions += 1;
                u.bytes += u64::from(tx.data_count) * bs;
                for bytes in &tx.records {
                    let rec = Record::decode(bytes)?;
                    let key = Key::of(&rec);
                    let data = matches!(rec, Record::Extent { data, .. } if data != DATA_HOLE);
                    u.bytes += bytes.len() as u64;
                    if live(&st, &rec, &key, true) {
                        u.live_bytes += bytes.len() as u64 + if data { bs } else { 0 };
                    }
                }
            }
        }
        Ok(out)
    }

    /// Verify the file system: every data block's crc (read from the device unless still
    /// cached), link counts against the entries naming each inode, directory entries against
    /// their inodes, parents, reachability from the root, sizes against blocks, symlink sizes,
    /// that no two blocks share a device block, that every block lies in a segment some
    /// stream's log holds, and that the live data blocks per segment kept for cleaning are
    /// those of the block maps.
    #[must_use]
    pub fn fsck(&self) -> FsckReport {
        self.fsck_with_progress(&mut |_, _| {})
    }

    /// [`Fs::fsck`], calling `progress(data_blocks_checked, data_blocks_total)` as it reads
    /// data blocks (the long part on a large image), for a progress bar.
    pub fn fsck_with_progress(&self, progress: &mut dyn FnMut(u64, u64)) -> FsckReport {
        let mut r = FsckReport::default();
        let mut st = match lock(&self.state) {
            Ok(st) => st,
            Err(e) => {
                r.problems.push(format!("the state in memory cannot be checked: {e}"));
                return r;
            }
        };
        // The space accounting's kept totals (statfs), against a walk.
        let kept = crate::live::live_parts(&mut st);
        let walked = crate::live::live_parts_walked(&st);
        if kept != walked {
            r.problems.push(format!(
                "live data blocks and record bytes kept for statfs {kept:?} differ from a walk \
                 of the state {walked:?}"
            ));
        }
        let data_blocks_total: u64 = st.inodes.values().map(|i| i.blocks.len() as u64).sum();
        // Segments some stream's log holds: a live block anywhere else sits in free space,
        // where a later write would overwrite it.
        let held: HashSet<u32> = (0..self.streams)
            .flat_map(|s| self.log.segment_usage(s).unwrap_or_default())
            .map(|u| u.segment)
            .collect();
        progress(0, data_blocks_total);
        let mut named: HashMap<Ino, u32> = HashMap::new();
        let mut subdirs: HashMap<Ino, u32> = HashMap::new();
        let mut parents: HashMap<Ino, Ino> = HashMap::new();
        let mut addrs: HashSet<u64> = HashSet::new();
        // Every data block to read, as the block maps hold it now.
        let mut data: Vec<(Ino, u64, Block)> = Vec::new();
        let bs = u64::from(self.bs);
        match st.inodes.get(&ROOT) {
            Some(i) if i.dir.is_some() => {}
            _ => r.problems.push("the root is missing or not a directory".into()),
        }
        for (&ino, inode) in &st.inodes {
            r.inodes += 1;
            if inode.attr.ino != ino {
                r.problems.push(format!("inode {ino} says it is {}", inode.attr.ino));
            }
            if (inode.attr.kind == FileKind::Dir) != inode.dir.is_some() {
                r.problems.push(format!("inode {ino}: kind and directory map disagree"));
            }
            if let Some(dir) = &inode.dir {
                if dir.order().len() != dir.entries().len() {
                    r.problems.push(format!("directory {ino}: order and name maps disagree"));
                }
                for (name, d) in dir.entries() {
                    r.entries += 1;
                    if dir.order().get(&d.cookie) != Some(name) {
                        r.problems
                            .push(format!("directory {ino}: entry {name:?} has a stale offset"));
                    }
                    match st.inodes.get(&d.ino) {
                        None => r.problems.push(format!(
                            "directory {ino}: entry {:?} names missing inode {}",
                            String::from_utf8_lossy(name),
                            d.ino
                        )),
                        Some(t) if t.attr.kind != d.kind => r.problems.push(format!(
                            "directory {ino}: entry {:?} says {:?}, inode {} is {:?}",
                            String::from_utf8_lossy(name),
                            d.kind,
                            d.ino,
                            t.attr.kind
                        )),
                        Some(_) => {}
                    }
                    *named.entry(d.ino).or_default() += 1;
                    if d.kind == FileKind::Dir {
                        *subdirs.entry(ino).or_default() += 1;
                        parents.insert(d.ino, ino);
                    }
                }
            }
            if inode.attr.kind == FileKind::Symlink && inode.attr.size != inode.target.len() as u64
            {
                r.problems.push(format!(
                    "symlink {ino}: size {} but target of {}",
                    inode.attr.size,
                    inode.target.len()
                ));
            }
            if inode.attr.kind != FileKind::File && !inode.blocks.is_empty() {
                r.problems.push(format!("inode {ino}: data blocks on a {:?}", inode.attr.kind));
            }
            let end_block = inode.attr.size.div_ceil(bs);
            for (&b, block) in &inode.blocks {
                if b >= end_block {
                    r.problems
                        .push(format!("inode {ino}: block {b} past its size {}", inode.attr.size));
                }
                if block.tx.is_some() && !addrs.insert(block.addr) {
                    r.problems
                        .push(format!("inode {ino}: block {b} shares device block {}", block.addr));
                }
                if block.tx.is_some() {
                    match self.log.segment_of(block.addr) {
                        None => r.problems.push(format!(
                            "inode {ino}: block {b} at device block {} is outside the log",
                            block.addr
                        )),
                        Some(seg) if !held.contains(&seg) => r.problems.push(format!(
                            "inode {ino}: block {b} is in segment {seg}, which no stream holds"
                        )),
                        Some(_) => {}
                    }
                }
                r.data_blocks += 1;
                if self.mutant == Some(crate::FsMutant::FsckSkipsDataBlocks) {
                    continue;
                }
                data.push((ino, b, block.clone()));
            }
        }
        for (&ino, inode) in &st.inodes {
            let links = named.get(&ino).copied().unwrap_or(0);
            if let Some(dir) = &inode.dir {
                let want = 2 + subdirs.get(&ino).copied().unwrap_or(0);
                if inode.attr.nlink != want {
                    r.problems.push(format!(
                        "directory {ino}: link count {} but {want} expected",
                        inode.attr.nlink
                    ));
                }
                if ino != ROOT {
                    if links != 1 {
                        r.problems.push(format!("directory {ino}: named by {links} entries"));
                    }
                    if parents.get(&ino) != Some(&dir.parent) {
                        r.problems.push(format!(
                            "directory {ino}: `..` is {} but it sits in {:?}",
                            dir.parent,
                            parents.get(&ino)
                        ));
                    }
                }
            } else if inode.attr.nlink != links {
                r.problems.push(format!(
                    "inode {ino}: link count {} but named by {links} entries",
                    inode.attr.nlink
                ));
            }
        }
        let reachable = st.reachable();
        for (&ino, inode) in &st.inodes {
            let open_orphan = inode.attr.nlink == 0 && st.pins.contains_key(&ino);
            if !reachable.contains(&ino) && !open_orphan {
                r.problems.push(format!("inode {ino} is not reachable from the root"));
            }
        }
        // The per-segment counts cleaning ranks by, kept as blocks change, against a walk.
        let walked = self.live_data_by_segment(&st);
        let kept = st.usage.all();
        if walked != kept {
            let mut differ: Vec<u32> = walked.keys().chain(kept.keys()).copied().collect();
            differ.sort_unstable();
            differ.dedup();
            differ.retain(|s| walked.get(s) != kept.get(s));
            let s = differ.first().copied().unwrap_or(0);
            r.problems.push(format!(
                "live data blocks per segment kept for cleaning differ from the block maps in \
                 {} segments (segment {s}: kept {:?}, the block maps {:?})",
                differ.len(),
                kept.get(&s),
                walked.get(&s)
            ));
        }
        drop(st);
        // The data blocks, against the copy of the block maps taken above: read with the
        // state lock dropped, so operations go on while fsck reads the whole image. A block
        // that fails is looked up again: one moved (cleaning reused its old place),
        // overwritten or removed meanwhile is not a problem.
        for (i, (ino, b, block)) in data.into_iter().enumerate() {
            if (i as u64).is_multiple_of(PROGRESS_EVERY_BLOCKS) {
                progress(i as u64, data_blocks_total);
            }
            let failed = match self.fetch_block(ino, b, &block) {
                Ok(bytes) if crc32c::crc32c(&bytes) == block.crc => continue,
                Ok(_) => format!("inode {ino}: block {b} does not match its crc"),
                Err(e) => format!("inode {ino}: block {b}: {e}"),
            };
            let same = |now: &Block| {
                (now.addr, now.ver, now.crc, now.tx) == (block.addr, block.ver, block.crc, block.tx)
            };
            match lock(&self.state) {
                Ok(st) => {
                    let now = st.inodes.get(&ino).and_then(|i| i.blocks.get(&b));
                    if !now.is_some_and(same) {
                        continue;
                    }
                }
                Err(e) => {
                    r.problems.push(format!("the state in memory cannot be checked: {e}"));
                    return r;
                }
            }
            r.problems.push(failed);
        }
        progress(r.data_blocks, data_blocks_total);
        r
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tally_media::{Device, MemDevice};

    use crate::fs::lock;
    use crate::{Fs, MkfsOptions, MountOptions, Owner, ROOT};

    /// Overwritten and deleted data stops counting as live; what was written stays counted.
    #[test]
    fn liveness_follows_overwrites_and_deletes() {
        let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, 1024).unwrap());
        let opts = MkfsOptions { streams: 1, segment_blocks: 128, uuid: None };
        Fs::mkfs(dev.clone(), &opts).unwrap();
        let fs = Fs::mount(dev, MountOptions::default()).unwrap();
        let me = Owner { uid: 0, gid: 0 };
        let sum = |fs: &Fs| {
            let l = fs.segment_liveness().unwrap();
            (l.iter().map(|u| u.bytes).sum::<u64>(), l.iter().map(|u| u.live_bytes).sum::<u64>())
        };
        let a = fs.create(None, ROOT, b"f", 0o644, me).unwrap();
        fs.write(None, a.ino, 0, &[1u8; 4 * 4096]).unwrap();
        let (bytes, live) = sum(&fs);
        assert!(live >= 4 * 4096 && live <= bytes, "{live} of {bytes}");
        fs.write(None, a.ino, 0, &[2u8; 4 * 4096]).unwrap();
        let (bytes2, live2) = sum(&fs);
        assert!(bytes2 >= bytes + 4 * 4096, "the overwrite is written: {bytes2}");
        assert!(bytes2 - live2 >= 4 * 4096, "the first 4 blocks are dead: {live2} of {bytes2}");
        fs.unlink(None, ROOT, b"f").unwrap();
        let (bytes3, live3) = sum(&fs);
        assert!(bytes3 >= bytes2 && live3 + 8 * 4096 <= bytes3, "{live3} of {bytes3}");
        assert!(live3 < 4 * 4096, "no data is live once the file is gone: {live3}");
    }

    /// The segment check can fire: a block moved (in the in-memory state) into a segment no
    /// stream holds is named, and one moved outside the log too.
    #[test]
    fn a_block_outside_the_held_segments_is_found() {
        let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, 1024).unwrap());
        let opts = MkfsOptions { streams: 2, segment_blocks: 64, uuid: None };
        Fs::mkfs(dev.clone(), &opts).unwrap();
        let fs = Fs::mount(dev, MountOptions::default()).unwrap();
        let a = fs.create(None, ROOT, b"f", 0o644, Owner { uid: 0, gid: 0 }).unwrap();
        fs.write(None, a.ino, 0, &[1u8; 4096]).unwrap();
        fs.sync().unwrap();
        assert!(fs.fsck().is_clean(), "{:?}", fs.fsck().problems);
        let held: Vec<u32> =
            (0..2).flat_map(|s| fs.log.segment_usage(s).unwrap()).map(|u| u.segment).collect();
        let free = (0..1024u64)
            .find(|&b| fs.log.segment_of(b).is_some_and(|s| !held.contains(&s)))
            .expect("a block in a free segment");
        let set_addr = |addr: u64| {
            let mut st = lock(&fs.state).unwrap();
            let block = st.inodes.get_mut(&a.ino).unwrap().blocks.get_mut(&0).unwrap();
            block.addr = addr;
            block.data = Some(Arc::new(vec![1u8; 4096])); // so the crc check still passes
        };
        set_addr(free);
        let problems = fs.fsck().problems;
        assert!(problems.iter().any(|p| p.contains("which no stream holds")), "{problems:?}");
        set_addr(1);
        let problems = fs.fsck().problems;
        assert!(problems.iter().any(|p| p.contains("outside the log")), "{problems:?}");
    }

    /// The kept per-segment counts are checked: a block placed without the count following
    /// it (the bug the check exists for: a change of the block maps that skips
    /// `State::usage`) is named.
    #[test]
    fn kept_segment_counts_that_drift_from_the_block_maps_are_found() {
        let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, 1024).unwrap());
        let opts = MkfsOptions { streams: 2, segment_blocks: 64, uuid: None };
        Fs::mkfs(dev.clone(), &opts).unwrap();
        let fs = Fs::mount(dev, MountOptions::default()).unwrap();
        let a = fs.create(None, ROOT, b"f", 0o644, Owner { uid: 0, gid: 0 }).unwrap();
        fs.write(None, a.ino, 0, &[1u8; 3 * 4096]).unwrap();
        fs.write(None, a.ino, 4096, &[2u8; 4096]).unwrap();
        fs.sync().unwrap();
        assert!(fs.fsck().is_clean(), "{:?}", fs.fsck().problems);
        {
            let mut st = lock(&fs.state).unwrap();
            let block = st.inodes[&a.ino].blocks[&1].clone();
            st.usage.remove(&block);
        }
        let problems = fs.fsck().problems;
        assert!(problems.iter().any(|p| p.contains("kept for cleaning differ")), "{problems:?}");
    }
}

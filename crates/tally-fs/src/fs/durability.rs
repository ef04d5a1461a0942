//! The durability half of the maintenance round alone ([`Fs::maintain_durability`]), for a
//! caller that runs cleaning on a schedule of its own: the mount defers cleaning while requests
//! arrive (`tally-fuse`'s maintenance) but must not defer durability, whose timing is part of
//! the contract (docs/FS.md, "Write-behind and the commit interval").
//!
//! Invariant: a call never moves, relocates or frees a segment; it does what [`Fs::maintain`]
//! does before and after its cleaning, in the same order.

use std::sync::atomic::Ordering;

use super::lock;
use crate::{Fs, MaintainReport, Result};

impl Fs {
    /// [`Fs::maintain`] without the cleaning: make committed changes durable (or, when nothing
    /// committed is waiting, release from memory the data that became durable by other means),
    /// then write a checkpoint snapshot if more than the replay budget was written since the
    /// last. The report's `segments_freed` and `mostly_dead_cleaned` are always 0.
    ///
    /// # Errors
    /// I/O errors (the file system is then read-only).
    pub fn maintain_durability(&self) -> Result<MaintainReport> {
        let report = MaintainReport { synced: self.make_durable()?, ..MaintainReport::default() };
        self.checkpoint_if_due()?;
        Ok(report)
    }

    /// The start of every maintenance round: make committed changes durable when something
    /// committed is waiting (other than parts of an open large transaction, flushed with its
    /// close, not every round), or else release from memory the data that became durable by
    /// other means (fsyncs, commits). True when it synced.
    pub(crate) fn make_durable(&self) -> Result<bool> {
        let dirty = (0..self.streams).any(|s| {
            self.whole_committed
                .get(usize::from(s))
                .is_some_and(|last| last.load(Ordering::Relaxed) > self.log.durable_seq(s))
        });
        if dirty {
            self.sync()?;
        } else {
            let mut st = lock(&self.state)?;
            if !st.cached.is_empty() {
                self.prune_cache(&mut st);
            }
        }
        Ok(dirty)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tally_media::{Device, MemDevice};

    use crate::{Fs, MkfsOptions, MountOptions, Owner, ROOT};

    const ME: Owner = Owner { uid: 1000, gid: 1000 };

    #[test]
    fn makes_durable_and_leaves_cleaning_to_maintain() {
        let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4096, 4096).unwrap());
        Fs::mkfs(dev.clone(), &MkfsOptions { streams: 1, segment_blocks: 64, uuid: None }).unwrap();
        let opts = MountOptions {
            write_behind: Some(tally_log::WriteBehind::default()),
            ..MountOptions::default()
        };
        let fs = Fs::mount(dev, opts).unwrap();
        let a = fs.create(None, ROOT, b"a", 0o644, ME).unwrap().ino;
        fs.write(None, a, 0, &[1; 40 * 4096]).unwrap();
        let b = fs.create(None, ROOT, b"b", 0o644, ME).unwrap().ino;
        fs.write(None, b, 0, &[2; 40 * 4096]).unwrap();
        // All of `a` but its first block dies: the oldest segment is mostly dead.
        fs.write(None, a, 4096, &[3; 39 * 4096]).unwrap();
        let free = fs.log().free_segments();
        let r = fs.maintain_durability().unwrap();
        assert!(r.synced, "{r:?}");
        assert_eq!((r.segments_freed, r.mostly_dead_cleaned), (0, 0));
        assert!(fs.log().durable_seq(0) > 0);
        assert_eq!(fs.log().free_segments(), free, "maintain_durability cleaned");
        // Nothing left to make durable; still nothing cleaned.
        let r = fs.maintain_durability().unwrap();
        assert!(!r.synced && r.segments_freed == 0, "{r:?}");
        assert_eq!(fs.log().free_segments(), free);
        // The whole round cleans what was left.
        let r = fs.maintain().unwrap();
        assert!(r.mostly_dead_cleaned > 0 && fs.log().free_segments() > free, "{r:?}");
    }
}

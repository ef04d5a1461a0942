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
        let mut report = MaintainReport::default();
        // As `maintain`: something committed and not durable yet, other than parts of an open
        // large transaction (flushed with its close).
        let dirty = (0..self.streams).any(|s| {
            self.whole_committed
                .get(usize::from(s))
                .is_some_and(|last| last.load(Ordering::Relaxed) > self.log.durable_seq(s))
        });
        if dirty {
            self.sync()?;
            report.synced = true;
        } else {
            let mut st = lock(&self.state)?;
            if !st.cached.is_empty() {
                self.prune_cache(&mut st);
            }
        }
        self.checkpoint_if_due()?;
        Ok(report)
    }
}

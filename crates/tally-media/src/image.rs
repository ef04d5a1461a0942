//! `Image`: the contents of a device as a sparse, cheaply cloned array of blocks.
//!
//! Crash exploration makes thousands of images that differ in a few blocks; sharing unchanged
//! blocks through `Arc` makes a clone cost one pointer per block instead of a copy of the device.

use std::sync::Arc;

use crate::{check_read, Geometry, Result};

/// Device contents. Blocks never written read as zeros.
#[derive(Clone)]
pub struct Image {
    geometry: Geometry,
    blocks: Vec<Option<Arc<[u8]>>>,
    zero: Arc<[u8]>,
}

impl Image {
    /// An all-zero image.
    ///
    /// # Panics
    /// If the block count does not fit in memory addressing (a bug for in-memory images).
    #[must_use]
    pub fn new(geometry: Geometry) -> Self {
        let count = usize::try_from(geometry.block_count).unwrap_or(usize::MAX);
        Image {
            geometry,
            blocks: vec![None; count],
            zero: vec![0u8; geometry.block_size as usize].into(),
        }
    }

    /// The image's geometry.
    #[must_use]
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Contents of one block (zeros if never written). `block` must be in range.
    #[must_use]
    pub fn block(&self, block: u64) -> &[u8] {
        match &self.blocks[block as usize] {
            Some(data) => data,
            None => &self.zero,
        }
    }

    /// The shared handle of one block, if it was ever written.
    #[must_use]
    pub fn block_arc(&self, block: u64) -> Option<&Arc<[u8]>> {
        self.blocks[block as usize].as_ref()
    }

    /// Replace one block. `data` must be exactly one block long and `block` in range.
    pub fn set_block(&mut self, block: u64, data: Arc<[u8]>) {
        assert_eq!(data.len(), self.geometry.block_size as usize, "set_block needs one block");
        self.blocks[block as usize] = Some(data);
    }

    /// Write whole blocks of `data` starting at `block` (already validated by the caller).
    pub fn write(&mut self, block: u64, data: &[u8]) {
        let bs = self.geometry.block_size as usize;
        for (i, chunk) in data.chunks_exact(bs).enumerate() {
            self.set_block(block + i as u64, chunk.into());
        }
    }

    /// Read whole blocks into `buf`.
    ///
    /// # Errors
    /// Misaligned or out-of-range requests.
    pub fn read(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        check_read(&self.geometry, block, buf)?;
        let bs = self.geometry.block_size as usize;
        for (i, chunk) in buf.chunks_exact_mut(bs).enumerate() {
            chunk.copy_from_slice(self.block(block + i as u64));
        }
        Ok(())
    }

    /// Blocks that were ever written, in order.
    pub fn written_blocks(&self) -> impl Iterator<Item = (u64, &[u8])> {
        self.blocks.iter().enumerate().filter_map(|(i, b)| b.as_deref().map(|b| (i as u64, b)))
    }
}

impl PartialEq for Image {
    fn eq(&self, other: &Self) -> bool {
        self.geometry == other.geometry
            && (0..self.geometry.block_count).all(|b| {
                let (x, y) = (&self.blocks[b as usize], &other.blocks[b as usize]);
                let same_arc = matches!((x, y), (Some(a), Some(b)) if Arc::ptr_eq(a, b));
                same_arc || self.block(b) == other.block(b)
            })
    }
}
impl Eq for Image {}

impl std::fmt::Debug for Image {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let written = self.blocks.iter().filter(|b| b.is_some()).count();
        write!(f, "Image({:?}, {written} blocks written)", self.geometry)
    }
}

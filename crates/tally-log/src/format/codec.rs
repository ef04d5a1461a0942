//! Bounds-checked little-endian reading and writing of fixed layouts.

/// Reads little-endian fields at explicit offsets; every read is bounds-checked.
pub struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader over `bytes`.
    #[must_use]
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes }
    }

    /// `N` bytes at `off`, or `None` if they are not all there.
    #[must_use]
    pub fn array<const N: usize>(&self, off: usize) -> Option<[u8; N]> {
        let end = off.checked_add(N)?;
        self.bytes.get(off..end)?.try_into().ok()
    }

    /// A u16 at `off`.
    #[must_use]
    pub fn u16(&self, off: usize) -> Option<u16> {
        self.array(off).map(u16::from_le_bytes)
    }

    /// A u32 at `off`.
    #[must_use]
    pub fn u32(&self, off: usize) -> Option<u32> {
        self.array(off).map(u32::from_le_bytes)
    }

    /// A u64 at `off`.
    #[must_use]
    pub fn u64(&self, off: usize) -> Option<u64> {
        self.array(off).map(u64::from_le_bytes)
    }

    /// Whether `bytes[off..off+len]` exist and are all zero.
    #[must_use]
    pub fn zeros(&self, off: usize, len: usize) -> bool {
        off.checked_add(len)
            .and_then(|end| self.bytes.get(off..end))
            .is_some_and(|s| s.iter().all(|&b| b == 0))
    }
}

/// Writes little-endian fields at explicit offsets into a buffer the caller sized.
pub struct Writer<'a> {
    bytes: &'a mut [u8],
}

impl<'a> Writer<'a> {
    /// A writer over `bytes`.
    pub fn new(bytes: &'a mut [u8]) -> Self {
        Writer { bytes }
    }

    /// Put raw bytes at `off`. Layouts are fixed at compile time, so a miss is a bug.
    pub fn put(&mut self, off: usize, src: &[u8]) {
        self.bytes[off..off + src.len()].copy_from_slice(src);
    }

    /// Put a u16 at `off`.
    pub fn u16(&mut self, off: usize, v: u16) {
        self.put(off, &v.to_le_bytes());
    }

    /// Put a u32 at `off`.
    pub fn u32(&mut self, off: usize, v: u32) {
        self.put(off, &v.to_le_bytes());
    }

    /// Put a u64 at `off`.
    pub fn u64(&mut self, off: usize, v: u64) {
        self.put(off, &v.to_le_bytes());
    }
}

//! Bounds-checked little-endian reading and writing, the one codec of every persisted structure:
//! [`Reader`] and [`Writer`] for fixed layouts at explicit offsets (headers), [`Cursor`] and
//! [`Appender`] for encodings read and written in sequence (the log snapshot's stream state,
//! the file system's records and snapshot, the persistent-memory log's records). It lives in
//! the media crate, the one every layer that persists bytes depends on; `tally-log` re-exports
//! it as `tally_log::format::codec`.
//!
//! Reading never panics: a field past the end of the bytes is `None` or [`Truncated`]. Writing
//! panics only on a bug (a layout fixed at compile time that does not fit its buffer, a length
//! that does not fit its prefix): encoders are given values the layer above already bounded.
//! Indexing, unchecked arithmetic and truncating casts are denied here.
#![cfg_attr(
    not(test),
    deny(
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects,
        clippy::cast_possible_truncation
    )
)]

use std::fmt;

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

    /// A u8 at `off`.
    #[must_use]
    pub fn u8(&self, off: usize) -> Option<u8> {
        self.bytes.get(off).copied()
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
        off.checked_add(len).and_then(|end| self.bytes.get(off..end)).is_some_and(all_zero)
    }

    /// Whether every byte from `off` to the end exists and is zero (`true` when `off` is the
    /// end).
    #[must_use]
    pub fn zeros_from(&self, off: usize) -> bool {
        self.bytes.get(off..).is_some_and(all_zero)
    }
}

/// Whether every byte of `s` is zero. A log unit's tail after its payload is checked this way
/// on every scan (recovery, cleaning, liveness), most of a block each time: the bytes are
/// OR-ed 64 at a time, which the compiler turns into vector instructions, where `all` on bytes
/// stops to branch on each (it was a fifth of the daemon's CPU while cleaning).
fn all_zero(s: &[u8]) -> bool {
    let chunks = s.chunks_exact(64);
    let rest = chunks.remainder();
    chunks.into_iter().all(|c| c.iter().fold(0u8, |acc, &b| acc | b) == 0)
        && rest.iter().all(|&b| b == 0)
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

    /// Put raw bytes at `off`.
    ///
    /// # Panics
    /// If they do not fit: layouts are fixed at compile time, so a miss is a bug.
    pub fn put(&mut self, off: usize, src: &[u8]) {
        let end = off.checked_add(src.len());
        let len = self.bytes.len();
        let Some(dst) = end.and_then(|end| self.bytes.get_mut(off..end)) else {
            panic!("field of {} bytes at {off} outside a {len}-byte buffer", src.len());
        };
        dst.copy_from_slice(src);
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

/// Bytes ran out: a field, or a length or count read from the bytes, reaches past their end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Truncated;

impl fmt::Display for Truncated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a field, length or count reaches past the end of the bytes")
    }
}

impl std::error::Error for Truncated {}

/// Reads little-endian fields one after another; every read is bounds-checked, and lengths and
/// counts read from the bytes are bounded by the bytes left before anything is allocated.
#[derive(Debug, Clone)]
pub struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    /// A cursor at the start of `bytes`.
    #[must_use]
    pub fn new(bytes: &'a [u8]) -> Self {
        Cursor { bytes, at: 0 }
    }

    /// Bytes read so far.
    #[must_use]
    pub fn position(&self) -> usize {
        self.at
    }

    /// Bytes not read yet.
    #[must_use]
    pub fn remaining(&self) -> usize {
        self.bytes.len().saturating_sub(self.at)
    }

    /// Whether every byte has been read.
    #[must_use]
    pub fn at_end(&self) -> bool {
        self.remaining() == 0
    }

    /// The next `n` bytes.
    ///
    /// # Errors
    /// [`Truncated`] if fewer are left.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], Truncated> {
        let end = self.at.checked_add(n).ok_or(Truncated)?;
        let out = self.bytes.get(self.at..end).ok_or(Truncated)?;
        self.at = end;
        Ok(out)
    }

    /// Every byte not read yet.
    pub fn rest(&mut self) -> &'a [u8] {
        let out = self.bytes.get(self.at..).unwrap_or_default();
        self.at = self.bytes.len();
        out
    }

    /// The next `N` bytes.
    ///
    /// # Errors
    /// [`Truncated`] if fewer are left.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], Truncated> {
        self.take(N)?.try_into().map_err(|_| Truncated)
    }

    /// A u8.
    ///
    /// # Errors
    /// [`Truncated`] at the end.
    pub fn u8(&mut self) -> Result<u8, Truncated> {
        self.array::<1>().map(|[b]| b)
    }

    /// A u16.
    ///
    /// # Errors
    /// [`Truncated`] if fewer than 2 bytes are left.
    pub fn u16(&mut self) -> Result<u16, Truncated> {
        self.array().map(u16::from_le_bytes)
    }

    /// A u32.
    ///
    /// # Errors
    /// [`Truncated`] if fewer than 4 bytes are left.
    pub fn u32(&mut self) -> Result<u32, Truncated> {
        self.array().map(u32::from_le_bytes)
    }

    /// A u64.
    ///
    /// # Errors
    /// [`Truncated`] if fewer than 8 bytes are left.
    pub fn u64(&mut self) -> Result<u64, Truncated> {
        self.array().map(u64::from_le_bytes)
    }

    /// A u8 length, then that many bytes.
    ///
    /// # Errors
    /// [`Truncated`] if they are not all there.
    pub fn bytes_len8(&mut self) -> Result<&'a [u8], Truncated> {
        let n = self.u8()?;
        self.take(usize::from(n))
    }

    /// A u32 length, then that many bytes.
    ///
    /// # Errors
    /// [`Truncated`] if they are not all there.
    pub fn bytes_len32(&mut self) -> Result<&'a [u8], Truncated> {
        let n = usize::try_from(self.u32()?).map_err(|_| Truncated)?;
        self.take(n)
    }

    /// A u64 count of items that take at least `item_size_min` bytes each (taken as 1 if 0):
    /// never more than the bytes left can hold, so the caller may allocate for it.
    ///
    /// # Errors
    /// [`Truncated`] if the count is larger.
    pub fn count(&mut self, item_size_min: usize) -> Result<usize, Truncated> {
        let n = self.u64()?;
        let fit = self.remaining().checked_div(item_size_min.max(1)).unwrap_or(0);
        usize::try_from(n).ok().filter(|&n| n <= fit).ok_or(Truncated)
    }
}

/// Appends little-endian fields to a growing buffer.
#[derive(Debug, Clone, Default)]
pub struct Appender {
    bytes: Vec<u8>,
}

impl Appender {
    /// An empty buffer with room for `capacity` bytes.
    #[must_use]
    pub fn with_capacity(capacity: usize) -> Self {
        Appender { bytes: Vec::with_capacity(capacity) }
    }

    /// An empty buffer in `bytes`'s allocation (its contents dropped), with room for at
    /// least `capacity` bytes: a caller encoding something large again and again keeps its
    /// memory mapped between encodings.
    #[must_use]
    pub fn reusing(mut bytes: Vec<u8>, capacity: usize) -> Self {
        bytes.clear();
        bytes.reserve(capacity);
        Appender { bytes }
    }

    /// Bytes appended so far.
    #[must_use]
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether nothing was appended.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The bytes.
    #[must_use]
    pub fn into_vec(self) -> Vec<u8> {
        self.bytes
    }

    /// Append raw bytes.
    pub fn put(&mut self, src: &[u8]) {
        self.bytes.extend_from_slice(src);
    }

    /// Append a u8.
    pub fn u8(&mut self, v: u8) {
        self.bytes.push(v);
    }

    /// Append a u16.
    pub fn u16(&mut self, v: u16) {
        self.put(&v.to_le_bytes());
    }

    /// Append a u32.
    pub fn u32(&mut self, v: u32) {
        self.put(&v.to_le_bytes());
    }

    /// Append a u64.
    pub fn u64(&mut self, v: u64) {
        self.put(&v.to_le_bytes());
    }

    /// Append a count or length as a u64.
    pub fn len_u64(&mut self, n: usize) {
        self.u64(widen(n));
    }

    /// Append a u8 length, then `b`.
    ///
    /// # Panics
    /// If `b` is longer than 255 bytes: callers bound what they encode (a bug otherwise).
    pub fn bytes_len8(&mut self, b: &[u8]) {
        let Ok(n) = u8::try_from(b.len()) else {
            panic!("{} bytes behind a u8 length", b.len());
        };
        self.u8(n);
        self.put(b);
    }

    /// Append a u32 length, then `b`.
    ///
    /// # Panics
    /// If `b` is 4 GiB or longer: callers bound what they encode (a bug otherwise).
    pub fn bytes_len32(&mut self, b: &[u8]) {
        let Ok(n) = u32::try_from(b.len()) else {
            panic!("{} bytes behind a u32 length", b.len());
        };
        self.u32(n);
        self.put(b);
    }
}

/// `n` as a u64: lossless on every target Rust supports (`usize` is at most 64 bits).
#[must_use]
pub fn widen(n: usize) -> u64 {
    const { assert!(usize::BITS <= u64::BITS) };
    n as u64
}

/// Whether `fields`, `(offset, size)` in order, cover `0..size` exactly: each field starts where
/// the one before it ends and the last ends at `size`. For compile-time asserts that a header's
/// offsets tile it:
///
/// ```
/// use tally_media::codec::tiles;
/// const _: () = assert!(tiles(&[(0, 4), (4, 2), (6, 2)], 8));
/// assert!(!tiles(&[(0, 4), (5, 3)], 8)); // a gap
/// assert!(!tiles(&[(0, 4), (2, 6)], 8)); // an overlap
/// ```
#[must_use]
pub const fn tiles(fields: &[(usize, usize)], size: usize) -> bool {
    let mut rest = fields;
    let mut end = 0usize;
    while let Some(((off, len), tail)) = rest.split_first() {
        if *off != end {
            return false;
        }
        end = match off.checked_add(*len) {
            Some(e) => e,
            None => return false,
        };
        rest = tail;
    }
    end == size
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeros_finds_a_nonzero_byte_anywhere() {
        let block = vec![0u8; 4096 + 13];
        for off in [0, 1, 63, 64, 100, 4095, 4096, 4108] {
            assert!(Reader::new(&block).zeros_from(off));
            for bad in [off, off + 1, off + 64, 4096 + 12] {
                let mut b = block.clone();
                b[bad.min(4096 + 12)] = 0x80;
                let r = Reader::new(&b);
                assert!(!r.zeros_from(off.min(bad)), "byte {bad} from {off}");
                assert!(!r.zeros(off.min(bad), b.len() - off.min(bad)));
            }
        }
        assert!(Reader::new(&block).zeros_from(block.len()), "nothing left is all zeros");
        assert!(!Reader::new(&block).zeros_from(block.len() + 1), "past the end");
    }

    #[test]
    fn cursor_reads_in_order_and_never_past_the_end() {
        let mut a = Appender::with_capacity(64);
        a.u8(1);
        a.u16(0x0203);
        a.u32(0x0405_0607);
        a.u64(0x0809_0a0b_0c0d_0e0f);
        a.bytes_len8(b"abc");
        a.bytes_len32(b"defg");
        a.len_u64(2);
        a.put(&[9, 9]);
        let bytes = a.into_vec();
        let mut c = Cursor::new(&bytes);
        assert_eq!(c.u8(), Ok(1));
        assert_eq!(c.u16(), Ok(0x0203));
        assert_eq!(c.u32(), Ok(0x0405_0607));
        assert_eq!(c.u64(), Ok(0x0809_0a0b_0c0d_0e0f));
        assert_eq!(c.bytes_len8(), Ok(&b"abc"[..]));
        assert_eq!(c.bytes_len32(), Ok(&b"defg"[..]));
        assert_eq!(c.count(1), Ok(2));
        assert_eq!(c.rest(), &[9, 9]);
        assert!(c.at_end());
        assert_eq!(c.u8(), Err(Truncated));
        for cut in 0..bytes.len() {
            let mut c = Cursor::new(&bytes[..cut]);
            let all = (|| {
                c.u8()?;
                c.u16()?;
                c.u32()?;
                c.u64()?;
                c.bytes_len8()?;
                c.bytes_len32()?;
                c.count(1)
            })();
            assert!(all.is_err() || c.remaining() < 2, "cut at {cut}");
        }
    }

    #[test]
    fn counts_and_lengths_are_bounded_by_the_bytes_left() {
        let mut a = Appender::default();
        a.u64(u64::MAX);
        a.put(&[0; 16]);
        let bytes = a.into_vec();
        assert_eq!(Cursor::new(&bytes).count(1), Err(Truncated));
        assert_eq!(Cursor::new(&bytes).count(8), Err(Truncated));
        assert_eq!(Cursor::new(&bytes[..8]).count(0), Err(Truncated));
        let mut ok = Appender::default();
        ok.u64(2);
        ok.put(&[0; 16]);
        assert_eq!(Cursor::new(&ok.into_vec()).count(8), Ok(2));
        assert_eq!(Cursor::new(&[0xff, 0xff, 0xff, 0xff, 1]).bytes_len32(), Err(Truncated));
        assert_eq!(Cursor::new(&[5, 1, 2]).bytes_len8(), Err(Truncated));
    }

    #[test]
    fn reader_and_writer_at_offsets() {
        let mut buf = [0u8; 16];
        let mut w = Writer::new(&mut buf);
        w.u16(0, 0x0102);
        w.u32(2, 0x0304_0506);
        w.u64(6, 7);
        let r = Reader::new(&buf);
        assert_eq!((r.u16(0), r.u32(2), r.u64(6)), (Some(0x0102), Some(0x0304_0506), Some(7)));
        assert_eq!(r.u8(15), Some(0));
        assert_eq!((r.u8(16), r.u64(9), r.u64(usize::MAX)), (None, None, None));
        assert!(r.zeros(14, 2) && !r.zeros(14, 3) && !r.zeros(usize::MAX, 2));
        assert!(r.zeros_from(14) && r.zeros_from(16) && !r.zeros_from(17) && !r.zeros_from(0));
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn a_write_outside_the_layout_is_a_bug() {
        Writer::new(&mut [0u8; 4]).u32(1, 0);
    }

    #[test]
    fn tiling() {
        assert!(tiles(&[], 0));
        assert!(tiles(&[(0, 8)], 8));
        assert!(!tiles(&[(0, 8)], 9));
        assert!(!tiles(&[(1, 7)], 8));
        assert!(!tiles(&[(0, usize::MAX), (usize::MAX, 1)], 0));
    }
}

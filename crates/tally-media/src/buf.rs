//! An owned, page-aligned byte buffer for device I/O.
//!
//! Written by hand rather than taken from a crate because it needs exactly three properties
//! together and nothing else: alignment to 4 KiB (O_DIRECT accepts it on every device), a
//! stable heap address while the kernel owns it (io_uring), and zero-initialised contents so no
//! stale heap bytes ever reach a device.

use std::alloc::{self, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Alignment of every [`IoBuf`]: enough for O_DIRECT on 512 B and 4 KiB sector devices.
pub const IO_ALIGN: usize = 4096;

/// An owned, zero-initialised, [`IO_ALIGN`]-aligned buffer.
pub struct IoBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: IoBuf owns its allocation exclusively, like Vec<u8>.
unsafe impl Send for IoBuf {}
// SAFETY: shared access only hands out &[u8].
unsafe impl Sync for IoBuf {}

impl IoBuf {
    /// A zeroed buffer of `len` bytes.
    ///
    /// # Panics
    /// If the allocation fails or `len` overflows the layout (a bug or out of memory).
    #[must_use]
    pub fn zeroed(len: usize) -> Self {
        if len == 0 {
            return IoBuf { ptr: NonNull::dangling(), len: 0 };
        }
        let layout = Self::layout(len);
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else { alloc::handle_alloc_error(layout) };
        IoBuf { ptr, len }
    }

    /// A buffer holding a copy of `bytes`.
    #[must_use]
    pub fn from_slice(bytes: &[u8]) -> Self {
        let mut buf = Self::zeroed(bytes.len());
        buf.copy_from_slice(bytes);
        buf
    }

    fn layout(len: usize) -> Layout {
        match Layout::from_size_align(len, IO_ALIGN) {
            Ok(layout) => layout,
            Err(_) => panic!("IoBuf of {len} bytes exceeds the address space"),
        }
    }

    /// Raw pointer for handing to the kernel.
    #[must_use]
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        if self.len != 0 {
            // SAFETY: allocated in `zeroed` with this exact layout.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
        }
    }
}

impl Deref for IoBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised bytes (or dangling with len 0).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for IoBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and we hold &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Clone for IoBuf {
    fn clone(&self) -> Self {
        Self::from_slice(self)
    }
}

impl std::fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IoBuf({} bytes)", self.len)
    }
}

impl PartialEq for IoBuf {
    fn eq(&self, other: &Self) -> bool {
        self[..] == other[..]
    }
}
impl Eq for IoBuf {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_zeroed_and_copyable() {
        let mut b = IoBuf::zeroed(8192);
        assert_eq!(b.as_ptr() as usize % IO_ALIGN, 0);
        assert!(b.iter().all(|&x| x == 0));
        b[100] = 7;
        let c = b.clone();
        assert_eq!(c[100], 7);
        assert_eq!(b, c);
        assert_eq!(IoBuf::zeroed(0).len(), 0);
        assert_eq!(&IoBuf::from_slice(b"abc")[..], b"abc");
    }
}

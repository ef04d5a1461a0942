//! An owned, page-aligned byte buffer for device I/O.
//!
//! Written by hand rather than taken from a crate because it needs exactly three properties
//! together and nothing else: alignment to 4 KiB (O_DIRECT accepts it on every device), a
//! stable heap address while the kernel owns it (io_uring), and zero-initialised contents so no
//! stale heap bytes ever reach a device (but [`IoBuf::for_overwrite`]'s: bytes of an earlier
//! buffer, for a caller that writes every byte it submits and cuts off the rest).

use std::alloc::{self, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Mutex;

/// Alignment of every [`IoBuf`]: enough for O_DIRECT on 512 B and 4 KiB sector devices.
pub const IO_ALIGN: usize = 4096;

/// An owned, zero-initialised, [`IO_ALIGN`]-aligned buffer.
pub struct IoBuf {
    ptr: NonNull<u8>,
    len: usize,
    /// Bytes allocated (at least `len`; more after [`IoBuf::truncate`]), freed whole.
    cap: usize,
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
            return IoBuf { ptr: NonNull::dangling(), len: 0, cap: 0 };
        }
        if let Some(ptr) = pool::take(len) {
            // SAFETY: a pooled allocation of exactly `len` bytes, owned by nobody else.
            unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, len) };
            return IoBuf { ptr, len, cap: len };
        }
        let layout = Self::layout(len);
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else { alloc::handle_alloc_error(layout) };
        IoBuf { ptr, len, cap: len }
    }

    /// A buffer of `len` bytes for a caller that writes every byte it lets reach a device
    /// (with [`IoBuf::truncate`] cutting off the rest): a kept one as it is, holding zeros or
    /// bytes of an earlier buffer (never uninitialised memory), else a zeroed new one. Saves
    /// zeroing a large buffer that is about to be overwritten (the log's write-behind batch
    /// buffers: zeroing them cost as much as the copy they replaced).
    #[must_use]
    pub fn for_overwrite(len: usize) -> Self {
        match pool::take(len) {
            // A pooled allocation of exactly `len` bytes, owned by nobody else; every byte
            // of it was initialised by the buffer it came from.
            Some(ptr) => IoBuf { ptr, len, cap: len },
            None => Self::zeroed(len),
        }
    }

    /// A buffer holding a copy of `bytes`.
    #[must_use]
    pub fn from_slice(bytes: &[u8]) -> Self {
        Self::gather(bytes.len(), &[(0, bytes)])
    }

    /// A buffer of `len` bytes holding each `(offset, bytes)` part at its offset and zeros
    /// everywhere else: like [`IoBuf::zeroed`] followed by copies, but each byte is written
    /// once (a transaction's blocks and a write-out's merged batches are mostly copied data).
    ///
    /// # Panics
    /// If the parts are not in increasing, non-overlapping order within `len` (a bug), or as
    /// [`IoBuf::zeroed`].
    #[must_use]
    pub fn gather(len: usize, parts: &[(usize, &[u8])]) -> Self {
        let mut at = 0usize;
        for &(offset, bytes) in parts {
            assert!(offset >= at, "IoBuf::gather: parts out of order or overlapping");
            let Some(end) = offset.checked_add(bytes.len()) else {
                panic!("IoBuf::gather: a part's end overflows the address space")
            };
            at = end;
        }
        assert!(at <= len, "IoBuf::gather: part ends at {at}, past the buffer's {len} bytes");
        if len == 0 {
            return IoBuf { ptr: NonNull::dangling(), len: 0, cap: 0 };
        }
        let ptr = pool::take(len).unwrap_or_else(|| {
            let layout = Self::layout(len);
            // SAFETY: layout has non-zero size.
            let raw = unsafe { alloc::alloc(layout) };
            NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout))
        });
        let mut cursor = 0usize;
        for &(offset, bytes) in parts {
            // SAFETY: cursor <= offset and offset + bytes.len() <= len (checked above), so
            // both writes stay inside the allocation; `bytes` cannot overlap a fresh one.
            unsafe {
                std::ptr::write_bytes(ptr.as_ptr().add(cursor), 0, offset - cursor);
                let dst = ptr.as_ptr().add(offset);
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len());
            }
            cursor = offset + bytes.len();
        }
        // SAFETY: cursor <= len; after this every byte of [0, len) has been written once.
        unsafe { std::ptr::write_bytes(ptr.as_ptr().add(cursor), 0, len - cursor) };
        IoBuf { ptr, len, cap: len }
    }

    /// Shorten the buffer to its first `len` bytes (no effect if it is not longer). The
    /// allocation is kept whole until the buffer is dropped: for a buffer filled part by part
    /// whose final length is known only at the end (the log's write-behind batches).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
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
        if self.cap != 0 && !pool::give(self.ptr, self.cap) {
            // SAFETY: allocated in `zeroed` or `gather` (or kept by the pool, which only
            // holds such allocations) with the layout of `cap` bytes.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.cap)) }
        }
    }
}

/// Freed buffers of up to 2 MiB kept for reuse. Every small transaction allocates a unit
/// block or two, and an aligned allocation is glibc's slow path (`posix_memalign`): 14 % of
/// the daemon's CPU for a SETATTR through the mount (issue 14's profile); the log's
/// write-behind batch buffers (32 KiB to 1 MiB) are above glibc's mmap threshold, so each new
/// one was a fresh mapping, its pages faulted in one by one. Buffers are often
/// freed on another thread than the one that made them (the write-out, the flusher), so the
/// pool is one mutex-guarded list per size, not per thread. Bounded: sizes up to
/// [`pool::SIZE_MAX`], at most [`pool::BYTES_MAX`] held in all; the rest is freed as before.
mod pool {
    use std::ptr::NonNull;

    use super::{Mutex, IO_ALIGN};

    /// Largest buffer kept (bytes): a unit block, small transactions' blocks, and the log's
    /// write-behind batch buffers, including one holding a whole 1 MiB write with its unit
    /// block (1 MiB and 4 KiB: with 1 MiB kept at most, each such write's buffer was a fresh
    /// allocation zeroed whole, 15 % of the daemon's samples under 1 MiB `O_DIRECT` writes).
    pub(super) const SIZE_MAX: usize = 512 * IO_ALIGN;
    /// Most bytes held by the pool at once.
    pub(super) const BYTES_MAX: usize = 16 << 20;
    const CLASSES: usize = SIZE_MAX / IO_ALIGN;

    struct Pool {
        /// `free[i]`: allocations of `(i + 1) * IO_ALIGN` bytes.
        free: [Vec<Ptr>; CLASSES],
        bytes: usize,
    }

    /// An allocation nobody owns while it is in the pool.
    struct Ptr(NonNull<u8>);
    // SAFETY: the pool owns what it holds exclusively, like the IoBuf it came from.
    unsafe impl Send for Ptr {}

    static POOL: Mutex<Pool> = Mutex::new(Pool { free: [const { Vec::new() }; CLASSES], bytes: 0 });

    fn class(len: usize) -> Option<usize> {
        (len.is_multiple_of(IO_ALIGN) && len <= SIZE_MAX).then(|| len / IO_ALIGN - 1)
    }

    /// A kept allocation of exactly `len` bytes (its contents are stale), if there is one.
    pub(super) fn take(len: usize) -> Option<NonNull<u8>> {
        let i = class(len)?;
        let mut pool = POOL.lock().ok()?;
        let p = pool.free.get_mut(i)?.pop()?;
        pool.bytes -= len;
        Some(p.0)
    }

    /// Keep an allocation of `len` bytes made with `IoBuf::layout(len)`: false if the pool
    /// does not want it (the caller frees it).
    pub(super) fn give(ptr: NonNull<u8>, len: usize) -> bool {
        let Some(i) = class(len) else { return false };
        let Ok(mut pool) = POOL.lock() else { return false };
        if pool.bytes + len > BYTES_MAX {
            return false;
        }
        let Some(list) = pool.free.get_mut(i) else { return false };
        list.push(Ptr(ptr));
        pool.bytes += len;
        true
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

    #[test]
    fn gather_places_parts_and_zeroes_the_rest() {
        let g = IoBuf::gather(8192, &[(0, b"ab"), (4096, b"xyz"), (4099, b"!")]);
        assert_eq!(g.as_ptr() as usize % IO_ALIGN, 0);
        let mut want = vec![0u8; 8192];
        want[..2].copy_from_slice(b"ab");
        want[4096..4100].copy_from_slice(b"xyz!");
        assert_eq!(&g[..], &want[..]);
        assert_eq!(IoBuf::gather(0, &[]).len(), 0);
        assert_eq!(&IoBuf::gather(3, &[])[..], &[0, 0, 0]);
    }

    /// A freed small buffer is reused, and a reused one is zeroed by `zeroed` and fully
    /// written by `gather`: no stale bytes reach a device.
    #[test]
    fn reused_buffers_hold_no_stale_bytes() {
        for _ in 0..100 {
            let mut b = IoBuf::zeroed(2 * IO_ALIGN);
            b.fill(0xAB);
            drop(b);
            let z = IoBuf::zeroed(2 * IO_ALIGN);
            assert!(z.iter().all(|&x| x == 0));
            drop(z);
            let mut b = IoBuf::zeroed(2 * IO_ALIGN);
            b.fill(0xCD);
            drop(b);
            let g = IoBuf::gather(2 * IO_ALIGN, &[(10, b"x")]);
            assert!(g.iter().enumerate().all(|(i, &x)| x == u8::from(i == 10) * b'x'));
            assert_eq!(g.as_ptr() as usize % IO_ALIGN, 0);
        }
        // Odd sizes and large ones are not pooled, and still work.
        assert_eq!(&IoBuf::from_slice(b"abc")[..], b"abc");
        assert!(IoBuf::zeroed(pool::SIZE_MAX + IO_ALIGN).iter().all(|&x| x == 0));
    }

    /// The pool gives back what it was given and holds no more than its bound.
    #[test]
    fn the_pool_is_bounded() {
        let bufs: Vec<IoBuf> = (0..(pool::BYTES_MAX / pool::SIZE_MAX) + 8)
            .map(|_| IoBuf::zeroed(pool::SIZE_MAX))
            .collect();
        drop(bufs);
        let mut again = 0;
        while pool::take(pool::SIZE_MAX).is_some_and(|p| {
            // SAFETY: a pooled allocation of SIZE_MAX bytes with IoBuf's layout.
            unsafe { std::alloc::dealloc(p.as_ptr(), IoBuf::layout(pool::SIZE_MAX)) };
            true
        }) {
            again += 1;
        }
        assert!(again <= pool::BYTES_MAX / pool::SIZE_MAX, "{again} kept");
    }

    /// A truncated buffer shows only its first bytes, and its whole allocation is freed (or
    /// pooled) with the layout it was made with.
    #[test]
    fn truncate_shortens_and_frees_the_whole_allocation() {
        for len in [3 * IO_ALIGN, pool::SIZE_MAX + IO_ALIGN] {
            let mut b = IoBuf::gather(len, &[(0, b"head"), (2 * IO_ALIGN, b"tail")]);
            b.truncate(2 * IO_ALIGN);
            assert_eq!(b.len(), 2 * IO_ALIGN);
            assert_eq!(&b[..4], b"head");
            b.truncate(len);
            assert_eq!(b.len(), 2 * IO_ALIGN, "truncate never lengthens");
            assert_eq!(b.clone().len(), 2 * IO_ALIGN);
            drop(b);
            assert!(IoBuf::zeroed(len).iter().all(|&x| x == 0));
        }
    }

    /// A buffer for overwriting is a kept one when there is one (its old bytes and all), else
    /// zeroed.
    #[test]
    fn for_overwrite_reuses_a_kept_buffer_and_zeroes_a_new_one() {
        let len = 7 * IO_ALIGN;
        let mut b = IoBuf::zeroed(len);
        b.fill(0x5A);
        let kept = b.as_ptr();
        drop(b);
        let again = IoBuf::for_overwrite(len);
        assert_eq!(again.len(), len);
        // (Another test's buffer of this size may have been taken meanwhile: then it is new.)
        if again.as_ptr() == kept {
            assert!(again.iter().all(|&x| x == 0x5A), "a kept buffer is not zeroed again");
        }
        let fresh = IoBuf::for_overwrite(pool::SIZE_MAX + IO_ALIGN);
        assert!(fresh.iter().all(|&x| x == 0), "a new buffer is zeroed");
    }

    #[test]
    #[should_panic(expected = "out of order")]
    fn gather_refuses_overlapping_parts() {
        let _ = IoBuf::gather(16, &[(0, b"abcd"), (2, b"x")]);
    }

    #[test]
    #[should_panic(expected = "past the buffer")]
    fn gather_refuses_parts_past_the_end() {
        let _ = IoBuf::gather(4, &[(2, b"abc")]);
    }
}

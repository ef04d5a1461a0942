//! The CPU's persistence instructions: cache-line write-back, store fence, non-temporal store.
//!
//! `clwb` and `clflushopt` are not in stable `std::arch` (and `is_x86_feature_detected!` does
//! not know them), so they are detected with CPUID leaf 7 and issued with inline `asm!`. Every
//! `asm!` here leaves out `nomem`, so the compiler treats it as touching memory and cannot move
//! the stores it is meant to order across it.

use serde::Serialize;

/// Bytes in a cache line: the unit `flush` writes back.
pub const LINE_SIZE: u64 = 64;
/// Bytes in a word: the unit the hardware never tears.
pub const WORD_SIZE: u64 = 8;

/// How a range is made persistent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FlushKind {
    /// `clwb`: write back, keep the line cached.
    Clwb,
    /// `clflushopt`: write back and invalidate, weakly ordered.
    Clflushopt,
    /// `clflush`: write back and invalidate, ordered with every other store (slow).
    Clflush,
    /// `msync` of the pages holding the range: no usable cache-line instruction (not x86-64),
    /// or a mapping only `msync` makes durable.
    Msync,
}

impl std::fmt::Display for FlushKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FlushKind::Clwb => "clwb",
            FlushKind::Clflushopt => "clflushopt",
            FlushKind::Clflush => "clflush",
            FlushKind::Msync => "msync",
        })
    }
}

/// The best cache-line flush this CPU has.
#[cfg(target_arch = "x86_64")]
#[must_use]
pub fn cpu_flush_kind() -> FlushKind {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    // `__cpuid*` became safe functions in later Rust releases; the block keeps 1.87 building.
    #[allow(unused_unsafe)]
    // SAFETY: CPUID exists on every x86-64 CPU; leaf 7 is only asked for when leaf 0 reports it.
    let (max_leaf, leaf1_edx) = unsafe { (__cpuid(0).eax, __cpuid(1).edx) };
    if max_leaf >= 7 {
        #[allow(unused_unsafe)]
        // SAFETY: as above; leaf 7 is within the CPU's range.
        let leaf7_ebx = unsafe { __cpuid_count(7, 0).ebx };
        if leaf7_ebx & (1 << 24) != 0 {
            return FlushKind::Clwb;
        }
        if leaf7_ebx & (1 << 23) != 0 {
            return FlushKind::Clflushopt;
        }
    }
    if leaf1_edx & (1 << 19) != 0 {
        return FlushKind::Clflush;
    }
    FlushKind::Msync
}

/// The best cache-line flush this CPU has: none off x86-64.
#[cfg(not(target_arch = "x86_64"))]
#[must_use]
pub fn cpu_flush_kind() -> FlushKind {
    FlushKind::Msync
}

/// Write back the cache line holding `line`. A no-op for [`FlushKind::Msync`], which the caller
/// handles with a system call.
///
/// # Safety
/// `line` must point into memory mapped in this process, and `kind` must be what
/// [`cpu_flush_kind`] returned (or a weaker instruction it implies: `clflush` is everywhere
/// `clflushopt` is).
#[cfg(target_arch = "x86_64")]
pub unsafe fn flush_line(kind: FlushKind, line: *const u8) {
    use std::arch::asm;
    // SAFETY (all three): the caller guarantees `line` is mapped, so the instruction cannot
    // fault, and that the CPU has the instruction. They change no register or flag and do not
    // use the stack; they do not change memory contents, only where the line is held.
    match kind {
        FlushKind::Clwb => unsafe {
            asm!("clwb [{0}]", in(reg) line, options(nostack, preserves_flags));
        },
        FlushKind::Clflushopt => unsafe {
            asm!("clflushopt [{0}]", in(reg) line, options(nostack, preserves_flags));
        },
        FlushKind::Clflush => unsafe {
            asm!("clflush [{0}]", in(reg) line, options(nostack, preserves_flags));
        },
        FlushKind::Msync => {}
    }
}

/// Off x86-64 there is no line flush: the caller uses `msync`.
///
/// # Safety
/// None needed; kept `unsafe` so callers are the same on every target.
#[cfg(not(target_arch = "x86_64"))]
pub unsafe fn flush_line(_kind: FlushKind, _line: *const u8) {}

/// Order every earlier store, line flush and non-temporal store of this thread before every
/// later store: `sfence` on x86-64, a sequentially consistent fence elsewhere.
pub fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` has no operands, cannot fault, and changes no register or flag.
    unsafe {
        std::arch::asm!("sfence", options(nostack, preserves_flags));
    }
    #[cfg(not(target_arch = "x86_64"))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// Store `value` at `dst` with a non-temporal (cache-bypassing) 8-byte store, `movnti`.
///
/// # Safety
/// `dst` must be valid for an 8-byte write, 8-byte aligned, and not accessed by anyone else
/// until the caller's next `store_fence` (non-temporal stores are weakly ordered).
#[cfg(target_arch = "x86_64")]
pub unsafe fn store_nt_u64(dst: *mut u8, value: u64) {
    // SAFETY: the caller guarantees `dst` is writable, aligned and unshared; `movnti` writes
    // exactly the 8 bytes at `dst` and touches no flag or stack.
    unsafe {
        std::arch::asm!(
            "movnti [{0}], {1}",
            in(reg) dst,
            in(reg) value,
            options(nostack, preserves_flags)
        );
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    #[test]
    fn instructions_run_on_this_cpu() {
        let kind = cpu_flush_kind();
        assert_ne!(kind, FlushKind::Msync, "every x86-64 CPU has at least clflush");
        let mut buf = vec![0u64; 16];
        let p = buf.as_mut_ptr().cast::<u8>();
        // SAFETY: p points at 128 live, 8-byte aligned bytes that only this test touches.
        unsafe {
            store_nt_u64(p.add(8), 0xdead_beef);
            flush_line(kind, p);
            flush_line(FlushKind::Clflush, p.add(64));
        }
        store_fence();
        assert_eq!(buf[1], 0xdead_beef);
    }
}

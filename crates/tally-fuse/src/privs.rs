//! Who keeps set-user-ID and set-group-ID bits when a file is changed.
//!
//! With `FUSE_HANDLE_KILLPRIV_V2` the kernel leaves the dropping of privileges to the file
//! system (and stops asking `getxattr("security.capability")` before writes: it marks
//! inodes `S_NOSEC`). It says when to drop the bits on a write (`FUSE_WRITE_KILL_SUIDGID`:
//! the writer lacks `CAP_FSETID`) and on a change of owner (always, for a non-directory); on a
//! truncate it sets `FATTR_KILL_SUIDGID` when the caller lacks `CAP_FSETID`, a flag fuser 0.18
//! does not pass on. For a truncate the adapter therefore asks `/proc` whether the caller has
//! `CAP_FSETID` — only when the file has a bit to lose, so a truncate costs nothing more.

/// `CAP_FSETID`: keep set-user-ID and set-group-ID bits when changing a file.
const CAP_FSETID: u32 = 4;

/// Whether a truncate of a file of mode `perm` by thread `pid` must drop its set-user-ID bit
/// and group-executable set-group-ID bit: the file has one and the caller lacks `CAP_FSETID`
/// (a caller `/proc` does not show, in another pid namespace, is taken to lack it).
pub(crate) fn truncate_drops_bits(perm: u16, pid: u32) -> bool {
    has_bits_to_drop(perm) && !has_cap_fsetid(pid)
}

/// A set-user-ID bit, or a set-group-ID bit with group execution.
fn has_bits_to_drop(perm: u16) -> bool {
    perm & 0o4000 != 0 || perm & 0o2010 == 0o2010
}

/// Whether thread `pid` has `CAP_FSETID` in its effective set.
fn has_cap_fsetid(pid: u32) -> bool {
    if pid == 0 {
        return false;
    }
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return false };
    effective_caps(&status).is_some_and(|caps| caps & (1 << CAP_FSETID) != 0)
}

/// The `CapEff` mask of a `/proc/<pid>/status` text.
fn effective_caps(status: &str) -> Option<u64> {
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_bits_count() {
        assert!(has_bits_to_drop(0o4755));
        assert!(has_bits_to_drop(0o2775));
        assert!(!has_bits_to_drop(0o2765), "set-group-ID without group execution");
        assert!(!has_bits_to_drop(0o0777));
    }

    #[test]
    fn capabilities_from_proc() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        assert_eq!(effective_caps(status), Some(0x01ff_ffff_ffff));
        assert_eq!(effective_caps("CapEff:\tzz\n"), None);
        assert!(!has_cap_fsetid(0));
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        assert_eq!(has_cap_fsetid(std::process::id()), root);
        assert!(!truncate_drops_bits(0o0755, std::process::id()), "no bit to lose");
        assert!(truncate_drops_bits(0o4755, 0));
    }
}

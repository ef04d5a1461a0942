//! Through the kernel: `fallocate` beyond the free space is `ENOSPC`, a reserved range is
//! written whole on a full mount (compared with ext4 on a loop device); `cp --reflink=never`
//! copies with `copy_file_range`, which the adapter now answers; `poll` is answered.
//!
//! Needs root, a usable /dev/fuse, util-linux `fallocate`, `mkfs.ext4` and loop devices;
//! without FUSE the test prints why it skips.

mod common;

use common::{require_fuse, sh_in, Ext4, Scratch};
use tally_fuse::Unmounted;

/// Reserve 8 MiB, fill the rest, then write the reserved range whole: every step's status.
/// (`huge` is removed after its failed fallocate: ext4 keeps the blocks a failed fallocate
/// allocated until then — its image was full after it — where Tally reserves nothing.)
const FALLOCATE: &str = r"
fallocate -l 100G huge; echo huge $?; ls huge 2>/dev/null | wc -l; rm -f huge
fallocate -l 8M reserved; echo reserved $? $(stat -c %s reserved)
dd if=/dev/zero of=filler bs=64k 2>/dev/null; echo filler $?
dd if=/dev/urandom of=reserved bs=64k count=128 conv=notrunc,fsync 2>&1 | grep -c 'No space'
echo written $(stat -c %s reserved)
";

#[test]
fn fallocate_reserves_as_on_ext4() {
    require_fuse!();
    let s = Scratch::new("space", "fallocate");
    let ext4 = Ext4::new(&s.root, "defaults");
    let m = s.mount();
    let (on_ext4, _) = sh_in(&ext4.dir, FALLOCATE);
    let (on_tally, _) = sh_in(&m.dir, FALLOCATE);
    let status = |out: &str| -> Vec<String> {
        // The fallocate error text and dd's ENOSPC exit code are the same on both.
        out.lines().filter(|l| !l.starts_with("fallocate:")).map(str::to_owned).collect()
    };
    assert_eq!(status(&on_tally), status(&on_ext4), "ext4:\n{on_ext4}\nTally:\n{on_tally}");
    assert!(on_tally.contains("No space left on device"), "{on_tally}");
    assert!(on_tally.contains("huge 1\n"), "{on_tally}");
    assert!(on_tally.contains("reserved 0 8388608"), "{on_tally}");
    assert!(on_tally.contains("\n0\nwritten 8388608"), "a reserved write got ENOSPC:\n{on_tally}");
    // Unmounted full: the snapshot is written all the same, and the next mount reads it.
    assert_eq!(m.unmount(), Unmounted::Clean);
    let fs = s.open_fs();
    assert!(fs.mount_report().from_snapshot, "the mount after a full unmount scanned the log");
    fs.unmount().unwrap();
}

#[test]
fn cp_copies_with_copy_file_range_and_poll_is_answered() {
    require_fuse!();
    let s = Scratch::new("space", "copy");
    let m = s.mount();
    let script = r#"
head -c 5000000 /dev/urandom > src
cp --reflink=never src dst; echo cp $?
cmp src dst && echo same
python3 -c '
import os, select
a = os.open("src", os.O_RDONLY); b = os.open("part", os.O_WRONLY | os.O_CREAT, 0o644)
n = os.copy_file_range(a, b, 100000, 123, 7)
print("copied", n)
p = select.poll(); p.register(a, select.POLLIN); print("poll", p.poll(0))
'
cmp -i 123:7 -n 100000 src part && echo part-same
"#;
    let (out, ok) = sh_in(&m.dir, script);
    assert!(ok, "{out}");
    assert!(out.contains("cp 0\nsame\n"), "{out}");
    assert!(out.contains("copied 100000") && out.contains("part-same"), "{out}");
    assert!(out.contains("poll [(3, 1)]"), "{out}");
    let counts = m.requests().to_string();
    assert!(counts.contains("POLL"), "the kernel never asked: {counts}");
    assert!(counts.contains("COPY_FILE_RANGE"), "the kernel never asked: {counts}");
    assert_eq!(m.unmount(), Unmounted::Clean);
}

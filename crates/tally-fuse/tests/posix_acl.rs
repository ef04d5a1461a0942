//! POSIX ACLs are refused (`EOPNOTSUPP`, as on ext4 mounted `noacl`), so the tools that copy
//! them fall back to `chmod`: the same commands run on a Tally mount and on ext4 mounted with
//! ACLs on a loop device leave the same modes. Only an ACL the mode cannot express differs:
//! ext4 keeps it, Tally refuses it.
//!
//! Needs root, a usable /dev/fuse, `mkfs.ext4`, loop devices, GNU sed and coreutils, and
//! `setfacl`/`getfacl` (the `acl` package); without FUSE the test prints why it skips.

mod common;

use common::{require_fuse, sh_in, Ext4, Scratch};
use tally_fuse::Unmounted;

/// Each step prints what a user would look at: modes after sed -i, cp -a, install -m, and
/// setfacl with ACLs equivalent to a mode; getfacl's view of a plain file.
const STEPS: &str = r"
printf 'a\n' > f; chmod 0644 f
sed -i s/a/b/ f; echo sed-644 $(stat -c %a f) $(cat f)
printf 'a\n' > g; chmod 0640 g
sed -i s/a/b/ g; echo sed-640 $(stat -c %a g)
cp -a f f2; echo cp-a $(stat -c %a f2)
cp -a g g2; echo cp-a-640 $(stat -c %a g2)
install -m 0644 f i1; echo install-644 $(stat -c %a i1)
install -m 0755 f i2; echo install-755 $(stat -c %a i2)
getfacl -c f
setfacl -m u::rwx,g::r-x,o::- f; echo setfacl-minimal $(stat -c %a f)
getfacl -c f
setfacl -b f; echo setfacl-b $(stat -c %a f)
mkdir d; setfacl -d -m u::rwx,g::rx,o::rx d 2>/dev/null; echo default-acl $?
";

#[test]
fn tools_keep_the_mode_as_on_ext4() {
    require_fuse!();
    let s = Scratch::new("posix_acl", "tools");
    let ext4 = Ext4::new(&s.root, "acl");
    let m = s.mount();
    let (on_ext4, ok) = sh_in(&ext4.dir, STEPS);
    assert!(ok, "on ext4:\n{on_ext4}");
    let (on_tally, ok) = sh_in(&m.dir, STEPS);
    assert!(ok, "on Tally:\n{on_tally}");
    let plain = |out: &str| -> Vec<String> {
        // A default ACL is the one thing ext4 keeps and Tally refuses.
        out.lines().filter(|l| !l.starts_with("default-acl")).map(str::to_owned).collect()
    };
    assert_eq!(plain(&on_tally), plain(&on_ext4), "ext4:\n{on_ext4}\nTally:\n{on_tally}");
    for want in ["sed-644 644 b", "sed-640 640", "cp-a 644", "install-644 644", "setfacl-b 750"] {
        assert!(on_tally.lines().any(|l| l == want), "{want:?} missing:\n{on_tally}");
    }
    assert!(on_ext4.contains("default-acl 0"), "{on_ext4}");
    assert!(on_tally.contains("default-acl 1"), "{on_tally}");

    // An ACL the mode cannot express: ext4 keeps it, Tally says it cannot, and nothing changed.
    let extended = "setfacl -m u:nobody:r f; echo status $?; stat -c %a f; getfattr -m - -d f";
    let (out, _) = sh_in(&ext4.dir, extended);
    assert!(out.contains("status 0"), "ext4: {out}");
    let (out, _) = sh_in(&m.dir, extended);
    assert!(out.contains("Operation not supported") && out.contains("status 1"), "Tally: {out}");
    assert!(out.contains("\n750\n") && !out.contains("posix_acl"), "Tally: {out}");
    // Asked directly, the attributes are refused with EOPNOTSUPP, set or read.
    let raw = "setfattr -n system.posix_acl_access -v 0x02000000 f; echo set $?; \
               getfattr -n system.posix_acl_access f; echo get $?";
    let (out, _) = sh_in(&m.dir, raw);
    assert!(out.contains("set 1") && out.contains("get 1"), "{out}");
    assert_eq!(out.matches("Operation not supported").count(), 2, "{out}");
    assert_eq!(m.unmount(), Unmounted::Clean);
}

//! The kernel's requests to the mount, as the adapter counts them: what an operation costs in
//! round trips.
//!
//! Needs root and a usable /dev/fuse (CI has both); otherwise each test prints why it skips.

mod common;

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::time::Duration;

use tally_fuse::{Opcode, Unmounted};

use common::{require_fuse, wait_until, Scratch};

#[test]
fn each_request_is_counted_once_under_its_opcode() {
    require_fuse!();
    let s = Scratch::new("requests-test", "count");
    let m = s.mount();
    let before = m.requests();
    let mut f = OpenOptions::new().write(true).create_new(true).open(m.path("f")).unwrap();
    for _ in 0..3 {
        f.write_all(&[7u8; 100]).unwrap();
    }
    drop(f);
    // The kernel's release comes a moment after close.
    wait_until("the release arrived", Duration::from_secs(5), || {
        m.requests().since(&before).get(Opcode::Release) == 1
    });
    let d = m.requests().since(&before);
    assert_eq!(d.get(Opcode::Create), 1, "{d}");
    assert_eq!(d.get(Opcode::Write), 3, "{d}");
    assert_eq!(fs::read(m.path("f")).unwrap(), [7u8; 300]);
    assert!(m.requests().since(&before).total() > d.total(), "the read was not counted");
    assert_eq!(m.unmount(), Unmounted::Clean);
}

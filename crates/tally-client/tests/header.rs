//! `include/tally.h` and the crate agree: a C program including the header is compiled with
//! the system's C compiler (the one Rust links with) and prints each number.

use std::path::PathBuf;
use std::process::Command;

use tally_client::ioctl;

#[test]
fn the_c_header_defines_the_same_numbers() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = std::env::temp_dir().join(format!("tally-header-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("numbers.c");
    std::fs::write(
        &src,
        r#"#include <stdio.h>
#include "tally.h"
int main(void) {
    printf("%lu %lu %lu %lu %lu %lu %lu %lu %lu\n", (unsigned long)TALLY_IOC_MAGIC,
           (unsigned long)TALLY_IOC_BEGIN, (unsigned long)TALLY_IOC_BEGIN_TREE,
           (unsigned long)TALLY_IOC_COMMIT, (unsigned long)TALLY_IOC_COMMIT_DURABLE,
           (unsigned long)TALLY_IOC_ABORT, (unsigned long)TALLY_IOC_BARRIER,
           (unsigned long)TALLY_IOC_CURRENT, (unsigned long)TALLY_IOC_SYNC);
    return 0;
}
"#,
    )
    .unwrap();
    let exe = dir.join("numbers");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .arg("-Wall")
        .arg("-Werror")
        .arg("-I")
        .arg(root.join("include"))
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("{cc} (the C compiler Rust links with) did not run: {e}"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let run = Command::new(&exe).output().unwrap();
    let text = String::from_utf8(run.stdout).unwrap();
    let got: Vec<u64> = text.split_whitespace().map(|n| n.parse().unwrap()).collect();
    let want: Vec<u64> =
        std::iter::once(u32::from(ioctl::MAGIC)).chain(ioctl::ALL).map(u64::from).collect();
    assert_eq!(got, want, "include/tally.h and tally_client::ioctl disagree");
    let _ = std::fs::remove_dir_all(&dir);
}

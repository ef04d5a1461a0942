//! SQLite's own `speedtest1` on the Tally library VFS: the C program's `main`, compiled as
//! `speedtest1_main` into a static library, runs inside this process against the very SQLite
//! rusqlite links, with the Tally VFS registered as `tally` and `--vfs tally` passed to it.
//!
//! ```text
//! speedtest1_vfs DEV [SPEEDTEST1 ARGS...]
//!   DEV  image file or block device: a new Tally file system is made on it (O_DIRECT)
//! ```
//!
//! After speedtest1's own report it prints one line: `tally flushes F bytes B submissions S
//! txns T batches N rollbacks R overflows O journals J vfs_writes W vfs_bytes X` (the device's
//! and the log's counters from mount to the end: flushes, bytes written, `submit` calls, Tally
//! transactions committed; and the VFS's).
//!
//! Only `bench/sqlite_mount.sh` (workload `speedtest1`) builds the real program: it compiles
//! Debian's `speedtest1.c` with `-Dmain=speedtest1_main` into `libspeedtest1.a` and links it with
//! `cargo rustc ... -- -L native=DIR -l static=speedtest1 --cfg speedtest1`. Any other build
//! of this example (`cargo test`, `cargo build --examples`) has no speedtest1 to link and only
//! says so.
// `speedtest1` is set by the `cargo rustc` line above only, so rustc's cfg check does not know it.
#![allow(unexpected_cfgs)]

#[cfg(speedtest1)]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    use std::ffi::{c_char, c_int, c_void, CString};
    use std::sync::Arc;

    use tally_fs::{Fs, MkfsOptions, MountOptions};
    use tally_media::{Device, DirectMode, FileDevice, FileOptions};
    use tally_sqlite::{TallyVfs, VfsOptions};

    extern "C" {
        fn speedtest1_main(argc: c_int, argv: *mut *mut c_char) -> c_int;
        fn fflush(stream: *mut c_void) -> c_int;
    }

    let mut args = std::env::args().skip(1);
    let dev_path = args.next().ok_or("usage: speedtest1_vfs DEV [SPEEDTEST1 ARGS...]")?;
    let options = FileOptions { direct: DirectMode::On, ..FileOptions::default() };
    let dev: Arc<dyn Device> = Arc::new(FileDevice::open(&dev_path, options)?);
    Fs::mkfs(dev.clone(), &MkfsOptions::default())?;
    let fs = Arc::new(Fs::mount(dev.clone(), MountOptions::default())?);
    let vfs = TallyVfs::register("tally", fs.clone(), VfsOptions::default())?;
    let (d0, t0) = (dev.stats(), fs.log().stats().commits);

    // speedtest1 deletes the database through the VFS and then unlink()s the same name on the
    // host: a name nothing on the host has.
    let mut argv: Vec<CString> = ["speedtest1", "--vfs", "tally"]
        .into_iter()
        .map(String::from)
        .chain(args)
        .chain(["/tally-speedtest1-in-the-vfs.db".to_owned()])
        .map(CString::new)
        .collect::<Result<_, _>>()?;
    let mut ptrs: Vec<*mut c_char> = argv.iter_mut().map(|a| a.as_ptr().cast_mut()).collect();
    ptrs.push(std::ptr::null_mut());
    let argc = c_int::try_from(argv.len())?;
    // SAFETY: argv is `argc` NUL-terminated strings and a null, alive through the call;
    // speedtest1 reads them and never writes through them. It closes its database before
    // returning (or calls exit on a fatal error).
    let rc = unsafe { speedtest1_main(argc, ptrs.as_mut_ptr()) };
    // SAFETY: fflush(NULL) flushes every C stream, so speedtest1's report precedes ours.
    unsafe { fflush(std::ptr::null_mut()) };
    if rc != 0 {
        return Err(format!("speedtest1 exited {rc}").into());
    }
    fs.sync()?;
    let d = dev.stats() - d0;
    let v = vfs.stats();
    println!(
        "tally flushes {} bytes {} submissions {} txns {} batches {} rollbacks {} overflows {} \
         journals {} vfs_writes {} vfs_bytes {}",
        d.flushes,
        d.bytes_written,
        d.submissions,
        fs.log().stats().commits - t0,
        v.batch_commits,
        v.batch_rollbacks,
        v.batch_overflows,
        v.journal_opens,
        v.file_writes,
        v.file_bytes,
    );
    drop(vfs);
    if let Some(fs) = Arc::into_inner(fs) {
        fs.unmount()?;
    }
    Ok(())
}

#[cfg(not(speedtest1))]
fn main() {
    eprintln!(
        "speedtest1_vfs: built without speedtest1; bench/sqlite_speedtest1.sh builds and runs it"
    );
    std::process::exit(2);
}

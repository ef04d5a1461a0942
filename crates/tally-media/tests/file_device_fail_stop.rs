//! After a failed write, a `FileDevice` refuses every later write and flush (fail-stop).
//!
//! The failure is real, not injected: `RLIMIT_FSIZE` makes the kernel refuse writes past a byte
//! limit with EFBIG. The limit is per process and applies to *every* regular file the process
//! writes — including the test harness's output when it is redirected to a file (as CI does) —
//! so the test re-runs itself as a child process whose output is a pipe, and only the child
//! lowers the limit.

use std::path::PathBuf;

use tally_media::{Device, Engine, FileDevice, FileOptions, IoBuf, MediaError, Write, WriteFlags};

const BLOCK: usize = 4096;

struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn limit_file_size(bytes: u64) {
    // SAFETY: ignoring SIGXFSZ turns "killed by signal" into an EFBIG error from write.
    let previous = unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    assert_ne!(previous, libc::SIG_ERR);
    let limit = libc::rlimit { rlim_cur: bytes, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: a valid rlimit struct; lowering the soft limit needs no privilege.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &limit) };
    assert_eq!(rc, 0, "setrlimit: {}", std::io::Error::last_os_error());
}

const CHILD_ENV: &str = "TALLY_FAIL_STOP_CHILD";

#[test]
fn a_failed_write_fails_the_device() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return failed_write_fails_the_device();
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "a_failed_write_fails_the_device", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "child failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("1 passed"), "the child did not run the test:\n{stdout}");
}

fn failed_write_fails_the_device() {
    let mut files = Vec::new();
    let mut devices = Vec::new();
    for (i, engine) in [Engine::IoUring, Engine::Threads].into_iter().enumerate() {
        let path = std::env::temp_dir().join(format!("tally-fail-stop-{}-{i}", std::process::id()));
        std::fs::File::create(&path).unwrap().set_len(8 * BLOCK as u64).unwrap();
        files.push(TempFile(path.clone()));
        match FileDevice::open(&path, FileOptions { engine, ..FileOptions::default() }) {
            Ok(dev) => devices.push(dev),
            Err(err) => println!("SKIP {engine:?}: {err}"),
        }
    }
    // Writes below 2 blocks still work; writes at or past it fail with EFBIG.
    limit_file_size(2 * BLOCK as u64);
    for dev in &devices {
        let engine = dev.engine();
        dev.write_sync(vec![Write::new(0, IoBuf::from_slice(&[1; BLOCK]))], WriteFlags::NONE)
            .unwrap();
        let bad = dev
            .submit(
                vec![
                    Write::new(1, IoBuf::from_slice(&[2; BLOCK])),
                    Write::new(5, IoBuf::from_slice(&[3; BLOCK])),
                ],
                WriteFlags::NONE,
            )
            .unwrap();
        for _ in 0..2 {
            match dev.wait(bad) {
                Err(MediaError::Io { source, .. }) => {
                    assert_eq!(source.raw_os_error(), Some(libc::EFBIG), "{engine}");
                }
                other => panic!("{engine}: expected EFBIG, got {other:?}"),
            }
        }
        let later = dev.submit(vec![Write::new(0, IoBuf::zeroed(BLOCK))], WriteFlags::NONE);
        match later {
            Err(MediaError::Failed { first_error }) => assert!(
                first_error.contains("File too large") || first_error.contains("27"),
                "{first_error}"
            ),
            other => panic!("{engine}: expected Failed, got {other:?}"),
        }
        assert!(matches!(dev.flush(), Err(MediaError::Failed { .. })), "{engine}");
        // Reads still work, and see the write that made it.
        let mut buf = IoBuf::zeroed(2 * BLOCK);
        dev.read(0, &mut buf).unwrap();
        assert!(buf[..BLOCK].iter().all(|&b| b == 1), "{engine}");
        assert!(buf[BLOCK..].iter().all(|&b| b == 2), "{engine}: block 1 is below the limit");
    }
}

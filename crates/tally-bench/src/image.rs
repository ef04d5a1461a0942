//! A fresh file system in an image file, mounted as `tally mount` runs it (the log's
//! write-behind on): what the library examples (`examples/small_tx.rs`,
//! `examples/small_beside_large.rs`, `examples/checkpoint_hold.rs`, `examples/prune_hold.rs`)
//! measure on.

use std::path::Path;
use std::sync::Arc;

use tally_fs::{Fs, Ino, MkfsOptions, MountOptions};
use tally_media::{Device, FileDevice, FileOptions};

/// Make `path` a `bytes`-long image file (overwriting it), make a file system on it with the
/// default options and mount it with the log's default write-behind.
///
/// # Errors
/// The file's creation, the device's open, `mkfs` and `mount`.
pub fn fresh_image_fs(
    path: &Path,
    bytes: u64,
) -> Result<Fs, Box<dyn std::error::Error + Send + Sync>> {
    let opts = MountOptions {
        write_behind: Some(tally_log::WriteBehind::default()),
        ..MountOptions::default()
    };
    fresh_image_fs_with(path, bytes, opts)
}

/// [`fresh_image_fs`], mounted with `opts`.
///
/// # Errors
/// The file's creation, the device's open, `mkfs` and `mount`.
pub fn fresh_image_fs_with(
    path: &Path,
    bytes: u64,
    opts: MountOptions,
) -> Result<Fs, Box<dyn std::error::Error + Send + Sync>> {
    let file = std::fs::File::create(path)?;
    file.set_len(bytes)?;
    drop(file);
    let dev: Arc<dyn Device> = Arc::new(FileDevice::open(path, FileOptions::default())?);
    Fs::mkfs(dev.clone(), &MkfsOptions::default())?;
    Ok(Fs::mount(dev, opts)?)
}

/// Unmount `fs` (no other holder may be left) and remove its image file `path`.
///
/// # Errors
/// Another holder of `fs` is left; the unmount; the removal.
pub fn unmount_and_remove(
    fs: Arc<Fs>,
    path: &Path,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let fs = Arc::try_unwrap(fs).map_err(|_| "file system still shared")?;
    fs.unmount()?;
    std::fs::remove_file(path)?;
    Ok(())
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A thread calling `getattr` on one inode in a loop, keeping the longest call since
/// [`GetattrProbe::measure`]: how long something else kept every operation waiting, as a user
/// of the mount would see it (`examples/checkpoint_hold.rs`, `examples/prune_hold.rs`).
pub struct GetattrProbe {
    stop: Arc<std::sync::atomic::AtomicBool>,
    worst_us: Arc<std::sync::atomic::AtomicU64>,
    thread: std::thread::JoinHandle<Result<u64, BoxError>>,
}

impl GetattrProbe {
    /// Start calling `getattr(ino)` on `fs`.
    pub fn start(fs: &Arc<Fs>, ino: Ino) -> GetattrProbe {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let stop = Arc::new(AtomicBool::new(false));
        let worst_us = Arc::new(AtomicU64::new(0));
        let thread = {
            let (fs, stop, worst) = (fs.clone(), stop.clone(), worst_us.clone());
            std::thread::spawn(move || -> Result<u64, BoxError> {
                let mut calls = 0;
                while !stop.load(Ordering::Relaxed) {
                    let t = std::time::Instant::now();
                    fs.getattr(ino)?;
                    let us = u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX);
                    worst.fetch_max(us, Ordering::Relaxed);
                    calls += 1;
                }
                Ok(calls)
            })
        };
        GetattrProbe { stop, worst_us, thread }
    }

    /// Let the probe start calling, then forget the longest call so far: what follows is
    /// measured.
    pub fn measure(&self) {
        std::thread::sleep(std::time::Duration::from_millis(20));
        self.worst_us.store(0, std::sync::atomic::Ordering::Relaxed);
    }

    /// Run `f` beside a probe calling `getattr(ino)`: `f`'s result, its wall time, the longest
    /// `getattr` during it and the calls made.
    ///
    /// # Errors
    /// `f`'s; a failed `getattr`; the probe thread's panic.
    pub fn around<T>(
        fs: &Arc<Fs>,
        ino: Ino,
        f: impl FnOnce() -> Result<T, BoxError>,
    ) -> Result<(T, std::time::Duration, std::time::Duration, u64), BoxError> {
        let probe = GetattrProbe::start(fs, ino);
        probe.measure();
        let t = std::time::Instant::now();
        let out = f();
        let took = t.elapsed();
        let (worst, calls) = probe.stop()?;
        Ok((out?, took, worst, calls))
    }

    /// Stop the probe: the longest call since [`GetattrProbe::measure`] and the calls made.
    ///
    /// # Errors
    /// A failed `getattr`; the probe thread's panic.
    pub fn stop(self) -> Result<(std::time::Duration, u64), BoxError> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let calls = self.thread.join().map_err(|_| "probe panicked")??;
        let worst = self.worst_us.load(std::sync::atomic::Ordering::Relaxed);
        Ok((std::time::Duration::from_micros(worst), calls))
    }
}

/// An example's command line: numbers in order, then an image path.
pub struct Args(std::iter::Skip<std::env::Args>);

impl Args {
    /// This process's arguments.
    #[allow(clippy::new_without_default)] // reads the process's arguments: not a default
    pub fn new() -> Args {
        Args(std::env::args().skip(1))
    }

    /// The next argument as a number, `default` when there is none.
    ///
    /// # Errors
    /// An argument that is not a number.
    pub fn number(&mut self, default: u64) -> Result<u64, BoxError> {
        Ok(self.0.next().map(|s| s.parse()).transpose()?.unwrap_or(default))
    }

    /// The next argument as the image's path; by default `NAME-PID.img` in the system's
    /// temporary directory.
    pub fn image(mut self, name: &str) -> std::path::PathBuf {
        self.0.next().map_or_else(
            || std::env::temp_dir().join(format!("{name}-{}.img", std::process::id())),
            std::path::PathBuf::from,
        )
    }
}

/// Unmount `fs` (no other holder may be left) and mount its image `path` again as
/// [`quiet_image_fs`] does; with the mount's own time (`MountReport::time`).
///
/// # Errors
/// Another holder of `fs` is left; the unmount; the device's open; the mount.
pub fn remount_quiet(fs: Arc<Fs>, path: &Path) -> Result<(Arc<Fs>, std::time::Duration), BoxError> {
    let fs = Arc::try_unwrap(fs).map_err(|_| "file system still shared")?;
    fs.unmount()?;
    let dev: Arc<dyn Device> = Arc::new(FileDevice::open(path, FileOptions::default())?);
    let fs = Fs::mount(dev, quiet_options())?;
    let took = fs.mount_report().time;
    Ok((Arc::new(fs), took))
}

fn quiet_options() -> MountOptions {
    MountOptions {
        write_behind: Some(tally_log::WriteBehind::default()),
        replay_budget: Some(0),
        ..MountOptions::default()
    }
}

/// A fresh 2 GiB image at `path` with write-behind on, online checkpoints off (replay budget
/// 0) and no maintenance thread: only what the example does runs on it.
///
/// # Errors
/// As [`fresh_image_fs_with`].
pub fn quiet_image_fs(path: &Path) -> Result<Arc<Fs>, BoxError> {
    Ok(Arc::new(fresh_image_fs_with(path, 2 << 30, quiet_options())?))
}

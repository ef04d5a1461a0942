//! Real NBD servers for the tests: `nbdkit` on a Unix socket, started and killed by the test.
//! A missing `nbdkit` skips a test on a developer's machine and fails it when `CI` is set
//! (`.ci/run` installs it).

// Each test binary compiles this module on its own and uses only some of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Whether `program` can run; panics when it cannot and `CI` is set.
pub fn have(program: &str) -> bool {
    let ok = Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "{program} is not installed and CI is set: the NBD tests need it (.ci/run installs it)"
        );
        eprintln!("skipping: {program} is not installed");
    }
    ok
}

/// A scratch directory, removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("tally-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An `nbdkit` process on a Unix socket, killed (SIGKILL) on drop.
pub struct Nbdkit {
    child: Child,
    pub socket: PathBuf,
    pub uri: String,
}

impl Nbdkit {
    /// `nbdkit --filter=F... PLUGIN PARAMS` on `socket` (replaced if it exists).
    pub fn start(socket: &Path, filters: &[&str], plugin_and_params: &[&str]) -> Nbdkit {
        let pid = socket.with_extension("pid");
        let _ = std::fs::remove_file(&pid);
        let _ = std::fs::remove_file(socket);
        let mut args: Vec<String> = ["-f", "--exit-with-parent", "-U"].map(String::from).to_vec();
        args.push(socket.display().to_string());
        args.push("-P".into());
        args.push(pid.display().to_string());
        args.extend(filters.iter().map(|f| format!("--filter={f}")));
        args.extend(plugin_and_params.iter().map(|s| (*s).to_string()));
        let child = spawn_ready("nbdkit", &args, &pid);
        let uri = format!("nbd+unix:///?socket={}", socket.display());
        Nbdkit { child, socket: socket.to_path_buf(), uri }
    }

    /// Kill the server at once (SIGKILL): whatever it held in memory is gone.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Nbdkit {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A `qemu-nbd` process serving a raw image on a Unix socket (up to 8 clients, the host's page
/// cache as its cache), killed (SIGKILL) on drop.
pub struct QemuNbd {
    child: Child,
    pub uri: String,
}

impl QemuNbd {
    pub fn start(socket: &Path, image: &Path) -> QemuNbd {
        let pid = socket.with_extension("pid");
        let _ = std::fs::remove_file(&pid);
        let _ = std::fs::remove_file(socket);
        let args: Vec<String> = vec![
            "-k".into(),
            socket.display().to_string(),
            "--pid-file".into(),
            pid.display().to_string(),
            "-f".into(),
            "raw".into(),
            "-e".into(),
            "8".into(),
            "--cache=writeback".into(),
            image.display().to_string(),
        ];
        let child = spawn_ready("qemu-nbd", &args, &pid);
        let uri = format!("nbd+unix:///?socket={}", socket.display());
        QemuNbd { child, uri }
    }

    /// Its process id (to kill it from another thread).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kill it at once (SIGKILL) and reap it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for QemuNbd {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Start `program args` and wait (at most 20 s) until it has written its pid file `pid`; it
/// binds its socket before that, and gets a moment more to finish the file.
fn spawn_ready(program: &str, args: &[String], pid: &Path) -> Child {
    let mut child = Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {program}: {e}"));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !pid.exists() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("{program} {args:?} exited before it was ready: {status}");
        }
        assert!(Instant::now() < deadline, "{program} not ready after 20 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(50));
    child
}

#!/usr/bin/env python3
"""Issue #6's side-by-side run: sets up every system on its own loop device (same-size files in
one directory, so all pay the same stack), runs each workload on each system with windows
interleaved (run 1 of every system, then run 2, ...), and writes the raw results as JSON for
bench/peers_report.py. Started by bench/run.sh, which installs the tools first.

Every mount and loop device this script makes is undone on any exit (normal end, exception,
SIGINT, SIGTERM); bench/run.sh undoes them again if this process was killed outright.

Usage: peers.py WORKDIR OUT_JSON TALLY LMDB_DRIVER [--quick]
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

WORK, OUT, TALLY, LMDB = sys.argv[1:5]
QUICK = "--quick" in sys.argv[5:]
RUNS = 3
SECS = 2 if QUICK else 5
SIZE = "2G"
# Seed of `tally bench peer append-crash` (payload, crash points, crash images): fixed, so a
# rerun checks the same images.
CRASH_SEED = 1

results = {"quick": QUICK, "runs": RUNS, "seconds": SECS, "image_size": SIZE, "windows": [],
           "systems": {}, "failures": [], "tx": {}, "mount": [], "recovery": []}
undo = []          # cleanup steps, run last-in first-out
started = time.time()
plan_total = 0
plan_done = 0


def log(msg):
    el = time.time() - started
    print(f"[{el/60:5.1f} min] {msg}", file=sys.stderr, flush=True)


def progress(what):
    global plan_done
    plan_done += 1
    el = time.time() - started
    eta = el / plan_done * (plan_total - plan_done) if plan_done else 0
    print(f"[{el/60:5.1f} min] ({plan_done}/{plan_total}, ~{eta/60:.0f} min left) {what}",
          file=sys.stderr, flush=True)


def sh(*args, check=True, capture=True, timeout=None):
    r = subprocess.run(args, capture_output=capture, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {r.returncode}: {r.stderr.strip()[-500:]}")
    return r


def cleanup():
    while undo:
        step = undo.pop()
        try:
            step()
        except Exception as e:  # keep undoing the rest
            print(f"cleanup: {e}", file=sys.stderr)


def on_signal(sig, _frame):
    raise SystemExit(f"stopped by signal {sig}")


signal.signal(signal.SIGTERM, on_signal)
signal.signal(signal.SIGINT, on_signal)


# ---- systems -------------------------------------------------------------------------------

def loop_device(name):
    img = os.path.join(WORK, f"{name}.img")
    sh("truncate", "-s", SIZE, img)
    undo.append(lambda: os.path.exists(img) and os.remove(img))
    # direct-io=on: the backing file's page cache would otherwise absorb writes and make every
    # flush an fsync of the image; on for all systems alike.
    dev = sh("losetup", "--find", "--show", "--direct-io=on", img).stdout.strip()
    undo.append(lambda: sh("losetup", "-d", dev, check=False))
    return dev


def mount_ext4(name, mkfs_opts, mount_opts):
    dev = loop_device(name)
    sh("mkfs.ext4", "-q", "-F", *mkfs_opts, dev)
    mnt = os.path.join(WORK, "mnt", name)
    os.makedirs(mnt, exist_ok=True)
    sh("mount", "-o", mount_opts, dev, mnt)
    undo.append(lambda: umount(mnt))
    return {"dev": dev, "mnt": mnt, "daemon": None, "kind": "ext4", "options": mount_opts,
            "mkfs": " ".join(mkfs_opts) or "defaults"}


def umount(mnt):
    """Unmount, waiting for a FUSE daemon above it to let go (fusermount -u returns before
    bindfs exits); lazily as a last resort, so the loop device can still be detached."""
    for _ in range(20):
        if sh("umount", mnt, check=False).returncode == 0:
            return
        time.sleep(0.25)
    sh("umount", "-l", mnt, check=False)


def mount_tally(dev):
    mnt = os.path.join(WORK, "mnt", "tally-fuse")
    os.makedirs(mnt, exist_ok=True)
    out = sh(TALLY, "mount", dev, mnt, "--log", os.path.join(WORK, "tally-mount.log")).stdout
    m = re.search(r"daemon pid (\d+)", out)
    undo.append(lambda: sh(TALLY, "umount", mnt, check=False))
    return mnt, (int(m.group(1)) if m else None)


def pid_of_mount(mnt):
    """The pid of the FUSE daemon serving mnt (bindfs daemonises and prints none)."""
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    args = f.read().split(b"\0")
                if mnt.encode() in args and b"bindfs" in args[0]:
                    return int(p)
            except OSError:
                pass
    return None


def setup():
    os.makedirs(os.path.join(WORK, "mnt"), exist_ok=True)
    S = results["systems"]
    S["ext4-ordered"] = mount_ext4("ext4-ordered", [], "data=ordered")
    S["ext4-journal"] = mount_ext4("ext4-journal", [], "data=journal")
    S["ext4-nj"] = mount_ext4("ext4-nj", ["-O", "^has_journal"], "defaults")
    # The pass-through: bindfs over its own ext4 data=ordered loop device.
    src = mount_ext4("bindfs-src", [], "data=ordered")
    bmnt = os.path.join(WORK, "mnt", "bindfs")
    os.makedirs(bmnt, exist_ok=True)
    sh("bindfs", "--no-allow-other", src["mnt"], bmnt)
    undo.append(lambda: sh("fusermount", "-u", bmnt, check=False))
    S["bindfs"] = {"dev": src["dev"], "mnt": bmnt, "daemon": pid_of_mount(bmnt),
                   "kind": "fuse", "options": "bindfs over ext4 data=ordered"}
    tdev = loop_device("tally")
    sh(TALLY, "mkfs", tdev, "--force")
    tmnt, tpid = mount_tally(tdev)
    S["tally-fuse"] = {"dev": tdev, "mnt": tmnt, "daemon": tpid, "kind": "fuse",
                       "options": "tally mount (4 streams)"}
    S["tally-lib"] = {"dev": tdev, "mnt": None, "daemon": None, "kind": "library",
                      "options": "tally-fs library on the same loop device (FUSE unmounted)"}
    for name, s in S.items():
        log(f"{name}: {s['dev']} {s['mnt'] or ''} {s['options']}")


# ---- counters ------------------------------------------------------------------------------

def diskstats(dev):
    name = os.path.basename(dev)
    with open("/proc/diskstats") as f:
        for line in f:
            p = line.split()
            if p[2] == name:
                # writes completed, sectors written, flushes completed (kernel >= 5.5)
                return int(p[7]), int(p[9]) * 512, int(p[18]) if len(p) > 18 else 0
    return 0, 0, 0


def proc_cpu(pid):
    if not pid:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


def timed(argv, dev, daemon, cwd=None, timeout=600):
    """Run argv; return (stdout, counters) with device and CPU deltas (child + FUSE daemon)."""
    sh("sync")
    d0, c0 = diskstats(dev), proc_cpu(daemon)
    t0 = time.time()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        raise RuntimeError(f"{argv[0]} timed out")
    # communicate() reaped the child; its rusage comes from RUSAGE_CHILDREN deltas instead.
    wall = time.time() - t0
    d1, c1 = diskstats(dev), proc_cpu(daemon)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {p.returncode}: {err.strip()[-400:]}")
    return out, {"dev_writes": d1[0] - d0[0], "dev_bytes": d1[1] - d0[1],
                 "dev_flushes": d1[2] - d0[2], "daemon_cpu_s": c1 - c0, "wall_s": wall}


def children_cpu():
    r = os.times()
    return r.children_user + r.children_system


def record(workload, system, config, run, ops, seconds, payload, counters, cpu_s, extra=None):
    w = {"workload": workload, "system": system, "config": config, "run": run, "ops": ops,
         "seconds": seconds, "ops_per_s": ops / seconds if seconds else 0.0,
         "payload_bytes": payload, "cpu_s": cpu_s, **counters}
    w.update(extra or {})
    results["windows"].append(w)
    save()


def save():
    # The scratch directory's and the binary's paths are this machine's: the committed data
    # names them $WORK and `tally` (a failed window's error quotes the command it ran).
    with open(OUT, "w") as f:
        f.write(json.dumps(results, indent=1).replace(TALLY, "tally").replace(WORK, "$WORK"))


def attempt(label, fn):
    try:
        fn()
    except Exception as e:  # one failed window is recorded, the run goes on
        log(f"FAILED {label}: {e}")
        results["failures"].append({"what": label, "error": str(e)[-600:]})
        save()


# ---- workloads -----------------------------------------------------------------------------

def fio_window(system, bs, jobs, run, etcd=False):
    s = results["systems"][system]
    d = os.path.join(s["mnt"], f"fio.{bs}.{jobs}")
    os.makedirs(d, exist_ok=True)
    argv = ["fio", "--name=append", f"--directory={d}", "--rw=write", "--file_append=1",
            "--ioengine=psync", f"--bs={bs}", f"--numjobs={jobs}", "--group_reporting",
            "--size=128M", f"--runtime={SECS}", "--time_based", "--output-format=json"]
    argv.append("--fdatasync=1" if etcd else "--fsync=1")
    c0 = children_cpu()
    out, cnt = timed(argv, s["dev"], s["daemon"])
    cpu = children_cpu() - c0 + cnt["daemon_cpu_s"]
    shutil.rmtree(d, ignore_errors=True)
    job = json.loads(out[out.index("{"):])["jobs"][0]
    wr = job["write"]
    secs = job["job_runtime"] / 1000.0 / max(jobs, 1) if job.get("job_runtime") else SECS
    ops = wr["total_ios"]
    sync = job.get("sync", {}).get("lat_ns", {}).get("percentile", {})
    extra = {"sync_p99_us": sync.get("99.000000", 0) / 1000.0,
             "write_p99_us": wr.get("clat_ns", {}).get("percentile", {}).get("99.000000", 0) / 1000.0}
    cfg = "etcd 2300B fdatasync" if etcd else f"{bs} x{jobs}"
    record("fio", system, cfg, run, ops, secs, wr["io_bytes"], cnt, cpu, extra)


def varmail_window(system, run):
    s = results["systems"][system]
    c0 = children_cpu()
    out, cnt = timed([TALLY, "bench", "peer", "varmail", "--dir", s["mnt"], "--system", system,
                      "--seconds", str(SECS), "--threads", "16", "--files", "1000", "--json"],
                     s["dev"], s["daemon"])
    cpu = children_cpu() - c0 + cnt["daemon_cpu_s"]
    w = json.loads(out)
    record("varmail", system, "16 threads", run, w["ops"], w["seconds"], w["payload_bytes"], cnt,
           cpu)


def dbbench_window(system, threads, run, batch=1, value=1024, workload="fillsync", label=None):
    s = results["systems"][system]
    d = os.path.join(s["mnt"], f"rocksdb.{threads}.{batch}")
    shutil.rmtree(d, ignore_errors=True)
    argv = ["db_bench", f"--db={d}", "--key_size=16", f"--value_size={value}",
            "--compression_type=none", f"--threads={threads}", f"--duration={SECS}",
            "--num=100000000", "--histogram=0", "--statistics=0"]
    if batch == 1:
        argv.append("--benchmarks=fillsync")
    else:
        # One synced WriteBatch of `batch` values per commit.
        argv += ["--benchmarks=fillrandom", "--sync=1", f"--batch_size={batch}"]
    c0 = children_cpu()
    out, cnt = timed(argv, s["dev"], s["daemon"])
    cpu = children_cpu() - c0 + cnt["daemon_cpu_s"]
    shutil.rmtree(d, ignore_errors=True)
    m = re.search(r"^(fillsync|fillrandom)\s*:\s*([\d.]+) micros/op (\d+) ops/sec", out, re.M)
    if not m:
        raise RuntimeError(f"db_bench printed no result: {out[-300:]}")
    ops_per_s = float(m.group(3)) / batch
    n = round(ops_per_s * SECS)
    if workload == "fillsync":
        record("dbbench", system, f"{threads} threads", run, n, SECS, n * (16 + value), cnt, cpu)
    else:
        record("multicommit", label or system, f"N={batch}", run, n, SECS, n * batch * value,
               cnt, cpu,
               {"note": "one synced WriteBatch in one database"})


def tally_peer(args, system, dev, daemon=None):
    c0 = children_cpu()
    out, cnt = timed([TALLY, "bench", "peer", *args, "--json"], dev, daemon)
    cpu = children_cpu() - c0 + cnt["daemon_cpu_s"]
    return json.loads(out), cnt, cpu


def multicommit_window(system, n, run):
    S = results["systems"]
    if system == "tally-lib":
        w, cnt, cpu = tally_peer(["multicommit", "--system", "tally", "--device",
                                  S["tally-lib"]["dev"], "--files", str(n), "--seconds",
                                  str(SECS)], system, S["tally-lib"]["dev"])
    elif system.startswith(("sqlite-", "tally-fuse-ioctl@")):
        kind, fs = system.rsplit("@", 1)
        s = S[fs]
        w, cnt, cpu = tally_peer(["multicommit", "--system", kind, "--dir", s["mnt"], "--files",
                                  str(n), "--seconds", str(SECS)], system, s["dev"], s["daemon"])
    elif system.startswith("lmdb@"):
        s = S[system.split("@")[1]]
        d = os.path.join(s["mnt"], f"lmdb.{n}")
        os.makedirs(d, exist_ok=True)
        c0 = children_cpu()
        out, cnt = timed([LMDB, d, str(n), str(SECS), "4096"], s["dev"], s["daemon"])
        cpu = children_cpu() - c0 + cnt["daemon_cpu_s"]
        shutil.rmtree(d, ignore_errors=True)
        w = json.loads(out)
        w["note"] = "one environment (one file) holding N databases"
    else:
        raise RuntimeError(system)
    record("multicommit", system, f"N={n}", run, w["ops"], w["seconds"], w["ops"] * n * 4096,
           cnt, cpu, {"note": w.get("note"), "p99_us": w.get("latency_p99_us"),
                      "tally_flushes": (w.get("tally_device") or {}).get("flushes")})


def append_window(system, run):
    S = results["systems"]
    if system in ("tally-fsync", "tally-barrier"):
        dev = S["tally-lib"]["dev"]
        w, cnt, cpu = tally_peer(["append", "--system", system, "--device", dev, "--seconds",
                                  str(SECS)], system, dev)
    else:
        s = S[system]
        w, cnt, cpu = tally_peer(["append", "--system", "posix-fsync", "--dir", s["mnt"],
                                  "--seconds", str(SECS)], system, s["dev"], s["daemon"])
    record("append", system, "4 KiB", run, w["ops"], w["seconds"], w["payload_bytes"], cnt, cpu,
           {"p99_us": w.get("latency_p99_us"), "p50_us": w.get("latency_p50_us")})


def mount_times(run):
    """Mount time of the Tally image after a clean unmount (snapshot) and after SIGKILL (scan),
    against ext4's mount after a clean unmount; the image holds what the workloads left plus
    `files` small files."""
    S = results["systems"]
    t = S["tally-fuse"]
    for files in ([1000] if QUICK else [1000, 10000]):
        d = os.path.join(t["mnt"], f"files.{files}")
        os.makedirs(d, exist_ok=True)
        for i in range(files):
            with open(os.path.join(d, f"f{i}"), "wb") as f:
                f.write(b"x" * 100)
        sh("sync")
        sh(TALLY, "umount", t["mnt"])
        t0 = time.time()
        _, pid = mount_tally(t["dev"])
        snap = time.time() - t0
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        sh(TALLY, "umount", "--lazy", t["mnt"], check=False)
        sh("umount", "-l", t["mnt"], check=False)
        t0 = time.time()
        _, pid = mount_tally(t["dev"])
        scan = time.time() - t0
        t["daemon"] = pid
        shutil.rmtree(d, ignore_errors=True)
        e = S["ext4-ordered"]
        sh("umount", e["mnt"])
        t0 = time.time()
        sh("mount", "-o", e["options"], e["dev"], e["mnt"])
        ext4 = time.time() - t0
        results["mount"].append({"run": run, "files": files, "tally_snapshot_s": snap,
                                 "tally_scan_s": scan, "ext4_clean_s": ext4})
        save()


def tx_sweeps():
    """`tally bench tx` on the Tally loop device (FUSE unmounted): it interleaves modes and
    repeats runs itself."""
    dev = results["systems"]["tally-lib"]["dev"]
    secs = "2" if QUICK else "3"
    sweeps = [("blocks-1", ["--threads", "1", "--blocks", "1",
                            "--modes", "classic,count,ordered,orderless"])]
    for b in ([] if QUICK else [4, 16]):
        sweeps.append((f"blocks-{b}", ["--threads", "1", "--blocks", str(b),
                                       "--modes", "classic,count,ordered,orderless"]))
    for th in ([] if QUICK else [2, 8]):
        sweeps.append((f"threads-{th}", ["--threads", str(th), "--blocks", "1",
                                         "--modes", "classic,count,ordered,orderless"]))
    for mib in ([64] if QUICK else [64, 256, 1024]):
        progress(f"recovery scan of a {mib} MiB log")
        def rec():
            # A file of the log's size beside the images (on a device the log takes it whole);
            # the tool creates and removes it.
            img = os.path.join(WORK, f"recovery-{mib}.img")
            out = sh(TALLY, "bench", "recovery", "--path", img, "--log-mib", str(mib), "--runs",
                     str(RUNS), "--json", timeout=900).stdout
            results["recovery"].append(json.loads(out))
            save()
        attempt(f"recovery {mib} MiB", rec)
    for name, args in sweeps:
        progress(f"tx {name}")
        def one():
            out = sh(TALLY, "bench", "tx", "--path", dev, "--force", "--keep", "--size", "1G",
                     "--seconds", secs, "--runs", str(RUNS), *args, "--json", timeout=900).stdout
            results["tx"][name] = json.loads(out)
            save()
        attempt(f"tx {name}", one)


def append_crash():
    """What of the ordered append stream survives a crash (workload 6's other half): the Tally
    library on the crash simulator, no device; seconds of CPU. Written beside results.json as
    append-crash.json, which peers_report.py reads when present. Exit 6 = a barrier or fsync
    guarantee broke: the report is kept and the failure recorded."""
    progress("what an ordered append stream keeps across a simulated crash (simulator)")
    path = os.path.join(os.path.dirname(OUT), "append-crash.json")
    if os.path.exists(path):
        os.remove(path)  # never report an earlier run's file as this run's
    r = sh(TALLY, "bench", "peer", "append-crash", "--seed", str(CRASH_SEED), "--json",
           check=False, timeout=900)
    if r.returncode not in (0, 6):
        raise RuntimeError(f"append-crash exited {r.returncode}: {r.stderr.strip()[-500:]}")
    with open(path, "w") as f:
        f.write(r.stdout)
    if r.returncode == 6:
        raise RuntimeError(f"append-crash: a barrier or fsync guarantee broke (seed {CRASH_SEED})")


def main():
    global plan_total
    fuse_systems = ["tally-fuse", "ext4-ordered", "ext4-journal", "ext4-nj", "bindfs"]
    fio_cfgs = [("4k", 1)] if QUICK else [("4k", 1), ("16k", 1), ("64k", 1), ("128k", 1),
                                          ("4k", 2), ("4k", 4), ("4k", 8)]
    db_threads = [1] if QUICK else [1, 8]
    ns = [2] if QUICK else [1, 2, 4, 8]
    commit_peers = ["tally-lib", "sqlite-rollback@ext4-ordered", "sqlite-wal@ext4-ordered",
                    "lmdb@ext4-ordered", "rocksdb@ext4-ordered"]
    append_systems = ["tally-fsync", "tally-barrier", "ext4-ordered", "ext4-journal", "ext4-nj"]
    plan_total = RUNS * (len(fuse_systems) * (len(fio_cfgs) + 2)
                         + 4 * len(db_threads) + 3 * len(ns)
                         + len(ns) * len(commit_peers) + len(append_systems))
    plan_total += 1 + (0 if QUICK else 4) + 1 + (1 if QUICK else 3) + 1
    setup()
    # Phase A: everything mounted, Tally through FUSE.
    for run in range(RUNS):
        for bs, jobs in fio_cfgs:
            for s in fuse_systems:
                progress(f"run {run+1}/{RUNS} fio append+fsync {bs} x{jobs} on {s}")
                attempt(f"fio {bs}x{jobs} {s} run {run}", lambda: fio_window(s, bs, jobs, run))
        for s in fuse_systems:
            progress(f"run {run+1}/{RUNS} fio etcd 2300 B fdatasync on {s}")
            attempt(f"fio etcd {s} run {run}", lambda: fio_window(s, "2300", 1, run, etcd=True))
        for s in fuse_systems:
            progress(f"run {run+1}/{RUNS} varmail on {s}")
            attempt(f"varmail {s} run {run}", lambda: varmail_window(s, run))
        for th in db_threads:
            for s in fuse_systems[:4]:
                progress(f"run {run+1}/{RUNS} db_bench fillsync {th} threads on {s}")
                attempt(f"dbbench {th} {s} run {run}", lambda: dbbench_window(s, th, run))
        for n in ns:
            for s in ["tally-fuse-ioctl@tally-fuse", "sqlite-rollback@tally-fuse",
                      "sqlite-wal@tally-fuse"]:
                progress(f"run {run+1}/{RUNS} multi-file commit N={n} {s}")
                attempt(f"multicommit {s} N={n} run {run}", lambda: multicommit_window(s, n, run))
    progress("mount time after clean unmount and after SIGKILL")
    attempt("mount times", lambda: mount_times(0))
    # Phase B: Tally's loop device freed for the library; the ext4 peers stay mounted and are
    # interleaved with it.
    sh(TALLY, "umount", results["systems"]["tally-fuse"]["mnt"], check=False)
    for run in range(RUNS):
        for n in ns:
            for s in commit_peers:
                progress(f"run {run+1}/{RUNS} multi-file commit N={n} {s}")
                if s.startswith("rocksdb@"):
                    attempt(f"multicommit {s} N={n} run {run}",
                            lambda: dbbench_window("ext4-ordered", 1, run, batch=n, value=4096,
                                                   workload="multicommit", label=s))
                else:
                    attempt(f"multicommit {s} N={n} run {run}",
                            lambda: multicommit_window(s, n, run))
        for s in append_systems:
            progress(f"run {run+1}/{RUNS} ordered append stream on {s}")
            attempt(f"append {s} run {run}", lambda: append_window(s, run))
    tx_sweeps()
    attempt("append-crash", append_crash)
    results["duration_s"] = time.time() - started
    save()
    log(f"done in {results['duration_s']/60:.1f} min; {len(results['failures'])} failed windows")


if __name__ == "__main__":
    try:
        main()
    finally:
        cleanup()

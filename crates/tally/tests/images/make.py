#!/usr/bin/env python3
"""Makes the images of tests/old_images.rs with an older `tally` build, as root (it mounts).

    sudo crates/tally/tests/images/make.py OLD_TALLY NAME

writes NAME-clean.img.gz (unmounted cleanly: the next mount reads its snapshot),
NAME-killed.img.gz (every file and directory fsynced, then the daemon killed with SIGKILL:
the next mount replays the log) and NAME.manifest (what both must hold), here. The tree
covers what the format stores: nested and empty directories, a directory of many entries,
files of less than a block, of blocks and a part, of 1 MiB, sparse, truncated, overwritten in
the middle, appended to, renamed across directories, removed; a symbolic link, a hard link,
modes, an owner, fixed times, extended attributes.

The manifest has one line per path, sorted, fields separated by tabs:
path, kind (d, f, l), mode (octal, permission bits), uid, gid, size (0 for a directory), nlink, mtime in seconds,
then for a file the FNV-1a 64 of its bytes (hex), for a link its target, for a directory "-";
then the extended attributes as name=hex(value), comma-separated ("-" when none).
"""
import gzip
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

OLD, NAME = sys.argv[1], sys.argv[2]
HERE = os.path.dirname(os.path.abspath(__file__))
FIXED_TIME = 1_700_000_000


def fnv64(data: bytes) -> int:
    h = 0xcbf29ce484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def pattern(tag: str, n: int) -> bytes:
    """n bytes that name their file and offset, so a block out of place shows."""
    out = bytearray()
    i = 0
    while len(out) < n:
        out += f"{tag}:{i:08d};".encode()
        i += 1
    return bytes(out[:n])


def build(m: str) -> None:
    os.makedirs(f"{m}/a/b/c")
    os.makedirs(f"{m}/empty")
    os.makedirs(f"{m}/many")
    for i in range(300):
        with open(f"{m}/many/entry-{i:03d}", "wb") as f:
            f.write(pattern(f"many{i}", 37 + i))
    for i in range(0, 300, 7):
        os.unlink(f"{m}/many/entry-{i:03d}")
    sizes = {"tiny": 100, "block": 4096, "blocks": 3 * 4096 + 1234, "mib": 1 << 20}
    for name, n in sizes.items():
        with open(f"{m}/a/{name}", "wb") as f:
            f.write(pattern(name, n))
    with open(f"{m}/a/b/sparse", "wb") as f:
        f.write(b"head")
        f.seek(5 << 20)
        f.write(pattern("sparse", 5000))
    with open(f"{m}/a/b/truncated", "wb") as f:
        f.write(pattern("truncated", 40000))
    os.truncate(f"{m}/a/b/truncated", 9000)
    with open(f"{m}/a/b/overwritten", "wb") as f:
        f.write(pattern("over", 20000))
    with open(f"{m}/a/b/overwritten", "r+b") as f:
        f.seek(6000)
        f.write(b"X" * 7000)
    with open(f"{m}/a/b/c/appended", "wb") as f:
        f.write(pattern("app1", 3000))
    with open(f"{m}/a/b/c/appended", "ab") as f:
        f.write(pattern("app2", 9000))
    with open(f"{m}/a/moved", "wb") as f:
        f.write(pattern("moved", 5555))
    os.rename(f"{m}/a/moved", f"{m}/a/b/c/moved-here")
    with open(f"{m}/gone", "wb") as f:
        f.write(pattern("gone", 8192))
    os.unlink(f"{m}/gone")
    os.symlink("a/b/c/appended", f"{m}/link")
    os.link(f"{m}/a/block", f"{m}/a/b/hardlink")
    os.chmod(f"{m}/a/tiny", 0o600)
    os.chmod(f"{m}/a/b/c", 0o750)
    os.chown(f"{m}/a/blocks", 1000, 1001)
    os.setxattr(f"{m}/a/tiny", "user.color", b"blue")
    os.setxattr(f"{m}/a/b", "user.note", pattern("xattr", 300))
    for root, dirs, files in os.walk(m):
        for n in files:
            os.utime(os.path.join(root, n), (FIXED_TIME, FIXED_TIME), follow_symlinks=False)
    for root, dirs, files in os.walk(m, topdown=False):
        for n in dirs:
            os.utime(os.path.join(root, n), (FIXED_TIME, FIXED_TIME))


def manifest(m: str) -> str:
    lines = []
    for root, dirs, files in os.walk(m):
        for n in sorted(dirs + files):
            p = os.path.join(root, n)
            st = os.lstat(p)
            rel = os.path.relpath(p, m)
            if os.path.islink(p):
                kind, what = "l", os.readlink(p)
            elif os.path.isdir(p):
                kind, what = "d", "-"
            else:
                with open(p, "rb") as f:
                    kind, what = "f", f"{fnv64(f.read()):016x}"
            names = sorted(os.listxattr(p, follow_symlinks=False))
            xattrs = ",".join(f"{x}={os.getxattr(p, x, follow_symlinks=False).hex()}"
                              for x in names) or "-"
            lines.append("\t".join([rel, kind, f"{st.st_mode & 0o7777:o}", str(st.st_uid),
                                    str(st.st_gid), str(st.st_size if kind != "d" else 0),
                                    str(st.st_nlink),
                                    str(int(st.st_mtime)), what, xattrs]))
    return "".join(sorted(l + "\n" for l in lines))


def fsync_all(m: str) -> None:
    for root, dirs, files in os.walk(m):
        for n in files:
            fd = os.open(os.path.join(root, n), os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        os.fsync(fd)
        os.close(fd)


def run(*args) -> str:
    r = subprocess.run([OLD, *args], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"tally {' '.join(args)}: {r.stdout}{r.stderr}")
    return r.stdout


def one(kind: str, work: str) -> str:
    image, m = f"{work}/{kind}.img", f"{work}/{kind}-mnt"
    os.makedirs(m)
    run("mkfs", "--size", "64M", image)
    out = run("mount", image, m)
    pid = int(out.split("daemon pid ")[1].split()[0].rstrip(",)"))
    build(m)
    man = manifest(m)
    if kind == "clean":
        run("umount", m)
    else:
        fsync_all(m)
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        subprocess.run(["umount", "-l", m], check=False)
    with open(image, "rb") as src, gzip.open(f"{HERE}/{NAME}-{kind}.img.gz", "wb", 9) as dst:
        shutil.copyfileobj(src, dst)
    return man


def main() -> None:
    work = tempfile.mkdtemp()
    try:
        a, b = one("clean", work), one("killed", work)
        assert a == b, "the two trees differ"
        with open(f"{HERE}/{NAME}.manifest", "w") as f:
            f.write(a)
    finally:
        shutil.rmtree(work, ignore_errors=True)


main()

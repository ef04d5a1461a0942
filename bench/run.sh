#!/usr/bin/env bash
# Issue #6: Tally side by side with what users pick instead, in one run, on one machine.
#
#   sudo bench/run.sh            # full run (about 45 minutes on a 2-core VM)
#   sudo bench/run.sh --quick    # smoke check, under 10 minutes (same workloads, fewer configs)
#
# Installs what is missing (Debian/Ubuntu: fio, db_bench, bindfs, LMDB, e2fsprogs, matplotlib, perf),
# builds Tally (release), makes one same-size image file per system in $BENCH_DIR (default
# /var/tmp; not tmpfs), attaches each to a loop device, makes ext4 data=ordered / data=journal /
# no journal, a bindfs pass-through, and a Tally file system mounted through FUSE, runs every
# workload with runs interleaved (bench/peers.py), then writes docs/bench/README.md and the
# plots (bench/peers_report.py), with perf profiles of the Tally side (bench/profile.sh). Every
# mount and loop device it made is removed on exit.
#
# Needs root (loop devices, mount). Everything runs on the same backing file system.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH_DIR=${BENCH_DIR:-/var/tmp}
QUICK=
case "${1:-}" in
  --quick) QUICK=--quick ;;
  "") ;;
  -h | --help)
    sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
  *)
    echo "bench/run.sh: unknown argument $1 (--quick or nothing)" >&2
    exit 2
    ;;
esac
[ "$(id -u)" = 0 ] || { echo "bench/run.sh: needs root (loop devices and mounts)" >&2; exit 2; }
fstype=$(stat -f -c %T "$BENCH_DIR")
if [ "$fstype" = tmpfs ]; then
  echo "bench/run.sh: $BENCH_DIR is tmpfs; O_DIRECT needs a real file system (set BENCH_DIR)" >&2
  exit 2
fi

# The system Python: Debian's matplotlib is installed for it, whatever python3 is on PATH.
PY=/usr/bin/python3
need=()
command -v fio >/dev/null || need+=(fio)
command -v db_bench >/dev/null || need+=(rocksdb-tools)
command -v bindfs >/dev/null || need+=(bindfs)
command -v mkfs.ext4 >/dev/null || need+=(e2fsprogs)
command -v losetup >/dev/null || need+=(util-linux)
command -v fusermount >/dev/null || need+=(fuse3)
command -v gcc >/dev/null || need+=(gcc)
[ -e /usr/include/lmdb.h ] || need+=(liblmdb-dev)
[ -x "$PY" ] && "$PY" -c 'import matplotlib' 2>/dev/null || need+=(python3 python3-matplotlib)
if [ ${#need[@]} -gt 0 ]; then
  echo "== installing ${need[*]}" >&2
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
fi

cd "$ROOT"
echo "== building tally (release)" >&2
# --all-features: the flags every build of this workspace uses, so the binary is shared; the
# deliberately broken variants it then contains run only when a test names one.
cargo build --release -q --all-features -p tally
TALLY="${CARGO_TARGET_DIR:-$ROOT/target}/release/tally"
BUILT_FROM="$(git rev-parse --short HEAD)"
git diff --quiet HEAD -- crates bench || BUILT_FROM="$BUILT_FROM + uncommitted changes"

WORK=$(mktemp -d "$BENCH_DIR/tally-peers.XXXXXX")
# Second line of defence: peers.py undoes its own mounts and loops; this catches a SIGKILL.
. "$ROOT/bench/lib.sh"
trap cleanup_work EXIT
gcc -O2 -Wall -o "$WORK/lmdb_commit" bench/lmdb_commit.c -llmdb

# BENCH_OUT: where the report goes (default docs/bench; a smoke check may write elsewhere).
OUT_DIR=${BENCH_OUT:-$ROOT/docs/bench}
DATA="$OUT_DIR/run-data"
mkdir -p "$DATA"
started=$(date -u +%Y-%m-%dT%H:%MZ)
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)" >"$DATA/load.txt"
"$PY" bench/peers.py "$WORK" "$DATA/results.json" "$TALLY" "$WORK/lmdb_commit" $QUICK
echo "== profiles of the Tally side (perf)" >&2
command -v perf >/dev/null || apt-get install -y -q --no-install-recommends linux-perf >/dev/null 2>&1 || true
bench/profile.sh "$WORK" "$TALLY" "$DATA/profile.md" || echo "bench/run.sh: profiling failed; the report says so" >&2
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$DATA/load.txt"
finished=$(date -u +%Y-%m-%dT%H:%MZ)
# The flush latency of the backing file system, as `tally probe` sees it (p50 and p99, µs).
probe=$("$TALLY" probe "$WORK/probe.img" --json 2>/dev/null | "$PY" -c '
import json, sys
p = json.load(sys.stdin)
print(json.dumps({k: {q: round(p[k][q], 1) for q in ("p50", "p99")}
                  for k in ("write_4k_us", "fdatasync_us", "fua_write_us") if k in p}))' \
  || echo '{}')
rm -f "$WORK/probe.img"
cat >"$DATA/machine.json" <<JSON
{"started": "$started", "finished": "$finished", "kernel": "$(uname -sr)", "cpus": $(nproc),
 "cpu": "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')",
 "memory_gib": $(awk '/MemTotal/ {printf "%.0f", $2/1048576}' /proc/meminfo),
 "backing_fs": "$fstype", "built_from": "$BUILT_FROM", "quick": "${QUICK:-no}",
 "fio": "$(fio --version)", "db_bench": "$(dpkg-query -W -f='${Version}' rocksdb-tools 2>/dev/null)",
 "sqlite": "rusqlite bundled", "lmdb": "$(dpkg-query -W -f='${Version}' liblmdb-dev 2>/dev/null)",
 "bindfs": "$(bindfs --version 2>&1 | head -1)", "probe": $probe}
JSON
"$PY" bench/peers_report.py "$DATA" "$OUT_DIR"
echo "bench/run.sh: wrote $OUT_DIR/README.md and the plots beside it" >&2
# Issue 14's everyday programs through the mount (untar, rm -rf, git clone/status, configure and
# make, speedtest1, varmail) against ext4 and bindfs, with requests and device submissions per
# operation: bench/mount.sh, table in mount.md (about 25 minutes; --quick: one run, small sizes).
echo "== everyday programs on the mount (bench/mount.sh)" >&2
if [ -n "$QUICK" ]; then
  RUNS=1 COPIES=4 SIZE=5 VARMAIL_SECS=3 RESULTS="$DATA/mount.tsv" bench/mount.sh "$TALLY" >"$OUT_DIR/mount-table.md"
else
  RESULTS="$DATA/mount.tsv" bench/mount.sh "$TALLY" >"$OUT_DIR/mount-table.md"
fi
echo "bench/run.sh: wrote $OUT_DIR/mount-table.md" >&2

# Issue 17's SQLite benchmarks: small transactions, a mobile mix, two ATTACHed databases
# (tally_sqlite::atomic against SQLite's super-journal), speedtest1 and Debian's sqlite3 inside
# `tally atomic`; batch-atomic on the mount and the library VFS against rollback and WAL on the
# mount without the ioctls and on ext4, each on a fresh loop device: bench/sqlite_mount.sh,
# tables in sqlite-table.md (docs/bench/sqlite.md; about 6 minutes, --quick: 2 s windows).
echo "== SQLite batch-atomic and multi-database commits (bench/sqlite_mount.sh)" >&2
if [ -n "$QUICK" ]; then
  SECONDS_EACH=2 SPEED_SIZE=2 ATTACH_CMDS=10 RESULTS="$DATA/sqlite.tsv" bench/sqlite_mount.sh >"$OUT_DIR/sqlite-table.md"
else
  RESULTS="$DATA/sqlite.tsv" bench/sqlite_mount.sh >"$OUT_DIR/sqlite-table.md"
fi
echo "bench/run.sh: wrote $OUT_DIR/sqlite-table.md" >&2

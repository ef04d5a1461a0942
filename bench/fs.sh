#!/usr/bin/env bash
# Issue #4's file-system benchmarks: builds `tally` (release), makes two same-size files in
# $BENCH_DIR (default /var/tmp; not tmpfs), attaches them as loop devices (direct I/O), puts ext4
# (data=ordered) on one, and runs on the other, in one run:
#   - `tally bench fs-peers`: Tally against ext4 (append, create) and SQLite (atomic update of
#     several files), mount of 100,000 files, write amplification of cleaning;
#   - `tally bench fs`: the stream policies and the two mount paths.
# Writes docs/bench/fs.md (via bench/fs_report.py, which keeps the hand-written sections after its marker line) and the raw JSON in docs/bench/fs-data/.
#
# ISSUE16=1 runs issue #16's rows instead, on the same set-up: append, create and
# create-shared at 1, 2, 8 and 32 threads against ext4, the mixed run (4 appenders' p99 beside a
# cleaner on a 90 %-full image) and fsync isolation (a small file's p99 beside a streaming
# writer, Tally and ext4). Writes docs/bench/fs-data/issue16.json and issue16-load.txt (the
# command and the load average) and leaves docs/bench/fs.md alone: its issue-16 section is
# written from them by hand.
# Needs root (losetup, mount). Loop devices, the mount and the files go on every exit path.
#
#   bench/fs.sh                       # ~6 minutes on a 2-core VM
#   QUICK=1 bench/fs.sh               # smoke run (~1 minute): prints the tables, writes nothing
#   RUNS=5 SECONDS_PER_RUN=5 SIZE=2G BENCH_DIR=/mnt/ssd bench/fs.sh
#   ISSUE16=1 RUNS=3 SECONDS_PER_RUN=2 bench/fs.sh   # issue #16's rows (~6 minutes)
#   ISSUE16=1 QUICK=1 bench/fs.sh     # their smoke run: prints the tables, writes nothing
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH_DIR=${BENCH_DIR:-/var/tmp}
SIZE=${SIZE:-1G}
RUNS=${RUNS:-3}
SECS=${SECONDS_PER_RUN:-3}
QUICK=${QUICK:-}
ISSUE16=${ISSUE16:-}
ISSUE16_SECTIONS=append,create,create-shared,mixed,isolation
ISSUE16_THREADS=1,2,8,32
OUT_MD="$ROOT/docs/bench/fs.md"
OUT_DATA="$ROOT/docs/bench/fs-data"

die() { echo "bench/fs.sh: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "needs root (losetup, mkfs.ext4, mount)"
for tool in losetup mkfs.ext4 mount umount python3; do
  command -v "$tool" >/dev/null || die "needs $tool"
done
fstype=$(stat -f -c %T "$BENCH_DIR")
[ "$fstype" != tmpfs ] || die "$BENCH_DIR is tmpfs; O_DIRECT needs a real file system (set BENCH_DIR)"

cd "$ROOT"
cargo build --release --all-features -q -p tally
BUILT_FROM="$(git rev-parse --short HEAD)"
git diff --quiet HEAD -- crates/tally-fs crates/tally-log crates/tally-media crates/tally-bench \
  || BUILT_FROM="$BUILT_FROM + uncommitted changes to the measured crates"
TALLY="${CARGO_TARGET_DIR:-$ROOT/target}/release/tally"

TALLY_IMG="$BENCH_DIR/tally-bench-fs.$$.tally.img"
EXT4_IMG="$BENCH_DIR/tally-bench-fs.$$.ext4.img"
MNT=""
TALLY_DEV=""
EXT4_DEV=""
cleanup() {
  set +e
  [ -n "$MNT" ] && mountpoint -q "$MNT" && umount "$MNT"
  [ -n "$MNT" ] && rmdir "$MNT"
  [ -n "$TALLY_DEV" ] && losetup -d "$TALLY_DEV"
  [ -n "$EXT4_DEV" ] && losetup -d "$EXT4_DEV"
  rm -f "$TALLY_IMG" "$EXT4_IMG"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Same size, same directory, every block written once: neither side pays for allocating its
# backing file's blocks during the measurements.
echo "== preparing two $SIZE files in $BENCH_DIR" >&2
for img in "$TALLY_IMG" "$EXT4_IMG"; do
  truncate -s "$SIZE" "$img"
  dd if=/dev/zero of="$img" bs=4M count=$(( $(stat -c %s "$img") / 4194304 )) oflag=direct \
    conv=notrunc,fsync status=none
done
TALLY_DEV=$(losetup -f --show --direct-io=on "$TALLY_IMG")
EXT4_DEV=$(losetup -f --show --direct-io=on "$EXT4_IMG")
# No discard (it would punch holes in the backing file), no lazy initialisation (a kernel thread
# would write inode tables during the measurements).
mkfs.ext4 -q -F -E nodiscard,lazy_itable_init=0,lazy_journal_init=0 "$EXT4_DEV"
MNT=$(mktemp -d /tmp/tally-bench-fs.XXXXXX)
mount -t ext4 -o data=ordered "$EXT4_DEV" "$MNT"
MOUNT_OPTS=$(findmnt -n -o OPTIONS "$MNT")
LOOP_DIO=$(cat "/sys/block/$(basename "$TALLY_DEV")/loop/dio")

if [ -n "$ISSUE16" ] && [ -n "$QUICK" ]; then
  "$TALLY" bench fs-peers --tally-dev "$TALLY_DEV" --ext4-dir "$MNT" --force --quick \
    --sections "$ISSUE16_SECTIONS" --threads "$ISSUE16_THREADS"
  exit 0
fi
if [ -n "$ISSUE16" ]; then
  mkdir -p "$OUT_DATA"
  LOAD="$OUT_DATA/issue16-load.txt"
  {
    echo "built from: $BUILT_FROM; $(uname -sr), $(nproc) CPUs; backing fs $fstype; two $SIZE loop devices (direct I/O: $LOOP_DIO); ext4 $MOUNT_OPTS"
    echo "tally bench fs-peers --tally-dev \$TALLY_LOOP --ext4-dir \$EXT4_MOUNT --force --sections $ISSUE16_SECTIONS --threads $ISSUE16_THREADS --runs $RUNS --seconds $SECS --json"
    echo "start $(date -u +%Y-%m-%dT%H:%M:%SZ): load $(cut -d' ' -f1-3 /proc/loadavg)"
  } >"$LOAD"
  "$TALLY" bench fs-peers --tally-dev "$TALLY_DEV" --ext4-dir "$MNT" --force \
    --sections "$ISSUE16_SECTIONS" --threads "$ISSUE16_THREADS" \
    --runs "$RUNS" --seconds "$SECS" --json >"$OUT_DATA/issue16.json"
  echo "end $(date -u +%Y-%m-%dT%H:%M:%SZ): load $(cut -d' ' -f1-3 /proc/loadavg)" >>"$LOAD"
  echo "bench/fs.sh: wrote ${OUT_DATA#"$ROOT"/}/issue16.json" >&2
  exit 0
fi
if [ -n "$QUICK" ]; then
  "$TALLY" bench fs-peers --tally-dev "$TALLY_DEV" --ext4-dir "$MNT" --force --quick
  "$TALLY" bench fs --path "$TALLY_DEV" --force --files 100 --runs 1
  exit 0
fi

mkdir -p "$OUT_DATA"
# perf-append.txt (a profile taken by hand, see docs/bench/fs.md) is kept.
rm -f "$OUT_DATA"/{fs-peers,fs,meta}.json "$OUT_DATA"/{load,commands}.txt
echo "start: $(cut -d' ' -f1-3 /proc/loadavg)" >"$OUT_DATA/load.txt"
others() {
  ps -eo pcpu=,comm= --sort=-pcpu | awk '$2 != "tally" && $2 !~ /^kworker/ && $1 >= 10 {printf "%s(%s%%) ", $2, $1}'
}
STARTED=$(date -u +%Y-%m-%dT%H:%MZ)
echo "fs-peers: $(cut -d' ' -f1-3 /proc/loadavg) others>=10%cpu: $(others)" >>"$OUT_DATA/load.txt"
echo "tally bench fs-peers --tally-dev \$TALLY_LOOP --ext4-dir \$EXT4_MOUNT --force --runs $RUNS --seconds $SECS --json" >>"$OUT_DATA/commands.txt"
"$TALLY" bench fs-peers --tally-dev "$TALLY_DEV" --ext4-dir "$MNT" --force \
  --runs "$RUNS" --seconds "$SECS" --json >"$OUT_DATA/fs-peers.json"
echo "fs: $(cut -d' ' -f1-3 /proc/loadavg) others>=10%cpu: $(others)" >>"$OUT_DATA/load.txt"
echo "tally bench fs --path \$TALLY_LOOP --force --threads 4 --files 500 --runs $RUNS --json" >>"$OUT_DATA/commands.txt"
"$TALLY" bench fs --path "$TALLY_DEV" --force --threads 4 --files 500 --runs "$RUNS" --json \
  >"$OUT_DATA/fs.json"
echo "end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT_DATA/load.txt"
FINISHED=$(date -u +%Y-%m-%dT%H:%MZ)

# What the report needs besides the JSON, kept beside it so the report can be rewritten from
# docs/bench/fs-data alone (python3 bench/fs_report.py docs/bench/fs-data docs/bench/fs.md).
python3 - "$OUT_DATA/meta.json" "$STARTED" "$FINISHED" "$(uname -sr)" "$(nproc)" \
  "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')" \
  "$fstype" "$SIZE" "$BUILT_FROM" "$MOUNT_OPTS" "$LOOP_DIO" <<'PY'
import json, sys
keys = ["started", "finished", "kernel", "cpus", "cpu_model", "backing_fs", "size", "built_from",
        "ext4_mount_options", "loop_direct_io"]
with open(sys.argv[1], "w") as f:
    json.dump(dict(zip(keys, sys.argv[2:])), f, indent=1)
PY
python3 "$ROOT/bench/fs_report.py" "$OUT_DATA" "$OUT_MD"
echo "bench/fs.sh: wrote ${OUT_MD#"$ROOT"/}" >&2

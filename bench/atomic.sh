#!/usr/bin/env bash
# `tally atomic` of a package-sized tree against the same extraction without it, on Tally and on
# ext4 (data=ordered, loop device), in one run (issue 15: atomic <= 1.3x plain Tally;
# docs/bench/fs.md, "Large transactions").
#
#   sudo bench/atomic.sh [TALLY_BINARY]      # default: target/release/tally
#
# The tree: Django and its dependencies as pip installs them (`pip install --target`, .pyc files
# compiled: some 7,300 files, 41 MB), from wheels downloaded once into $BENCH_CACHE/wheels;
# PKG_TAR=FILE takes another tarball instead. RUNS times (default 3), interleaved, each on a fresh
# file system of SIZE (default 1G):
#   tally-plain   mkdir d && tar -xf TREE -C d, then `tally sync`
#   tally-atomic  tally atomic MNT -- tar -xf TREE -C d (durable commit), then `tally sync`
#   ext4          mkdir d && tar -xf TREE -C d, then sync
# each timed with its durability inside the timed region. For Tally the daemon's device counters
# (SIGUSR1) give the flushes and bytes written of each extraction.
#
# Prints one line per measurement, then the medians and the per-run ratios (atomic / plain Tally,
# each / ext4) with the machine and its load. Files live in $BENCH_DIR (default /var/tmp).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH_DIR=${BENCH_DIR:-/var/tmp}
BENCH_CACHE=${BENCH_CACHE:-/var/tmp/tally-bench-cache}
RUNS=${RUNS:-3}
SIZE=${SIZE:-1G}
SYSTEMS=${SYSTEMS:-"tally-plain tally-atomic ext4"}
TALLY=${1:-$ROOT/target/release/tally}
case "$TALLY" in -h | --help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
[ "$(id -u)" = 0 ] || { echo "bench/atomic.sh: needs root (loop devices and mounts)" >&2; exit 2; }
[ -x "$TALLY" ] || { echo "bench/atomic.sh: $TALLY is not a program (cargo build --release -p tally)" >&2; exit 2; }

WORK=$(mktemp -d "$BENCH_DIR/tally-atomic.XXXXXX")
. "$ROOT/bench/lib.sh"
trap cleanup_work EXIT
mkdir -p "$WORK/mnt" "$BENCH_CACHE"
OUT=${RESULTS:-$WORK/results.tsv}
: >"$OUT"

if [ -n "${PKG_TAR:-}" ]; then
  cp "$PKG_TAR" "$WORK/tree.tar"
else
  if ! ls "$BENCH_CACHE"/wheels/[Dd]jango-*.whl >/dev/null 2>&1; then
    python3 -m pip download -q django -d "$BENCH_CACHE/wheels"
  fi
  python3 -m pip install -q --no-index --find-links "$BENCH_CACHE/wheels" --target "$WORK/tree" django 2>/dev/null
  tar -cf "$WORK/tree.tar" -C "$WORK/tree" .
  rm -rf "$WORK/tree"
fi
ENTRIES=$(tar -tf "$WORK/tree.tar" | grep -cv '/$')
BYTES=$(tar -tvf "$WORK/tree.tar" | awk '{s += $3} END {print s}')
echo "tree: $ENTRIES files, $((BYTES / 1000000)) MB of contents, $(du -sh "$WORK/tree.tar" | cut -f1) as a tarball" >&2

mount_sys() {
  rm -f "$WORK/img" "$WORK/daemon.log"
  case $1 in
    tally-*)
      "$TALLY" mkfs "$WORK/img" --size "$SIZE" >/dev/null
      DAEMON=$("$TALLY" mount "$WORK/img" "$WORK/mnt" --log "$WORK/daemon.log" |
        sed -n 's/.*daemon pid \([0-9]*\).*/\1/p')
      ;;
    ext4)
      truncate -s "$SIZE" "$WORK/img"
      mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$WORK/img"
      LOOP=$(losetup -f --show "$WORK/img")
      mount "$LOOP" "$WORK/mnt"
      ;;
  esac
}

umount_sys() {
  case $1 in
    tally-*) "$TALLY" umount "$WORK/mnt" >/dev/null ;;
    ext4) umount "$WORK/mnt"; losetup -d "$LOOP" ;;
  esac
}

# device SYSTEM: "FLUSHES BYTES_WRITTEN" of the Tally daemon's device so far; "- -" for ext4.
device() {
  case $1 in tally-*) ;; *) echo "- -"; return ;; esac
  local before
  before=$(grep -c 'device since open' "$WORK/daemon.log" || true)
  kill -USR1 "$DAEMON"
  for _ in $(seq 500); do
    [ "$(grep -c 'device since open' "$WORK/daemon.log" || true)" -gt "$before" ] && break
    sleep 0.01
  done
  grep 'device since open' "$WORK/daemon.log" | tail -1 |
    sed 's/.*flushes \([0-9]*\), bytes written \([0-9]*\).*/\1 \2/'
}

extract() {
  case $1 in
    tally-atomic) "$TALLY" atomic "$WORK/mnt" -- sh -c "mkdir '$WORK/mnt/d' && tar -xf '$WORK/tree.tar' -C '$WORK/mnt/d'" ;;
    *) mkdir "$WORK/mnt/d" && tar -xf "$WORK/tree.tar" -C "$WORK/mnt/d" ;;
  esac
  case $1 in
    tally-*) "$TALLY" sync "$WORK/mnt" >/dev/null ;;
    *) sync ;;
  esac
}

for run in $(seq "$RUNS"); do
  for sys in $SYSTEMS; do
    mount_sys "$sys"
    sync
    read -r f0 b0 < <(device "$sys")
    t0=$(date +%s.%N)
    extract "$sys"
    t1=$(date +%s.%N)
    read -r f1 b1 < <(device "$sys")
    secs=$(echo "$t1 - $t0" | bc -l | xargs printf '%.3f')
    flushes=-; mb=-
    [ "$f0" = - ] || { flushes=$((f1 - f0)); mb=$(((b1 - b0) / 1000000)); }
    n=$(find "$WORK/mnt/d" -type f | wc -l)
    [ "$n" = "$ENTRIES" ] || { echo "bench/atomic.sh: $sys extracted $n of $ENTRIES files" >&2; exit 1; }
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$sys" "$run" "$secs" "$flushes" "$mb" "$(cut -d' ' -f1 /proc/loadavg)" | tee -a "$OUT" >&2
    umount_sys "$sys"
  done
done

MACHINE="$(nproc) cores ($(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)), $(free -g | awk '/^Mem:/ {print $2}') GiB, Linux $(uname -r), load at the end $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$OUT" "$ENTRIES" "$BYTES" "$RUNS" "$MACHINE" "$(git -C "$ROOT" rev-parse --short HEAD)" <<'EOF'
import statistics as st, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
entries, nbytes, runs, machine, commit = sys.argv[2:7]
by = {}
for sys_, run, secs, fl, mb, load in rows:
    by.setdefault(sys_, {})[run] = (float(secs), fl, mb, float(load))
systems = [s for s in ("tally-plain", "tally-atomic", "ext4") if s in by]
print(f"tree: {entries} files, {int(nbytes) / 1e6:.1f} MB; {runs} runs, interleaved; commit {commit}")
print(f"machine: {machine}")
print()
print("| | median s | min-max s | flushes | MB written | load (1 min) at each |")
print("|---|---|---|---|---|---|")
for s in systems:
    t = [v[0] for v in by[s].values()]
    fl = sorted({v[1] for v in by[s].values()})
    mb = [v[2] for v in by[s].values()]
    loads = " ".join(f"{v[3]:.1f}" for v in by[s].values())
    print(f"| {s} | {st.median(t):.2f} | {min(t):.2f}-{max(t):.2f} | {'/'.join(fl)} | {'/'.join(mb)} | {loads} |")
print()
def ratios(a, b):
    common = sorted(set(by.get(a, {})) & set(by.get(b, {})))
    return [by[a][r][0] / by[b][r][0] for r in common]
for a, b in (("tally-atomic", "tally-plain"), ("tally-atomic", "ext4"), ("tally-plain", "ext4")):
    r = ratios(a, b)
    if r:
        print(f"{a} / {b}: median {st.median(r):.2f}x (runs: {', '.join(f'{x:.2f}' for x in r)})")
EOF

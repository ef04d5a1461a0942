#!/usr/bin/env bash
# Sequential writes through the FUSE mount against ext4 on a loop device of the same size, in
# one run, runs interleaved (docs/bench/posix.md, "Sequential writes through the mount").
#
#   sudo bench/seqwrite.sh [TALLY_BINARY ...]     # default: target/release/tally
#
# For each binary given (e.g. the build before a change and the one after) and for ext4, RUNS
# times (default 3): a fresh 1 GiB image, `dd if=/dev/zero bs=B count=64MiB/B conv=fsync` into
# one new file for B in 8 KiB and 1 MiB; then, on a fresh image already holding a 64 MiB file,
# 512 MiB more with bs=1M conv=fsync, stopped after BIG_TIMEOUT seconds (default 300). Prints
# one line per measurement (seconds; the Tally daemon's CPU in ms, all its threads, io_uring
# workers included) and the medians with min-max; RESULTS=FILE also writes them as TSV.
# SIZES (default "8k 1M"; also 4k, 128k) and BIG=0 (skip the 512 MiB case) narrow a run.
# Images live in $BENCH_DIR (default /var/tmp; not tmpfs). Needs root (loop devices, mounts).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH_DIR=${BENCH_DIR:-/var/tmp}
RUNS=${RUNS:-3}
BIG_TIMEOUT=${BIG_TIMEOUT:-300}
SIZES=${SIZES:-"8k 1M"}
BIG=${BIG:-1}
[ "$(id -u)" = 0 ] || { echo "bench/seqwrite.sh: needs root (loop devices and mounts)" >&2; exit 2; }
if [ $# -eq 0 ]; then set -- "$ROOT/target/release/tally"; fi

WORK=$(mktemp -d "$BENCH_DIR/tally-seqwrite.XXXXXX")
. "$ROOT/bench/lib.sh"
trap cleanup_work EXIT
OUT=${RESULTS:-$WORK/results.tsv}
: >"$OUT"

# mount_sys NAME: a fresh 1 GiB file system for NAME ("ext4" or a tally binary) on $WORK/mnt.
mount_sys() {
  rm -f "$WORK/img"
  mkdir -p "$WORK/mnt"
  if [ "$1" = ext4 ]; then
    truncate -s 1G "$WORK/img"
    mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$WORK/img"
    LOOP=$(losetup -f --show "$WORK/img")
    mount "$LOOP" "$WORK/mnt"
  else
    "$1" mkfs "$WORK/img" --size 1G >/dev/null
    DAEMON=$("$1" mount "$WORK/img" "$WORK/mnt" --log "$WORK/daemon.log" | sed -n 's/.*daemon pid \([0-9]*\).*/\1/p')
  fi
}

umount_sys() {
  if [ "$1" = ext4 ]; then
    umount "$WORK/mnt"
    losetup -d "$LOOP"
  else
    "$1" umount "$WORK/mnt" >/dev/null
  fi
}

# timed SECONDS CMD...: print the wall time of CMD, or "timeout" after SECONDS.
timed() {
  local limit=$1 t0 t1
  shift
  t0=$(date +%s.%N)
  if timeout "$limit" "$@" 2>/dev/null; then
    t1=$(date +%s.%N)
    echo "$t1 - $t0" | bc -l | xargs printf '%.3f\n'
  else
    echo timeout
  fi
}

# cpu_ms: CPU time (user + system, all threads) of the Tally daemon so far; 0 for ext4.
cpu_ms() {
  if [ "$1" = ext4 ]; then echo 0; else awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) * 1000 / hz}' "/proc/$DAEMON/stat"; fi
}

label() { if [ "$1" = ext4 ]; then echo ext4; else echo "tally:$(basename "$1")"; fi; }

for run in $(seq "$RUNS"); do
  for sys in "$@" ext4; do
    for bs in $SIZES; do
      mount_sys "$sys"
      case $bs in 8k) n=8192 ;; 4k) n=16384 ;; 128k) n=512 ;; 1M) n=64 ;; *) echo "size $bs?" >&2; exit 2 ;; esac
      c0=$(cpu_ms "$sys")
      t=$(timed 600 dd if=/dev/zero of="$WORK/mnt/f" bs="$bs" count="$n" conv=fsync)
      c1=$(cpu_ms "$sys")
      umount_sys "$sys"
      printf '%s\t64MiB\t%s\t%s\t%s\t%s\n' "$(label "$sys")" "$bs" "$run" "$t" "$((c1 - c0))" | tee -a "$OUT"
    done
    if [ "$BIG" = 1 ]; then
      mount_sys "$sys"
      dd if=/dev/zero of="$WORK/mnt/full" bs=1M count=64 conv=fsync 2>/dev/null
      c0=$(cpu_ms "$sys")
      t=$(timed "$BIG_TIMEOUT" dd if=/dev/zero of="$WORK/mnt/f" bs=1M count=512 conv=fsync)
      c1=$(cpu_ms "$sys")
      umount_sys "$sys"
      printf '%s\t512MiB-after-64\t1M\t%s\t%s\t%s\n' "$(label "$sys")" "$run" "$t" "$((c1 - c0))" | tee -a "$OUT"
    fi
  done
done

echo "== medians (min-max) over $RUNS runs; machine: $(nproc) cores, $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$OUT" <<'PY'
import sys, statistics, collections
rows = collections.defaultdict(list)
cpu = collections.defaultdict(list)
for line in open(sys.argv[1]):
    sys_, case, bs, _run, t, c = line.rstrip("\n").split("\t")
    rows[(case, bs, sys_)].append(t)
    cpu[(case, bs, sys_)].append(float(c))
for (case, bs, sys_), ts in sorted(rows.items()):
    done = sorted(float(t) for t in ts if t != "timeout")
    miss = len(ts) - len(done)
    med = f"{statistics.median(done):.3f} s ({done[0]:.3f}-{done[-1]:.3f})" if done else "-"
    c = sorted(cpu[(case, bs, sys_)])
    daemon = f"  daemon CPU {statistics.median(c):.0f} ms ({c[0]:.0f}-{c[-1]:.0f})" if sys_ != "ext4" else ""
    print(f"{case:18} {bs:5} {sys_:28} {med}{daemon}" + (f"  {miss} timed out" if miss else ""))
PY

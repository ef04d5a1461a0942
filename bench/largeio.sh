#!/usr/bin/env bash
# Large sequential writes and reads through the FUSE mount against ext4 on a loop device of
# the same size, in one run, runs interleaved (docs/bench/posix.md, "Large reads and writes").
#
#   sudo bench/largeio.sh [TALLY_BINARY]     # default: target/release/tally; RUNS=3, MIB=256
#
# For tally and for ext4 (loop device with --direct-io=on, so ext4's reads and writes reach the
# image file as Tally's do, past the host's page cache), RUNS times on a fresh 1 GiB file
# system: write MIB MiB with `dd bs=1M conv=fsync` (the fsync inside the time), and again with
# `oflag=direct`; unmount and mount again (nothing cached); read the first file with dd bs=1M
# (first read), read it again (second read: the page cache), read the second with
# `iflag=direct`. Prints each time, the medians, and the ratios ext4 time / Tally time (above
# 1: Tally faster). MOUNT_OPTS: options for `tally mount -o` (e.g. read_ahead_kb=0). The
# daemon's READ requests and device reads of the first read are logged
# (SIGUSR1). Needs root. Files live in $BENCH_DIR (default /var/tmp; not tmpfs).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH_DIR=${BENCH_DIR:-/var/tmp}
RUNS=${RUNS:-3}
MIB=${MIB:-256}
TALLY=${1:-$ROOT/target/release/tally}
[ "$(id -u)" = 0 ] || { echo "bench/largeio.sh: needs root (loop devices and mounts)" >&2; exit 2; }
[ -x "$TALLY" ] || { echo "bench/largeio.sh: $TALLY is not a program" >&2; exit 2; }

WORK=$(mktemp -d "$BENCH_DIR/tally-largeio.XXXXXX")
. "$ROOT/bench/lib.sh"
trap cleanup_work EXIT
OUT=${RESULTS:-$WORK/results.tsv}
: >"$OUT"
mkdir -p "$WORK/mnt"

mount_sys() { # SYS FRESH
  if [ "$1" = ext4 ]; then
    if [ "$2" = 1 ]; then
      rm -f "$WORK/img"; truncate -s 1G "$WORK/img"; mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$WORK/img"
    fi
    LOOP=$(losetup --direct-io=on -f --show "$WORK/img")
    mount "$LOOP" "$WORK/mnt"
  else
    if [ "$2" = 1 ]; then rm -f "$WORK/img"; "$TALLY" mkfs "$WORK/img" --size 1G >/dev/null; fi
    DAEMON=$("$TALLY" mount "$WORK/img" "$WORK/mnt" ${MOUNT_OPTS:+-o "$MOUNT_OPTS"} --log "$WORK/daemon.log" |
      sed -n 's/.*daemon pid \([0-9]*\).*/\1/p')
  fi
}

umount_sys() {
  if [ "$1" = ext4 ]; then umount "$WORK/mnt"; losetup -d "$LOOP"; else "$TALLY" umount "$WORK/mnt" >/dev/null; fi
}

timed() {
  local t0 t1
  t0=$(date +%s.%N)
  "$@"
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc -l | xargs printf '%.3f'
}

dd_() { dd "$@" bs=1M status=none; }

for run in $(seq "$RUNS"); do
  for sys in tally ext4; do
    mount_sys "$sys" 1
    w=$(timed dd_ if=/dev/zero of="$WORK/mnt/f" count="$MIB" conv=fsync)
    wd=$(timed dd_ if=/dev/zero of="$WORK/mnt/g" count="$MIB" oflag=direct conv=fsync)
    umount_sys "$sys"
    mount_sys "$sys" 0
    r1=$(timed dd_ if="$WORK/mnt/f" of=/dev/null)
    r2=$(timed dd_ if="$WORK/mnt/f" of=/dev/null)
    rd=$(timed dd_ if="$WORK/mnt/g" of=/dev/null iflag=direct)
    if [ "$sys" = tally ]; then kill -USR1 "$DAEMON"; sleep 0.3; fi
    umount_sys "$sys"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$run" "$sys" "$w" "$wd" "$r1" "$r2" "$rd" | tee -a "$OUT"
  done
done
grep -E 'requests since mount|device since open' "$WORK/daemon.log" | grep -v adapter | tail -2 || true

python3 - "$OUT" "$MIB" <<'PY'
import statistics, sys
rows = [l.split('\t') for l in open(sys.argv[1]).read().splitlines()]
mib = int(sys.argv[2])
names = ["write bs=1M + fsync", "write O_DIRECT", "first read", "second read", "read O_DIRECT"]
by = {}
for r in rows:
    by.setdefault(r[1], []).append([float(x) for x in r[2:]])
print(f"{'case':<22} {'tally s':>9} {'ext4 s':>9} {'tally MB/s':>11} {'ext4 MB/s':>10} {'ratio':>7}")
for i, n in enumerate(names):
    t = statistics.median(r[i] for r in by["tally"])
    e = statistics.median(r[i] for r in by["ext4"])
    ratios = sorted(re[i] / rt[i] for rt, re in zip(by["tally"], by["ext4"]))
    mb = mib * 1.048576
    print(f"{n:<22} {t:9.3f} {e:9.3f} {mb / t:11.0f} {mb / e:10.0f} {statistics.median(ratios):6.2f}x"
          f"  ({ratios[0]:.2f}-{ratios[-1]:.2f})")
PY

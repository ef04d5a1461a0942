#!/usr/bin/env bash
# Does a write's cost grow with what the file system holds? (issue 14 item 5; docs/bench/posix.md,
# "Writes as the file system fills")
#
#   sudo bench/fill.sh [TALLY_BINARY...]   # default: target/release/tally; RUNS=2, STEPS=4
#
# For each Tally binary given (two builds compare in one run) and for ext4 (loop device with
# --direct-io=on, as in bench/largeio.sh), RUNS times on a fresh 4 GiB file system: STEPS
# times, grow one file by 256 MiB (1 MiB `O_DIRECT` writes, fsync), then time writing a new
# 256 MiB file the same way. Prints MiB/s per step (the file system holding 512 MiB more at
# each) and each Tally build's ratio to ext4 at each step (median of per-run ratios; above 1:
# Tally faster). A cost that grows with what is stored shows as a ratio that falls step by
# step. Needs root. Files live in $BENCH_DIR (default /var/tmp; not tmpfs).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH_DIR=${BENCH_DIR:-/var/tmp}
RUNS=${RUNS:-2}
STEPS=${STEPS:-4}
[ "$#" -gt 0 ] || set -- "$ROOT/target/release/tally"
[ "$(id -u)" = 0 ] || { echo "bench/fill.sh: needs root (loop devices and mounts)" >&2; exit 2; }
for t in "$@"; do [ -x "$t" ] || { echo "bench/fill.sh: $t is not a program" >&2; exit 2; }; done
[ $((STEPS * 512)) -le 3584 ] || { echo "bench/fill.sh: STEPS=$STEPS does not fit 4 GiB" >&2; exit 2; }

WORK=$(mktemp -d "$BENCH_DIR/tally-fill.XXXXXX")
. "$ROOT/bench/lib.sh"
trap cleanup_work EXIT
OUT=$WORK/results.tsv
: >"$OUT"
mkdir -p "$WORK/mnt"

# run_one NAME [TALLY]: one run on a fresh file system; appends "run name step MiB/s" lines.
run_one() {
  local name=$1 tally=${2:-} loop="" s e
  rm -f "$WORK/img"
  if [ -z "$tally" ]; then
    truncate -s 4G "$WORK/img"
    mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$WORK/img"
    loop=$(losetup --direct-io=on -f --show "$WORK/img")
    mount "$loop" "$WORK/mnt"
  else
    "$tally" mkfs "$WORK/img" --size 4G >/dev/null
    "$tally" mount "$WORK/img" "$WORK/mnt" --log "$WORK/daemon.log" >/dev/null
  fi
  for step in $(seq "$STEPS"); do
    dd if=/dev/zero of="$WORK/mnt/big" bs=1M count=256 seek=$(((step - 1) * 256)) \
      oflag=direct conv=notrunc,fsync status=none
    s=$(date +%s.%N)
    dd if=/dev/zero of="$WORK/mnt/new$step" bs=1M count=256 oflag=direct conv=fsync status=none
    e=$(date +%s.%N)
    printf '%s\t%s\t%s\t%s\n' "$run" "$name" "$step" "$(echo "256 / ($e - $s)" | bc -l)" >>"$OUT"
  done
  if [ -z "$tally" ]; then umount "$WORK/mnt"; losetup -d "$loop"; else "$tally" umount "$WORK/mnt" >/dev/null; fi
}

for run in $(seq "$RUNS"); do
  i=0
  for t in "$@"; do
    i=$((i + 1))
    run_one "tally$i" "$t"
  done
  run_one ext4
done

n=0
for t in "$@"; do n=$((n + 1)); echo "tally$n: $t"; done
python3 - "$OUT" "$STEPS" <<'PY'
import statistics, sys
rows = [l.split('\t') for l in open(sys.argv[1]).read().splitlines()]
steps = int(sys.argv[2])
by = {}
for run, name, step, mibs in rows:
    by.setdefault(name, {}).setdefault(int(step), {})[run] = float(mibs)
names = sorted(n for n in by if n != "ext4") + ["ext4"]
print("MiB/s writing a new 256 MiB file (1 MiB O_DIRECT) with the file system holding:")
print(f"{'holding':>9} " + " ".join(f"{n:>14}" for n in names)
      + " " + " ".join(f"{n + '/ext4':>14}" for n in names if n != "ext4"))
for s in range(1, steps + 1):
    held = f"{(2 * s - 1) * 256} MiB"
    cells = [f"{statistics.median(by[n][s].values()):14.0f}" for n in names]
    ratios = []
    for n in names:
        if n == "ext4":
            continue
        r = sorted(by[n][s][run] / by["ext4"][s][run] for run in by[n][s] if run in by["ext4"][s])
        ratios.append(f"{statistics.median(r):13.2f}x")
    print(f"{held:>9} " + " ".join(cells) + " " + " ".join(ratios))
PY

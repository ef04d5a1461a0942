#!/usr/bin/env bash
# SQLite through the FUSE mount against ext4 on a loop device of the same size, in one run,
# runs interleaved (docs/bench/posix.md, "SQLite speedtest1-like").
#
#   sudo bench/sqlite.sh [TALLY_BINARY]     # default: target/release/tally; RUNS=3, SIZE=100
#
# RUNS times, for tally (default mount options) and ext4 (mkfs.ext4 defaults, data=ordered),
# each on a fresh 1 GiB file system: bench/sqlite_speed.py --size SIZE (speedtest1's main test
# set, written here: see its header) on a database on the mount, then `sync`, timed together.
# Prints each run's total and its step times, the median total ratio Tally / ext4 (below 1:
# Tally faster) and, per step, the median of its per-run ratios; for Tally the FUSE requests
# and the device's reads and writes (SIGUSR1). Needs root, python3 with sqlite3, bc. Files live
# in $BENCH_DIR (default /var/tmp; not tmpfs).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH_DIR=${BENCH_DIR:-/var/tmp}
RUNS=${RUNS:-3}
SIZE=${SIZE:-100}
TALLY=${1:-$ROOT/target/release/tally}
[ "$(id -u)" = 0 ] || { echo "bench/sqlite.sh: needs root (loop devices and mounts)" >&2; exit 2; }
[ -x "$TALLY" ] || { echo "bench/sqlite.sh: $TALLY is not a program" >&2; exit 2; }

WORK=$(mktemp -d "$BENCH_DIR/tally-sqlite.XXXXXX")
. "$ROOT/bench/lib.sh"
trap cleanup_work EXIT
mkdir -p "$WORK/mnt" "$WORK/out"

for run in $(seq "$RUNS"); do
  for sys in tally ext4; do
    rm -f "$WORK/img"
    if [ "$sys" = ext4 ]; then
      # Initialised by mkfs, not by ext4lazyinit in the background of the timed run.
      truncate -s 1G "$WORK/img"; mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$WORK/img"
      LOOP=$(losetup -f --show "$WORK/img"); mount "$LOOP" "$WORK/mnt"
    else
      "$TALLY" mkfs "$WORK/img" --size 1G >/dev/null
      DAEMON=$("$TALLY" mount "$WORK/img" "$WORK/mnt" --log "$WORK/daemon.log" |
        sed -n 's/.*daemon pid \([0-9]*\).*/\1/p')
    fi
    t0=$(date +%s.%N)
    python3 "$ROOT/bench/sqlite_speed.py" "$WORK/mnt/db" --size "$SIZE" >"$WORK/out/$sys.$run"
    "$TALLY" sync  # plain sync does not reach a FUSE server (docs/CLI.md)
    t1=$(date +%s.%N)
    echo "$t1 - $t0" | bc -l | xargs printf 'TIMED %.3f\n' >>"$WORK/out/$sys.$run"
    if [ "$sys" = tally ]; then
      kill -USR1 "$DAEMON"; sleep 0.3
      grep -E 'requests since mount|device since open' "$WORK/daemon.log" | grep -v adapter |
        tail -2 | sed 's/.*INFO [a-z_:]* //' >>"$WORK/out/$sys.$run"
      "$TALLY" umount "$WORK/mnt" >/dev/null
    else
      umount "$WORK/mnt"; losetup -d "$LOOP"
    fi
    echo "run $run $sys: $(grep TIMED "$WORK/out/$sys.$run")"
  done
done

python3 - "$WORK/out" "$RUNS" <<'PY'
import statistics, sys, re
out, runs = sys.argv[1], int(sys.argv[2])
def load(name):
    steps, timed, extra = {}, None, []
    for line in open(f"{out}/{name}"):
        m = re.match(r"\s*(\d+) - (.*?)\s+([\d.]+)s$", line)
        if m:
            steps[(int(m.group(1)), m.group(2).strip())] = float(m.group(3))
        elif line.startswith("TIMED"):
            timed = float(line.split()[1])
        elif "since" in line:
            extra.append(line.strip())
    return steps, timed, extra
t = [load(f"tally.{r}") for r in range(1, runs + 1)]
e = [load(f"ext4.{r}") for r in range(1, runs + 1)]
ratios = sorted(a[1] / b[1] for a, b in zip(t, e))
print(f"total (workload + sync): tally {statistics.median(x[1] for x in t):.2f} s, "
      f"ext4 {statistics.median(x[1] for x in e):.2f} s, tally/ext4 {statistics.median(ratios):.2f}x "
      f"({ratios[0]:.2f}-{ratios[-1]:.2f}); per run: "
      + ", ".join(f"{a[1]:.2f}/{b[1]:.2f}" for a, b in zip(t, e)))
print(f"{'step':<58} {'tally s':>8} {'ext4 s':>8} {'ratio':>7}")
for key in t[0][0]:
    ts = [x[0].get(key, 0) for x in t]
    es = [x[0].get(key, 0) for x in e]
    rr = sorted(a / b for a, b in zip(ts, es) if b > 0)
    r = f"{statistics.median(rr):6.2f}x" if rr else "-"
    print(f"{key[0]:4d} {key[1]:<53} {statistics.median(ts):8.3f} {statistics.median(es):8.3f} {r:>7}"
          f"  (max {max(ts):.2f})")
for x in t:
    for line in x[2]:
        print("tally:", line)
PY

#!/usr/bin/env bash
# The two FUSE transports against ext4 on an untar: Tally mounted with -o io_uring=on (FUSE over
# io_uring) and with -o io_uring=off (/dev/fuse), and ext4 on a loop device, in one run
# (docs/bench/posix.md, "FUSE over io_uring").
#
#   sudo bench/transport.sh [TALLY_BINARY]     # default: target/release/tally
#
# RUNS times (default 3), interleaved: a fresh 2 GiB file system for each system; the timed
# region is `tar -x` of COPIES (default 17, about 5,100 files) copies of this repository's tree
# (`git archive HEAD`), then `tally sync` (every Tally mount made durable, then sync(2): plain
# `sync` never reaches a FUSE server), then an fsync of one untarred file (on both, it finds
# nothing left). Measured per run: wall time, the daemon's CPU time (user + system, /proc/PID/stat),
# the requests it served and how many came over the ring (its SIGUSR1 line), the machine's load
# average before the run and its busy CPU share during it (/proc/stat). Prints one line per
# measurement and the medians with per-run ratios; RESULTS=FILE keeps them as TSV. With PERF=1,
# `perf stat` also counts the daemon's system calls and context switches during the timed
# region (per request in the medians; perf's own cost lands in the times). Needs root,
# the fuse module's enable_uring on (`echo 1 > /sys/module/fuse/parameters/enable_uring`), git,
# tar, python3, bc. Files live in $BENCH_DIR (default /var/tmp; not tmpfs).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH_DIR=${BENCH_DIR:-/var/tmp}
RUNS=${RUNS:-3}
COPIES=${COPIES:-17}
TALLY=${1:-$ROOT/target/release/tally}
[ "$(id -u)" = 0 ] || { echo "bench/transport.sh: needs root (loop devices and mounts)" >&2; exit 2; }
[ -x "$TALLY" ] || { echo "bench/transport.sh: $TALLY is not a program" >&2; exit 2; }
URING=/sys/module/fuse/parameters/enable_uring
[ "$(cat "$URING" 2>/dev/null)" = Y ] || {
  echo "bench/transport.sh: FUSE over io_uring is off (echo 1 > $URING, Linux 6.14+)" >&2; exit 2; }

WORK=$(mktemp -d "$BENCH_DIR/tally-transport.XXXXXX")
. "$ROOT/bench/lib.sh"
trap cleanup_work EXIT
OUT=${RESULTS:-$WORK/results.tsv}
: >"$OUT"

make_tree "$COPIES"
FILES=$(find "$WORK/tree" -type f | wc -l)
DIRS=$(find "$WORK/tree" -type d | wc -l)
ONE=$(cd "$WORK/tree" && find . -type f -print -quit)
rm -rf "$WORK/tree"
echo "tree: $FILES files, $DIRS directories"

# mount_sys SYSTEM: a fresh 2 GiB file system on $WORK/mnt: ext4, or tally with -o io_uring=X.
mount_sys() {
  rm -f "$WORK/img" "$WORK/daemon.log"
  if [ "$1" = ext4 ]; then
    truncate -s 2G "$WORK/img"
    mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$WORK/img"
    LOOP=$(losetup -f --show "$WORK/img")
    mount "$LOOP" "$WORK/mnt"
  else
    "$TALLY" mkfs "$WORK/img" --size 2G >/dev/null
    DAEMON=$("$TALLY" mount "$WORK/img" "$WORK/mnt" -o "$1" --log "$WORK/daemon.log" |
      sed -n 's/.*daemon pid \([0-9]*\).*/\1/p')
  fi
}

umount_sys() {
  if [ "$1" = ext4 ]; then umount "$WORK/mnt"; losetup -d "$LOOP"; else "$TALLY" umount "$WORK/mnt" >/dev/null; fi
}

# cpu SYSTEM: the daemon's CPU time so far in clock ticks (utime + stime); 0 for ext4.
cpu() {
  if [ "$1" = ext4 ]; then echo 0; return; fi
  awk '{print $14 + $15}' "/proc/$DAEMON/stat"
}

# requests SYSTEM: "total ring" requests the daemon counted so far; "- -" for ext4.
requests() {
  if [ "$1" = ext4 ]; then echo "- -"; return; fi
  local before
  before=$(grep -c 'FUSE requests since mount' "$WORK/daemon.log" || true)
  kill -USR1 "$DAEMON"
  for _ in $(seq 500); do
    [ "$(grep -c 'FUSE requests since mount' "$WORK/daemon.log" || true)" -gt "$before" ] && break
    sleep 0.01
  done
  grep 'FUSE requests since mount' "$WORK/daemon.log" | tail -1 |
    sed -E 's/.*total ([0-9]+)( \(([0-9]+) over io_uring\))?.*/\1 \3/' |
    awk '{print $1, ($2 == "" ? 0 : $2)}'
}

# busy: "busy total" jiffies of all CPUs so far (/proc/stat).
busy() {
  awk '/^cpu /{t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t}' /proc/stat
}

work() {
  tar -xf "$WORK/tree.tar" -C "$WORK/mnt/untar"
  "$TALLY" sync >/dev/null
  python3 -c 'import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.fsync(fd)' "$WORK/mnt/untar/$ONE"
}

TICK=$(getconf CLK_TCK)
for run in $(seq "$RUNS"); do
  for sys in io_uring=on io_uring=off ext4; do
    mount_sys "$sys"
    mkdir "$WORK/mnt/untar"
    load=$(cut -d' ' -f1 /proc/loadavg)
    read -r q0 r0 <<<"$(requests "$sys")"
    c0=$(cpu "$sys")
    read -r b0 a0 <<<"$(busy)"
    sc=- cs=-
    if [ "${PERF:-0}" = 1 ] && [ "$sys" != ext4 ]; then
      perf stat -x, -e raw_syscalls:sys_enter,context-switches -p "$DAEMON" -o "$WORK/perf.txt" &
      PERF_PID=$!
      sleep 0.5
    fi
    t0=$(date +%s.%N)
    work
    t1=$(date +%s.%N)
    if [ "${PERF:-0}" = 1 ] && [ "$sys" != ext4 ]; then
      kill -INT "$PERF_PID"; wait "$PERF_PID" || true
      sc=$(awk -F, '/raw_syscalls:sys_enter/ {print $1}' "$WORK/perf.txt")
      cs=$(awk -F, '/context-switches/ {print $1}' "$WORK/perf.txt")
    fi
    read -r b1 a1 <<<"$(busy)"
    c1=$(cpu "$sys")
    read -r q1 r1 <<<"$(requests "$sys")"
    t=$(echo "$t1 - $t0" | bc -l | xargs printf '%.3f')
    dcpu=$(echo "($c1 - $c0) / $TICK" | bc -l | xargs printf '%.2f')
    machine=$(echo "100 * ($b1 - $b0) / ($a1 - $a0)" | bc -l | xargs printf '%.0f')
    if [ "$sys" = ext4 ]; then dq=-; dr=-; dcpu=-; else dq=$((q1 - q0)); dr=$((r1 - r0)); fi
    umount_sys "$sys"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$sys" "$run" "$t" "$dcpu" "$dq" "$dr" "$load" "$machine" "$sc" "$cs" | tee -a "$OUT"
  done
done

echo "== medians over $RUNS runs; $FILES files; machine: $(nproc) cores, $(uname -r), load now $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$OUT" "$FILES" <<'PY'
import sys, statistics, collections
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    sysname, run, t, cpu, q, r, load, busy, sc, cs = line.rstrip("\n").split("\t")
    rows[sysname].append(dict(run=int(run), t=float(t), cpu=cpu, q=q, r=r, load=float(load), busy=float(busy), sc=sc, cs=cs))
ext4 = {x["run"]: x["t"] for x in rows["ext4"]}
dev = {x["run"]: x["t"] for x in rows["io_uring=off"]}
for name in ["io_uring=on", "io_uring=off", "ext4"]:
    ms = rows[name]
    med = lambda k: statistics.median(x[k] for x in ms)
    line = (f"{name:13} time {med('t'):.3f} s  x ext4 {statistics.median(x['t'] / ext4[x['run']] for x in ms):.2f}"
            f"  x /dev/fuse {statistics.median(x['t'] / dev[x['run']] for x in ms):.2f}"
            f"  load before {med('load'):.2f}  machine busy {med('busy'):.0f}%")
    if name != "ext4":
        cpu = statistics.median(float(x["cpu"]) for x in ms)
        q = statistics.median(int(x["q"]) for x in ms)
        r = statistics.median(int(x["r"]) for x in ms)
        line += f"  daemon CPU {cpu:.2f} s  requests {q:.0f} ({r:.0f} over the ring)"
        if all(x["sc"] not in ("-", "") for x in ms):
            sc = statistics.median(int(x["sc"]) / int(x["q"]) for x in ms)
            cs = statistics.median(int(x["cs"]) / int(x["q"]) for x in ms)
            line += f"  daemon syscalls/request {sc:.2f}  context switches/request {cs:.2f}"
    print(line)
PY

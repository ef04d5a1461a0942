#!/usr/bin/env bash
# Device submissions per file and wall time against ext4 for an untar on the Tally mount, with
# write-behind (the default, commit_ms=5000) and without it (-o commit_ms=0: each change
# submitted as it commits, as before write-behind), in one run (docs/bench/posix.md,
# "Write-behind: device submissions per operation").
#
#   sudo bench/writebehind.sh [TALLY_BINARY]     # default: target/release/tally
#
# RUNS times (default 3), interleaved: a fresh 2 GiB file system for each of tally with
# commit_ms=0, tally with the default, and ext4 on a loop device; the timed region is
# `tar -x` of COPIES (default 17, about 5,100 files) copies of this repository's tree (`git archive HEAD`), then
# `sync`, then an fsync of one untarred file (FUSE has no syncfs here: the fsync is what makes
# Tally write out and flush everything; on ext4 it finds nothing left). The daemon logs its
# device counters on SIGUSR1 before and after; the difference is the untar's. Prints one line
# per measurement and the medians; RESULTS=FILE keeps them as TSV. Needs root, git, tar,
# python3, bc. Files live in $BENCH_DIR (default /var/tmp; not tmpfs).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH_DIR=${BENCH_DIR:-/var/tmp}
RUNS=${RUNS:-3}
COPIES=${COPIES:-17}
TALLY=${1:-$ROOT/target/release/tally}
[ "$(id -u)" = 0 ] || { echo "bench/writebehind.sh: needs root (loop devices and mounts)" >&2; exit 2; }
[ -x "$TALLY" ] || { echo "bench/writebehind.sh: $TALLY is not a program" >&2; exit 2; }

WORK=$(mktemp -d "$BENCH_DIR/tally-writebehind.XXXXXX")
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

# mount_sys CONFIG: a fresh 2 GiB file system on $WORK/mnt: ext4, or tally with -o commit_ms=N.
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

# device CONFIG: "submissions writes flushes" of the daemon's device so far; "- - -" for ext4.
device() {
  if [ "$1" = ext4 ]; then echo "- - -"; return; fi
  local before
  before=$(grep -c 'device since open' "$WORK/daemon.log" || true)
  kill -USR1 "$DAEMON"
  for _ in $(seq 500); do
    [ "$(grep -c 'device since open' "$WORK/daemon.log" || true)" -gt "$before" ] && break
    sleep 0.01
  done
  grep 'device since open' "$WORK/daemon.log" | tail -1 |
    sed 's/.*submissions \([0-9]*\), writes \([0-9]*\), flushes \([0-9]*\).*/\1 \2 \3/'
}

work() {
  tar -xf "$WORK/tree.tar" -C "$WORK/mnt/untar"
  "$TALLY" sync  # plain sync does not reach a FUSE server (docs/CLI.md)
  python3 -c 'import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.fsync(fd)' "$WORK/mnt/untar/$ONE"
}

for run in $(seq "$RUNS"); do
  for sys in commit_ms=0 commit_ms=5000 ext4; do
    mount_sys "$sys"
    mkdir "$WORK/mnt/untar"
    read -r s0 w0 f0 <<<"$(device "$sys")"
    t0=$(date +%s.%N)
    work
    t1=$(date +%s.%N)
    read -r s1 w1 f1 <<<"$(device "$sys")"
    t=$(echo "$t1 - $t0" | bc -l | xargs printf '%.3f')
    if [ "$sys" = ext4 ]; then ds=-; dw=-; df=-; else ds=$((s1 - s0)); dw=$((w1 - w0)); df=$((f1 - f0)); fi
    umount_sys "$sys"
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$sys" "$run" "$t" "$ds" "$dw" "$df" | tee -a "$OUT"
  done
done

echo "== medians over $RUNS runs; $FILES files; machine: $(nproc) cores, $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$OUT" "$FILES" <<'PY'
import sys, statistics, collections
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    cfg, run, t, s, w, f = line.rstrip("\n").split("\t")
    rows[cfg].append((int(run), float(t), s, w, f))
files = int(sys.argv[2])
ext4 = {r: t for r, t, *_ in rows["ext4"]}
for cfg in ["commit_ms=0", "commit_ms=5000", "ext4"]:
    ms = rows[cfg]
    t = statistics.median(x[1] for x in ms)
    ratio = statistics.median(x[1] / ext4[x[0]] for x in ms)
    line = f"{cfg:16} time {t:.3f} s  ratio to ext4 {ratio:.2f}x"
    if cfg != "ext4":
        s = statistics.median(int(x[2]) for x in ms)
        w = statistics.median(int(x[3]) for x in ms)
        f = statistics.median(int(x[4]) for x in ms)
        line += f"  submissions {s:.0f} ({s / files:.2f}/file)  writes {w:.0f}  flushes {f:.0f}"
    print(line)
PY

#!/usr/bin/env bash
# Everyday programs on the Tally mount against ext4 (data=ordered) and a bindfs pass-through
# over ext4, on loop devices of the same size, in one run (issue 14's table; docs/bench/mount.md).
#
#   sudo bench/mount.sh [TALLY_BINARY]      # default: target/release/tally
#
# For each system, RUNS times (default 3), runs interleaved: a fresh 2 GiB file system, then
# these workloads in order, each timed with a final `tally sync` inside the timed region (plain
# `sync` never reaches a FUSE server on Linux up to 6.18; `tally sync` makes every Tally mount
# durable, then calls sync(2) for the other file systems, so ext4 and bindfs pay what they did):
#   untar     tar -x of COPIES (default 17) copies of this repository's tree (over 5,000 files)
#   rm        rm -rf of the untarred tree
#   clone     git clone (file://, every object copied) of a repository holding the same tree
#   status    git status in the clone
#   build     ./configure && make -j2 of GNU hello 2.10 (Debian's source tarball)
#   speedtest SQLite's speedtest1 --size SIZE (default 25; built from Debian's SQLite 3.40.1
#             source, test/speedtest1.c, against the system libsqlite3)
#   varmail   `tally bench peer varmail` for VARMAIL_SECS (default 10) seconds: operations/s
# For Tally, the daemon logs its FUSE requests by opcode and its device counters on SIGUSR1
# before and after each workload; the differences are the workload's requests and device
# submissions. TALLY_MOUNT_OPTS (e.g. "io_uring=on") go to `tally mount -o`.
#
# Prints one line per measurement; at the end, per workload and system, the median time (or
# ops/s), the median of the per-run speed ratios to ext4 (ext4's time over the system's: above
# 1 is faster than ext4), Tally's requests and submissions per operation, and writes the table
# to REPORT (default docs/bench/mount.md's generated part is printed; bench/mount_report.py).
# Files live in $BENCH_DIR (default /var/tmp; not tmpfs); the downloaded sources are kept in
# $BENCH_CACHE (default /var/tmp/tally-bench-cache). Needs root (loop devices, mounts).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH_DIR=${BENCH_DIR:-/var/tmp}
BENCH_CACHE=${BENCH_CACHE:-/var/tmp/tally-bench-cache}
RUNS=${RUNS:-3}
COPIES=${COPIES:-17}
SIZE=${SIZE:-25}
VARMAIL_SECS=${VARMAIL_SECS:-10}
WORKLOADS=${WORKLOADS:-"untar rm clone status build speedtest varmail"}
SYSTEMS=${SYSTEMS:-"tally ext4 bindfs"}
TALLY=${1:-$ROOT/target/release/tally}
case "$TALLY" in -h | --help) sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
[ "$(id -u)" = 0 ] || { echo "bench/mount.sh: needs root (loop devices and mounts)" >&2; exit 2; }
[ -x "$TALLY" ] || { echo "bench/mount.sh: $TALLY is not a program (cargo build --release -p tally)" >&2; exit 2; }

need=()
for c in git tar gcc make bc bindfs curl; do command -v $c >/dev/null || need+=("$c"); done
[ -e /usr/include/sqlite3.h ] || need+=(libsqlite3-dev)
if [ ${#need[@]} -gt 0 ]; then
  echo "== installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  { apt-get install -y -qq "${need[@]}" || { apt-get update -qq && apt-get install -y -qq "${need[@]}"; }; } >/dev/null
fi

# Sources from Debian's archive (the package registry): GNU hello for configure+make, and
# SQLite's source for speedtest1 (no Debian package ships the program).
DEB=http://deb.debian.org/debian/pool/main
mkdir -p "$BENCH_CACHE"
fetch() { [ -s "$BENCH_CACHE/$2" ] || curl -fsS -o "$BENCH_CACHE/$2" "$DEB/$1/$2"; }
fetch h/hello hello_2.10.orig.tar.gz
if [ ! -x "$BENCH_CACHE/speedtest1" ]; then
  fetch s/sqlite3 sqlite3_3.40.1.orig.tar.xz
  tar -xJf "$BENCH_CACHE/sqlite3_3.40.1.orig.tar.xz" -C "$BENCH_CACHE" --wildcards '*/test/speedtest1.c'
  gcc -O2 -o "$BENCH_CACHE/speedtest1" "$BENCH_CACHE/sqlite3-3.40.1/test/speedtest1.c" -lsqlite3
fi

WORK=$(mktemp -d "$BENCH_DIR/tally-mount.XXXXXX")
. "$ROOT/bench/lib.sh"
trap cleanup_work EXIT
OUT=${RESULTS:-$WORK/results.tsv}
: >"$OUT"

# The tree: COPIES copies of this repository's tree, as a tarball and as a bare git repository.
make_tree "$COPIES"
mkdir "$WORK/lower"
ENTRIES=$(tar -tf "$WORK/tree.tar" | grep -cv '^\./$')
FILES=$(find "$WORK/tree" -type f | wc -l)
git -C "$WORK/tree" init -q
git -C "$WORK/tree" add -A
git -C "$WORK/tree" -c user.name=bench -c user.email=bench@localhost commit -q -m tree
git clone -q --bare "$WORK/tree" "$WORK/tree.git"
rm -rf "$WORK/tree"
echo "tree: $ENTRIES entries ($FILES files), $(du -sh "$WORK/tree.tar" | cut -f1) as a tarball" >&2

opts=()
[ -n "${TALLY_MOUNT_OPTS:-}" ] && opts=(-o "$TALLY_MOUNT_OPTS")

# mount_sys SYSTEM: a fresh 2 GiB file system on $WORK/mnt.
mount_sys() {
  rm -f "$WORK/img" "$WORK/daemon.log"
  case $1 in
    tally)
      "$TALLY" mkfs "$WORK/img" --size 2G >/dev/null
      DAEMON=$("$TALLY" mount "$WORK/img" "$WORK/mnt" --log "$WORK/daemon.log" "${opts[@]}" |
        sed -n 's/.*daemon pid \([0-9]*\).*/\1/p')
      ;;
    ext4 | bindfs)
      truncate -s 2G "$WORK/img"
      mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$WORK/img"
      LOOP=$(losetup -f --show "$WORK/img")
      if [ "$1" = ext4 ]; then
        mount "$LOOP" "$WORK/mnt"
      else
        mount "$LOOP" "$WORK/lower"
        bindfs "$WORK/lower" "$WORK/mnt"
      fi
      ;;
  esac
}

umount_sys() {
  case $1 in
    tally) "$TALLY" umount "$WORK/mnt" >/dev/null ;;
    ext4) umount "$WORK/mnt"; losetup -d "$LOOP" ;;
    bindfs) umount "$WORK/mnt"; umount "$WORK/lower"; losetup -d "$LOOP" ;;
  esac
}

# counters SYSTEM: "REQUESTS|SUBMISSIONS" of the Tally daemon so far, as it logs them on
# SIGUSR1 ("total N: OP n, ..." and "submissions N, writes N, flushes N"); "-|-" otherwise.
counters() {
  if [ "$1" != tally ]; then echo "-|-"; return; fi
  local before
  before=$(grep -c 'device since open' "$WORK/daemon.log" || true)
  kill -USR1 "$DAEMON"
  for _ in $(seq 500); do
    [ "$(grep -c 'device since open' "$WORK/daemon.log" || true)" -gt "$before" ] && break
    sleep 0.01
  done
  local r d
  r=$(grep 'FUSE requests since mount' "$WORK/daemon.log" | tail -1 | sed 's/.*FUSE requests since mount: //')
  d=$(grep 'device since open' "$WORK/daemon.log" | tail -1 | sed 's/.*submissions \([0-9]*\).*/\1/')
  echo "$r|$d"
}

# cpu_ms SYSTEM: CPU time of the Tally daemon so far (all threads), in ms; "-" otherwise.
cpu_ms() {
  if [ "$1" != tally ]; then echo -; return; fi
  awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) * 1000 / hz}' "/proc/$DAEMON/stat"
}

untar() { mkdir "$WORK/mnt/untar" && tar -xf "$WORK/tree.tar" -C "$WORK/mnt/untar"; }
remove() { rm -rf "$WORK/mnt/untar"; }
clone() { git clone -q "file://$WORK/tree.git" "$WORK/mnt/clone"; }
status() { git -C "$WORK/mnt/clone" status --porcelain; }
build() {
  tar -xzf "$BENCH_CACHE/hello_2.10.orig.tar.gz" -C "$WORK/mnt" &&
    (cd "$WORK/mnt/hello-2.10" && ./configure -q && make -s -j2) >/dev/null 2>&1
}
speedtest() { "$BENCH_CACHE/speedtest1" --size "$SIZE" "$WORK/mnt/speedtest1.db"; }

# timed CMD...: the wall time of CMD followed by `tally sync` (every Tally mount made durable,
# then sync(2)), in seconds; fails if CMD does.
timed() {
  local t0 t1
  t0=$(date +%s.%N)
  "$@" >/dev/null
  "$TALLY" sync >/dev/null
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc -l | xargs printf '%.3f\n'
}

for run in $(seq "$RUNS"); do
  for sys in $SYSTEMS; do
    mount_sys "$sys"
    last=$(counters "$sys")
    for w in $WORKLOADS; do
      c0=$(cpu_ms "$sys")
      case $w in
        varmail)
          v=$("$TALLY" bench peer varmail --dir "$WORK/mnt" --system "$sys" --seconds "$VARMAIL_SECS" --json |
            python3 -c 'import json, sys; w = json.load(sys.stdin); print("%.1f %d" % (w["ops"] / w["seconds"], w["ops"]))')
          ;;
        untar) v=$(timed untar) ;;
        rm) v=$(timed remove) ;;
        clone) v=$(timed clone) ;;
        status) v=$(timed status) ;;
        build) v=$(timed build) ;;
        speedtest) v=$(timed speedtest) ;;
        *) echo "bench/mount.sh: unknown workload $w" >&2; exit 2 ;;
      esac
      c1=$(cpu_ms "$sys")
      # What requests and submissions are counted per: entries of the tree, varmail's operations.
      case $w in
        untar | rm | clone | status) ops=$ENTRIES ;;
        varmail) ops=${v#* }; v=${v% *} ;;
        *) ops=- ;;
      esac
      cpu=-
      [ "$c0" = - ] || cpu=$(echo "$c1 - $c0" | bc)
      now=$(counters "$sys")
      printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$sys" "$run" "$w" "$v" "$cpu" "$last" "$now" "$ops" | tee -a "$OUT" >&2
      last=$now
    done
    umount_sys "$sys"
  done
done

MACHINE="$(nproc) cores ($(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)), $(free -g | awk '/^Mem:/ {print $2}') GiB, Linux $(uname -r), load at the end $(cut -d' ' -f1-3 /proc/loadavg)"
python3 "$ROOT/bench/mount_report.py" "$OUT" --entries "$ENTRIES" --files "$FILES" \
  --runs "$RUNS" --machine "$MACHINE" --commit "$(git -C "$ROOT" rev-parse --short HEAD)" \
  --options "${TALLY_MOUNT_OPTS:-defaults}"

#!/usr/bin/env bash
# SQLite small transactions on the FUSE mount against ext4, in one run (docs/bench/sqlite.md,
# "On the mount"):
#
#   sudo bench/sqlite_mount.sh [SECONDS]      # default 5 s per configuration
#
# Five configurations, each a fresh file system of 256 MiB on an image file in $BENCH_DIR
# (default /var/tmp; the host's file system, not tmpfs), each running
# crates/tally-bench/examples/sqlite_commits.rs (1-4 rows per commit, synchronous=FULL):
# rollback mode on a Tally mount answering F2FS's atomic-write ioctls (SQLite's batch-atomic
# commit), rollback and WAL on a Tally mount started with -o no_atomic_write, rollback and WAL
# on ext4 (data=ordered) on a loop device over an image file in the same directory. For Tally,
# the device's flushes come from the daemon's SIGUSR1 log line. Prints commits/s, flushes per
# commit (Tally) and the ratios of batch-atomic to ext4.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH_DIR=${BENCH_DIR:-/var/tmp}
SECONDS_EACH=${1:-5}
[ "$(id -u)" = 0 ] || { echo "bench/sqlite_mount.sh: needs root (loop devices and mounts)" >&2; exit 2; }
(cd "$ROOT" && cargo build --release -q -p tally && cargo build --release -q -p tally-bench --example sqlite_commits)
TALLY=$ROOT/target/release/tally
RUNNER=$ROOT/target/release/examples/sqlite_commits

WORK=$(mktemp -d "$BENCH_DIR/tally-sqlite-mount.XXXXXX")
. "$ROOT/bench/lib.sh"
trap cleanup_work EXIT

flushes() { # the daemon's device flushes so far, from its log after SIGUSR1
  kill -USR1 "$1"; sleep 0.5
  grep -o 'flushes [0-9]*' "$2" | tail -1 | awk '{print $2}'
}

run_tally() { # NAME MODE OPTIONS
  local dir=$WORK/$1
  mkdir -p "$dir/mnt"
  "$TALLY" mkfs --size 256M "$dir/image" >/dev/null
  local out pid
  out=$("$TALLY" mount --log "$dir/log" ${3:+-o "$3"} "$dir/image" "$dir/mnt")
  pid=$(echo "$out" | sed -n 's/.*daemon pid \([0-9]*\).*/\1/p')
  local f0 f1 line
  f0=$(flushes "$pid" "$dir/log")
  line=$("$RUNNER" "$dir/mnt/bench.db" "$2" "$SECONDS_EACH")
  f1=$(flushes "$pid" "$dir/log")
  "$TALLY" umount "$dir/mnt" >/dev/null
  set -- $line
  echo "$1 $2 $4 $((f1 - f0))"
}

run_ext4() { # NAME MODE
  local dir=$WORK/$1
  mkdir -p "$dir/mnt"
  truncate -s 256M "$dir/ext4.img"
  mkfs.ext4 -q -F "$dir/ext4.img"
  mount -o loop "$dir/ext4.img" "$dir/mnt"
  local line
  line=$("$RUNNER" "$dir/mnt/bench.db" "$2" "$SECONDS_EACH")
  umount "$dir/mnt"
  set -- $line
  echo "$1 $2 $4 -"
}

printf '%-34s %10s %10s %16s\n' configuration commits/s commits flushes/commit
declare -A RATE
for cfg in "tally-batch delete" "tally-rollback delete no_atomic_write" "tally-wal wal no_atomic_write" \
           "ext4-rollback delete" "ext4-wal wal"; do
  set -- $cfg
  if [[ $1 == tally-* ]]; then r=$(run_tally "$1" "$2" "${3:-}"); else r=$(run_ext4 "$1" "$2"); fi
  set -- $1 $r
  rate=$(echo "scale=1; $3 / $4" | bc)
  per=$([ "$5" = - ] && echo - || echo "scale=2; $5 / $3" | bc)
  RATE[$1]=$rate
  printf '%-34s %10s %10s %16s\n' "$1" "$rate" "$3" "$per"
done
for peer in tally-rollback tally-wal ext4-rollback ext4-wal; do
  printf 'tally-batch / %-16s %6.2fx\n' "$peer" "$(echo "scale=4; ${RATE[tally-batch]} / ${RATE[$peer]}" | bc)"
done

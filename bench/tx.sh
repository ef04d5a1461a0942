#!/usr/bin/env bash
# Issue #3's transaction benchmark: builds `tally` (release), runs `tally bench tx` and
# `tally bench recovery` in the configurations the issue asks for, on a file in $BENCH_DIR
# (default /var/tmp, which must not be tmpfs: O_DIRECT), and writes docs/bench/tx.md plus the
# raw JSON reports in docs/bench/tx-data/.
#
#   bench/tx.sh                 # ~9 minutes on a 2-core VM
#   SECONDS_PER_RUN=5 RUNS=3 SIZE=4G BENCH_DIR=/mnt/ssd bench/tx.sh
#
# Run it on an otherwise idle machine: the load average is recorded in the document.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH_DIR=${BENCH_DIR:-/var/tmp}
SECS=${SECONDS_PER_RUN:-3}
RUNS=${RUNS:-5}
SIZE=${SIZE:-1G}
LOG_MIB=${LOG_MIB:-1024}
OUT_MD="$ROOT/docs/bench/tx.md"
OUT_DATA="$ROOT/docs/bench/tx-data"
FILE="$BENCH_DIR/tally-bench-tx.$$.img"
RFILE="$BENCH_DIR/tally-bench-recovery.$$.img"

command -v python3 >/dev/null || { echo "bench/tx.sh: needs python3 to write the report" >&2; exit 2; }
fstype=$(stat -f -c %T "$BENCH_DIR")
if [ "$fstype" = tmpfs ]; then
  echo "bench/tx.sh: $BENCH_DIR is tmpfs; O_DIRECT needs a real file system (set BENCH_DIR)" >&2
  exit 2
fi

cd "$ROOT"
cargo build --release -q -p tally
# The code measured: the commit the binary was built from, and whether the crates it measures
# had uncommitted changes at that moment.
BUILT_FROM="$(git rev-parse --short HEAD)"
git diff --quiet HEAD -- crates/tally-log crates/tally-media crates/tally-bench \
  || BUILT_FROM="$BUILT_FROM + uncommitted changes to the measured crates"
TALLY="${CARGO_TARGET_DIR:-$ROOT/target}/release/tally"

cleanup() { rm -f "$FILE" "$RFILE"; }
trap cleanup EXIT

# Wait (at most two minutes) for the machine to settle; record the load either way.
for _ in $(seq 24); do
  load1=$(cut -d' ' -f1 /proc/loadavg)
  python3 -c "import sys; sys.exit(0 if float('$load1') < 1.0 else 1)" && break
  echo "bench/tx.sh: load average $load1, waiting for < 1.0" >&2
  sleep 5
done

mkdir -p "$OUT_DATA"
rm -f "$OUT_DATA"/*.json
: >"$OUT_DATA/commands.txt"
# The first line is the load before any benchmark ran; later lines include the benchmark's own
# threads (the load average counts threads waiting for I/O), so the busiest other processes
# are logged beside them.
echo "start: $(cut -d' ' -f1-3 /proc/loadavg)" >"$OUT_DATA/load.txt"

# run NAME ARGS...: one tally invocation, JSON to $OUT_DATA/NAME.json, command and load logged.
# The first tx invocation creates the file (--keep); later ones reuse it (--force).
run() {
  local name=$1
  shift
  local shown="tally $*"
  local others
  others=$(ps -eo pcpu=,comm= --sort=-pcpu | awk '$2 != "tally" && $2 !~ /^kworker/ && $1 >= 10 {printf "%s(%s%%) ", $2, $1}')
  echo "$name: $(cut -d' ' -f1-3 /proc/loadavg) others>=10%cpu: ${others:-none}" >>"$OUT_DATA/load.txt"
  echo "${shown//$BENCH_DIR/\$BENCH_DIR}" >>"$OUT_DATA/commands.txt"
  echo "== $name: $shown" >&2
  "$TALLY" "$@" --json >"$OUT_DATA/$name.json"
}

started=$(date -u +%Y-%m-%dT%H:%MZ)
reuse=(--keep)
tx() {
  local name=$1
  shift
  run "$name" bench tx --path "$FILE" --size "$SIZE" --seconds "$SECS" --runs "$RUNS" "${reuse[@]}" "$@"
  reuse=(--keep --force)
}

# Create and write the file once with a short unrecorded run, then let the disk settle: the
# host may still be writing back the fill, which would slow the first measured runs.
echo "== warm-up (not recorded)" >&2
"$TALLY" bench tx --path "$FILE" --size "$SIZE" --seconds 1 --runs 1 --modes count --keep --json >/dev/null
reuse=(--keep --force)
sleep 15
# (a) 1 thread x 1 block, all four modes.
tx a-1x1 --threads 1 --blocks 1 --modes classic,count,ordered,orderless
# (b) 1 thread x 1..16 blocks.
for b in 1 2 4 8 16; do
  tx "b-1x$b" --threads 1 --blocks "$b" --modes classic,count,ordered
done
# (c) 1..8 threads x 1 block, count (group commit).
for t in 1 2 3 4 5 6 7 8; do
  tx "c-${t}x1" --threads "$t" --blocks 1 --modes count
done
# (e) 8 threads sharing 2 streams: queued commits of a stream are merged into one write (RIO).
tx e-8x1-2streams --threads 8 --streams 2 --blocks 1 --modes count,ordered,orderless
rm -f "$FILE"
# (d) recovery scan of a full log.
run d-recovery bench recovery --path "$RFILE" --log-mib "$LOG_MIB" --runs "$RUNS"
finished=$(date -u +%Y-%m-%dT%H:%MZ)

python3 "$ROOT/bench/tx_report.py" "$OUT_DATA" "$OUT_MD" "$started" "$finished" \
  "$(uname -sr)" "$(nproc)" "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')" \
  "$fstype" "$SECS" "$RUNS" "$SIZE" "$BUILT_FROM"
echo "bench/tx.sh: wrote ${OUT_MD#$ROOT/}" >&2

#!/usr/bin/env bash
# Issue 18's remote benchmark: `tally bench tx` on an NBD export against the same on a local
# file, in one run, on the same file system. The export is nbdkit's file plugin serving a file
# in $BENCH_DIR (its FLUSH is an fdatasync of that file), over a Unix socket, optionally behind
# the delay filter (DELAYS, whole milliseconds: nbdkit 1.32's delay filter has no finer unit).
# Writes the raw JSON reports and a table to docs/bench/remote-data/; docs/bench/remote.md
# discusses them.
#
#   bench/remote.sh                       # ~4 minutes on a 2-core VM
#   SECONDS_PER_RUN=3 RUNS=3 THREADS=4 DELAYS="0 1" BENCH_DIR=/var/tmp bench/remote.sh
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH_DIR=${BENCH_DIR:-/var/tmp}
SECS=${SECONDS_PER_RUN:-2}
RUNS=${RUNS:-3}
THREADS=${THREADS:-4}
SIZE=${SIZE:-512M}
DELAYS=${DELAYS:-"0 1"}
MODES=${MODES:-count,ordered,orderless}
OUT_DATA="$ROOT/docs/bench/remote-data"
WORK="$BENCH_DIR/tally-bench-remote.$$"

command -v nbdkit >/dev/null || { echo "bench/remote.sh: needs nbdkit" >&2; exit 2; }
command -v python3 >/dev/null || { echo "bench/remote.sh: needs python3" >&2; exit 2; }
if [ "$(stat -f -c %T "$BENCH_DIR")" = tmpfs ]; then
  echo "bench/remote.sh: $BENCH_DIR is tmpfs; O_DIRECT needs a real file system" >&2
  exit 2
fi

cd "$ROOT"
cargo build --release -q -p tally
BUILT_FROM="$(git rev-parse --short HEAD)"
git diff --quiet HEAD -- crates/tally-log crates/tally-media crates/tally-bench \
  || BUILT_FROM="$BUILT_FROM + uncommitted changes to the measured crates"
TALLY="${CARGO_TARGET_DIR:-$ROOT/target}/release/tally"

NBDKIT_PID=
cleanup() {
  [ -n "$NBDKIT_PID" ] && kill "$NBDKIT_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$WORK" "$OUT_DATA"
rm -f "$OUT_DATA"/*.json
: >"$OUT_DATA/commands.txt"
{
  echo "built from: $BUILT_FROM"
  echo "machine: $(uname -sr) $(uname -m), $(nproc) CPUs, $(nbdkit --version)"
  echo "start load: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$OUT_DATA/machine.txt"

# serve DELAY_MS: nbdkit (file plugin, multi-conn) on a Unix socket, writes delayed DELAY_MS.
serve() {
  [ -n "$NBDKIT_PID" ] && { kill "$NBDKIT_PID"; wait "$NBDKIT_PID" 2>/dev/null || true; }
  rm -f "$WORK/s.sock" "$WORK/s.pid"
  truncate -s "$SIZE" "$WORK/export.img"
  local filters=() params=()
  if [ "$1" != 0 ]; then filters=(--filter=delay); params=("delay-write=${1}ms"); fi
  nbdkit -f -U "$WORK/s.sock" -P "$WORK/s.pid" "${filters[@]}" file "$WORK/export.img" \
    "${params[@]}" &
  NBDKIT_PID=$!
  for _ in $(seq 100); do [ -s "$WORK/s.pid" ] && break; sleep 0.05; done
  URI="nbd+unix:///?socket=$WORK/s.sock"
}

# run NAME ARGS...: one `tally bench tx`, JSON to NAME.json, command and load logged.
run() {
  local name=$1; shift
  echo "$name: tally bench tx $* (load $(cut -d' ' -f1 /proc/loadavg))" | tee -a "$OUT_DATA/commands.txt" >&2
  "$TALLY" bench tx --json --threads "$THREADS" --seconds "$SECS" --runs "$RUNS" \
    --modes "$MODES" "$@" >"$OUT_DATA/$name.json"
}

# Interleaved: local, then each remote configuration, so drift is spread over all of them.
run local --path "$WORK/local.img" --size "$SIZE"
for d in $DELAYS; do
  serve "$d"
  run "nbd-d${d}ms-per-stream" --path "$URI" --force
  run "nbd-d${d}ms-one-conn" --path "$URI" --force --connections 1
done
echo "end load: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT_DATA/machine.txt"

python3 - "$OUT_DATA" >"$OUT_DATA/table.md" <<'PY'
import json, os, sys
d = sys.argv[1]
names = ["local"] + sorted(n[:-5] for n in os.listdir(d) if n.startswith("nbd-") and n.endswith(".json"))
reps = {n: json.load(open(os.path.join(d, n + ".json"))) for n in names}
def mode(r, m):
    return next((x for x in r["modes"] if x["mode"] == m), None)
print("| configuration | device | mode | tx/s median [min-max] | flushes/tx | submissions/tx | cpu µs/tx | vs local | ordered/orderless | ordered/count |")
print("|---|---|---|---|---|---|---|---|---|---|")
for n in names:
    r = reps[n]
    for m in r["modes"]:
        t = m["tx_per_sec"]
        loc = mode(reps["local"], m["mode"])
        o, ol, c = mode(r, "ordered"), mode(r, "orderless"), mode(r, "count")
        ratio = lambda a, b: f"{a['tx_per_sec']['median'] / b['tx_per_sec']['median']:.2f}" if a and b else ""
        print(f"| {n} | {r['config']['engine']} | {m['mode']} | {t['median']:.0f} [{t['min']:.0f}-{t['max']:.0f}] "
              f"| {m['flushes_per_tx']['median']:.3f} | {m['submissions_per_tx']['median']:.3f} "
              f"| {m['cpu_us_per_tx']['median']:.1f} | {ratio(m, loc)} "
              f"| {ratio(o, ol) if m['mode'] == 'ordered' else ''} | {ratio(o, c) if m['mode'] == 'ordered' else ''} |")
print()
print("| configuration | write p50 µs | flush p50 µs | FUA write p50 µs |")
print("|---|---|---|---|")
for n in names:
    p = reps[n]["probe"]
    print(f"| {n} | {p['write_4k_p50_us']:.0f} | {p['fdatasync_p50_us']:.0f} | {p['fua_write_p50_us']:.0f} |")
PY
cat "$OUT_DATA/table.md"

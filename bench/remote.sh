#!/usr/bin/env bash
# Issue 18's remote benchmark: `tally bench tx` on NBD exports against the same on a local
# file, in one run, on the same file system. Each export is nbdkit's file plugin serving a file
# in $BENCH_DIR (its FLUSH is an fdatasync of that file), over a Unix socket, optionally behind
# the delay filter (DELAYS, whole milliseconds: nbdkit 1.32's delay filter has no finer unit).
# DELAY_US (microseconds, e.g. "0 50 200"): serve through bench/delayfile.c instead (nbdkit's
# cc plugin compiles it; needs nbdkit-plugin-dev and cc), which holds every request (read,
# write, flush) that long; DELAYS is then ignored.
# THREADS_LIST and BLOCKS_LIST (data blocks a transaction: 1 = 4 KiB, 4 = 16 KiB): every
# combination is run; their JSONs are named ...-<threads>th-<KiB>k.
# TARGET_COUNTS: images on one export and striped over several (a multi-target image, one
# segment per stripe). Beside each, the "Linux-style" baseline: every ordered write followed by
# a flush before the next is sent (tally-media's flush_per_write example, same threads, same
# exports). Writes the raw JSON reports and a table to docs/bench/remote-data/;
# docs/bench/remote.md discusses them.
#
#   bench/remote.sh                       # ~5 minutes on a 2-core VM
#   SECONDS_PER_RUN=2 RUNS=3 THREADS=8 DELAYS="0 1" TARGET_COUNTS="1 3" BENCH_DIR=/var/tmp bench/remote.sh
#   DATA=docs/bench/remote-data/us DELAY_US="0 50 200" THREADS_LIST="1 8" BLOCKS_LIST="1 4" \
#     MODES=classic,count,ordered,orderless RUNS=2 RECOVERY_MIB=0 bench/remote.sh
#   KEEP=1 LOCAL=0 DELAYS=1 TARGET_COUNTS=3 bench/remote.sh   # rerun one configuration (e.g. one
#       that ran at a far higher load than the others), keeping the other JSONs; the table is
#       made from whatever the data directory holds, commands.txt says when each ran
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH_DIR=${BENCH_DIR:-/var/tmp}
SECS=${SECONDS_PER_RUN:-2}
RUNS=${RUNS:-3}
THREADS=${THREADS:-8}
THREADS_LIST=${THREADS_LIST:-}
BLOCKS_LIST=${BLOCKS_LIST:-}
DELAY_US=${DELAY_US:-}
SIZE=${SIZE:-512M}
DELAYS=${DELAYS:-"0 1"}
TARGET_COUNTS=${TARGET_COUNTS:-"1 3"}
# Also run one export with every stream on one connection (ONE_CONN=1).
ONE_CONN=${ONE_CONN:-0}
# Recovery time of a log of this many MiB (0: skip): a local file, one export, 3 exports.
RECOVERY_MIB=${RECOVERY_MIB:-1024}
MODES=${MODES:-count,ordered,orderless}
KEEP=${KEEP:-0}
LOCAL=${LOCAL:-1}
OUT_DATA="$ROOT/${DATA:-docs/bench/remote-data}"
WORK="$BENCH_DIR/tally-bench-remote.$$"

command -v nbdkit >/dev/null || { echo "bench/remote.sh: needs nbdkit" >&2; exit 2; }
command -v python3 >/dev/null || { echo "bench/remote.sh: needs python3" >&2; exit 2; }
if [ -n "$DELAY_US" ] && [ ! -e /usr/include/nbdkit-plugin.h ]; then
  echo "bench/remote.sh: DELAY_US needs nbdkit-plugin-dev (bench/delayfile.c is compiled by nbdkit's cc plugin)" >&2
  exit 2
fi
if [ "$(stat -f -c %T "$BENCH_DIR")" = tmpfs ]; then
  echo "bench/remote.sh: $BENCH_DIR is tmpfs; O_DIRECT needs a real file system" >&2
  exit 2
fi

cd "$ROOT"
# SKIP_BUILD=1: use the binaries already in the target directory.
if [ -z "${SKIP_BUILD:-}" ]; then
  cargo build --release -q -p tally
  cargo build --release -q -p tally-media --example flush_per_write --example recovery_time
fi
BUILT_FROM="$(git rev-parse --short HEAD)"
git diff --quiet HEAD -- crates/tally-log crates/tally-media crates/tally-bench \
  || BUILT_FROM="$BUILT_FROM + uncommitted changes to the measured crates"
TALLY="${CARGO_TARGET_DIR:-$ROOT/target}/release/tally"
FPW="${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/flush_per_write"
RECOVERY="${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/recovery_time"

NBDKIT_PIDS=()
stop_servers() {
  for pid in "${NBDKIT_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  NBDKIT_PIDS=()
}
cleanup() {
  stop_servers
  rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$WORK" "$OUT_DATA"
if [ "$KEEP" = 1 ]; then
  echo "--- KEEP=1 rerun, $(date -u '+%F %T UTC'): DELAYS=$DELAYS TARGET_COUNTS=$TARGET_COUNTS LOCAL=$LOCAL" \
    >>"$OUT_DATA/commands.txt"
else
  rm -f "$OUT_DATA"/*.json
  : >"$OUT_DATA/commands.txt"
  : >"$OUT_DATA/machine.txt"
fi
{
  echo "built from: $BUILT_FROM"
  echo "machine: $(uname -sr) $(uname -m), $(nproc) CPUs, $(nbdkit --version)"
  echo "start load: $(cut -d' ' -f1-3 /proc/loadavg)"
} >>"$OUT_DATA/machine.txt"

# serve DELAY COUNT: COUNT nbdkit servers (multi-conn), each on its own Unix socket and file of
# $SIZE: the file plugin with writes delayed DELAY ms, or, with DELAY_US set, bench/delayfile.c
# holding every request DELAY µs. URIS: their URIs, space-separated.
serve() {
  stop_servers
  local filters=() params=() uris=() plugin=(file)
  if [ -n "$DELAY_US" ]; then
    plugin=(cc "$ROOT/bench/delayfile.c"); params=("delay_us=$1")
  elif [ "$1" != 0 ]; then
    filters=(--filter=delay); params=("delay-write=${1}ms")
  fi
  for i in $(seq 0 $(($2 - 1))); do
    rm -f "$WORK/s$i.sock" "$WORK/s$i.pid" "$WORK/export$i.img"
    truncate -s "$SIZE" "$WORK/export$i.img"
    nbdkit -f -U "$WORK/s$i.sock" -P "$WORK/s$i.pid" "${filters[@]}" "${plugin[@]}" \
      "file=$WORK/export$i.img" "${params[@]}" &
    NBDKIT_PIDS+=($!)
    for _ in $(seq 200); do [ -s "$WORK/s$i.pid" ] && break; sleep 0.05; done
    uris+=("nbd+unix:///?socket=$WORK/s$i.sock")
  done
  URIS="${uris[*]}"
}

# baseline NAME: the flush-per-write baseline on the current servers, JSON to NAME.json.
baseline() {
  echo "$1: flush_per_write --threads $THREADS --blocks $BLOCKS --seconds $SECS (load $(cut -d' ' -f1 /proc/loadavg))" \
    | tee -a "$OUT_DATA/commands.txt" >&2
  # shellcheck disable=SC2086 # URIS is a list
  "$FPW" --threads "$THREADS" --blocks "$BLOCKS" --seconds "$SECS" --stripe 256 $URIS >"$OUT_DATA/$1.json"
}

# run NAME ARGS...: one `tally bench tx`, JSON to NAME.json, command and load logged.
run() {
  local name=$1; shift
  echo "$name: tally bench tx $* (load $(cut -d' ' -f1 /proc/loadavg))" | tee -a "$OUT_DATA/commands.txt" >&2
  "$TALLY" bench tx --json --threads "$THREADS" --blocks "$BLOCKS" --seconds "$SECS" \
    --runs "$RUNS" --modes "$MODES" "$@" >"$OUT_DATA/$name.json"
}

# Interleaved: local, then each remote configuration, so drift is spread over all of them.
if [ -n "$DELAY_US" ]; then DELAY_LIST=$DELAY_US; UNIT=us; else DELAY_LIST=$DELAYS; UNIT=ms; fi
for THREADS in ${THREADS_LIST:-$THREADS}; do
  for BLOCKS in ${BLOCKS_LIST:-1}; do
    # Names keep their old form when neither list is given.
    tag=""
    if [ -n "$THREADS_LIST$BLOCKS_LIST" ]; then tag="-${THREADS}th-$((BLOCKS * 4))k"; fi
    [ "$LOCAL" = 0 ] || run "local$tag" --path "$WORK/local.img" --size "$SIZE"
    for d in $DELAY_LIST; do
      for n in $TARGET_COUNTS; do
        serve "$d" "$n"
        run "nbd-d${d}${UNIT}-${n}t$tag" --path "$URIS" --force
        baseline "fpw-d${d}${UNIT}-${n}t$tag"
        if [ "$n" = 1 ] && [ "$ONE_CONN" = 1 ]; then
          run "nbd-d${d}${UNIT}-1t-one-conn$tag" --path "$URIS" --force --connections 1
        fi
      done
    done
  done
done
if [ "$RECOVERY_MIB" != 0 ]; then
  echo "recovery-local: recovery_time --mib $RECOVERY_MIB --file (load $(cut -d' ' -f1 /proc/loadavg))" \
    | tee -a "$OUT_DATA/commands.txt" >&2
  rm -f "$WORK/recovery.img"
  truncate -s "$((RECOVERY_MIB * 2))M" "$WORK/recovery.img"
  "$RECOVERY" --mib "$RECOVERY_MIB" --file "$WORK/recovery.img" >"$OUT_DATA/recovery-local.json"
  rm -f "$WORK/recovery.img"
  for n in 1 3; do
    SIZE="$((RECOVERY_MIB * 2 / n + 64))M" serve 0 "$n"
    echo "recovery-${n}t: recovery_time --mib $RECOVERY_MIB (load $(cut -d' ' -f1 /proc/loadavg))" \
      | tee -a "$OUT_DATA/commands.txt" >&2
    # shellcheck disable=SC2086 # URIS is a list
    "$RECOVERY" --mib "$RECOVERY_MIB" $URIS >"$OUT_DATA/recovery-${n}t.json"
  done
  stop_servers
  rm -f "$WORK"/export*.img
fi
echo "end load: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT_DATA/machine.txt"

python3 - "$OUT_DATA" >"$OUT_DATA/table.md" <<'PY'
import json, os, re, sys
d = sys.argv[1]
load = lambda n: json.load(open(os.path.join(d, n + ".json")))
files = sorted(n[:-5] for n in os.listdir(d) if n.endswith(".json"))
# nbd-d<delay><unit>-<n>t[-one-conn][<tag>]; tag = -<threads>th-<KiB>k or empty.
pat = re.compile(r"nbd-d(\d+)(ms|us)-(\d+)t(-one-conn)?(.*)$")
def key(n):
    m = pat.match(n)
    return (m.group(5), int(m.group(1)) * (1000 if m.group(2) == "ms" else 1), int(m.group(3)), m.group(4) or "") if m else None
nbd = sorted((n for n in files if pat.match(n)), key=key)
reps = {n: load(n) for n in nbd}
def mode(r, m):
    return next((x for x in r["modes"] if x["mode"] == m), None) if r else None
def med(m):
    return m["tx_per_sec"]["median"]
ratio = lambda a, b: f"{med(a) / med(b):.2f}" if a and b and med(b) else ""
print("| configuration | mode | tx/s median [min-max] | flushes/tx | submissions/tx | cpu µs/tx | vs local | ordered/orderless | ordered/count | ordered/classic |")
print("|---|---|---|---|---|---|---|---|---|---|")
for n in ["local" + t for t in sorted({key(x)[0] for x in nbd})] + nbd:
    if n not in reps:
        if n + "" in files:
            reps[n] = load(n)
        else:
            continue
    r = reps[n]
    loc = reps.get("local" + (key(n)[0] if key(n) else ""))
    o, ol, c, cl = (mode(r, m) for m in ("ordered", "orderless", "count", "classic"))
    for m in r["modes"]:
        t = m["tx_per_sec"]
        only = lambda x: x if m["mode"] == "ordered" else ""
        print(f"| {n} | {m['mode']} | {t['median']:.0f} [{t['min']:.0f}-{t['max']:.0f}] "
              f"| {m['flushes_per_tx']['median']:.3f} | {m['submissions_per_tx']['median']:.3f} "
              f"| {m['cpu_us_per_tx']['median']:.1f} | {ratio(m, mode(loc, m['mode'])) if not n.startswith('local') else ''} "
              f"| {only(ratio(o, ol))} | {only(ratio(o, c))} | {only(ratio(o, cl))} |")
print()
print("| configuration | flush-per-write tx/s | flushes/tx | cpu µs/tx | ordered / flush-per-write | count / flush-per-write |")
print("|---|---|---|---|---|---|")
for n in nbd:
    f = "fpw-" + n[4:]
    if f not in files:
        continue
    b = load(f)
    o, c = mode(reps[n], "ordered"), mode(reps[n], "count")
    x = lambda m: f"{med(m) / b['tx_per_sec']:.1f}" if m and b["tx_per_sec"] else ""
    print(f"| {n} | {b['tx_per_sec']:.0f} | {b['flushes_per_tx']:.2f} | {b['cpu_us_per_tx']:.1f} | {x(o)} | {x(c)} |")
print()
for n in nbd:
    k = key(n)
    if k[2] != 3 or k[3]:
        continue
    one = reps.get(n.replace("-3t", "-1t", 1))
    for m in ("classic", "count", "ordered", "orderless"):
        a, b = mode(reps[n], m), mode(one, m)
        if a and b:
            print(f"- {n}, {m}: 3 targets / 1 target = {med(a) / med(b):.2f}")
rec = {n[9:]: load(n) for n in files if n.startswith("recovery-")}
if rec:
    print()
    print("| recovery | transactions | log MiB written | MiB read by recovery | write s | recovery s (each run) | median | vs local |")
    print("|---|---|---|---|---|---|---|---|")
    for k in sorted(rec):
        r = rec[k]
        loc = rec.get("local")
        vs = f"{r['recovery_median_s'] / loc['recovery_median_s']:.2f}" if loc else ""
        runs = ", ".join(f"{x:.2f}" for x in r["recovery_s"])
        print(f"| {r['device']} ({r['mib']} MiB) | {r['transactions']} | {r.get('written_mib', '')} | {r.get('read_mib', '')} | {r['write_s']:.1f} | {runs} | {r['recovery_median_s']:.2f} | {vs} |")
print()
print("| configuration | write p50 µs | flush p50 µs | FUA write p50 µs |")
print("|---|---|---|---|")
for n in [x for x in files if x.startswith("local")] + nbd:
    p = load(n).get("probe")
    if p:
        print(f"| {n} | {p['write_4k_p50_us']:.0f} | {p['fdatasync_p50_us']:.0f} | {p['fua_write_p50_us']:.0f} |")
PY
cat "$OUT_DATA/table.md"

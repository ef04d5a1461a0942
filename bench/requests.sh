#!/usr/bin/env bash
# FUSE requests per operation on a Tally mount, and wall time against ext4 on a loop device of
# the same size, in one run (docs/bench/posix.md, "FUSE requests per operation").
#
#   sudo bench/requests.sh [TALLY_BINARY ...]     # default: target/release/tally
#
# For each binary given (e.g. the build before a change and the one after) and for ext4, RUNS
# times (default 3), runs interleaved: a fresh 2 GiB file system, then these workloads in
# order, each timed with a final `tally sync` inside the timed region (plain `sync` never
# reaches a FUSE server; `tally sync` makes the Tally mounts durable, then calls sync(2)), the
# kernel's caches left warm from one to the next (as on a machine in use):
#   untar    tar -x of a tarball of COPIES (default 20) copies of this repository's tree
#            (`git archive HEAD`; 20 copies of 311 entries: 5,180 files, 1,040 directories)
#   clone    git clone (file://, so every object is copied) of a local repository whose one
#            commit holds the same tree
#   status   git status in the clone
#   cp       cp -a of the untarred tree to a new directory on the same file system
#   rm       rm -rf of everything
# After each workload the Tally daemon gets SIGUSR1 and logs its request counts by opcode
# (tally mount --help); the difference from the previous line is that workload's requests.
# Prints one line per measurement and, at the end, per workload: round trips (requests but
# FORGET, which has no reply; median over runs) and the last run's requests by opcode, per
# binary, the median time, the median of the per-run ratios to ext4, and the daemon's median
# CPU time (all its threads), which the machine's load disturbs less than wall time.
# RESULTS=FILE also keeps the measurements as TSV. Files live in $BENCH_DIR (default /var/tmp;
# not tmpfs). Needs root (loop devices, mounts), git, tar, python3.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH_DIR=${BENCH_DIR:-/var/tmp}
RUNS=${RUNS:-3}
COPIES=${COPIES:-20}
[ "$(id -u)" = 0 ] || { echo "bench/requests.sh: needs root (loop devices and mounts)" >&2; exit 2; }
if [ $# -eq 0 ]; then set -- "$ROOT/target/release/tally"; fi
for b in "$@"; do [ -x "$b" ] || { echo "bench/requests.sh: $b is not a program" >&2; exit 2; }; done
# `tally sync` from the last binary given (older builds may not have the command).
SYNC_WITH=${!#}

WORK=$(mktemp -d "$BENCH_DIR/tally-requests.XXXXXX")
. "$ROOT/bench/lib.sh"
trap cleanup_work EXIT
OUT=${RESULTS:-$WORK/results.tsv}
: >"$OUT"

# The tree: COPIES copies of this repository's tree, as a tarball and as a git repository.
make_tree "$COPIES"
ENTRIES=$(tar -tf "$WORK/tree.tar" | grep -cv '^\./$')
FILES=$(find "$WORK/tree" -type f | wc -l)
git -C "$WORK/tree" init -q
git -C "$WORK/tree" add -A
git -C "$WORK/tree" -c user.name=bench -c user.email=bench@localhost commit -q -m tree
rm -rf "$WORK/tree.git"
git clone -q --bare "$WORK/tree" "$WORK/tree.git"
rm -rf "$WORK/tree"
echo "tree: $ENTRIES entries ($FILES files), $(du -sh "$WORK/tree.tar" | cut -f1) as a tarball"

# mount_sys NAME: a fresh 2 GiB file system for NAME ("ext4" or a tally binary) on $WORK/mnt.
mount_sys() {
  rm -f "$WORK/img" "$WORK/daemon.log"
  if [ "$1" = ext4 ]; then
    truncate -s 2G "$WORK/img"
    mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$WORK/img"
    LOOP=$(losetup -f --show "$WORK/img")
    mount "$LOOP" "$WORK/mnt"
  else
    "$1" mkfs "$WORK/img" --size 2G >/dev/null
    DAEMON=$("$1" mount "$WORK/img" "$WORK/mnt" --log "$WORK/daemon.log" |
      sed -n 's/.*daemon pid \([0-9]*\).*/\1/p')
  fi
}

umount_sys() {
  if [ "$1" = ext4 ]; then
    umount "$WORK/mnt"
    losetup -d "$LOOP"
  else
    "$1" umount "$WORK/mnt" >/dev/null
  fi
}

# timed CMD...: the wall time of CMD followed by `tally sync` (of the newest binary given: it
# syncs every Tally mount, then calls sync(2)), in seconds; fails if CMD does.
timed() {
  local t0 t1
  t0=$(date +%s.%N)
  "$@" >/dev/null
  "$SYNC_WITH" sync >/dev/null
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc -l | xargs printf '%.3f\n'
}

# requests NAME: the Tally daemon's request counts now, as logged on SIGUSR1 ("total N: OP n,
# ..."); "-" for ext4.
requests() {
  if [ "$1" = ext4 ]; then echo -; return; fi
  local before
  before=$(grep -c 'FUSE requests since mount' "$WORK/daemon.log" || true)
  kill -USR1 "$DAEMON"
  for _ in $(seq 500); do
    [ "$(grep -c 'FUSE requests since mount' "$WORK/daemon.log" || true)" -gt "$before" ] && break
    sleep 0.01
  done
  grep 'FUSE requests since mount' "$WORK/daemon.log" | tail -1 | sed 's/.*FUSE requests since mount: //'
}

# cpu_ms NAME: CPU time (user + system, all threads, io_uring workers included) of the Tally
# daemon so far, in ms, which the machine's load disturbs less than wall time; "-" for ext4.
cpu_ms() {
  if [ "$1" = ext4 ]; then echo -; return; fi
  awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) * 1000 / hz}' "/proc/$DAEMON/stat"
}

label() { if [ "$1" = ext4 ]; then echo ext4; else echo "tally:$(basename "$1")"; fi; }

untar() { tar -xf "$WORK/tree.tar" -C "$WORK/mnt/untar"; }
clone() { git clone -q "file://$WORK/tree.git" "$WORK/mnt/clone"; }
status() { git -C "$WORK/mnt/clone" status --porcelain; }
copy() { cp -a "$WORK/mnt/untar" "$WORK/mnt/copy"; }
remove() { rm -rf "$WORK/mnt/untar" "$WORK/mnt/clone" "$WORK/mnt/copy"; }

for run in $(seq "$RUNS"); do
  for sys in "$@" ext4; do
    mount_sys "$sys"
    mkdir "$WORK/mnt/untar"
    last=$(requests "$sys")
    for w in untar clone status cp rm; do
      c0=$(cpu_ms "$sys")
      case $w in
        untar) t=$(timed untar) ;;
        clone) t=$(timed clone) ;;
        status) t=$(timed status) ;;
        cp) t=$(timed copy) ;;
        rm) t=$(timed remove) ;;
      esac
      c1=$(cpu_ms "$sys")
      cpu=-
      [ "$c0" = - ] || cpu=$(echo "$c1 - $c0" | bc)
      now=$(requests "$sys")
      printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$(label "$sys")" "$run" "$w" "$t" "$cpu" "$last" "$now" | tee -a "$OUT"
      last=$now
    done
    umount_sys "$sys"
  done
done

echo "== $COPIES copies of the tree: $ENTRIES entries ($FILES files); $RUNS runs"
echo "== machine: $(nproc) cores ($(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)), $(free -g | awk '/^Mem:/ {print $2}') GiB, Linux $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$OUT" "$ENTRIES" <<'PY'
import collections, re, statistics, sys

entries = int(sys.argv[2])
def counts(field):
    if field == "-":
        return None
    total = int(re.match(r"total (\d+)", field).group(1))
    ops = {op: int(n) for op, n in re.findall(r"([A-Z_]+) (\d+)", field.split(":", 1)[1] if ":" in field else "")}
    return total, ops

times = collections.defaultdict(dict)    # (workload, system) -> run -> seconds
cpus = collections.defaultdict(list)     # (workload, system) -> daemon CPU ms
reqs = collections.defaultdict(list)     # (workload, system) -> [(total, ops)]
order = []
for line in open(sys.argv[1]):
    sys_, run, w, t, cpu, before, after = line.rstrip("\n").split("\t")
    if cpu != "-":
        cpus[(w, sys_)].append(float(cpu))
    if w not in order:
        order.append(w)
    times[(w, sys_)][run] = float(t)
    b, a = counts(before), counts(after)
    if a is not None:
        ops = {op: n - b[1].get(op, 0) for op, n in a[1].items() if n - b[1].get(op, 0)}
        reqs[(w, sys_)].append((a[0] - b[0], ops))

systems = sorted({s for (_, s) in times})
for w in order:
    print(f"-- {w}")
    ext4 = times.get((w, "ext4"), {})
    for s in systems:
        ts = times[(w, s)]
        med = statistics.median(ts.values())
        line = f"   {s:40} {med:8.3f} s"
        if s != "ext4" and ext4:
            ratios = [ts[r] / ext4[r] for r in ts if r in ext4]
            line += f"  {statistics.median(ratios):5.2f}x ext4 ({min(ratios):.2f}-{max(ratios):.2f})"
        if cpus.get((w, s)):
            line += f"  daemon CPU {statistics.median(cpus[(w, s)]):.0f} ms"
        if reqs.get((w, s)):
            # FORGET is a one-way message (no reply), counted per inode: not a round trip.
            trips = statistics.median(t - ops.get("FORGET", 0) for t, ops in reqs[(w, s)])
            ops = reqs[(w, s)][-1][1]
            top = ", ".join(f"{op} {n}" for op, n in sorted(ops.items(), key=lambda x: -x[1]))
            # rm removes three trees: the untarred one, the clone and the copy.
            n = entries * (3 if w == "rm" else 1)
            line += f"  round trips {trips:.0f} ({trips / n:.2f} per entry): {top}"
        print(line)
PY

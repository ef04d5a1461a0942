#!/usr/bin/env bash
# Issue 17's SQLite benchmarks in one run (docs/bench/sqlite.md): SQLite batch-atomic on a Tally
# mount, on the Tally library VFS, rollback and WAL on a Tally mount without the F2FS ioctls
# (-o no_atomic_write), rollback and WAL on ext4 (data=ordered).
#
#   sudo bench/sqlite_mount.sh            # ROUNDS=3 SECONDS_EACH=5 SPEED_SIZE=10 ATTACH_CMDS=30 WORKLOADS=...
#
# Every configuration gets a fresh loop device over a 256 MiB image file written with zeros
# in $BENCH_DIR (default /var/tmp; the host's file system, not tmpfs), so that Tally (mount or
# library, which opens the loop device O_DIRECT itself) and ext4 sit on identical devices, and
# flushes and bytes written are read the same way for all: from the loop device's
# /sys/dev/block/MAJ:MIN/stat over the measuring window (for the library the Tally device's
# own counters are printed beside them). Workloads (crates/tally-sqlite/examples/sqlite_bench.rs,
# synchronous=FULL, 50 warm-up commits, SECONDS_EACH seconds):
#   small   1-4 rows of ~100 bytes inserted or updated per commit
#   mix     a phone app's mix of inserts, updates and deletes over four tables
#           (both also with locking_mode=EXCLUSIVE on the library and for WAL on ext4: one
#           connection owning its database, as an embedded program's does)
#   attach  two databases (main + ATTACH): tally_sqlite::atomic on the library VFS (one Tally
#           transaction) against SQLite's super-journal commit (rollback mode) on ext4 and on
#           the mount, and WAL (not atomic across the files)
#   speedtest1  SQLite's own speedtest1.c (Debian's SQLite 3.40.1 source, as bench/mount.sh)
#           compiled against this workspace's SQLite amalgamation (libsqlite3-sys, in
#           ~/.cargo/registry) with -DSQLITE_ENABLE_BATCH_ATOMIC_WRITE, --size SPEED_SIZE; and
#           on the library VFS: speedtest1.c's main linked into
#           crates/tally-sqlite/examples/speedtest1_vfs.rs (the very SQLite rusqlite links,
#           the Tally VFS registered, --vfs tally)
#   tally atomic  Debian's sqlite3 shell, ATTACH_CMDS invocations each committing one transfer
#           across two databases: inside `tally atomic DIR --` (journal_mode=MEMORY) on the
#           mount, against the same command's super-journal commit on ext4 and on the mount
# The commit workloads run ROUNDS times, configurations interleaved inside each round (this
# machine's flush latency drifts over minutes: only ratios within a round mean anything).
# Prints a table per workload with the medians of commits/s, flushes and device KiB per
# commit, and the ratios the issue sets targets for (median of the per-round ratios, [min-max]).
# RESULTS=FILE also writes the raw lines (TSV).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH_DIR=${BENCH_DIR:-/var/tmp}
BENCH_CACHE=${BENCH_CACHE:-/var/tmp/tally-bench-cache}
SECONDS_EACH=${SECONDS_EACH:-${1:-5}}
SPEED_SIZE=${SPEED_SIZE:-10}
ATTACH_CMDS=${ATTACH_CMDS:-30}
ROUNDS=${ROUNDS:-3}
WORKLOADS=${WORKLOADS:-"small mix attach speedtest1 atomic-cli"}
[ "$(id -u)" = 0 ] || { echo "bench/sqlite_mount.sh: needs root (loop devices and mounts)" >&2; exit 2; }
# SKIP_BUILD=1: use the binaries already in target/release.
[ -n "${SKIP_BUILD:-}" ] ||
  (cd "$ROOT" && cargo build --release -q -p tally && cargo build --release -q -p tally-sqlite --example sqlite_bench)
TALLY=$ROOT/target/release/tally
RUNNER=$ROOT/target/release/examples/sqlite_bench

WORK=$(mktemp -d "$BENCH_DIR/tally-sqlite-bench.XXXXXX")
. "$ROOT/bench/lib.sh"
trap cleanup_work EXIT
RAW=$WORK/results.tsv
: >"$RAW"

# speedtest1 against the workspace's SQLite, with batch atomic writes compiled in.
SPEED=$BENCH_CACHE/speedtest1-batch
if [[ " $WORKLOADS " == *" speedtest1 "* && ! -x $SPEED ]]; then
  mkdir -p "$BENCH_CACHE"
  [ -f "$BENCH_CACHE/sqlite3_3.40.1.orig.tar.xz" ] ||
    curl -sfo "$BENCH_CACHE/sqlite3_3.40.1.orig.tar.xz" \
      http://deb.debian.org/debian/pool/main/s/sqlite3/sqlite3_3.40.1.orig.tar.xz
  [ -f "$BENCH_CACHE/sqlite3-3.40.1/test/speedtest1.c" ] ||
    tar -xJf "$BENCH_CACHE/sqlite3_3.40.1.orig.tar.xz" -C "$BENCH_CACHE" --wildcards '*/test/speedtest1.c'
  AMALG=$(ls -d "$HOME"/.cargo/registry/src/*/libsqlite3-sys-*/sqlite3 | sort -V | tail -1)
  echo "building speedtest1 against $(basename "$(dirname "$AMALG")")'s SQLite with batch atomic writes" >&2
  gcc -O2 -DSQLITE_ENABLE_BATCH_ATOMIC_WRITE -DSQLITE_THREADSAFE=0 -I"$AMALG" -o "$SPEED" \
    "$BENCH_CACHE/sqlite3-3.40.1/test/speedtest1.c" "$AMALG/sqlite3.c" -lm
fi
# speedtest1 on the library VFS: its main() as speedtest1_main in a static library, linked into
# the Rust example (which registers the VFS) with the SQLite that rusqlite links.
SPEED_LIB=$WORK/speedtest1-tally-vfs
if [[ " $WORKLOADS " == *" speedtest1 "* ]]; then
  AMALG=$(ls -d "$HOME"/.cargo/registry/src/*/libsqlite3-sys-*/sqlite3 | sort -V | tail -1)
  gcc -O2 -c -Dmain=speedtest1_main -I"$AMALG" -o "$WORK/speedtest1.o" \
    "$BENCH_CACHE/sqlite3-3.40.1/test/speedtest1.c"
  ar rcs "$WORK/libspeedtest1.a" "$WORK/speedtest1.o"
  (cd "$ROOT" && cargo rustc --release -q -p tally-sqlite --example speedtest1_vfs -- \
    -L "native=$WORK" -l static=speedtest1 --cfg speedtest1)
  cp "$ROOT/target/release/examples/speedtest1_vfs" "$SPEED_LIB"
fi

LOOP= STAT= DAEMON= MNT=$WORK/mnt
mkdir -p "$MNT"
new_loop() { # a fresh loop device over zeros: sets LOOP and STAT
  rm -f "$WORK/dev.img"
  dd if=/dev/zero of="$WORK/dev.img" bs=1M count=256 conv=fsync status=none
  LOOP=$(losetup -f --show "$WORK/dev.img")
  STAT=/sys/dev/block/$(cat "/sys/block/${LOOP#/dev/}/dev")/stat
}
drop_loop() { losetup -d "$LOOP"; rm -f "$WORK/dev.img"; }
mount_sys() { # SYS: ext4 | fuse | fuse-noatomic (on $LOOP, at $MNT)
  case $1 in
    # Inode tables and journal zeroed by mkfs: left to ext4lazyinit, ~17 MB of background
    # writes land in the first seconds after mount, inside the measuring window.
    ext4) mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$LOOP"
      mount -o data=ordered "$LOOP" "$MNT" ;;
    fuse*)
      "$TALLY" mkfs "$LOOP" --force >/dev/null
      local opt=; [ "$1" = fuse-noatomic ] && opt="-o no_atomic_write"
      DAEMON=$("$TALLY" mount --log "$WORK/daemon.log" $opt "$LOOP" "$MNT" |
        sed -n 's/.*daemon pid \([0-9]*\).*/\1/p') ;;
  esac
}
umount_sys() { case $1 in ext4) umount "$MNT" ;; fuse*) "$TALLY" umount "$MNT" >/dev/null ;; esac; }
blk() { awk '{printf "%.0f %.0f\n", $16, $7 * 512}' "$STAT"; } # flushes, bytes written

run_bench() { # WORKLOAD SYS MODE   (SYS: lib ext4 fuse fuse-noatomic)
  local w=$1 sys=$2 mode=$3 line
  new_loop
  if [ "$sys" = lib ]; then
    line=$(SQLITE_BENCH_STAT=$STAT "$RUNNER" "$w" "$mode" "lib:$LOOP" "$SECONDS_EACH")
  else
    mount_sys "$sys"
    line=$(SQLITE_BENCH_STAT=$STAT "$RUNNER" "$w" "$mode" "$MNT" "$SECONDS_EACH")
    umount_sys "$sys"
  fi
  drop_loop
  printf '%s\t%s\t%s\t%s round %s\n' "$w" "$sys" "$mode" "$line" "$ROUND" | tee -a "$RAW" >&2
}

run_speedtest() { # SYS MODE
  local sys=$1 mode=$2 b0 b1 total out
  if [ "$sys" = lib ]; then
    # The Tally counters from mount to the end (after speedtest1's own sync and the final one).
    new_loop
    out=$("$SPEED_LIB" "$LOOP" --size "$SPEED_SIZE" --journal "$mode")
    drop_loop
    total=$(awk '/TOTAL/ {gsub("s", "", $NF); print $NF}' <<<"$out")
    set -- $(awk '/^tally / {print $3, $5, $9, $11, $19, $21}' <<<"$out")
    printf 'speedtest1\tlib\t%s\tseconds %s blk_flushes %s blk_bytes %s txns %s batches %s vfs_bytes %s\n' \
      "$mode" "$total" "$1" "$2" "$3" "$4" "$6" | tee -a "$RAW" >&2
    return
  fi
  new_loop; mount_sys "$sys"
  b0=$(blk)
  total=$("$SPEED" --size "$SPEED_SIZE" --journal "$mode" "$MNT/speedtest1.db" | awk '/TOTAL/ {gsub("s", "", $NF); print $NF}')
  "$TALLY" sync "$MNT"  # plain sync does not reach a FUSE server; syncfs elsewhere
  b1=$(blk)
  umount_sys "$sys"; drop_loop
  set -- $b0 $b1
  printf 'speedtest1\t%s\t%s\tseconds %s blk_flushes %s blk_bytes %s\n' "$sys" "$mode" "$total" \
    $(($3 - $1)) $(($4 - $2)) | tee -a "$RAW" >&2
}

run_atomic_cli() { # SYS HOW   (HOW: tally-atomic | plain) Debian's sqlite3, one commit per process
  local sys=$1 how=$2 b0 b1 t0 t1
  new_loop; mount_sys "$sys"
  sqlite3 "$MNT/a.db" "ATTACH '$MNT/b.db' AS b; CREATE TABLE acct(id INTEGER PRIMARY KEY, bal);
    CREATE TABLE b.acct(id INTEGER PRIMARY KEY, bal); INSERT INTO acct VALUES (1, 1000);
    INSERT INTO b.acct VALUES (1, 1000);"
  local sql="UPDATE acct SET bal = bal - 1; UPDATE b.acct SET bal = bal + 1; COMMIT;"
  b0=$(blk); t0=$(date +%s.%N)
  for _ in $(seq "$ATTACH_CMDS"); do
    if [ "$how" = tally-atomic ]; then
      "$TALLY" atomic "$MNT" -- sqlite3 "$MNT/a.db" "PRAGMA journal_mode=MEMORY; PRAGMA synchronous=FULL;
        ATTACH '$MNT/b.db' AS b; PRAGMA b.journal_mode=MEMORY; BEGIN; $sql" >/dev/null
    else
      sqlite3 "$MNT/a.db" "PRAGMA synchronous=FULL; ATTACH '$MNT/b.db' AS b; BEGIN; $sql" >/dev/null
    fi
  done
  t1=$(date +%s.%N); b1=$(blk)
  local check
  check=$(sqlite3 "$MNT/a.db" "ATTACH '$MNT/b.db' AS b; SELECT (SELECT bal FROM acct) + (SELECT bal FROM b.acct),
    (SELECT count(*) FROM acct), (SELECT * FROM pragma_integrity_check), (SELECT * FROM b.pragma_integrity_check);" | tr '|' ' ')
  umount_sys "$sys"; drop_loop
  set -- $b0 $b1
  printf 'atomic-cli\t%s\t%s\tcommits %s seconds %s blk_flushes %s blk_bytes %s check %s\n' "$sys" "$how" \
    "$ATTACH_CMDS" "$(echo "$t1 - $t0" | bc -l)" $(($3 - $1)) $(($4 - $2)) "${check// /,}" | tee -a "$RAW" >&2
}

load() { uptime | sed 's/.*load average: //'; }
echo "load before: $(load); $(nproc) CPUs; $(uname -sr)" | tee "$WORK/load" >&2
ROUND=1
for ROUND in $(seq "$ROUNDS"); do
for w in $WORKLOADS; do
  case $w in
    small | mix)
      run_bench "$w" fuse delete
      run_bench "$w" lib delete
      run_bench "$w" lib delete+excl
      run_bench "$w" fuse-noatomic delete
      run_bench "$w" fuse-noatomic wal
      run_bench "$w" ext4 delete
      run_bench "$w" ext4 wal
      run_bench "$w" ext4 wal+excl ;;
    attach)
      run_bench attach lib atomic
      run_bench attach lib delete
      run_bench attach fuse delete
      run_bench attach ext4 delete
      run_bench attach ext4 wal ;;
  esac
done
done
for w in $WORKLOADS; do
  case $w in
    speedtest1)
      run_speedtest lib delete
      run_speedtest fuse delete
      run_speedtest fuse-noatomic delete
      run_speedtest fuse-noatomic wal
      run_speedtest ext4 delete
      run_speedtest ext4 wal ;;
    atomic-cli)
      run_atomic_cli fuse tally-atomic
      run_atomic_cli fuse plain
      run_atomic_cli ext4 plain ;;
  esac
done
echo "load after: $(load)" | tee -a "$WORK/load" >&2
[ -n "${RESULTS:-}" ] && cp "$RAW" "$RESULTS"

python3 - "$RAW" "$WORK/load" <<'PY'
import sys
import statistics
rows, runs = {}, {}
for line in open(sys.argv[1]):
    w, sysname, mode, rest = line.rstrip("\n").split("\t")
    f = rest.split()
    r = {f[i]: f[i + 1] for i in range(0, len(f) - 1, 2)}
    rows[(w, sysname, mode)] = r
    runs.setdefault((w, sysname, mode), []).append(r)
med = statistics.median
print("".join(open(sys.argv[2])))
names = {("fuse", "delete"): "Tally-FUSE, batch-atomic", ("lib", "delete"): "Tally library VFS (batch-atomic)",
         ("fuse-noatomic", "delete"): "Tally-FUSE, rollback, no ioctls", ("fuse-noatomic", "wal"): "Tally-FUSE, WAL, no ioctls",
         ("ext4", "delete"): "ext4, rollback", ("ext4", "wal"): "ext4, WAL", ("lib", "atomic"): "Tally library, tally_sqlite::atomic",
         ("fuse", "wal"): "Tally-FUSE, WAL", ("lib", "delete+excl"): "Tally library VFS, locking_mode=EXCLUSIVE",
         ("ext4", "wal+excl"): "ext4, WAL, locking_mode=EXCLUSIVE"}
def rate(r): return float(r["commits"]) / float(r["seconds"])
def per(r, k): return int(r[k]) / int(r["commits"])
for w in ("small", "mix", "attach"):
    sel = {k[1:]: v for k, v in runs.items() if k[0] == w}
    if not sel: continue
    print(f"### {w}\n\n| configuration | commits/s (median [min-max] of {len(next(iter(sel.values())))}) | flushes/commit | device KiB/commit | SQLite writes (KiB)/commit, Tally submissions/commit |\n|---|--:|--:|--:|--:|")
    for (s, m), rs in sel.items():
        name = names.get((s, m), f"{s} {m}")
        if w == "attach" and m == "delete": name = {"lib": "Tally library, super-journal", "fuse": "Tally-FUSE, super-journal", "ext4": "ext4, super-journal"}[s]
        if w == "attach" and m == "wal": name += " (not atomic across files)"
        rates = sorted(rate(r) for r in rs)
        extra = "-"
        if "vfs_writes" in rs[0]:
            extra = f"{med(per(r, 'vfs_writes') for r in rs):.2f} ({med(per(r, 'vfs_bytes') for r in rs)/1024:.1f}), {med(per(r, 'submissions') for r in rs):.2f}"
        print(f"| {name} | {med(rates):.0f} [{rates[0]:.0f}-{rates[-1]:.0f}] | {med(per(r, 'blk_flushes') for r in rs):.2f} | {med(per(r, 'blk_bytes') for r in rs)/1024:.1f} | {extra} |")
    def spread(v):
        v = sorted(v)
        return f"{med(v):.2f}x [{v[0]:.2f}-{v[-1]:.2f}]"
    def ratio(a, b):
        if a not in sel or b not in sel: return "-"
        return spread(rate(x) / rate(y) for x, y in zip(sel[a], sel[b]))
    def bytes_ratio(a, b):
        if a not in sel or b not in sel: return "-"
        return spread(per(x, "blk_bytes") / per(y, "blk_bytes") for x, y in zip(sel[a], sel[b]))
    print()
    if w == "attach":
        print(f"- atomic (library) / super-journal on ext4: {ratio(('lib','atomic'), ('ext4','delete'))} (target >= 10x, one flush)")
        print(f"- atomic (library) / WAL on ext4: {ratio(('lib','atomic'), ('ext4','wal'))}")
    else:
        print(f"- batch-atomic FUSE / ext4 WAL: {ratio(('fuse','delete'), ('ext4','wal'))} (target >= 2x); / ext4 rollback: {ratio(('fuse','delete'), ('ext4','delete'))} (>= 3x)")
        print(f"- library VFS / ext4 WAL: {ratio(('lib','delete'), ('ext4','wal'))} (target >= 5x); / ext4 rollback: {ratio(('lib','delete'), ('ext4','delete'))}")
        print(f"- library VFS, exclusive / ext4 WAL: {ratio(('lib','delete+excl'), ('ext4','wal'))}; / ext4 WAL, exclusive: {ratio(('lib','delete+excl'), ('ext4','wal+excl'))}")
        print(f"- device bytes per commit, library exclusive / ext4 WAL: {bytes_ratio(('lib','delete+excl'), ('ext4','wal'))}; / ext4 WAL exclusive: {bytes_ratio(('lib','delete+excl'), ('ext4','wal+excl'))}")
        print(f"- device bytes per commit, batch-atomic FUSE / ext4 WAL: {bytes_ratio(('fuse','delete'), ('ext4','wal'))} (target <= 0.5); library / ext4 WAL: {bytes_ratio(('lib','delete'), ('ext4','wal'))}")
    print()
sp = {k[1:]: v for k, v in rows.items() if k[0] == "speedtest1"}
if sp:
    print("### speedtest1\n\n| configuration | seconds | x ext4 rollback time | flushes | device MiB |\n|---|--:|--:|--:|--:|")
    base = float(sp[("ext4", "delete")]["seconds"]) if ("ext4", "delete") in sp else None
    for (s, m), r in sp.items():
        t = float(r["seconds"])
        name = "Tally library VFS (batch-atomic)" if s == "lib" else names.get((s, m), s + ' ' + m)
        if s == "lib": name += f" [{r['txns']} Tally transactions, {r['batches']} batches, SQLite wrote {int(r['vfs_bytes'])/2**20:.0f} MiB]"
        print(f"| {name} | {t:.2f} | {t / base if base else 0:.2f} | {r['blk_flushes']} | {int(r['blk_bytes'])/2**20:.0f} |")
    print()
cli = {k[1:]: v for k, v in rows.items() if k[0] == "atomic-cli"}
if cli:
    print("### Debian's sqlite3, one 2-database commit per process\n\n| configuration | ms/commit | flushes/commit | device KiB/commit | sum, rows, integrity |\n|---|--:|--:|--:|---|")
    for (s, m), r in cli.items():
        n = int(r["commits"])
        print(f"| {s} {m} | {float(r['seconds'])*1000/n:.1f} | {int(r['blk_flushes'])/n:.2f} | {int(r['blk_bytes'])/n/1024:.1f} | {r['check']} |")
PY

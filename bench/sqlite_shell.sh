#!/usr/bin/env bash
# SQLite's own sqlite3 shell with batch atomic writes (issue 17): on a `tally mount` its
# rollback-mode commits go through F2FS's atomic-write ioctls, one flush and no -journal file.
# Debian's sqlite3 (and libsqlite3) is built without SQLITE_ENABLE_BATCH_ATOMIC_WRITE and
# journals every commit.
#
#   bench/sqlite_shell.sh [OUT]      # builds OUT (default: target/sqlite3-batch)
#   target/sqlite3-batch /mnt/tally/app.db
#
# The library is the amalgamation of the libsqlite3-sys crate this workspace locks (the very
# SQLite rusqlite links, so the tests and benchmarks run the same one); libsqlite3-sys does not
# ship SQLite's shell, so shell.c is generated from Debian's SQLite 3.40.1 source
# (src/shell.c.in, tool/mkshellc.tcl: needs tclsh) — an older shell on the newer library, which
# keeps its API. `PRAGMA compile_options` lists ENABLE_BATCH_ATOMIC_WRITE.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-$ROOT/target/sqlite3-batch}
BENCH_CACHE=${BENCH_CACHE:-/var/tmp/tally-bench-cache}
SRC=$BENCH_CACHE/sqlite3-3.40.1
command -v tclsh >/dev/null || { echo "needs tclsh (apt-get install tcl)" >&2; exit 1; }
command -v gcc >/dev/null || { echo "needs gcc" >&2; exit 1; }

mkdir -p "$BENCH_CACHE"
[ -f "$BENCH_CACHE/sqlite3_3.40.1.orig.tar.xz" ] ||
  curl -sfo "$BENCH_CACHE/sqlite3_3.40.1.orig.tar.xz" \
    http://deb.debian.org/debian/pool/main/s/sqlite3/sqlite3_3.40.1.orig.tar.xz
[ -f "$SRC/src/shell.c.in" ] && [ -f "$SRC/tool/mkshellc.tcl" ] ||
  tar -xJf "$BENCH_CACHE/sqlite3_3.40.1.orig.tar.xz" -C "$BENCH_CACHE" \
    sqlite3-3.40.1/src sqlite3-3.40.1/ext sqlite3-3.40.1/tool

# The amalgamation Cargo.lock selects.
AMALG=$(cd "$ROOT" && cargo metadata --format-version 1 --locked 2>/dev/null |
  python3 -c 'import json, os, sys
pkgs = json.load(sys.stdin)["packages"]
print(next(os.path.dirname(p["manifest_path"]) for p in pkgs if p["name"] == "libsqlite3-sys"))')/sqlite3
[ -f "$AMALG/sqlite3.c" ] || { echo "no amalgamation at $AMALG (cargo fetch first)" >&2; exit 1; }

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
(cd "$SRC" && tclsh tool/mkshellc.tcl) >"$WORK/shell.c"
echo "building $OUT: SQLite $(sed -n 's/^#define SQLITE_VERSION *"\(.*\)"/\1/p' "$AMALG/sqlite3.h") \
($(basename "$(dirname "$AMALG")")) with SQLITE_ENABLE_BATCH_ATOMIC_WRITE, Debian's 3.40.1 shell" >&2
mkdir -p "$(dirname "$OUT")"
gcc -O2 -DSQLITE_ENABLE_BATCH_ATOMIC_WRITE -I"$AMALG" -o "$OUT" \
  "$WORK/shell.c" "$AMALG/sqlite3.c" -lm -lpthread -ldl
"$OUT" :memory: 'PRAGMA compile_options' | grep -qx ENABLE_BATCH_ATOMIC_WRITE
echo "$OUT" >&2

#!/usr/bin/env python3
"""A workload shaped like SQLite's speedtest1 main test set, for file systems.

    bench/sqlite_speed.py DATABASE [--size N]     # N as speedtest1's --size (default 100)

speedtest1 itself is built from SQLite's source tree (test/speedtest1.c), which no package
this project installs carries; this is an equivalent written here on Python's sqlite3 module
(the system SQLite): the same steps, numbered as speedtest1 numbers them, with the same row
counts (size 100: 50,000-row tables) and the same shape of statements (each step one
transaction; default journal mode DELETE, synchronous FULL, 4 KiB pages, a 2,000-page cache),
not the same SQL text or random numbers. Prints one line per step (number, name, seconds) and
the total; the step "280 DELETEs of individual rows" is the one issue 14 names.
"""

import argparse
import os
import sqlite3
import sys
import time

ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
        "fourteen fifteen sixteen seventeen eighteen nineteen").split()
TENS = "_ ten twenty thirty forty fifty sixty seventy eighty ninety".split()


def number_name(n):
    """English words for n (as speedtest1 fills its text columns)."""
    out = []
    for div, word in ((1_000_000_000, "billion"), (1_000_000, "million"), (1000, "thousand")):
        if n >= div:
            out += [number_name(n // div), word]
            n %= div
    if n >= 100:
        out += [ONES[n // 100], "hundred"]
        n %= 100
    if n >= 20:
        out.append(TENS[n // 10])
        n %= 10
    if n > 0:
        out.append(ONES[n])
    return " ".join(out) if out else "zero"


class Rand:
    """A fixed pseudo-random sequence (same numbers every run)."""

    def __init__(self):
        self.x = 0xAD131D0B

    def next(self):
        self.x = (self.x * 1103515245 + 12345) & 0xFFFFFFFF
        return self.x >> 1


def swizzle(i, limit):
    """Map 1..limit onto itself in a scattered, invertible order (bit reversal)."""
    out = 0
    while limit:
        out = (out << 1) | (i & 1)
        i >>= 1
        limit >>= 1
    return out


def roundup_allones(limit):
    m = 1
    while m < limit:
        m = (m << 1) + 1
    return m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("database")
    ap.add_argument("--size", type=int, default=100)
    args = ap.parse_args()
    for suffix in ("", "-journal"):
        if os.path.exists(args.database + suffix):
            os.unlink(args.database + suffix)
    db = sqlite3.connect(args.database, isolation_level=None)
    db.execute("PRAGMA page_size=4096")
    db.execute("PRAGMA cache_size=2000")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("PRAGMA journal_mode=DELETE")
    sz = args.size * 500
    maxb = roundup_allones(sz)
    total = 0.0

    def step(num, name, fn):
        nonlocal total
        t0 = time.monotonic()
        db.execute("BEGIN")
        fn()
        db.execute("COMMIT")
        dt = time.monotonic() - t0
        total += dt
        print(f"{num:4d} - {name:<52} {dt:8.3f}s", flush=True)

    rnd = Rand()

    def rows(a_ordered):
        for i in range(1, sz + 1):
            x = swizzle(i, maxb)
            yield (i if a_ordered else x, x, number_name(x))

    def fill(table, a_ordered):
        db.executemany(f"INSERT INTO {table} VALUES(?,?,?)", rows(a_ordered))

    def s100():
        db.execute("CREATE TABLE t1(a INTEGER, b INTEGER, c TEXT)")
        fill("t1", True)

    def s110():
        db.execute("CREATE TABLE t2(a INTEGER PRIMARY KEY, b INTEGER, c TEXT)")
        fill("t2", True)

    def s120():
        db.execute("CREATE TABLE t3(a INTEGER UNIQUE, b INTEGER, c TEXT)")
        fill("t3", False)

    def between(table, col, n, width):
        for _ in range(n):
            lo = rnd.next() % sz
            db.execute(
                f"SELECT count(*), avg(b), sum(length(c)) FROM {table} WHERE {col} BETWEEN ? AND ?",
                (lo, lo + width)).fetchall()

    def like(n, order):
        for i in range(n):
            pat = "%" + number_name(rnd.next() % 1000) + "%"
            db.execute(f"SELECT a, b, c FROM t1 WHERE c LIKE ? {order}", (pat,)).fetchall()

    def s150():
        for sql in ("CREATE UNIQUE INDEX t1b ON t1(b)", "CREATE INDEX t1c ON t1(c)",
                    "CREATE UNIQUE INDEX t2b ON t2(b)", "CREATE INDEX t2c ON t2(c DESC)",
                    "CREATE INDEX t3bc ON t3(b,c)"):
            db.execute(sql)

    def text_between(n):
        for _ in range(n):
            lo = number_name(rnd.next() % sz)
            db.execute("SELECT count(*), avg(b) FROM t1 WHERE c BETWEEN ? AND ? || 'z'",
                       (lo, lo)).fetchall()

    def s180():
        db.execute("CREATE TABLE t4(a INTEGER UNIQUE, b INTEGER UNIQUE, c TEXT, d INTEGER)")
        db.execute("CREATE INDEX t4c ON t4(c)")
        db.execute("INSERT INTO t4 SELECT a, b, c, NULL FROM t1")

    def s190():
        db.execute("DELETE FROM t2")
        db.execute("INSERT INTO t2 SELECT a, b, c FROM t1")

    def s210():
        db.execute("ALTER TABLE t2 ADD COLUMN d DEFAULT 123")
        db.execute("SELECT sum(d) FROM t2").fetchall()

    def s230():
        for _ in range(sz // 5):
            lo = rnd.next() % sz
            db.execute("UPDATE t2 SET d=b*2 WHERE b BETWEEN ? AND ?", (lo, lo + 10))

    def s240():
        for _ in range(sz):
            db.execute("UPDATE t2 SET d=b*3 WHERE a=?", (rnd.next() % sz + 1,))

    def s270():
        for _ in range(sz // 5):
            lo = rnd.next() % sz
            db.execute("DELETE FROM t2 WHERE b BETWEEN ? AND ?", (lo, lo + 10))

    def s280():
        for _ in range(sz):
            db.execute("DELETE FROM t3 WHERE a=?", (rnd.next() % maxb + 1,))

    def s290():
        db.execute("REPLACE INTO t2(a, b, c) SELECT a, b, c FROM t1")
        db.execute("REPLACE INTO t3(a, b, c) SELECT a, b, c FROM t1")

    def s300():
        db.execute("DELETE FROM t2")
        db.execute("INSERT INTO t2(a, b, c) SELECT a, b, c FROM t1 WHERE (b&1)==(a&1)")
        db.execute("INSERT INTO t2(a, b, c) SELECT a, b, c FROM t1 WHERE (b&1)<>(a&1)")

    def s310():
        for _ in range(sz // 5):
            lo = rnd.next() % sz
            db.execute(
                "SELECT t1.c FROM t1, t2, t3, t4 WHERE t4.a BETWEEN ? AND ? + 10 "
                "AND t3.a=t4.b AND t2.a=t3.b AND t1.c=t2.c", (lo, lo)).fetchall()

    def s400():
        db.execute("CREATE TABLE t5(a INTEGER PRIMARY KEY, b)")
        for _ in range(sz * 7 // 5):
            db.execute("REPLACE INTO t5 VALUES(?, ?)", (rnd.next() % sz, rnd.next()))

    def s410():
        for _ in range(sz * 7 // 5):
            db.execute("SELECT b FROM t5 WHERE a=?", (rnd.next() % sz,)).fetchall()

    def s500():
        db.execute("CREATE TABLE t6(a TEXT PRIMARY KEY, b)")
        for _ in range(sz * 7 // 5):
            db.execute("REPLACE INTO t6 VALUES(?, ?)", (number_name(rnd.next() % sz), rnd.next()))

    def s510():
        for _ in range(sz * 7 // 5):
            db.execute("SELECT b FROM t6 WHERE a=?", (number_name(rnd.next() % sz),)).fetchall()

    step(100, f"{sz} INSERTs into table with no index", s100)
    step(110, f"{sz} ordered INSERTS with one index/PK", s110)
    step(120, f"{sz} unordered INSERTS with one index/PK", s120)
    step(130, "25 SELECTS, numeric BETWEEN, unindexed", lambda: between("t1", "b", 25, sz // 100))
    step(140, "10 SELECTS, LIKE, unindexed", lambda: like(10, ""))
    step(142, "10 SELECTS w/ORDER BY, unindexed", lambda: like(10, "ORDER BY c"))
    step(145, "10 SELECTS w/ORDER BY and LIMIT, unindexed", lambda: like(10, "ORDER BY c LIMIT 10"))
    step(150, "CREATE INDEX five times", s150)
    step(160, f"{sz // 5} SELECTS, numeric BETWEEN, indexed",
         lambda: between("t1", "b", sz // 5, 10))
    step(161, f"{sz // 5} SELECTS, numeric BETWEEN, PK", lambda: between("t2", "a", sz // 5, 10))
    step(170, f"{sz // 5} SELECTS, text BETWEEN, indexed", lambda: text_between(sz // 5))
    step(180, f"{sz} INSERTS with three indexes", s180)
    step(190, "DELETE and REFILL one table", s190)
    t0 = time.monotonic()
    db.execute("VACUUM")
    dt = time.monotonic() - t0
    total += dt
    print(f" 200 - {'VACUUM':<52} {dt:8.3f}s", flush=True)
    step(210, "ALTER TABLE ADD COLUMN, and query", s210)
    step(230, f"{sz // 5} UPDATES, numeric BETWEEN, indexed", s230)
    step(240, f"{sz} UPDATES of individual rows", s240)
    step(250, f"One big UPDATE of the whole {sz}-row table",
         lambda: db.execute("UPDATE t2 SET d=b*4"))
    step(260, "Query added column after filling",
         lambda: db.execute("SELECT sum(d) FROM t2").fetchall())
    step(270, f"{sz // 5} DELETEs, numeric BETWEEN, indexed", s270)
    step(280, f"{sz} DELETEs of individual rows", s280)
    step(290, f"Refill two {sz}-row tables using REPLACE", s290)
    step(300, f"Refill a {sz}-row table using (b&1)==(a&1)", s300)
    step(310, f"{sz // 5} four-ways joins", s310)
    step(400, f"{sz * 7 // 5} REPLACE ops on an IPK", s400)
    step(410, f"{sz * 7 // 5} SELECTS on an IPK", s410)
    step(500, f"{sz * 7 // 5} REPLACE on TEXT PK", s500)
    step(510, f"{sz * 7 // 5} SELECTS on a TEXT PK", s510)
    step(980, "PRAGMA integrity_check",
         lambda: db.execute("PRAGMA integrity_check").fetchall())
    step(990, "ANALYZE", lambda: db.execute("ANALYZE"))
    db.close()
    print(f"       {'TOTAL':<52} {total:8.3f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

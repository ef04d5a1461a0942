#!/usr/bin/env python3
"""The table of bench/mount.sh: everyday programs on the Tally mount, ext4 and bindfs.

    bench/mount_report.py RESULTS.tsv --entries N --files N --runs N --machine TEXT ...

RESULTS.tsv has one line per measurement: system, run, workload, value (seconds, or operations
per second for varmail), the Tally daemon's CPU ms ("-" elsewhere), its request counts before
and after ("REQUESTS|SUBMISSIONS", "-|-" elsewhere) and what the counts are per ("-" for a
total). Ratios are speeds relative to ext4 in the same run (ext4's time over the system's, or
the system's operations/s over ext4's): above 1 is faster than ext4. Prints Markdown.
"""

import argparse
import collections
import re
import statistics

# Issue 14's targets: Tally's speed as a fraction of ext4 data=ordered's (median of per-run
# ratios).
TARGETS = {"untar": 0.5, "rm": 0.5, "clone": 0.5, "build": 0.9, "speedtest": 0.7, "varmail": 0.5}
NAMES = {
    "untar": "untar (tar -x)",
    "rm": "rm -rf of it",
    "clone": "git clone (file://)",
    "status": "git status",
    "build": "configure && make (GNU hello)",
    "speedtest": "SQLite speedtest1",
    "varmail": "varmail (ops/s)",
}


def counts(field):
    """(total requests but FORGET, {opcode: n}, device submissions) from 'REQUESTS|SUBS'."""
    reqs, subs = field.split("|")
    if reqs == "-":
        return None
    total = int(re.match(r"total (\d+)", reqs).group(1))
    ops = {op: int(n) for op, n in re.findall(r"([A-Z_0-9]+) (\d+)", reqs.split(":", 1)[-1])}
    return total, ops, int(subs) if subs.isdigit() else 0


def fmt_range(xs):
    return f"{statistics.median(xs):.2f}× [{min(xs):.2f}–{max(xs):.2f}]"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--entries", type=int, required=True)
    ap.add_argument("--files", type=int, required=True)
    ap.add_argument("--runs", type=int, required=True)
    ap.add_argument("--machine", required=True)
    ap.add_argument("--commit", default="?")
    ap.add_argument("--options", default="defaults")
    a = ap.parse_args()

    value = collections.defaultdict(dict)  # (workload, system) -> run -> value
    cpu = collections.defaultdict(list)
    per_op = collections.defaultdict(list)  # (workload) -> [(trips/op, subs/op, top opcodes)]
    order = []
    for line in open(a.results):
        sys_, run, w, v, c, before, after, ops = line.rstrip("\n").split("\t")
        if w not in order:
            order.append(w)
        value[(w, sys_)][run] = float(v)
        if c != "-":
            cpu[w].append(float(c))
        b, e = counts(before), counts(after)
        if b and e:
            d = {op: n - b[1].get(op, 0) for op, n in e[1].items() if n - b[1].get(op, 0)}
            trips = e[0] - b[0] - d.get("FORGET", 0)
            n = int(ops) if ops != "-" else 1
            per_op[w].append((trips / n, (e[2] - b[2]) / n, d))

    def ratios(w, s):
        """Per-run speed ratios of system s to ext4."""
        mine, base = value.get((w, s), {}), value.get((w, "ext4"), {})
        if w == "varmail":
            return [mine[r] / base[r] for r in mine if r in base and base[r]]
        return [base[r] / mine[r] for r in mine if r in base and mine[r]]

    print(f"Commit {a.commit}, Tally mounted with {a.options}; {a.runs} runs, systems interleaved "
          f"within each run. Machine: {a.machine}. Tree: {a.entries} entries ({a.files} files).\n")
    print("| workload | ext4 | Tally | Tally speed / ext4 | target | verdict | bindfs speed / ext4 "
          "| Tally / bindfs | Tally round trips per op | device submissions per op | daemon CPU |")
    print("|---|--:|--:|--:|--:|---|--:|--:|--:|--:|--:|")
    unit = lambda w: " ops/s" if w == "varmail" else " s"
    for w in order:
        med = lambda s: statistics.median(value[(w, s)].values()) if value.get((w, s)) else None
        ext4, tally, bindfs = med("ext4"), med("tally"), med("bindfs")
        r = ratios(w, "tally")
        rb = ratios(w, "bindfs")
        target = TARGETS.get(w)
        verdict = ""
        if target and r:
            m = statistics.median(r)
            verdict = "MET" if m >= target else f"MISSED ({m / target:.0%} of the target)"
        vs_bindfs = ""
        if value.get((w, "bindfs")) and value.get((w, "tally")):
            t, bd = value[(w, "tally")], value[(w, "bindfs")]
            xs = [t[k] / bd[k] if w == "varmail" else bd[k] / t[k] for k in t if k in bd]
            vs_bindfs = fmt_range(xs)
            if w == "varmail":
                verdict += f"; vs bindfs ≥ 3×: {'MET' if statistics.median(xs) >= 3 else 'MISSED'}"
        trips = subs = ""
        if per_op.get(w):
            per = "" if w in ("build", "speedtest") else " "
            tr = statistics.median(x[0] for x in per_op[w])
            sb = statistics.median(x[1] for x in per_op[w])
            trips = f"{tr:,.0f} (total)" if w in ("build", "speedtest") else f"{tr:.2f}{per}"
            subs = f"{sb:,.0f} (total)" if w in ("build", "speedtest") else f"{sb:.3f}"
        c = f"{statistics.median(cpu[w]) / 1000:.2f} s" if cpu.get(w) else ""
        cell = lambda x: f"{x:.3f}{unit(w)}" if x is not None else ""
        print(f"| {NAMES.get(w, w)} | {cell(ext4)} | {cell(tally)} | {fmt_range(r) if r else ''} | "
              f"{f'≥ {target}×' if target else ''} | {verdict} | {fmt_range(rb) if rb else ''} | "
              f"{vs_bindfs} | {trips} | {subs} | {c} |")

    print("\nRequests by opcode in Tally's last run (round trips; FORGET is one-way):\n")
    for w in order:
        if per_op.get(w):
            d = per_op[w][-1][2]
            top = ", ".join(f"{op} {n}" for op, n in sorted(d.items(), key=lambda x: -x[1])[:10])
            print(f"- **{NAMES.get(w, w)}**: {top}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Who made a thread wait for a lock: each wait's length, and the stack of the thread that
woke it (for a mutex, the one that gave it up, so the function that held it).

Record the daemon's switches and wake-ups with stacks, then give this script the text perf
prints:

    perf record -e sched:sched_switch -e sched:sched_wakeup --call-graph dwarf,8192 \\
        -p DAEMON_PID -o wk.data -- COMMAND...
    perf script -i wk.data -F comm,tid,time,event,trace,ip,sym > wk.txt
    bench/lockwaits.py wk.txt [--blocked-in lock_contended] [--top 8] [--by-holder]

A wait starts when a thread switches out not runnable and ends at the wake-up naming it; the
wake-up's stack is the waker's. `--blocked-in` keeps the waits whose own stack has that frame
(default: std's contended mutex lock). `--by-holder` sums the waits per waker's first two
`tally_fs` frames (the function that gave the lock up and its caller) with the longest.
The wait includes the time the woken thread then spent runnable; on a loaded machine a holder
preempted while holding counts in it too. How docs/bench/fs.md's "Letting go of durable data,
a slice at a time" was found (28 Nov 2026). `perf record` may lose events under load (it says
so): then some waits are missing, none is made up.
"""
import argparse
import re

HEAD = re.compile(r"^\s*(.+?)\s+(\d+)\s+([\d.]+):\s+(sched:\S+):\s*(.*)$")
FRAME = re.compile(r"^\s+[0-9a-f]+ (.*)$")


def events(path):
    ev = None
    with open(path, errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            m = FRAME.match(line)
            if m and ev is not None and line[0] in " \t" and not HEAD.match(line):
                ev["stack"].append(m.group(1).strip())
                continue
            m = HEAD.match(line)
            if m:
                if ev:
                    yield ev
                ev = dict(comm=m.group(1), tid=int(m.group(2)), t=float(m.group(3)),
                          name=m.group(4), trace=m.group(5), stack=[])
    if ev:
        yield ev


def waits(path):
    blocked = {}
    for e in events(path):
        if e["name"] == "sched:sched_switch":
            m = re.search(r"prev_pid=(\d+) .*prev_state=(\S+)", e["trace"])
            if m and not m.group(2).startswith("R"):
                blocked[int(m.group(1))] = e
        elif e["name"] == "sched:sched_wakeup":
            m = re.search(r"pid=(\d+)", e["trace"])
            b = m and blocked.pop(int(m.group(1)), None)
            if b:
                yield e["t"] - b["t"], b, e


def holder(stack):
    frames = [s.replace(" (inlined)", "") for s in stack
              if s.startswith("tally_fs::") and "drop" not in s.split(" ")[0]]
    return " <- ".join(frames[:2]) or "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--blocked-in", default="lock_contended")
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--by-holder", action="store_true")
    a = ap.parse_args()
    found = [w for w in waits(a.trace) if any(a.blocked_in in s for s in w[1]["stack"])]
    found.sort(key=lambda w: -w[0])
    if a.by_holder:
        agg = {}
        for d, _, w in found:
            n, most, total = agg.get(holder(w["stack"]), (0, 0.0, 0.0))
            agg[holder(w["stack"])] = (n + 1, max(most, d), total + d)
        for k, (n, most, total) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:a.top]:
            print("%6.1f ms longest %8.1f ms in all %6d waits  %s" % (most * 1e3, total * 1e3, n, k))
        return
    for d, b, w in found[:a.top]:
        print("%.1f ms: %s/%d blocked at %.6f, woken by %s/%d" %
              (d * 1e3, b["comm"], b["tid"], b["t"], w["comm"], w["tid"]))
        print("  holder: " + holder(w["stack"]))


if __name__ == "__main__":
    main()

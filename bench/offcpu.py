#!/usr/bin/env python3
"""What a thread waited for: its longest off-CPU stretches, each with the stack it left on.

Record the scheduler's switches with stacks, then give this script the text perf prints:

    perf record -e sched:sched_switch --call-graph dwarf,8192 -o sw.data -- COMMAND...
    perf script -i sw.data -F tid,time,trace,ip,sym > sw.txt
    bench/offcpu.py sw.txt TID [--top 15] [--min-ms 1] [--from T] [--to T]

A stretch starts when TID switches out (`prev_pid=TID`) and ends when a switch brings it back
(`next_pid=TID`). Voluntary waits (a lock, a condition variable, I/O) and preemptions (state R:
runnable, no CPU) are both counted; the state is printed. The frames shown skip the
scheduler's and the system call entry's own. How docs/bench/fs.md's traces of
`examples/small_beside_large.rs` were read (28 Nov 2026).
"""
import argparse
import re
import sys

HEAD = re.compile(r"\s*(\d+)\s+([\d.]+):\s+(.*)")
SKIP = ("schedule", "__switch", "finish_task", "__x64_sys", "do_syscall", "entry_SYSCALL",
        "syscall", "futex", "std::sys::sync", "std::sync::poison", "core::ops::function",
        "[unknown]")


def events(path):
    """(time, tid, trace, frames) per sample of the perf script text."""
    cur = None
    with open(path, errors="replace") as f:
        for line in f:
            if not line.strip():
                if cur:
                    yield cur
                cur = None
            elif not line.startswith((" ", "\t")):
                m = HEAD.match(line)
                cur = (float(m.group(2)), int(m.group(1)), m.group(3), []) if m else None
            elif cur is not None:
                parts = line.split(None, 1)
                if len(parts) > 1:
                    cur[3].append(re.sub(r"\+0x[0-9a-f]+$", "", parts[1].strip()))
    if cur:
        yield cur


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("script", help="output of perf script -F tid,time,trace,ip,sym")
    ap.add_argument("tid", type=int, help="the thread to follow")
    ap.add_argument("--top", type=int, default=15, help="stretches to print (longest first)")
    ap.add_argument("--min-ms", type=float, default=0.0, help="ignore shorter stretches")
    ap.add_argument("--from", dest="lo", type=float, default=0.0, help="start time (perf's)")
    ap.add_argument("--to", dest="hi", type=float, default=float("inf"), help="end time")
    ap.add_argument("--frames", type=int, default=12, help="frames printed per stack")
    a = ap.parse_args()
    out = f"prev_pid={a.tid} "
    back = f"next_pid={a.tid} "
    left = None
    stretches = []
    for t, tid, trace, frames in events(a.script):
        if tid == a.tid and out in trace:
            state = re.search(r"prev_state=(\S+)", trace)
            left = (t, state.group(1) if state else "?", frames)
        elif back in trace and left is not None:
            t0, state, frames0 = left
            if a.lo <= t0 <= a.hi:
                stretches.append((t - t0, t0, state, frames0))
            left = None
    stretches = [s for s in stretches if s[0] * 1e3 >= a.min_ms]
    total = sum(s[0] for s in stretches)
    print(f"{len(stretches)} stretches off CPU, {total * 1e3:.1f} ms in all")
    for d, t0, state, frames in sorted(stretches, reverse=True)[: a.top]:
        shown = [f for f in frames if not any(k in f for k in SKIP)][: a.frames]
        print(f"{d * 1e3:8.2f} ms at {t0:.4f} ({state}): " + " < ".join(shown))
    return 0


if __name__ == "__main__":
    sys.exit(main())

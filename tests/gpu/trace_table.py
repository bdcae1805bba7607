#!/usr/bin/env python3
"""tests/gpu/trace_table.py: a MOET_TRACE timeline (runtime/moet_trace.h) summed up as text, for
runs whose trace file is too large to bring back or to open in a viewer.

Usage: python3 tests/gpu/trace_table.py TRACE.json [LAST]

Passes are grouped by their name ("decode 16 rows, two micro-batches", ...); for each group, over
its LAST passes (default 8; the earlier ones warm up), the medians per pass of: the pass's time,
each lane's busy time (the union of its spans: a GPU stream's ops, the CPU tier's calls, the
driver's waits), the GPU's busy time over its streams together, the time both the GPU and the
CPU tier were busy (overlap), and the ops' summed times per lane and name (the largest ten).
"""
import json
import statistics
import sys

LANES = {0: "gpu pass stream", 1: "gpu stream 0", 2: "gpu stream 1", 10: "cpu tier 0",
         11: "cpu tier 1", 20: "driver waits"}


def union(spans):
    """Total length of the union of [a, b) intervals."""
    total, end = 0.0, None
    for a, b in sorted(spans):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def clip(spans, a, b):
    return [(max(x, a), min(y, b)) for x, y in spans if y > a and x < b]


def intersect(s1, s2):
    """Length of the intersection of two unions of intervals."""
    return union(s1) + union(s2) - union(s1 + s2)


def main():
    if len(sys.argv) < 2:
        sys.stderr.write(__doc__)
        return 2
    last = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    with open(sys.argv[1]) as f:
        ev = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    passes = sorted((e for e in ev if e["tid"] == 30), key=lambda e: e["ts"])
    spans = sorted((e for e in ev if e["tid"] != 30), key=lambda e: e["ts"])
    if not passes:
        print("no passes in %s" % sys.argv[1])
        return 0
    groups = {}
    for p in passes:
        groups.setdefault(p["name"], []).append(p)
    for name, ps in groups.items():
        ps = ps[-last:]
        rows = []
        ops = {}
        for p in ps:
            a, b = p["ts"], p["ts"] + p["dur"]
            inside = [e for e in spans if e["ts"] < b and e["ts"] + e["dur"] > a]
            lane = {}
            for e in inside:
                lane.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
            lane = {t: clip(s, a, b) for t, s in lane.items()}
            gpu = sum((lane.get(t, []) for t in (0, 1, 2)), [])
            cpu = sum((lane.get(t, []) for t in (10, 11)), [])
            r = {"pass": p["dur"], "gpu": union(gpu), "cpu": union(cpu),
                 "both": intersect(gpu, cpu)}
            for t, s in lane.items():
                r[t] = union(s)
            rows.append(r)
            for e in inside:
                if e["tid"] <= 2:
                    k = (e["tid"], e["name"])
                    ops[k] = ops.get(k, 0.0) + e["dur"] / len(ps)
        def med(key):
            return statistics.median(r.get(key, 0.0) for r in rows) / 1e3
        print("== %s: %d passes (the last %d), ms per pass (medians)" % (name, len(groups[name]),
                                                                        len(ps)))
        print("  pass %.3f   gpu busy %.3f   cpu tier busy %.3f   both %.3f" %
              (med("pass"), med("gpu"), med("cpu"), med("both")))
        print("  " + "   ".join("%s %.3f" % (LANES[t], med(t)) for t in sorted(LANES)
                               if any(t in r for r in rows)))
        for (t, n), s in sorted(ops.items(), key=lambda kv: -kv[1])[:10]:
            print("    %-16s %-28s %8.3f" % (LANES[t], n, s / 1e3))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""tests/gpu/trace_table.py: a MOET_TRACE timeline (runtime/moet_trace.h) summed up as text, for
runs whose trace file is too large to bring back or to open in a viewer.

Usage: python3 tests/gpu/trace_table.py TRACE.json [LAST]

Passes are grouped by their name ("decode 16 rows, two micro-batches", ...); for each group, over
its LAST passes (default 8; the earlier ones warm up), the medians per pass of: the pass's time,
each lane's busy time (the union of its spans: a GPU stream's ops, the CPU tier's calls, the
driver's waits), the GPU's busy time over its streams together, the time both the GPU and the
CPU tier were busy (overlap) and neither, the ops' summed times per lane and name (the largest
ten), and the means per pass of what the device ran while the CPU tier ran no call and what the
driver waited for while the device had nothing queued (the largest six each).
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


def merge(spans):
    """The union of [a, b) intervals as sorted disjoint intervals."""
    out = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def complement(merged, a, b):
    """[a, b) less a sorted disjoint list."""
    out, at = [], a
    for x, y in merged:
        if x > at:
            out.append((at, min(x, b)))
        at = max(at, y)
    if at < b:
        out.append((at, b))
    return [(x, y) for x, y in out if y > x]


def overlap(x, y, merged):
    """Length of [x, y) inside a sorted disjoint list."""
    return sum(max(0.0, min(y, b) - max(x, a)) for a, b in merged if b > x and a < y)


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
        idle_what = {}
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
            r["neither"] = r["pass"] - union(gpu + cpu)
            # what the device ran while the CPU tier had no call running, and what the driver
            # waited for while the device had nothing on any stream
            cpu_idle = complement(merge(cpu), a, b)
            gpu_idle = complement(merge(gpu), a, b)
            for e in inside:
                x, y = max(e["ts"], a), min(e["ts"] + e["dur"], b)
                if e["tid"] <= 2:
                    k = ("cpu idle", LANES[e["tid"]], e["name"])
                    idle_what[k] = idle_what.get(k, 0.0) + overlap(x, y, cpu_idle) / len(ps)
                elif e["tid"] == 20:
                    k = ("gpu idle", "driver", e["name"])
                    idle_what[k] = idle_what.get(k, 0.0) + overlap(x, y, gpu_idle) / len(ps)
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
        print("  pass %.3f   gpu busy %.3f   cpu tier busy %.3f   both %.3f   neither %.3f" %
              (med("pass"), med("gpu"), med("cpu"), med("both"), med("neither")))
        print("  " + "   ".join("%s %.3f" % (LANES[t], med(t)) for t in sorted(LANES)
                               if any(t in r for r in rows)))
        for (t, n), s in sorted(ops.items(), key=lambda kv: -kv[1])[:10]:
            print("    %-16s %-28s %8.3f" % (LANES[t], n, s / 1e3))
        for side in ("cpu idle", "gpu idle"):
            top = sorted(((k, v) for k, v in idle_what.items() if k[0] == side and v > 0),
                         key=lambda kv: -kv[1])[:6]
            print("  while the %s, ms per pass:%s" % (
                "CPU tier ran no call, the device ran" if side == "cpu idle"
                else "device had nothing queued, the driver waited for", "" if top else " -"))
            for (_, who, n), v in top:
                print("    %-16s %-28s %8.3f" % (who, n, v / 1e3))
    return 0


if __name__ == "__main__":
    sys.exit(main())

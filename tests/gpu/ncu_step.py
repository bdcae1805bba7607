#!/usr/bin/env python3
"""tests/gpu/ncu_step.py: the kernels of whole decode steps from an Nsight Compute raw page
(tests/gpu/ncu.sh step: `ncu --metrics gpu__time_duration.sum`, then `--page raw --csv
--print-units base`), summed up by kernel.

Usage: python3 tests/gpu/ncu_step.py RAW.csv [STEPS]

The launches are cut into forward passes at each embed_kernel (every pass, prefill or decode,
starts with the embedding); the last STEPS passes (default 1; bench e2e's timed decode steps
are the last ones) are summed up per kernel name: launches, microseconds, share of the
pass's kernel time. ncu runs the kernels one at a time, so launch gaps are not in these
sums: compare the total with the step time of an unprofiled run of the same arguments.
"""
import csv
import sys


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    with open(sys.argv[1], newline="") as f:
        rows = [r for r in csv.reader(f)]
    head = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if head is None:
        sys.exit("ncu_step.py: no 'Kernel Name' column in %s" % sys.argv[1])
    cols = rows[head]
    name_c, dur_c = cols.index("Kernel Name"), cols.index("gpu__time_duration.sum")
    passes = []
    for r in rows[head + 1:]:
        if len(r) <= max(name_c, dur_c):
            continue
        try:
            ns = float(r[dur_c].replace(",", ""))
        except ValueError:
            continue  # the units row
        name = r[name_c]
        if name.startswith("embed_kernel") or not passes:
            passes.append([])
        passes[-1].append((name, ns))
    if not passes:
        sys.exit("ncu_step.py: no kernels in %s" % sys.argv[1])
    for i, p in enumerate(passes[-steps:]):
        total = sum(ns for _, ns in p)
        by = {}
        for name, ns in p:
            base = name.split("(")[0]
            n, t = by.get(base, (0, 0.0))
            by[base] = (n + 1, t + ns)
        print("== pass %d of %d: %d kernels, %.1f us of kernel time"
              % (len(passes) - steps + i + 1, len(passes), len(p), total / 1e3))
        for base, (n, t) in sorted(by.items(), key=lambda kv: -kv[1][1]):
            print("  %-60s %5d %10.1f us %5.1f%% %8.2f us/launch"
                  % (base[:60], n, t / 1e3, 100.0 * t / total, t / 1e3 / n))


if __name__ == "__main__":
    main()

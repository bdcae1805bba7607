#!/usr/bin/env python3
"""tests/gpu/e2e_table.py OUT_DIR VARIANT...: the table of tests/gpu/e2e_ab.sh from its bench
e2e records (OUT_DIR/e2e-NAME-R.json): per variant, round and batch the median step, the
one-pass step, Tc, Tg, the overlap bound and step / bound, the CPU tier's team span, the
driver's wait for it, the GPU's idle time and its part at the routing's waits (i_rt), and the
shares of passes in two micro-batches, of those on two streams (strm) and polled (poll) (ms per
step), Tc / Tg, the cold experts staged per step (stg: MOET_STAGE_BALANCE) and the link price
most of the timed passes ran at (prc, MOET_STAGE_BALANCE=auto: 0 none, 1, 2; - without),
the MoE layers a step whose next attention went early (erl, MOET_EARLY_ROWS; nan where the
record predates it), the staged copies' rate in GB/s in the row (lnk) and in its serial run (tlnk: stage_bytes over
stage_link_s; - where nothing was staged or the record predates them); then per variant and
batch the median over rounds of the step and of step / bound.
The records' steps of mode MOET_AB_MODE (default hybrid; gpu has no overlap check: nan there).
Rounds 1 .. MOET_AB_ROUNDS (e2e_ab.sh sets it), else those the named variants' records have.
A missing or unreadable record is named on its row, never skipped silently."""
import json
import os
import statistics
import sys

COLS = ("step_s", "one_pass_step_s", "tc_s", "tg_s", "overlap_bound_s", "cpu_run_s",
        "cpu_wait_s", "gpu_idle_s", "gpu_idle_route_s")


def rows(path):
    with open(path) as f:
        rec = json.load(f)
    mode = os.environ.get("MOET_AB_MODE", "hybrid")
    return [s for s in rec.get("steps", []) if s.get("mode") == mode]


def rate(s, pre):
    """The staged copies' GB/s of a step entry (pre "tc_": its serial run's), else "-"."""
    b, t = s.get(pre + "stage_bytes"), s.get(pre + "stage_link_s")
    return "%5.1f" % (b / t / 1e9) if b and t else "-"


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, names = sys.argv[1], [v.split(":", 1)[0] for v in sys.argv[2:]]
    n = os.environ.get("MOET_AB_ROUNDS", "")
    if n.isdigit() and int(n) > 0:
        runs = list(range(1, int(n) + 1))
    else:
        runs = sorted({int(f[:-5].rsplit("-", 1)[1]) for f in os.listdir(out)
                       if f.endswith(".json") and f.startswith("e2e-") and
                       f[4:-5].rsplit("-", 1)[0] in names and
                       f[:-5].rsplit("-", 1)[1].isdigit()})
    print("variant  round batch    step      1p      Tc      Tg   bound st/bd   run"
          "    wait   idle  i_rt split  strm  poll tc/tg   stg prc   erl   lnk  tlnk")
    agg = {}
    for name in names:
        for r in runs:
            path = os.path.join(out, "e2e-%s-%d.json" % (name, r))
            try:
                steps = rows(path)
            except (OSError, ValueError) as e:
                print("%-8s %5d  no record: %s" % (name, r, e))
                continue
            for s in steps:
                v = [1e3 * s.get(k, float("nan")) for k in COLS]
                ratio = s.get("step_over_bound", float("nan"))
                agg.setdefault((name, s["batch"]), []).append((v[0], ratio))
                ps = s.get("price_share") or [0, 0, 0]
                prc = str(ps.index(max(ps))) if max(ps) > 0 else "-"
                lnk = [rate(s, p) for p in ("", "tc_")]
                print("%-8s %5d %5d %7.2f %7.2f %7.2f %7.2f %7.2f %5.3f %6.2f %6.2f %6.2f %5.2f "
                      "%5.2f %5.2f %5.2f %5.2f %5.2f %3s %5.2f %5s %5s" % (
                          name, r, s["batch"], v[0], v[1], v[2], v[3], v[4], ratio, v[5], v[6],
                          v[7], v[8], s.get("split_share", float("nan")),
                          s.get("stream_share", float("nan")),
                          s.get("polled_share", float("nan")),
                          s.get("tc_tg_ratio", float("nan")),
                          s.get("staged_experts", float("nan")), prc,
                          s.get("early_layers", float("nan")), lnk[0], lnk[1]))
    print("\nmedians over rounds: variant batch step_ms step/bound (runs)")
    for (name, b), vals in agg.items():
        print("%-8s %5d %8.2f %6.3f (%d)" % (name, b, statistics.median(x for x, _ in vals),
                                             statistics.median(y for _, y in vals), len(vals)))


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# tests/gpu/layer_max.sh: the cost model's two ways of taking a MoE layer's wait for its tiers
# (plan --layer-max means / spread, docs/profile-and-plan.md) beside measured decode steps.
#
#   bash tests/gpu/layer_max.sh BUILD_DIR OUT_DIR CKPT_DIR PLACEMENT [PLACEMENT...]
#
# 1. Unless CKPT_DIR holds a checkpoint: gen-checkpoint --preset kimi-k2 (MOET_LM_PRESET) with
#    MOET_LM_LAYERS (10) layers of MOET_LM_EXPERTS (128) experts, --hot-share-by-layer
#    MOET_LM_SHARES (0.9,0.6,0.8,0.7,0.85,0.65,0.75,0.9,0.6), seed 1.
# 2. bench e2e --modes gpu,hybrid on the first placement with --profile-out and
#    --hardware-out: the routing of its timed steps and this machine's figures (the CPU tier's
#    rate, PCIe, the dense part), which every prediction below uses.
# 3. MOET_LM_ROUNDS rounds (1), each over every placement in turn: bench e2e --modes hybrid
#    --predict-profile (that routing) --hardware (those figures): its overlap check's one-pass
#    run against the one-pass prediction with the means and with the spread (the record's
#    predictions: measured_one_pass_s, predicted_one_pass_s, predicted_one_pass_spread_s),
#    record OUT_DIR/e2e-I-R.json for placement I, round R.
# 4. OUT_DIR/table.txt: per placement and batch the median of the rounds' measured one-pass
#    steps, the rounds and their range (max / min - 1: one placement's steps moved by up to a
#    third between single runs on the H200), each prediction (round 1's; the same inputs give
#    the same figure every round) and its error; last, each model's mean absolute error over
#    the rows. OUT_DIR keeps the records, logs, profile and hardware file.
#
# Environment: MOET_LM_DEVICE (cuda; cpu: the CPU backend, its test double, for the script's
# logic), MOET_LM_BATCHES (16), MOET_LM_STEPS (16), MOET_LM_ROUNDS (1), MOET_LM_TIMEOUT
# (seconds per bench run, 300). MOET_STAGE_BALANCE is 0 unless set: the cost model does not
# price decode staging.
set -euo pipefail

if [ $# -lt 4 ]; then
	echo "usage: $0 BUILD_DIR OUT_DIR CKPT_DIR PLACEMENT [PLACEMENT...]" >&2
	exit 2
fi
build=$1 out=$2 ckpt=$3
shift 3
bin=$build/moet-hybrid
device=${MOET_LM_DEVICE:-cuda}
batches=${MOET_LM_BATCHES:-16}
steps=${MOET_LM_STEPS:-16}
limit=${MOET_LM_TIMEOUT:-300}
rounds=${MOET_LM_ROUNDS:-1}
export MOET_STAGE_BALANCE=${MOET_STAGE_BALANCE:-0}
case $device in
cuda | cpu) ;;
*) echo "MOET_LM_DEVICE '$device': want cuda or cpu" >&2; exit 2 ;;
esac
case $rounds in
'' | *[!0-9]* | 0) echo "MOET_LM_ROUNDS '$rounds': want a count of 1 or more" >&2; exit 2 ;;
esac
for p in "$@"; do
	[ -f "$p" ] || { echo "placement $p: no such file" >&2; exit 2; }
done
mkdir -p "$out"
. tests/gpu/debs.sh
: >"$out/placements.txt"
step() { echo "== $(date +%T) $*"; }

if [ ! -f "$ckpt/config.json" ]; then
	step "gen-checkpoint into $ckpt"
	"$bin" gen-checkpoint --preset "${MOET_LM_PRESET:-kimi-k2}" \
		--layers "${MOET_LM_LAYERS:-10}" --experts "${MOET_LM_EXPERTS:-128}" --seed 1 \
		--hot-share-by-layer "${MOET_LM_SHARES:-0.9,0.6,0.8,0.7,0.85,0.65,0.75,0.9,0.6}" \
		--out "$ckpt" --quiet
fi
common=(--model "$ckpt" --device "$device" --batches "$batches" --prefill none --steps "$steps")

step "bench e2e gpu,hybrid on $1: the routing and the hardware figures"
timeout "$limit" "$bin" bench e2e "${common[@]}" --modes gpu,hybrid --placement "$1" \
	--profile-out "$out/profile.json" --hardware-out "$out/hw.yaml" \
	--json "$out/probe.json" >"$out/probe.txt" 2>&1

i=0
for p in "$@"; do
	i=$((i + 1))
	echo "$i $p" >>"$out/placements.txt"
done
for r in $(seq "$rounds"); do
	i=0
	for p in "$@"; do
		i=$((i + 1))
		step "round $r: bench e2e hybrid on $p with the predictions"
		timeout "$limit" "$bin" bench e2e "${common[@]}" --modes hybrid --placement "$p" \
			--predict-profile "$out/profile.json" --hardware "$out/hw.yaml" \
			--json "$out/e2e-$i-$r.json" >"$out/e2e-$i-$r.txt" 2>&1
	done
done

python3 - "$out" "$rounds" <<'EOF' | tee "$out/table.txt"
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
print("placement                       batch runs range  1pass_ms  means_ms    err  spread_ms"
      "    err")
errs = ([], [])
for line in open(out + "/placements.txt"):
    i, path = line.split(None, 1)
    rows = {}  # batch: (measured per round, round 1's predictions)
    for r in range(1, rounds + 1):
        try:
            rec = json.load(open("%s/e2e-%s-%d.json" % (out, i, r)))
        except (OSError, ValueError):
            continue  # a run that failed: its log says why
        for p in rec.get("predictions", []):
            if p.get("mode") != "hybrid" or "measured_one_pass_s" not in p:
                continue
            row = rows.setdefault(p["batch"], ([], p))
            row[0].append(p["measured_one_pass_s"] * 1e3)
    for b, (ms, p) in sorted(rows.items()):
        m = statistics.median(ms)
        a = p["predicted_one_pass_s"] * 1e3
        s = p["predicted_one_pass_spread_s"] * 1e3
        errs[0].append(abs(a / m - 1))
        errs[1].append(abs(s / m - 1))
        print("%-30s %6d %4d %4.0f%% %9.3f %9.3f %+5.1f%% %10.3f %+5.1f%%" % (
            path.strip()[-30:], b, len(ms), 100 * (max(ms) / min(ms) - 1), m, a,
            100 * (a / m - 1), s, 100 * (s / m - 1)))
if errs[0]:
    print("mean absolute error over %d rows: means %.1f%%, spread %.1f%%" % (
        len(errs[0]), 100 * statistics.mean(errs[0]), 100 * statistics.mean(errs[1])))
print("1pass: the median of the rounds' one-pass runs (the overlap check's); range: max / min "
      "- 1 of them; means / spread: the one-pass prediction with --layer-max means / spread "
      "on the first run's routing and hardware figures")
EOF

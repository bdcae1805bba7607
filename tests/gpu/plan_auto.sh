#!/usr/bin/env bash
# tests/gpu/plan_auto.sh: `plan --auto` against the even split, measured (issue 6's target:
# --auto beats an even hot-per-layer split on predicted and measured decode step time when
# layers differ in concentration). A synthetic checkpoint whose MoE layers are calibrated to
# different hot shares (gen-checkpoint --hot-share-by-layer), a routing profile (profile
# --synthetic), two placements under one byte budget (--hot-per-layer K in every layer, and
# --auto for a batch mix), `bench e2e --modes hybrid` of each on the same batches, alternating
# (even, auto, even, auto, ...) MOET_PA_REPS times, with the cost model's predictions beside
# the measurements, and a table of both (median measured steps).
#
# Usage (from the repository root): bash tests/gpu/plan_auto.sh BUILD_DIR OUT_DIR [CKPT_DIR]
#   BUILD_DIR  a build with moet-hybrid (carried from a development machine is fine)
#   OUT_DIR    logs, profiles, plans, placements, JSON records and table.txt go here
#   CKPT_DIR   where the checkpoint is made if missing (default /dev/shm/moet-plan-auto: RAM-
#              backed, so the CPU tier reads it from memory as it would a page-cached one)
# Environment:
#   MOET_PA_DEVICE   cuda (default) or cpu (the script's logic on a machine without a GPU)
#   MOET_PA_PRESET   kimi-k2 (default) or tiny
#   MOET_PA_LAYERS   layers, layer 0 dense (default 4: 3 MoE layers of 384 experts, ~56 GB)
#   MOET_PA_EXPERTS  routed experts per MoE layer (default: the preset's; gen-checkpoint
#                    --experts), e.g. 10 layers of 128 for a deeper model in the same RAM
#   MOET_PA_SHARES   hot share per MoE layer (default 0.95,0.55,0.85: concentrated, flat, in
#                    between; one value per MoE layer)
#   MOET_PA_HOT      K of the even split (default 120 of 384; the budget holds K x MoE layers)
#   MOET_PA_PLAN_BATCH  the decode batch or batch mix --auto optimizes for, passed to plan
#                    --batch (default 1,4,16,64: the sum of the steps; B:W weights one)
#   MOET_PA_REPS     bench runs of each placement, alternating even and auto (default 3);
#                    the table gives each batch's median measured step
#   MOET_PA_BATCHES  benched batches (default 1,4,16,64)
#   MOET_PA_STEPS    timed decode steps (default 16: the engine's first 6 passes of a batch
#                    size try both forms, so the median is the form it then keeps)
#   MOET_PA_PREFILL  (default 1024); MOET_PA_CTX (default 64); MOET_PA_PROMPTS (default 48)
#   MOET_PA_HARDWARE the cost model's figures (default configs/hardware-h200-host.yaml)
#   MOET_PA_CALIBRATE 1 (default, with MOET_PA_PROFILE=bench): the probe run measures the
#                    figures bench e2e can measure (--hardware-out: the CPU tier's decode
#                    rate, PCIe, the dense part per batch; the rest keeps the built-in H200
#                    figures) and the plans and predictions use them; 0: MOET_PA_HARDWARE
#   MOET_PA_PROFILE  bench (default) or synthetic: the routing both plans are made from.
#                    bench: a first `bench e2e --profile-out` run (the probe placement, the
#                    same batches) records the routing of the bench's own prompts, which the
#                    measured runs then see again (a user profiling the workload they serve);
#                    synthetic: `profile --synthetic`, whose prompts route differently from the
#                    bench's (measured 2026-11-30: --auto planned that way was 16% faster at
#                    batch 1 and 9% slower at batch 16 than the even split)
# Debian runtime libraries may be carried as .deb files in .deb/ (as for tests/gpu/run.sh).
#
# The budget: the even plan's printout gives the expert bytes and the dense part; the budget
# is dense + K x MoE layers x expert bytes + half an expert, with --reserve-gb 0B, so that both
# plans have exactly K x MoE layers slots. The benches' own routing (bench e2e --profile-out of
# the first) is priced afterwards too (plan --predict), since the bench's random-token
# prompts route differently from the synthetic prompt mix the plans were made from.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=$1
out=$2
device=${MOET_PA_DEVICE:-cuda}
preset=${MOET_PA_PRESET:-kimi-k2}
ckpt=${3:-/dev/shm/moet-plan-auto-$preset}
layers=${MOET_PA_LAYERS:-4}
experts=${MOET_PA_EXPERTS:-}
shares=${MOET_PA_SHARES:-0.95,0.55,0.85}
hot=${MOET_PA_HOT:-120}
pbatch=${MOET_PA_PLAN_BATCH:-1,4,16,64}
reps=${MOET_PA_REPS:-3}
batches=${MOET_PA_BATCHES:-1,4,16,64}
steps=${MOET_PA_STEPS:-16}
prefill=${MOET_PA_PREFILL:-1024}
ctx=${MOET_PA_CTX:-64}
prompts=${MOET_PA_PROMPTS:-48}
pfrom=${MOET_PA_PROFILE:-bench}
hw=${MOET_PA_HARDWARE:-configs/hardware-h200-host.yaml}
calibrate=${MOET_PA_CALIBRATE:-1}
case $reps in
'' | *[!0-9]* | 0) echo "plan_auto: MOET_PA_REPS=$reps (want a whole number >= 1)" >&2; exit 1 ;;
esac
mkdir -p "$out"
. tests/gpu/debs.sh
bin=$build/moet-hybrid
step() { echo "== $(date +%T) $*" | tee -a "$out/plan_auto.log"; }

if [ ! -f "$ckpt/config.json" ]; then
	ex=()
	[ -z "$experts" ] || ex=(--experts "$experts")
	step "gen-checkpoint $preset --layers $layers ${ex[*]} --hot-share-by-layer $shares -> $ckpt"
	"$bin" gen-checkpoint --preset "$preset" --layers "$layers" "${ex[@]}" --seed 1 \
		--hot-share-by-layer "$shares" --out "$ckpt" --quiet 2>&1 | tee -a "$out/plan_auto.log"
fi
cp "$ckpt/generator.json" "$out/generator.json"
step "profile --synthetic $prompts ($device)"
"$bin" profile --model "$ckpt" --device "$device" --synthetic "$prompts" --seed 1 --max-new 8 \
	--batch 16 --quiet --out "$out/profile.json" 2>&1 | tail -3 | tee -a "$out/plan_auto.log"

step "the budget: dense part + $hot x MoE layers experts"
"$bin" plan --model "$ckpt" --profile "$out/profile.json" --gpus 1 --vram-gb 1000GiB \
	--hot-per-layer "$hot" --out "$out/probe.yaml" >"$out/plan-probe.txt" 2>&1
eb=$(awk '/^expert bytes:/ {print $3; exit}' "$out/plan-probe.txt")
dense=$(awk '/^dense part:/ {print $3; exit}' "$out/plan-probe.txt")
n_moe=$(awk '/^experts per MoE layer:/ {
	for (i = 1; i <= NF; i++) if ($i ~ /^layers?$/) {print $(i-1); exit}}' "$out/plan-probe.txt")
if [ -z "$eb" ] || [ -z "$dense" ] || [ -z "$n_moe" ]; then
	echo "plan_auto: could not read the expert bytes, dense part or MoE layers from" \
		"$out/plan-probe.txt" >&2
	exit 1
fi
budget=$((dense + hot * n_moe * eb + eb / 2))
echo "expert $eb bytes, dense $dense bytes, $n_moe MoE layers: budget ${budget}B" \
	"($((hot * n_moe)) slots)" | tee -a "$out/plan_auto.log"

plan_profile=$out/profile.json
if [ "$pfrom" = bench ]; then
	# The probe placement ($hot per layer, no budget) is only there to run the bench once.
	step "bench e2e --profile-out: the routing of the bench's own prompts (probe placement)"
	# With MOET_PA_CALIBRATE=1 (the default) it also measures the cost model's figures on
	# this machine (--hardware-out: the CPU tier's own decode rate, PCIe, the dense part per
	# batch from the gpu mode), and both plans and every prediction use that file.
	modes=hybrid
	cal=()
	if [ "$calibrate" = 1 ]; then
		modes=gpu,hybrid
		cal=(--hardware "$hw" --hardware-out "$out/hw-measured.yaml")
	fi
	"$bin" bench e2e --model "$ckpt" --device "$device" --modes "$modes" \
		--placement "$out/probe.yaml" --batches "$batches" --prefill "$prefill" \
		--ctx "$ctx" --steps "$steps" --profile-out "$out/train-profile.json" "${cal[@]}" \
		--json "$out/e2e-probe.json" >"$out/bench-train.txt" 2>"$out/bench-train.err"
	plan_profile=$out/train-profile.json
	if [ "$calibrate" = 1 ]; then
		hw=$out/hw-measured.yaml
		grep -E '^[a-z_]+:' "$hw" | tee -a "$out/plan_auto.log"
	fi
elif [ "$pfrom" != synthetic ]; then
	echo "plan_auto: MOET_PA_PROFILE=$pfrom (want bench or synthetic)" >&2
	exit 1
fi

for kind in even auto; do
	if [ "$kind" = even ]; then how=(--hot-per-layer "$hot"); else how=(--auto); fi
	step "plan ${how[*]} (budget ${budget}B, batch $pbatch)"
	"$bin" plan --model "$ckpt" --profile "$plan_profile" --gpus 1 --vram-gb "${budget}B" \
		--reserve-gb 0B "${how[@]}" --hardware "$hw" --batch "$pbatch" \
		--out "$out/place-$kind.yaml" >"$out/plan-$kind.txt" 2>&1
	grep -E '^experts per MoE layer|^predicted decode step' "$out/plan-$kind.txt" |
		tee -a "$out/plan_auto.log"
done
# The per-layer counts of both plans, and whether they differ at all.
counts() { awk '/^  layer experts/ {on = 1; next}
	on && NF >= 3 && $1 ~ /^[0-9]+$/ {printf "%s ", $2; next} on {exit}' "$1"; }
even_counts=$(counts "$out/plan-even.txt")
auto_counts=$(counts "$out/plan-auto.txt")
echo "experts per MoE layer: even [ $even_counts], auto [ $auto_counts]" |
	tee -a "$out/plan_auto.log"
if [ "$even_counts" = "$auto_counts" ]; then
	echo "plan_auto: WARNING: --auto kept the even split (no predicted gain at batch" \
		"$pbatch)" |
		tee -a "$out/plan_auto.log"
fi

# Alternating runs (even, auto, even, auto, ...), so that a drift of the machine (heat, page
# cache, other load) falls on both placements alike; the first run of each is also kept as
# bench-KIND.txt (its prediction columns are the table's).
for r in $(seq 1 "$reps"); do
	for kind in even auto; do
		step "bench e2e --modes hybrid, placement $kind, run $r of $reps"
		extra=()
		if [ "$kind" = even ] && [ "$r" = 1 ]; then
			extra=(--profile-out "$out/bench-profile.json")
		fi
		"$bin" bench e2e --model "$ckpt" --device "$device" --modes hybrid \
			--placement "$out/place-$kind.yaml" --batches "$batches" --prefill "$prefill" \
			--ctx "$ctx" --steps "$steps" --predict-profile "$plan_profile" --hardware "$hw" \
			"${extra[@]}" --json "$out/e2e-$kind-$r.json" >"$out/bench-$kind-$r.txt" \
			2>"$out/bench-$kind-$r.err"
		cat "$out/bench-$kind-$r.txt" >>"$out/plan_auto.log"
		if [ "$r" = 1 ]; then
			cp "$out/bench-$kind-1.txt" "$out/bench-$kind.txt"
			cp "$out/e2e-$kind-1.json" "$out/e2e-$kind.json"
		fi
	done
done
for kind in even auto; do
	step "plan --predict $kind on the bench's own routing"
	"$bin" plan --predict --model "$ckpt" --placement "$out/place-$kind.yaml" \
		--profile "$out/bench-profile.json" --batch "$batches" --hardware "$hw" --json \
		>"$out/predict-bench-$kind.json"
	"$bin" plan --predict --model "$ckpt" --placement "$out/place-$kind.yaml" \
		--profile "$out/bench-profile.json" --batch "$batches" --hardware "$hw" \
		>"$out/predict-bench-$kind.txt"
done

# The table: the prediction rows of each bench (after the header "mode batch measured_ms"):
# mode batch measured ran(2 words) 1pass_meas pred_1pass pred_2halves form(2 words) error
# err_1p pred_1p_spr err_1p_sp; and the chosen form's prediction on the bench's routing from plan --predict's
# forms table (batch one_pass two_halves chosen(2 words) ...).
rows() { awk '/^mode +batch +measured_ms/ {on = 1; next} on && $1 == "hybrid" {
	pred = ($9 " " $10 == "two halves") ? $8 : $7
	print $2, $3, $4 "_" $5, pred, $11}' "$1"; }
# "batch ms" of every run of a placement -> "batch median" (the mean of the middle two for an
# even count), and "batch ms ms ..." (every run, in order) for the record.
measured() { for r in $(seq 1 "$reps"); do rows "$out/bench-$1-$r.txt" | awk '{print $1, $2}'; done; }
median() { sort -k1,1n -k2,2g | awk '$1 != b {if (n) out(); b = $1; n = 0} {v[n++] = $2}
	END {if (n) out()}
	function out() {print b, (n % 2) ? v[(n - 1) / 2] : (v[n / 2 - 1] + v[n / 2]) / 2}'; }
runs() { for r in $(seq 1 "$reps"); do rows "$out/bench-$1-$r.txt" | awk -v r="$r" '{print $1, r, $2}'; done |
	sort -k1,1n -k2,2n | awk '$1 != b {if (b != "") print line; b = $1; line = $1} {line = line " " $3}
	END {if (b != "") print line}'; }
# The first run's row (batch, ran, pred, error) with the median measured step in place of the
# first run's and the error against the median: batch median ran pred err.
rows_med() { join <(rows "$out/bench-$1.txt" | sort -k1,1) <(measured "$1" | median | sort -k1,1) |
	awk '{printf "%s %s %s %s %+.1f%%\n", $1, $6, $3, $4, ($6 > 0) ? 100 * ($4 / $6 - 1) : 0}'; }
forms() { awk '/^forms:/ {on = 1; next} on && $1 ~ /^[0-9]+$/ {
	print $1, ($4 " " $5 == "two halves") ? $3 : $2}' "$1"; }
{
	echo "plan --auto against the even split ($hot per layer), one budget of ${budget}B," \
		"$device, $(basename "$ckpt"), hot shares $shares"
	echo "experts per MoE layer: even [ $even_counts], auto [ $auto_counts] (planned for" \
		"batch $pbatch from the $pfrom profile); measured: medians of $reps alternating runs"
	printf '%6s | %11s %-11s %9s %8s %9s | %11s %-11s %9s %8s %9s | %9s %9s %9s\n' batch \
		even_ms ran pred_ms err pred_b_ms auto_ms ran pred_ms err pred_b_ms \
		meas_a/e pred_a/e pred_b_a/e
	# NOTE: join wants its inputs sorted on the key in its own collation (1 16 4 64): both
	# under LC_ALL=C, sort on the first field only (a whole-line sort in a UTF-8 locale
	# ignores the blanks and put "16 41.8" before "1 7.86"); sort -n after it.
	export LC_ALL=C
	join <(rows_med even | sort -k1,1) \
		<(forms "$out/predict-bench-even.txt" | sort -k1,1) |
		join - <(rows_med auto | sort -k1,1) |
		join - <(forms "$out/predict-bench-auto.txt" | sort -k1,1) | sort -n |
		awk '{f = "%6s | %11.3f %-11s %9.3f %8s %9.3f | %11.3f %-11s %9.3f %8s %9.3f | "
			printf f "%9.3f %9.3f %9.3f\n", $1, $2, $3, $4, $5, $6, $7, $8, $9,
			$10, $11, $7 / $2, $9 / $4, $11 / $6}'
	echo "ms: measured decode step, the median of $reps runs (the engine's default: 'ran' =" \
		"the form it chose in the first run); pred: the cost model's faster form on the" \
		"plans' profile ($pfrom), err its error against the median; pred_b: on the" \
		"bench's own routing (--profile-out); a/e: auto over even"
	echo "every run's measured step (ms), in order:"
	join <(runs even | sort -k1,1) <(runs auto | sort -k1,1) | sort -n |
		awk -v n="$reps" '{s = sprintf("%6s | even", $1); for (i = 2; i <= n + 1; i++)
			s = s sprintf(" %9.3f", $i); s = s " | auto"
			for (i = n + 2; i <= 2 * n + 1; i++) s = s sprintf(" %9.3f", $i); print s}'
} | tee "$out/table.txt"
step "done"

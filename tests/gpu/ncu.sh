#!/usr/bin/env bash
# tests/gpu/ncu.sh: Nsight Compute profiles of the kernels issue 4's targets are about, so
# that their redesign starts from counters instead of estimates:
#   rows    the contract expert kernel at 1, 2, 4 and 8 tokens per expert (bench gpu-experts at
#           Kimi-K2 expert geometry: gate_up and down passes, rows_kernel instances, or
#           rows_wide_kernel where the default takes the wide variant)
#   wide    the same at 64 and 256 tokens (rows_wide_kernel)
#   latent  the absorbed-MLA kernel (latent_fast_kernel) at Kimi-K2 heads, from test_gpu_latent
#   step    every kernel of whole decode steps (bench e2e --modes gpu on a 3-layer Kimi-K2
#           gen-checkpoint, every expert resident), durations only: per batch size, the last
#           step's kernel time summed by kernel (step-B.table.txt), against the step's span
#           from its first kernel's start to its last one's end (launch gaps included)
# Each profile is exported (.ncu-rep) and printed as the details page (text) and as its stall
# reasons per launch (NAME.stalls.txt, from the raw page NAME.raw.csv), all under
# OUT_DIR/ncu/; OUT_DIR/ncu.tar.gz holds them all (the GPU machine's tool brings back few files).
#
# Usage (from the repository root): bash tests/gpu/ncu.sh BUILD_DIR OUT_DIR [WHAT...]
#   BUILD_DIR  a build with moet-hybrid and test_gpu_latent (carried from a development
#              machine is fine)
#   OUT_DIR    where the reports go
#   WHAT       any of rows wide latent step (default: rows wide latent)
# Environment: MOET_NCU (the ncu binary; default: ncu on PATH, else
# /usr/local/cuda/bin/ncu, else the newest /usr/local/cuda-*/bin/ncu), MOET_NCU_SET (section
# set, default full), MOET_NCU_COUNT (kernel launches profiled per report, default 6),
# MOET_NCU_ROWS_TOKENS / MOET_NCU_WIDE_TOKENS (tokens per expert profiled by rows / wide;
# defaults "1 2 4 8" / "64 256"), MOET_NCU_STEP_BATCHES (decode batches of step, default
# "1 16").
# Needs permission to read the GPU's performance counters (root on the GPU machine).
# Debian runtime libraries may be carried as .deb files in .deb/ (as for tests/gpu/run.sh).
set -uo pipefail
cd "$(dirname "$0")/../.."
build=$1
out=$2
shift 2
what=${*:-rows wide latent}
mkdir -p "$out/ncu"
. tests/gpu/debs.sh
ncu=${MOET_NCU:-$(command -v ncu || true)}
[ -n "$ncu" ] || [ ! -x /usr/local/cuda/bin/ncu ] || ncu=/usr/local/cuda/bin/ncu
[ -n "$ncu" ] || ncu=$(ls -d /usr/local/cuda-*/bin/ncu 2>/dev/null | sort -V | tail -1)
[ -x "$ncu" ] || { echo "ncu.sh: no ncu found (set MOET_NCU)"; exit 1; }
set_=${MOET_NCU_SET:-full}
count=${MOET_NCU_COUNT:-6}
export MOET_SOURCE_DIR=$PWD MOET_TMP=/tmp/moet-test-tmp
mkdir -p "$MOET_TMP"

# prof NAME KERNEL_REGEX COMMAND...: one report of up to $count launches of the kernels whose
# (demangled base) name matches, then its details page as text
prof() {
	local name=$1 kre=$2
	shift 2
	echo "== $(date +%T) $name: $*"
	timeout -s KILL 540 "$ncu" --set "$set_" -k "regex:$kre" -c "$count" -f \
		-o "$out/ncu/$name" "$@" >"$out/ncu/$name.run.txt" 2>&1
	echo "   exit $?"
	"$ncu" --import "$out/ncu/$name.ncu-rep" --page details >"$out/ncu/$name.txt" 2>&1
	local keys="Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)"
	keys+="|Achieved Occupancy|Registers Per|Warp Cycles Per Issued"
	grep -E "^  [a-z_]+.*\(|$keys" "$out/ncu/$name.txt" | head -60
	# the stall reasons (warps stalled per issued instruction, by reason), largest first,
	# per profiled launch: the raw page's smsp__average_warps_issue_stalled_* metrics
	"$ncu" --import "$out/ncu/$name.ncu-rep" --page raw --csv >"$out/ncu/$name.raw.csv" 2>&1
	python3 - "$out/ncu/$name.raw.csv" <<'PY' | tee "$out/ncu/$name.stalls.txt"
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
if len(rows) < 3:
    sys.exit(0)
head = rows[0]
key = "smsp__average_warps_issue_stalled_"
cols = [i for i, h in enumerate(head) if h.startswith(key) and h.endswith("_per_issue_active.ratio")]
name = head.index("Kernel Name") if "Kernel Name" in head else None
def num(v):
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return 0.0
tail = len("_per_issue_active.ratio")
for r in rows[2:]:
    st = sorted(((num(r[i]), head[i][len(key):-tail]) for i in cols), reverse=True)
    print("  %s: %s" % (r[name][:40] if name is not None else "?",
                        ", ".join("%s %.2f" % (n, v) for v, n in st[:6])))
PY
}

for w in $what; do
	case $w in
	rows)
		for t in ${MOET_NCU_ROWS_TOKENS:-1 2 4 8}; do
			prof "rows-t$t" 'rows_(wide_)?kernel' "$build/moet-hybrid" bench gpu-experts \
				--tokens "$t" \
				--reps 1 --experts-rotate 16
		done ;;
	wide)
		for t in ${MOET_NCU_WIDE_TOKENS:-64 256}; do
			prof "wide-t$t" 'rows_wide_kernel' "$build/moet-hybrid" bench gpu-experts \
				--tokens "$t" --reps 1 --experts-rotate 16
		done ;;
	latent)
		prof latent 'latent_fast_kernel' "$build/test_gpu_latent" ;;
	step)
		ck=$out/ncu/step-ckpt
		[ -f "$ck/config.json" ] || "$build/moet-hybrid" gen-checkpoint --preset kimi-k2 \
			--layers 3 --experts 64 --seed 1 --out "$ck" --quiet || exit 1
		for b in ${MOET_NCU_STEP_BATCHES:-1 16}; do
			echo "== $(date +%T) step-b$b"
			timeout -s KILL 540 "$ncu" --metrics gpu__time_duration.sum -f \
				-o "$out/ncu/step-b$b" "$build/moet-hybrid" bench e2e --model "$ck" \
				--device cuda --modes gpu --batches "$b" --prefill none --steps 2 \
				>"$out/ncu/step-b$b.run.txt" 2>&1
			echo "   exit $?"
			"$ncu" --import "$out/ncu/step-b$b.ncu-rep" --page raw --csv \
				--print-units base >"$out/ncu/step-b$b.raw.csv" 2>&1
			python3 tests/gpu/ncu_step.py "$out/ncu/step-b$b.raw.csv" |
				tee "$out/ncu/step-b$b.table.txt" | head -40
		done
		rm -rf "$ck" ;;
	*) echo "ncu.sh: unknown WHAT '$w' (rows, wide, latent, step)"; exit 1 ;;
	esac
done
tar -czf "$out/ncu.tar.gz" -C "$out" ncu

#!/usr/bin/env bash
# tests/gpu/e2e.sh: the hybrid engine end to end on a GPU machine (issue 5): a full-geometry
# synthetic Kimi-K2 checkpoint, a routing profile, placements from `plan`, `verify` on the GPU
# against every expert resident, and `bench e2e` records.
#
# Usage (from the repository root): bash tests/gpu/e2e.sh BUILD_DIR OUT_DIR [CKPT_DIR]
#   BUILD_DIR  a build with moet-hybrid (carried from a development machine is fine)
#   OUT_DIR    logs, profile, placements and JSON records go here
#   CKPT_DIR   where the checkpoint is made if missing (default /dev/shm/moet-kimi: RAM-backed,
#              so the CPU tier reads it from memory as it would a page-cached checkpoint)
# Environment: MOET_E2E_LAYERS (default 4: layer 0 dense + 3 MoE layers of 384 experts, about
# 56 GB), MOET_E2E_HOT (hot experts per layer of the hybrid bench placement, default 352),
# MOET_E2E_STEPS (default 8), MOET_E2E_PREFILL (default 1024,8192),
# MOET_E2E_BATCHES (default 1,4,16,64), MOET_E2E_MODES (default gpu,hybrid,cpu),
# MOET_E2E_VERIFY_HOT (hot experts per layer of the
# verify placement, default 96: over 25% of routings on the CPU), MOET_E2E_SKIP (words:
# verify bench120 bench serve mla), MOET_E2E_SERVE_TOKENS (tokens per stream of the serve step,
# default 64).
# Debian runtime libraries may be carried as .deb files in .deb/ (as for tests/gpu/run.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=$1
out=$2
ckpt=${3:-/dev/shm/moet-kimi}
layers=${MOET_E2E_LAYERS:-4}
hot=${MOET_E2E_HOT:-352}
steps=${MOET_E2E_STEPS:-8}
prefill=${MOET_E2E_PREFILL:-1024,8192}
batches=${MOET_E2E_BATCHES:-1,4,16,64}
vhot=${MOET_E2E_VERIFY_HOT:-96}
skip=${MOET_E2E_SKIP:-}
mkdir -p "$out"
. tests/gpu/debs.sh
bin=$build/moet-hybrid
step() { echo "== $(date +%T) $*" | tee -a "$out/e2e.log"; }

if [ ! -f "$ckpt/config.json" ]; then
	step "gen-checkpoint kimi-k2 --layers $layers -> $ckpt"
	/usr/bin/time -v "$bin" gen-checkpoint --preset kimi-k2 --layers "$layers" --seed 1 \
		--out "$ckpt" --quiet 2>"$out/gen.time"
fi
step "inspect"
"$bin" inspect --model "$ckpt" >"$out/inspect.txt"
step "profile (GPU, every expert resident)"
"$bin" profile --model "$ckpt" --device cuda --synthetic 48 --seed 1 --max-new 8 --batch 16 \
	--quiet --out "$out/profile.json" 2>&1 | tail -3 | tee -a "$out/e2e.log"
for k in 120 "$hot" "$vhot"; do
	step "plan --hot-per-layer $k"
	"$bin" plan --model "$ckpt" --profile "$out/profile.json" --gpus 1 --vram-gb 139GiB \
		--hot-per-layer "$k" --out "$out/place-$k.yaml" >"$out/plan-$k.txt" 2>&1
	tail -2 "$out/plan-$k.txt" | tee -a "$out/e2e.log"
done
if [[ " $skip " != *" verify "* ]]; then
	step "verify --device cuda, $vhot of 384 per layer on the GPU"
	"$bin" verify --model "$ckpt" --device cuda --placement "$out/place-$vhot.yaml" --prompts 64 \
		--len 24 --steps 4 --batches 1,16,64 2>&1 | tee -a "$out/e2e.log"
fi
n_gpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [[ " $skip " != *" verify "* ]] && [ "${n_gpu:-0}" -ge 2 ]; then
	step "plan --gpus 2 --hot-per-layer $vhot; verify on two GPUs"
	"$bin" plan --model "$ckpt" --profile "$out/profile.json" --gpus 2 --vram-gb 139GiB \
		--hot-per-layer "$vhot" --out "$out/place2-$vhot.yaml" >"$out/plan2-$vhot.txt" 2>&1
	"$bin" verify --model "$ckpt" --device cuda --placement "$out/place2-$vhot.yaml" \
		--prompts 16 --len 24 --steps 4 2>&1 | tee -a "$out/e2e.log"
	step "the same with NCCL_P2P_DISABLE=1 CUDA_VISIBLE_DEVICES reversed (no peer path assumed)"
	CUDA_VISIBLE_DEVICES=1,0 NCCL_P2P_DISABLE=1 "$bin" verify --model "$ckpt" --device cuda \
		--placement "$out/place2-$vhot.yaml" --prompts 4 --len 16 --steps 2 2>&1 |
		tee -a "$out/e2e.log"
fi
if [[ " $skip " != *" bench "* ]]; then
	step "bench e2e, hybrid = $hot of 384 per layer on the GPU"
	"$bin" bench e2e --model "$ckpt" --placement "$out/place-$hot.yaml" --batches "$batches" \
		--prefill "$prefill" --steps "$steps" --modes "${MOET_E2E_MODES:-gpu,hybrid,cpu}" \
		--profile-out "$out/bench-profile.json" --json "$out/e2e-hot$hot.json" 2>&1 |
		tee -a "$out/e2e.log"
fi
if [[ " $skip " != *" bench120 "* ]]; then
	step "bench e2e, hybrid = 120 of 384 per layer on the GPU"
	"$bin" bench e2e --model "$ckpt" --modes hybrid --placement "$out/place-120.yaml" \
		--batches "$batches" --prefill 1024 --steps "$steps" --json "$out/e2e-hot120.json" \
		2>&1 | tee -a "$out/e2e.log"
fi
if [[ " $skip " != *" mla "* ]]; then
	# issue 4: the absorbed MLA form (the latent cache) against the expanded default, every
	# expert resident, decode and prefill
	step "bench e2e --modes gpu, MOET_MLA=absorbed"
	MOET_MLA=absorbed "$bin" bench e2e --model "$ckpt" --modes gpu --batches "$batches" \
		--prefill 1024 --steps "$steps" --json "$out/e2e-gpu-absorbed.json" 2>&1 |
		tee -a "$out/e2e.log"
fi
if [[ " $skip " != *" serve "* ]]; then
	# issue 7's targets: 16 streams >= 4x one stream's tokens/s with every expert resident;
	# with the hot-120 placement, tokens/s against the bytes-roofline prediction
	stok=${MOET_E2E_SERVE_TOKENS:-64}
	step "bench serve --streams 1,16, every expert resident"
	"$bin" bench serve --device cuda --model "$ckpt" --streams 1,16 --tokens "$stok" --reps 3 \
		--json "$out/serve-resident.json" 2>&1 | tee -a "$out/e2e.log"
	step "bench serve --streams 1,16, hybrid = 120 of 384 per layer on the GPU"
	"$bin" bench serve --device cuda --model "$ckpt" --streams 1,16 --tokens "$stok" --reps 3 \
		--placement "$out/place-120.yaml" --json "$out/serve-hot120.json" 2>&1 |
		tee -a "$out/e2e.log"
fi
if [ -f "$out/bench-profile.json" ]; then
	step "cost model on the bench's own routing (compare with the measured steps above)"
	for k in "$hot" 120; do
		"$bin" plan --predict --model "$ckpt" --placement "$out/place-$k.yaml" \
			--profile "$out/bench-profile.json" --batch "$batches" \
			--hardware configs/hardware-h200-host.yaml 2>&1 | tail -6 | tee -a "$out/e2e.log"
	done
fi
step "done"

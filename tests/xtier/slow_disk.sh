#!/usr/bin/env bash
# tests/xtier/slow_disk.sh: the NVMe tier's prefetch policies (MOET_XTIER_PREFETCH=all|budget)
# on a disk made slow on purpose, alternating, on any Linux machine with root (no GPU): the
# tier's reads go through a block-I/O throttle of the cgroup the bench runs in (cgroup v1
# blkio.throttle.read_bps_device, or cgroup v2 io.max), so that one expert's read takes
# several all-in-RAM decode steps, as a 44 MB Kimi-K2 expert does on the GPU machine's 2.1 GB/s
# virtual disk (21 ms against a ~4 ms step at batch 1).
#
# Usage (from the repository root): bash tests/xtier/slow_disk.sh BUILD_DIR OUT_DIR
# Environment: MOET_SD_BPS (read bytes/s of the throttle, default 16000000: a 98 KB expert of
# the model below in ~6.9 ms against its ~1.2 ms all-in-RAM step), MOET_SD_REPS (rounds of
# all, budget; default 2), MOET_SD_BATCHES (default 1,16), MOET_SD_BUDGET (default 50%),
# MOET_SD_DIR (work directory on the throttled disk, default /var/tmp/moet-slow-disk).
# The model: gen-checkpoint --preset tiny --experts 384 --layers 4 --hot-share 0.8, 64 experts
# per MoE layer on a simulated device (plan --hot-per-layer 64), the rest the CPU tier behind
# the NVMe tier; bench e2e --device cpu --ram-only, 32 warm-up and 32 timed steps.
# Out: OUT_DIR/<policy>-<round>.txt and .json, and table.txt (mean step: the throughput; the
# median hides the steps that wait for reads).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=$(cd "$1" && pwd)
out=$2
bps=${MOET_SD_BPS:-16000000}
reps=${MOET_SD_REPS:-2}
batches=${MOET_SD_BATCHES:-1,16}
budget=${MOET_SD_BUDGET:-50%}
dir=${MOET_SD_DIR:-/var/tmp/moet-slow-disk}
mkdir -p "$out" "$dir"
out=$(cd "$out" && pwd)
bin=$build/moet-hybrid
ck=$dir/ck
if [ ! -f "$ck/config.json" ]; then
	"$bin" gen-checkpoint --preset tiny --experts 384 --layers 4 --seed 1 --hot-share 0.8 \
		--out "$ck" --quiet
fi
"$bin" profile --model "$ck" --device cpu --synthetic 32 --seed 1 --max-new 8 --batch 16 \
	--quiet --out "$dir/profile.json" >/dev/null
"$bin" plan --model "$ck" --profile "$dir/profile.json" --gpus 1 --vram-gb 139GiB \
	--hot-per-layer 64 --out "$dir/place.yaml" >/dev/null

# the throttle on the block device that holds the checkpoint
src=$(df --output=source "$ck" | tail -1)
devno=$(lsblk -no MAJ:MIN "$src" 2>/dev/null | head -1 | tr -d ' ')
parent=$(lsblk -no PKNAME "$src" 2>/dev/null | head -1)
[ -z "$parent" ] || devno=$(lsblk -no MAJ:MIN "/dev/$parent" | head -1 | tr -d ' ')
[ -n "$devno" ] || { echo "slow_disk.sh: no block device under $ck ($src)"; exit 1; }
if [ -d /sys/fs/cgroup/blkio ]; then
	cg=/sys/fs/cgroup/blkio/moet-slow-disk
	mkdir -p "$cg"
	echo "$devno $bps" >"$cg/blkio.throttle.read_bps_device"
else
	root=$(awk '$3 == "cgroup2" {print $2; exit}' /proc/mounts)
	grep -qw io "$root/cgroup.controllers" || { echo "slow_disk.sh: no io controller"; exit 1; }
	echo +io >"$root/cgroup.subtree_control" 2>/dev/null || true
	cg=$root/moet-slow-disk
	mkdir -p "$cg"
	echo "$devno rbps=$bps" >"$cg/io.max"
fi
echo "throttle: $devno at $bps B/s ($cg)" | tee "$out/table.txt"

run() { # policy round
	(
		echo $BASHPID >"$cg/cgroup.procs"
		sync
		echo 3 >/proc/sys/vm/drop_caches
		MOET_XTIER_PREFETCH=$1 exec "$bin" bench e2e --model "$ck" --device cpu \
			--placement "$dir/place.yaml" --modes hybrid --batches "$batches" \
			--prefill none --ctx 32 --warmup 32 --steps 32 --no-overlap-check \
			--ram-budgets "$budget" --ram-only --json "$out/$1-$2.json"
	) >"$out/$1-$2.txt" 2>&1
}
for r in $(seq "$reps"); do
	for p in all budget; do
		run "$p" "$r"
		awk -v p="$p" -v r="$r" '/RAM budget/ {
			for (i = 1; i <= NF; i++) if ($i == "step") m = $(i + 1)
			printf "%-7s round %s  batch %4s  median %9.3f ms  mean %9.3f ms\n", p, r, $3,
			       $4, m}' "$out/$p-$r.txt" | tee -a "$out/table.txt"
	done
done

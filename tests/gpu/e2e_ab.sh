#!/usr/bin/env bash
# tests/gpu/e2e_ab.sh: `bench e2e --modes hybrid` (or gpu) of one placement under several
# environment variants, alternating (A B C A B C ...), with one table of the decode steps, the overlap
# bound and the time split per variant, run and batch (tests/gpu/e2e_table.py). For A/B
# measurements of the engine's switches (docs/hybrid.md): the same checkpoint, placement and
# batches in every run; a fresh process per run; the machine's drift falls on every variant
# alike. Compare medians over rounds, not single runs: on the H200 machine the same code spreads
# ~5% between runs and the serial run behind Tc far more (docs/hybrid.md, "Queued copies").
#
# Usage (from the repository root):
#   bash tests/gpu/e2e_ab.sh BUILD_DIR OUT_DIR CKPT_DIR PLACEMENT 'NAME[:VAR=V[,VAR=V...]]' ...
#   BUILD_DIR  a build with moet-hybrid (carried from a development machine is fine)
#   OUT_DIR    e2e-NAME-R.json / .txt per run, table.txt (also printed) and one archive of it
#              all, ab.tar.gz (the device tool brings back few files); the variants' records of
#              an earlier invocation there are removed first
#   CKPT_DIR   the checkpoint (e.g. made by gen-checkpoint in /dev/shm)
#   PLACEMENT  the placement file (e.g. from tests/gpu/plan_auto.sh)
#   variants   e.g. def 'queued:MOET_MB_QUEUE=1' 'split:MOET_MICROBATCH=1,MOET_MB_MERGE=1'
# Environment: MOET_AB_ROUNDS (default 2), MOET_AB_BATCHES (default 16,64), MOET_AB_STEPS
# (default 16), MOET_AB_DEVICE (default cuda; cpu runs the same on the CPU backend),
# MOET_AB_MODE (default hybrid; gpu: every expert resident, the placement file still needed,
# no overlap check: Tc, Tg and the bound are nan), MOET_AB_TIMEOUT (seconds per run, default
# 300), MOET_AB_TRACE (1: after the rounds one more run per variant, untimed in the table, with
# MOET_TRACE and without the overlap check: trace-NAME.txt from tests/gpu/trace_table.py, the
# trace itself as trace-NAME.json.xz).
# Debian runtime libraries may be carried as .deb files in .deb/ (as for tests/gpu/run.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ $# -lt 5 ]; then
	sed -n '2,/^set -euo/p' "$0" | sed '$d' >&2
	exit 2
fi
build=$1 out=$2 ckpt=$3 place=$4
shift 4
rounds=${MOET_AB_ROUNDS:-2}
mode=${MOET_AB_MODE:-hybrid}
case $mode in
hybrid | gpu) ;;
*) echo "e2e_ab: MOET_AB_MODE=$mode (want hybrid or gpu)" >&2; exit 2 ;;
esac
case $rounds in
'' | *[!0-9]* | 0) echo "e2e_ab: MOET_AB_ROUNDS=$rounds (want a whole number >= 1)" >&2; exit 2 ;;
esac
for v in "$@"; do
	case ${v%%:*} in
	'' | *[!A-Za-z0-9_-]*) echo "e2e_ab: variant name '${v%%:*}' (want letters, digits, _ or -)" >&2
		exit 2 ;;
	esac
done
mkdir -p "$out"
. tests/gpu/debs.sh
# an earlier invocation's records of these variants (more rounds, say) would enter the table
for v in "$@"; do
	rm -f "$out/e2e-${v%%:*}-"[0-9]*.json "$out/e2e-${v%%:*}-"[0-9]*.txt
done
for r in $(seq 1 "$rounds"); do
	for v in "$@"; do
		name=${v%%:*} envs=()
		[ "$name" = "$v" ] || IFS=, read -ra envs <<<"${v#*:}"
		echo "== $(date +%T) $name round $r ${envs[*]:-}"
		rc=0
		env "${envs[@]}" timeout "${MOET_AB_TIMEOUT:-300}" "$build/moet-hybrid" bench e2e \
			--model "$ckpt" --device "${MOET_AB_DEVICE:-cuda}" --modes "$mode" \
			--placement "$place" --batches "${MOET_AB_BATCHES:-16,64}" --prefill none \
			--steps "${MOET_AB_STEPS:-16}" --json "$out/e2e-$name-$r.json" \
			>"$out/e2e-$name-$r.txt" 2>&1 || rc=$?
		if [ "$rc" != 0 ]; then
			echo "e2e_ab: $name round $r failed (exit $rc): $out/e2e-$name-$r.txt" >&2
			tail -n 3 "$out/e2e-$name-$r.txt" >&2
		fi
	done
done
MOET_AB_MODE=$mode MOET_AB_ROUNDS=$rounds python3 tests/gpu/e2e_table.py "$out" "$@" |
	tee "$out/table.txt"
if [ "${MOET_AB_TRACE:-0}" = 1 ]; then
	for v in "$@"; do
		name=${v%%:*} envs=()
		[ "$name" = "$v" ] || IFS=, read -ra envs <<<"${v#*:}"
		echo "== $(date +%T) $name traced ${envs[*]:-}"
		rm -f "$out/trace-$name.json" "$out/trace-$name.json.xz"
		rc=0
		env "${envs[@]}" MOET_TRACE="$out/trace-$name.json" MOET_TRACE_MAX=2000000 \
			timeout "${MOET_AB_TIMEOUT:-300}" "$build/moet-hybrid" bench e2e \
			--model "$ckpt" --device "${MOET_AB_DEVICE:-cuda}" --modes "$mode" \
			--placement "$place" --batches "${MOET_AB_BATCHES:-16,64}" --prefill none \
			--steps "${MOET_AB_STEPS:-16}" --no-overlap-check \
			>"$out/trace-$name.log" 2>&1 || rc=$?
		if [ "$rc" != 0 ]; then
			echo "e2e_ab: $name traced run failed (exit $rc): $out/trace-$name.log" >&2
			continue
		fi
		python3 tests/gpu/trace_table.py "$out/trace-$name.json" 6 >"$out/trace-$name.txt"
		! command -v xz >/dev/null || xz -f "$out/trace-$name.json"
	done
fi
# NOTE: written outside OUT_DIR, then moved in: tar fails on a file that grows while read
arch=$(mktemp)
tar -czf "$arch" -C "$out" --exclude ab.tar.gz .
mv "$arch" "$out/ab.tar.gz"

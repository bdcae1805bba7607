#!/usr/bin/env bash
# tests/gpu/run.sh: every GPU test, on a machine with a CUDA device.
#
# Usage (from the repository root): bash tests/gpu/run.sh [BUILD_DIR] [OUT_DIR]
#   BUILD_DIR  a build made on a development machine and carried here (default: build), or
#              built here if missing (needs cmake, nvcc and the Debian -dev packages)
#   OUT_DIR    where logs go (default: $OUT if set, else ./gpu-test-out)
# Environment: MOET_GPU_TESTS (a glob of the tests to run, default test_*),
# MOET_GPU_TEST_TIMEOUT (seconds one test may run before it is killed and counted as failed,
# default 300: a hang must not eat the rest of a GPU machine's lease).
# Debian runtime libraries the binaries link (libjansson, ...) may be carried as .deb files in
# .deb/ (see docs/benchmarks.md); they are unpacked into /tmp/moet-debs and put on
# LD_LIBRARY_PATH.
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
out=${2:-${OUT:-gpu-test-out}}
mkdir -p "$out"
. tests/gpu/debs.sh
if [ ! -x "$build/moet-hybrid" ]; then
	cmake -S . -B "$build" -G Ninja >"$out/configure.log" 2>&1 && cmake --build "$build" >"$out/build.log" 2>&1 || {
		echo "build failed (see $out/build.log)"; exit 1; }
fi
nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || true
# NOTE: the test programs are run directly rather than through ctest, since a carried build
# folder's CTest files name the paths of the machine that built it.
export MOET_SOURCE_DIR=$PWD MOET_BIN=$PWD/$build/moet-hybrid MOET_TMP=/tmp/moet-test-tmp
logs=$(mktemp -d)
mkdir -p "$MOET_TMP"
pass=0 fail=0 skip=0
limit=${MOET_GPU_TEST_TIMEOUT:-300}
for t in "$build"/${MOET_GPU_TESTS:-test_*}; do
	[ -x "$t" ] || continue
	name=$(basename "$t")
	start=$(date +%s%N)
	timeout -s KILL "$limit" "$t" >"$logs/$name.log" 2>&1
	rc=$?
	ms=$((($(date +%s%N) - start) / 1000000))
	case $rc in
	0) pass=$((pass + 1)); st=PASS ;;
	77) skip=$((skip + 1)); st=SKIP ;;
	137) fail=$((fail + 1)); st="TIMEOUT(${limit}s)" ;;
	*) fail=$((fail + 1)); st="FAIL($rc)" ;;
	esac
	printf '%-28s %-8s %7d ms  %s\n' "$name" "$st" "$ms" "$(tail -n 1 "$logs/$name.log")" |
		tee -a "$out/summary.txt"
done
echo "$pass passed, $fail failed, $skip skipped" | tee -a "$out/summary.txt"
# NOTE: one archive for the per-test logs: the device tool brings back at most 8 files.
tar -czf "$out/test-logs.tar.gz" -C "$logs" .
[ "$fail" -eq 0 ]

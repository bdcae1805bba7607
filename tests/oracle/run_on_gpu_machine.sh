#!/usr/bin/env bash
# run_on_gpu_machine.sh: regenerates the oracle fixtures on a machine with torch, transformers
# 5.x, safetensors and a CUDA GPU (the GPU is needed by the "hf-fp8" fixture only, whose
# checkpoint transformers' own FineGrainedFP8Config path quantizes).
#
#   bash tests/oracle/run_on_gpu_machine.sh [DEST] [--only NAME ...]
#
# Writes DEST/fixtures.tar.gz (the folder tests/oracle/fixtures/, ready to unpack at the
# repository root) and DEST/make_fixtures.log. DEST defaults to $OUT, else ./oracle-out.
# Unpack here with: tar -xzf DEST/fixtures.tar.gz -C /path/to/repo
set -euo pipefail
cd "$(dirname "$0")/../.."
dest="${OUT:-./oracle-out}"
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then dest="$1"; shift; fi
mkdir -p "$dest"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/tests/oracle/fixtures"
export PYTHONUNBUFFERED=1
rc=0
python3 tests/oracle/make_fixtures.py --out "$work/tests/oracle/fixtures" "$@" \
	2>&1 | tee "$dest/make_fixtures.log" || rc=$?
tar -czf "$dest/fixtures.tar.gz" -C "$work" tests/oracle/fixtures
du -sh "$work/tests/oracle/fixtures"/* || true
exit "$rc"

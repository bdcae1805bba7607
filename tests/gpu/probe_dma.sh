#!/usr/bin/env bash
# tests/gpu/probe_dma.sh: runs probe_dma (tests/gpu/probe_dma.c) on a file of GIB GiB made in
# /dev/shm: the DMA rate from the page-locked mapped pages alone and beside the CPU tier's reads.
# Usage (from the repository root): bash tests/gpu/probe_dma.sh [BUILD_DIR] [GIB] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build} gib=${2:-8} secs=${3:-1.5}
. tests/gpu/debs.sh
f=/dev/shm/probe-dma.bin
[ "$(stat -c %s "$f" 2>/dev/null || echo 0)" -ge $((gib << 30)) ] ||
	dd if=/dev/zero of="$f" bs=64M count=$((gib * 16)) status=none
"$build/probe_dma" "$f" "$secs"
rm -f "$f"

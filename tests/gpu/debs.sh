# tests/gpu/debs.sh, sourced by the GPU scripts from the repository root: the Debian runtime
# libraries the binaries link (libjansson, ...), carried as .deb files in .deb/ (see
# docs/benchmarks.md), unpacked into /tmp/moet-debs and put on LD_LIBRARY_PATH. Nothing
# happens without .deb/ (a machine that has the packages installed).
if ls .deb/*.deb >/dev/null 2>&1; then
	mkdir -p /tmp/moet-debs
	for f in .deb/*.deb; do dpkg -x "$f" /tmp/moet-debs; done
	export LD_LIBRARY_PATH="/tmp/moet-debs/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi

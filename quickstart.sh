#!/usr/bin/env bash
# quickstart.sh: set up, build and run moet-hybrid on a fresh Debian/Ubuntu machine.
#
#   ./quickstart.sh serve   build, start the OpenAI-compatible server on the embedded demo
#                           (foreground; PORT=N picks the port, default 8000)
#   ./quickstart.sh demo    build, make the demo checkpoint on first use, run generate on it
#   ./quickstart.sh test    build, run every test (ctest)
#   ./quickstart.sh asan    build with AddressSanitizer + UBSan in build-asan/, run every test
#
# Installs the Debian packages the build needs when they are missing (apt-get, as root or
# through sudo). CUDA code is compiled when nvcc is found (/usr/local/cuda/bin or PATH).
set -euo pipefail
cd "$(dirname "$0")"

PKGS=(build-essential cmake ninja-build pkg-config libjansson-dev libhwloc-dev libnuma-dev
	libdnnl-dev libyaml-dev libpcre2-dev libmicrohttpd-dev liburing-dev)

need_pkgs() {
	local missing=()
	for p in "${PKGS[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
			missing+=("$p")
	done
	if [ ${#missing[@]} -gt 0 ]; then
		echo "quickstart: installing ${missing[*]}" >&2
		local sudo=""
		[ "$(id -u)" -eq 0 ] || sudo="sudo"
		$sudo apt-get update -qq
		DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
	fi
}

build() { # build DIR [cmake options...]
	local dir=$1
	shift
	export PATH="$PATH:/usr/local/cuda/bin"
	cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
	cmake --build "$dir" -j "$(nproc)"
}

cmd=${1:-demo}
case "$cmd" in
serve)
	need_pkgs
	build build
	port=${PORT:-8000}
	cat >&2 <<MSG
quickstart: starting the server on the embedded demo (a synthetic, untrained model: its text
is meaningless; made on first use). In another terminal:

  curl -s http://127.0.0.1:$port/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 32}'

  curl -sN http://127.0.0.1:$port/v1/completions -H 'Content-Type: application/json' \\
    -d '{"prompt": "Once upon a time", "max_tokens": 32, "stream": true}'

Ctrl-C stops it.
MSG
	exec build/moet-hybrid serve --port "$port"
	;;
demo)
	need_pkgs
	build build
	demo_dir=${MOET_DEMO_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/moet-hybrid/demo-tiny}
	if [ ! -f "$demo_dir/config.json" ]; then
		echo "quickstart: writing the demo checkpoint (synthetic, untrained) to $demo_dir" >&2
		mkdir -p "$(dirname "$demo_dir")"
		build/moet-hybrid gen-checkpoint --preset tiny --seed 1 --out "$demo_dir" --quiet
	fi
	build/moet-hybrid inspect --model "$demo_dir"
	echo "quickstart: greedy continuation of tokens 1,2,3,4,5 (an untrained synthetic model)"
	build/moet-hybrid generate --model "$demo_dir" --tokens 1,2,3,4,5 --max-new 16
	;;
test)
	need_pkgs
	build build
	ctest --test-dir build --output-on-failure -j 2
	;;
asan)
	need_pkgs
	build build-asan -DMOET_SANITIZE=ON
	ctest --test-dir build-asan --output-on-failure -j 2
	;;
*)
	echo "usage: $0 serve|demo|test|asan" >&2
	exit 2
	;;
esac

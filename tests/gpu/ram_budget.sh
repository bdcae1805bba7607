#!/usr/bin/env bash
# tests/gpu/ram_budget.sh: decode under a RAM budget, the NVMe tier against plain mmap paging,
# measured side by side (issue 9's target: with a 50% RAM budget and skewed routing, decode
# tokens/s >= 60% of the all-in-RAM figure, and above what the same placement gets from plain
# mmap page-cache paging).
#
# Usage (from the repository root): bash tests/gpu/ram_budget.sh BUILD_DIR OUT_DIR [CKPT_DIR]
#   BUILD_DIR  a build with moet-hybrid (carried from a development machine is fine)
#   OUT_DIR    ram_budget.log, the bench outputs, the JSON records, table.txt and
#              ram_budget.json (the table as JSON) go here
#   CKPT_DIR   where the checkpoint is made if missing (default /var/tmp/moet-rb-PRESET-LAYERS).
#              It must be on a real disk, not tmpfs (/dev/shm): tmpfs pages cannot be paged
#              out, so an mmap'd checkpoint there never leaves RAM. Its profile and placement
#              are kept beside it in CKPT_DIR.rb/ and reused by later calls.
#
# Three configurations, one placement (plan --hot-per-layer K from a routing profile of a
# checkpoint with skewed routing), the same decode batches, each a separate `bench e2e --modes
# hybrid` process with --prefill none (and --no-overlap-check: decode rows only):
#   all   every CPU-tier expert in RAM: no tier, no limit, the page cache warmed first by reading
#         the shards (row decode-hybrid);
#   tier  per budget B (50%, 25% of the CPU tier's experts): the NVMe tier (`--ram-budgets B
#         --ram-only`, docs/io-uring.md): slots in RAM filled by io_uring O_DIRECT reads;
#   mmap  per budget B: no tier, the CPU tier reading the mmap'd checkpoint, the process in a
#         cgroup v2 whose memory.max equals what the tier process of that budget held beside
#         the page cache, so the kernel pages experts in and out of a page cache of about the
#         slots' size.
# The page cache is dropped (sync; echo 3 > /proc/sys/vm/drop_caches) before each tier and mmap
# process, so none inherits another's cache (MOET_RB_DROP=0 skips it: on a shared machine).
#
# The limit of the mmap row, and why it is measured this way: the tier process of the same
# budget runs in a cgroup without a limit while its memory is sampled every 0.1 s; the limit
# is the peak of memory.current - (active_file + inactive_file), i.e. everything the tier
# process held that was not reclaimable page cache: its slots (anonymous memory) plus the
# process's own baseline (heap, KV caches, staging buffers, what the driver charges, page
# tables). So the mmap process, which needs the same baseline but no slots, is left about the
# slots' bytes for the checkpoint's pages. Measured rather than estimated (e.g. from the
# dense part's size) because the baseline is mostly not the checkpoint: on a GPU the dense
# part lives on the device and the host process's own memory is CUDA's and the engine's. On
# --device cpu the dense part is read from the mapping at every step by both processes (as
# page cache, outside the measured peak), so its bytes (plan's "dense part") are added to the
# limit there. The peak includes transient buffers of the start (the upload's staging), which
# the mmap process also has at its start. Should the mmap process still be OOM-killed, it is
# run once more with MOET_RB_OOM_MARGIN_MB (default 512) more, and the table says so.
#
# cgroup v2: the script looks for a cgroup2 mount whose cgroup.controllers has "memory",
# enables it in that mount's cgroup.subtree_control, creates moet-rb-* children there, moves a
# probe process in and checks /proc/self/cgroup. If any of that fails (cgroup v1 or a hybrid
# mount with memory bound to v1, no permission, a container's namespace root with processes
# in it), it says why, the mmap rows are skipped and the rest runs. Needs root in practice.
#
# Environment:
#   MOET_RB_DEVICE   cuda (default) or cpu (the script's logic on a machine without a GPU)
#   MOET_RB_PRESET   kimi-k2 (default) or tiny; MOET_RB_LAYERS (default 3: layer 0 dense and
#                    2 MoE layers of 384 experts, about 40 GB with kimi-k2)
#   MOET_RB_SHARE    gen-checkpoint --hot-share (default 0.8: the generator's hot set of 120
#                    experts per layer gets 80% of the routings), or MOET_RB_SHARES for
#                    --hot-share-by-layer F1,F2 (one per MoE layer)
#   MOET_RB_HOT      experts per MoE layer on the GPU (plan --hot-per-layer; default 64 with
#                    kimi-k2, 5 with tiny: half the hot set, so the CPU tier's own routing is
#                    skewed too, as with a real checkpoint's long tail)
#   MOET_RB_BUDGETS  RAM budgets (default 50%,25%); MOET_RB_BATCHES (default 1,16);
#                    MOET_RB_STEPS timed steps (default 12); MOET_RB_CTX (default 32);
#                    MOET_RB_WARMUP untimed decode steps before them (default 32: the
#                    tier's slots move from the profile's warm fill toward what these
#                    prompts route to, as in a served decode, before it is timed)
#   MOET_RB_ROWS     which configurations (default "all tier mmap"; "none": only make the
#                    checkpoint, profile and placement, e.g. as a first call)
#   MOET_RB_DROP     1 (default): drop the page cache before each tier and mmap process
#   MOET_RB_OOM_MARGIN_MB  see above (default 512)
#   MOET_RB_FAKE_CGROUP=DIR  test only: DIR, a plain directory, stands in for the cgroup root
#                    (files written by hand, no limit enforced, figures not measured); for
#                    checking the script's logic where there is no cgroup v2
# Time on the GPU machine: the checkpoint (about 40 GB written) and the GPU profile take a few
# minutes; run with MOET_RB_ROWS=none first if one call must stay under 10 minutes.
# Debian runtime libraries may be carried as .deb files in .deb/ (as for tests/gpu/run.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=$1
out=$2
device=${MOET_RB_DEVICE:-cuda}
preset=${MOET_RB_PRESET:-kimi-k2}
layers=${MOET_RB_LAYERS:-3}
ckpt=${3:-/var/tmp/moet-rb-$preset-$layers}
share=${MOET_RB_SHARE:-0.8}
shares=${MOET_RB_SHARES:-}
if [ "$preset" = tiny ]; then hot=${MOET_RB_HOT:-5}; else hot=${MOET_RB_HOT:-64}; fi
budgets=${MOET_RB_BUDGETS:-50%,25%}
batches=${MOET_RB_BATCHES:-1,16}
steps=${MOET_RB_STEPS:-12}
warmup=${MOET_RB_WARMUP:-32}
ctx=${MOET_RB_CTX:-32}
rows=" ${MOET_RB_ROWS:-all tier mmap} "
dropping=${MOET_RB_DROP:-1}
margin=$((${MOET_RB_OOM_MARGIN_MB:-512} << 20))
fake=${MOET_RB_FAKE_CGROUP:-}
mkdir -p "$out"
out=$(cd "$out" && pwd)
. tests/gpu/debs.sh
bin=$build/moet-hybrid
log=$out/ram_budget.log
step() { echo "== $(date +%T) $*" | tee -a "$log"; }
say() { echo "$*" | tee -a "$log"; }
die() { echo "ram_budget: $*" | tee -a "$log" >&2; exit 1; }

# ---- the checkpoint, its profile and placement ----
mkdir -p "$(dirname "$ckpt")"
fs=$(stat -fc %T "$(dirname "$ckpt")")
case $fs in tmpfs | ramfs) die "$ckpt: on $fs, which cannot be paged out; give a CKPT_DIR on" \
	"a disk";; esac
gen_args=(--preset "$preset" --layers "$layers" --seed 1)
if [ -n "$shares" ]; then gen_args+=(--hot-share-by-layer "$shares")
else gen_args+=(--hot-share "$share"); fi
if [ ! -f "$ckpt/config.json" ]; then
	avail=$(df -B1 --output=avail "$(dirname "$ckpt")" | tail -1)
	if [ "$preset" = kimi-k2 ]; then
		# NOTE: about 17.2 GB per MoE layer (384 experts) and 5 GB for the rest
		need=$(((layers - 1) * 17200000000 + 5000000000))
		[ "$avail" -gt "$need" ] || die "$(dirname "$ckpt"): $avail bytes free, the" \
			"checkpoint needs about $need"
	fi
	step "gen-checkpoint ${gen_args[*]} -> $ckpt ($fs, $avail bytes free)"
	"$bin" gen-checkpoint "${gen_args[@]}" --out "$ckpt" --quiet 2>&1 | tee -a "$log"
	echo "${gen_args[*]}" >"$ckpt/.moet-rb-args"
elif [ "$(cat "$ckpt/.moet-rb-args" 2>/dev/null)" != "${gen_args[*]}" ]; then
	die "$ckpt was not made with '${gen_args[*]}' (.moet-rb-args: $(cat \
		"$ckpt/.moet-rb-args" 2>/dev/null || echo none)): remove it or give another CKPT_DIR"
fi
ckpt_bytes=$(du -sb "$ckpt" | cut -f1)
say "checkpoint $ckpt: $ckpt_bytes bytes (du), filesystem $fs"
cp "$ckpt/generator.json" "$out/generator.json"
state=$ckpt.rb
mkdir -p "$state"
if [ ! -f "$state/profile-$device.json" ]; then
	step "profile --synthetic 48 ($device, every expert resident)"
	"$bin" profile --model "$ckpt" --device "$device" --synthetic 48 --seed 1 --max-new 8 \
		--batch 16 --quiet --out "$state/profile-$device.json.tmp" 2>&1 | tail -3 | tee -a "$log"
	mv "$state/profile-$device.json.tmp" "$state/profile-$device.json"
fi
place=$state/place-$device-$hot.yaml
if [ ! -f "$place" ]; then
	step "plan --hot-per-layer $hot"
	"$bin" plan --model "$ckpt" --profile "$state/profile-$device.json" --gpus 1 \
		--vram-gb 139GiB --hot-per-layer "$hot" --out "$place.tmp" >"$state/plan-$hot.txt" 2>&1
	mv "$place.tmp" "$place"
fi
cp "$place" "$state/plan-$hot.txt" "$state/profile-$device.json" "$out/"
dense=$(awk '/^dense part:/ {print $3; exit}' "$state/plan-$hot.txt")
[ -n "$dense" ] || die "no 'dense part:' line in $state/plan-$hot.txt"
grep -E '^experts per MoE layer|hit rate' "$state/plan-$hot.txt" | tail -2 | tee -a "$log" || true

bench=("$bin" bench e2e --model "$ckpt" --device "$device" --modes hybrid --placement "$place"
	--batches "$batches" --ctx "$ctx" --steps "$steps" --warmup "$warmup" --prefill none
	--no-overlap-check)

drop_cache() {
	[ "$dropping" = 1 ] || { say "page cache kept (MOET_RB_DROP=$dropping)"; return 0; }
	sync
	if (echo 3 >/proc/sys/vm/drop_caches) 2>/dev/null; then
		say "page cache dropped ($(awk '/^Cached:/ {print $2 " kB"}' /proc/meminfo) cached now)"
	else
		say "WARNING: cannot drop the page cache (/proc/sys/vm/drop_caches not writable):" \
			"this run may find the previous one's pages"
	fi
}

# ---- cgroup v2 ----
cg_root='' cg_why='' made_cgs=() poller=''
cleanup() {
	[ -z "$poller" ] || kill "$poller" 2>/dev/null || true
	for c in "${made_cgs[@]}"; do
		if [ -n "$fake" ]; then rm -rf "$c"; else rmdir "$c" 2>/dev/null || true; fi
	done
}
trap cleanup EXIT
cg_probe() {
	if [ -n "$fake" ]; then
		[ -d "$fake" ] || { cg_why="MOET_RB_FAKE_CGROUP=$fake: not a directory"; return 1; }
		cg_root=$fake
		say "cgroup: TEST MODE, $fake stands in for a cgroup v2 root: no limit is enforced"
		return 0
	fi
	local root
	root=$(awk '$3 == "cgroup2" {print $2; exit}' /proc/mounts)
	if [ -z "$root" ]; then
		cg_why="no cgroup v2 mounted (/sys/fs/cgroup is $(stat -fc %T /sys/fs/cgroup \
			2>/dev/null || echo absent): cgroup v1)"
		return 1
	fi
	if ! grep -qw memory "$root/cgroup.controllers" 2>/dev/null; then
		cg_why="the cgroup v2 at $root lacks the memory controller (cgroup.controllers:"
		cg_why+=" '$(cat "$root/cgroup.controllers" 2>/dev/null)'; with a v1 memory"
		cg_why+=" hierarchy mounted it is bound there)"
		return 1
	fi
	if ! grep -qw memory "$root/cgroup.subtree_control" &&
		! (echo +memory >"$root/cgroup.subtree_control") 2>/dev/null; then
		cg_why="cannot enable the memory controller in $root/cgroup.subtree_control (not root,"
		cg_why+=" or a non-root cgroup with processes of its own)"
		return 1
	fi
	local p=$root/moet-rb-probe-$$ got
	if ! mkdir "$p" 2>/dev/null; then
		cg_why="cannot create a cgroup under $root (mkdir $p failed)"
		return 1
	fi
	if [ ! -f "$p/memory.max" ] || ! (echo 1073741824 >"$p/memory.max") 2>/dev/null; then
		rmdir "$p"
		cg_why="$p/memory.max is missing or not writable"
		return 1
	fi
	got=$(sh -c 'echo $$ >"$1/cgroup.procs" && cat /proc/self/cgroup' _ "$p" 2>&1 || true)
	for _ in 1 2 3 4 5 6 7 8 9 10; do rmdir "$p" 2>/dev/null && break; sleep 0.2; done
	if [[ "$got" != *"/moet-rb-probe-$$"* ]]; then
		cg_why="a process could not be moved into $p (/proc/self/cgroup: $got)"
		return 1
	fi
	cg_root=$root
	say "cgroup: v2 at $root with the memory controller; children moet-rb-* made there"
}
# cg_make NAME LIMIT: a child cgroup (LIMIT bytes or "max"); its path in $cg.
cg_make() {
	cg=$cg_root/moet-rb-$1-$$
	mkdir "$cg"
	made_cgs+=("$cg")
	if [ -n "$fake" ]; then
		# stand-ins: 3 GiB charged, 1 GiB of it page cache of files
		echo 3221225472 >"$cg/memory.current"
		printf 'anon 2147483648\nfile 1073741824\nactive_file 536870912\n' >"$cg/memory.stat"
		printf 'inactive_file 536870912\npgmajfault 0\nworkingset_refault_file 0\n' \
			>>"$cg/memory.stat"
		printf 'low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n' >"$cg/memory.events"
		: >"$cg/cgroup.procs"
	fi
	echo "$2" >"$cg/memory.max"
	if [ -f "$cg/memory.swap.max" ]; then echo 0 >"$cg/memory.swap.max"; fi
}
# cg_exec CG CMD...: CMD in cgroup CG.
cg_exec() {
	local c=$1
	shift
	bash -c 'echo $$ >"$1/cgroup.procs" || exit 125; shift; exec "$@"' _ "$c" "$@"
}
# cg_poll CG FILE: the peak of memory.current - active_file - inactive_file into FILE.
cg_poll() {
	local peak=0 cur v
	echo 0 >"$2"
	while cur=$(cat "$1/memory.current" 2>/dev/null); do
		v=$(awk -v c="$cur" '$1 == "active_file" || $1 == "inactive_file" {c -= $2}
			END {printf "%.0f\n", c}' "$1/memory.stat" 2>/dev/null) || break
		# NOTE: written aside and renamed: the poller is killed at any moment
		if [ "$v" -gt "$peak" ]; then peak=$v; echo "$peak" >"$2.new" && mv -f "$2.new" "$2"; fi
		sleep 0.1
	done
}
stat_of() { awk -v k="$2" '$1 == k {print $2; exit}' "$1" 2>/dev/null || true; }
cg_ok=0
if [[ "$rows" == *" mmap "* ]] || [[ "$rows" == *" tier "* ]]; then
	if cg_probe; then cg_ok=1; else say "cgroup: UNAVAILABLE: $cg_why; the mmap rows are skipped"; fi
fi

# ---- the measurements ----
IFS=, read -r -a blist <<<"$budgets"
tag() { echo "${1%\%}pct"; }
declare -A limit slots oom_note
if [[ "$rows" == *" all "* ]]; then
	step "all in RAM: the page cache warmed (cat of the shards), no tier, no limit"
	t0=$(date +%s.%N)
	cat "$ckpt"/*.safetensors >/dev/null
	say "read $ckpt_bytes bytes in $(echo "$(date +%s.%N) $t0" | awk '{printf "%.1f", $1 - $2}') s"
	"${bench[@]}" --json "$out/all.json" >"$out/all.txt" 2>"$out/all.err"
	cat "$out/all.txt" >>"$log"
fi
for b in "${blist[@]}"; do
	t=$(tag "$b")
	if [[ "$rows" == *" tier "* ]]; then
		step "NVMe tier at $b of the CPU tier"
		drop_cache
		run=("${bench[@]}" --ram-budgets "$b" --ram-only --json "$out/tier-$t.json")
		if [ "$cg_ok" = 1 ]; then
			cg_make "tier-$t" max
			cg_poll "$cg" "$out/tier-$t.peak" &
			poller=$!
			cg_exec "$cg" "${run[@]}" >"$out/tier-$t.txt" 2>"$out/tier-$t.err"
			kill "$poller" 2>/dev/null || true
			wait "$poller" 2>/dev/null || true
			poller=''
			limit[$b]=$(cat "$out/tier-$t.peak")
			if ! [[ "${limit[$b]}" =~ ^[0-9]+$ ]] || [ "${limit[$b]}" -le 0 ]; then
				say "WARNING: the tier process's memory was not sampled: no limit"
				limit[$b]=''
			elif [ "$device" = cpu ]; then
				limit[$b]=$((limit[$b] + dense))
			fi
			say "tier process: peak $(cat "$out/tier-$t.peak") bytes beside the page cache" \
				"(memory.peak $(cat "$cg/memory.peak" 2>/dev/null || echo -))"
		else
			"${run[@]}" >"$out/tier-$t.txt" 2>"$out/tier-$t.err"
		fi
		cat "$out/tier-$t.txt" >>"$log"
		grep '^NVMe tier: [0-9.]* GiB' "$out/tier-$t.err" | tee -a "$log" || true
		slots[$b]=$(awk '/^NVMe tier: [0-9.]+ GiB/ {
			for (i = 1; i < NF; i++) if ($(i + 1) == "slots") n = $i
			for (i = NF - 1; i >= 1; i--) if ($i == "of") s = $(i + 1)
			printf "%.0f\n", n * s; exit}' "$out/tier-$t.err")
	fi
	if [[ "$rows" == *" mmap "* ]]; then
		if [ "$cg_ok" != 1 ]; then
			oom_note[$b]="skipped: no memory cgroup (below)"
			say "mmap at $b: SKIPPED: no memory cgroup ($cg_why)"
			continue
		fi
		if [ -z "${limit[$b]:-}" ]; then
			oom_note[$b]="skipped: no limit measured"
			say "mmap at $b: SKIPPED: no limit measured (the tier row at $b did not run or" \
				"was not sampled)"
			continue
		fi
		for try in 1 2; do
			step "plain mmap under memory.max ${limit[$b]} bytes (the tier at $b's own)"
			drop_cache
			cg_make "mmap-$t-$try" "${limit[$b]}"
			rc=0
			cg_exec "$cg" "${bench[@]}" --json "$out/mmap-$t.json" >"$out/mmap-$t.txt" \
				2>"$out/mmap-$t.err" || rc=$?
			cp "$cg/memory.stat" "$out/mmap-$t.memory.stat" 2>/dev/null || true
			kills=$(stat_of "$cg/memory.events" oom_kill)
			say "mmap process: exit $rc, memory.peak $(cat "$cg/memory.peak" 2>/dev/null ||
				echo -), major faults $(stat_of "$cg/memory.stat" pgmajfault)," \
				"file refaults $(stat_of "$cg/memory.stat" workingset_refault_file)," \
				"oom kills ${kills:-?}"
			if [ "$rc" = 0 ]; then
				cat "$out/mmap-$t.txt" >>"$log"
				[ "$try" = 1 ] || oom_note[$b]="limit raised by $margin bytes after an OOM kill"
				break
			fi
			tail -3 "$out/mmap-$t.err" | tee -a "$log"
			if [ "${kills:-0}" -gt 0 ] && [ "$try" = 1 ]; then
				limit[$b]=$((limit[$b] + margin))
				continue
			fi
			oom_note[$b]="failed (exit $rc, oom kills ${kills:-?})"
			break
		done
	fi
done

# ---- the table ----
# tok/s of a decode row: its mean step's ("... mean step X ms = Y tok/s", the throughput: a
# few steps that wait for reads or page faults pull the mean up, which the median column hides)
# decode rows of a bench output: "batch tok/s" (all-in-RAM and mmap rows: no "RAM")
mean_tok='function mean_tok(i) {for (i = 1; i < NF; i++) if ($(i + 1) == "tok/s" &&
	$(i - 1) == "=") return $i; return "-"}'
plain_rows() { awk "$mean_tok"'
	$1 == "hybrid" && $2 == "decode" && $6 != "RAM" {print $3, mean_tok()}' "$1" \
	2>/dev/null || true; }
# tier rows: "batch tok/s hit_rate opt_hit_rate read_ms" from the NVMe tier lines after each
# row: the hit rate, Belady/MIN's on the same trace (the field before "Belady/MIN"), and the
# read time per step its demand misses cost at its own read rate (the field before "ms/step")
tier_rows() { awk "$mean_tok"'
	function out() {if (b != "") print b, r, h, o, io; b = ""}
	$1 == "hybrid" && $2 == "decode" && $6 == "RAM" {out(); b = $3; r = mean_tok()
		h = o = io = "-"; next}
	b != "" && /^NVMe tier: hit rate/ {h = $5}
	b != "" && /^NVMe tier: hindsight/ {for (i = 2; i <= NF; i++) if ($i == "Belady/MIN")
		o = $(i - 1)}
	b != "" && /^NVMe tier: disk bound/ {for (i = 2; i <= NF; i++) if ($i == "ms/step") {
		io = $(i - 1); break}}
	END {out()}' "$1" 2>/dev/null || true; }
# the tier's tok/s over its disk bound's: B / (B / all_tok_s + read_ms / 1000)
disk_ratio() { awk -v t="$1" -v a="$2" -v io="$3" -v b="$4" 'BEGIN {
	if (t == "" || a == "" || io == "" || io == "-" || a + 0 <= 0) print "-"
	else printf "%.3f", t * (b / a + io / 1000) / b}'; }
jstr() { printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g'; }
num() { if [ -z "$1" ] || [ "$1" = - ]; then echo null; else echo "$1"; fi; }
get() { awk -v b="$2" -v k="$3" '$1 == b {print $k; exit}' <<<"$1"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (a == "" || b == "" || b + 0 <= 0) print "-";
	else printf "%.3f", a / b}'; }
all_r=$(plain_rows "$out/all.txt")
IFS=, read -r -a bat <<<"$batches"
json_rows=()
tfmt='%-7s %5s | %10s | %10s %6s %6s %12s | %10s %14s | %9s %9s %9s %9s %s\n'
jfmt='{"budget": "%s", "batch": %s, "all_tok_s": %s, "tier_tok_s": %s, "tier_hit_rate": %s,'
jfmt+=' "tier_slot_bytes": %s, "mmap_tok_s": %s, "mmap_limit_bytes": %s, "tier_over_all": %s,'
jfmt+=' "tier_over_mmap": %s, "mmap_over_all": %s, "tier_opt_hit_rate": %s,'
jfmt+=' "tier_read_ms_per_step": %s, "tier_over_disk_bound": %s, "note": "%s"}'
{
	echo "decode tokens/s under RAM budgets: $(basename "$ckpt") ($ckpt_bytes bytes), device" \
		"$device, $hot experts per MoE layer on the GPU, gen ${gen_args[*]}, $steps timed" \
		"steps after ctx $ctx and $warmup untimed"
	# shellcheck disable=SC2059 # the format is $tfmt, built above
	printf "$tfmt" budget \
		batch all_tok/s tier_tok/s hit opt slots_bytes mmap_tok/s limit_bytes tier/all \
		tier/mmap mmap/all tier/disk note
	for b in "${blist[@]}"; do
		t=$(tag "$b")
		tr=$(tier_rows "$out/tier-$t.txt")
		mr=$(plain_rows "$out/mmap-$t.txt")
		for B in "${bat[@]}"; do
			a=$(get "$all_r" "$B" 2)
			ti=$(get "$tr" "$B" 2)
			h=$(get "$tr" "$B" 3)
			o=$(get "$tr" "$B" 4)
			io=$(get "$tr" "$B" 5)
			mm=$(get "$mr" "$B" 2)
			r1=$(ratio "$ti" "$a")
			r2=$(ratio "$ti" "$mm")
			r3=$(ratio "$mm" "$a")
			r4=$(disk_ratio "$ti" "$a" "$io" "$B")
			note=${oom_note[$b]:-}
			# shellcheck disable=SC2059 # the format is $tfmt, built above
			printf "$tfmt" "$b" "$B" "${a:--}" "${ti:--}" "${h:--}" "${o:--}" \
				"${slots[$b]:--}" "${mm:--}" "${limit[$b]:--}" "$r1" "$r2" "$r3" \
				"$r4" "$note"
			# shellcheck disable=SC2059 # the format is $jfmt, built above
			json_rows+=("$(printf "$jfmt" \
				"$b" "$B" "$(num "$a")" "$(num "$ti")" "$(num "$h")" \
				"$(num "${slots[$b]:-}")" "$(num "$mm")" "$(num "${limit[$b]:-}")" \
				"$(num "$r1")" "$(num "$r2")" "$(num "$r3")" "$(num "$o")" \
				"$(num "$io")" "$(num "$r4")" "$(jstr "$note")")")
		done
	done
	echo "tok/s: B / the mean timed step (the throughput; bench e2e's median column hides the"
	echo "steps that wait for reads or page faults)"
	echo "target (issue 9, budget 50%): tier/all >= 0.6 and tier/mmap > 1. tier: the NVMe tier;"
	echo "mmap: no tier, memory.max = limit_bytes (the tier process's peak beside the page" \
		"cache); hit: the tier's hit rate over the timed steps; opt: Belady/MIN's (a" \
		"demand cache of the same slots, hindsight) on the same lookups; tier/disk: tier" \
		"tok/s over the disk bound's, B / (B / all_tok/s + the tier's misses per step x" \
		"slot bytes / its read rate) (docs/io-uring.md)"
	if [ "$cg_ok" != 1 ] && [ -n "$cg_why" ]; then echo "no memory cgroup: $cg_why"; fi
} >"$out/table.txt"
tee -a "$log" <"$out/table.txt"
{
	printf '{"bench": "ram_budget", "checkpoint": "%s", "checkpoint_bytes": %s, "device": "%s",' \
		"$ckpt" "$ckpt_bytes" "$device"
	printf ' "hot_per_layer": %s, "steps": %s, "warmup": %s, "ctx": %s, "cgroup": "%s", "rows": [\n' \
		"$hot" "$steps" "$warmup" "$ctx" "$(jstr "${cg_root:-none: $cg_why}")"
	for i in "${!json_rows[@]}"; do
		[ "$i" = 0 ] || printf ',\n'
		printf '  %s' "${json_rows[$i]}"
	done
	printf '\n]}\n'
} >"$out/ram_budget.json"
step "done"

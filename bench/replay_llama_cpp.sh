#!/usr/bin/env bash
# `duet replay` against llama.cpp's own HTTP server (llama-server) beside `duet serve` (issue 44):
# the ~125M bench model (bf16, random weights; `duet make-test-model --preset bench`) served by
# each on the same weights (llama-server reads its GGUF conversion by bench/cpu/to_gguf.py) with
# the same CPU threads, and the same synthetic trace replayed against each: REQUESTS requests,
# Poisson arrivals at RATE per second, prompts of 64..192 random token ids (no prefix-cache
# hits), 64 output tokens each (ignore_eos), greedy. Each run starts a fresh server, warms it
# with a 2-request replay of other prompts, replays the trace and stops the server; the engines
# alternate over REPS runs each (duet first in odd runs, llama-server first in even ones) so
# drift hits both. Prints per engine the medians over the runs of TTFT p50/p99, TPOT p50, E2E
# p50 and output tokens/s, the output tokens replay recorded against those asked, and how many
# requests had TPOT > 0 and E2E > TTFT (what a replay that took a chunk with empty text for no
# token got wrong on llama-server, whose padded-vocabulary tokens here decode to no text), with
# the CPU other processes took during the runs (the VM is shared); then each run's figures.
# Settings, alike where the engines have them: SLOTS requests batched at most (duet serve
# --max-num-seqs, llama-server --parallel: a slot each); llama-server's context SLOTS x 512
# tokens (-c; 512 per slot, its KV cache split per slot as it does when --parallel is given),
# logical and physical batch 2048 and 512 tokens (-b, -ub: its defaults; a whole prompt is one
# step, as under duet serve's --max-num-batched-tokens 8192), threads -t = -tb = THREADS, its
# defaults otherwise (f16 KV cache, flash attention "auto", prompt cache on). duet serve:
# --threads THREADS --max-num-seqs SLOTS, its defaults otherwise (bf16 KV cache).
# llama-server is built from the llama.cpp that the pinned llama-cpp-python sdist vendors
# (bench/requirements-llama-cpp.txt; PyPI is where it comes from), CPU only, without curl,
# OpenSSL or the web UI's assets, into .llama-server/ at the repository root: once, and again
# only when that pin changes (several minutes on 2 cores). The GGUF conversion runs in
# .venv-bench/ (bench/venv.sh, from bench/requirements-llama-cpp.txt).
# Usage: bench/replay_llama_cpp.sh [THREADS]   (default: all hardware threads)
#   REPS=3 runs per engine; REQUESTS=32; RATE=1 (requests/s); SLOTS=16
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
THREADS="${1:-$(nproc)}"
REPS="${REPS:-3}"
REQUESTS="${REQUESTS:-32}"
RATE="${RATE:-1}"
SLOTS="${SLOTS:-16}"
OUTPUT_TOKENS=64
SLOT_CONTEXT=512  # llama-server's context per slot: the longest prompt (192) + 64, with room
source bench/lib.sh  # DUET; serve_start, serve_stop and bench_setup for below
source bench/venv.sh
bench_venv bench/requirements-llama-cpp.txt
case "$PY" in /*) ;; *) PY="$root/$PY" ;; esac  # the runs below work elsewhere

# llama-server, built from the pinned llama-cpp-python's sdist when .llama-server/ holds no
# build of that version. LLAMA_BUILD_UI and LLAMA_USE_PREBUILT_UI off: the server embeds an
# empty table of web UI assets instead of running npm or downloading prebuilt ones.
version=$(sed -n 's/^llama-cpp-python==//p' bench/requirements-llama-cpp.txt)
cache=.llama-server
llama_server="$root/$cache/llama-server"
# Each step runs only if the one before it succeeded (set -e does not reach into a function
# whose status is tested).
build_llama_server() {
  local src="$cache/llama_cpp_python-$version/vendor/llama.cpp"
  "$PY" -m pip download --no-binary :all: --no-deps "llama-cpp-python==$version" -d "$cache" \
    && tar -xzf "$cache/llama_cpp_python-$version.tar.gz" -C "$cache" \
    && { [ -f "$src/tools/server/CMakeLists.txt" ] || { echo "no $src/tools/server"; false; }; } \
    && cmake -S "$src" -B "$cache/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
         -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
         -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
         -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    && cmake --build "$cache/build" --target llama-server -j "$(nproc)" \
    && cp "$cache/build/bin/llama-server" "$llama_server"
}
if [ "$(cat "$cache/version" 2>/dev/null)" != "$version" ] || [ ! -x "$llama_server" ]; then
  echo "building llama-server from llama-cpp-python $version's vendored llama.cpp into" \
    "$cache/ (several minutes; log: $cache/build.log)" >&2
  rm -rf "$cache"
  mkdir -p "$cache"
  started=$SECONDS
  if ! build_llama_server >"$cache/build.log" 2>&1; then
    echo "building llama-server failed; the end of $cache/build.log:" >&2
    tail -n 20 "$cache/build.log" >&2
    exit 1
  fi
  rm -rf "$cache/build" "$cache/llama_cpp_python-$version" "$cache"/*.tar.gz
  echo "$version" >"$cache/version"
  echo "built llama-server in $((SECONDS - started)) s" | tee -a "$cache/build.log" >&2
fi

work=$(mktemp -d)
llama_port=$((port + 1))
llama=
llama_stop() {
  [ -z "$llama" ] || { kill -INT "$llama" 2>/dev/null; wait "$llama" || true; llama=; }
}
cleanup() {
  serve_stop
  llama_stop
  rm -rf "${work:?}/bench" "$work/bench.gguf"
}
trap cleanup EXIT
bench_setup "$work"
"$PY" "$root/bench/cpu/to_gguf.py" bench bench.gguf

llama_start() {
  "$llama_server" -m bench.gguf --alias bench --host 127.0.0.1 --port "$llama_port" \
    -t "$THREADS" -tb "$THREADS" -np "$SLOTS" -c $((SLOTS * SLOT_CONTEXT)) -b 2048 -ub 512 \
    >"$1" 2>&1 &
  llama=$!
  for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$llama_port/health" >/dev/null && return
    kill -0 "$llama" 2>/dev/null || break
    sleep 0.1
  done
  echo "llama-server did not come up; the end of $work/$1:" >&2
  tail -n 20 "$1" >&2
  exit 1
}

# The trace, and the warm-up's (replayed with another --seed, which draws the prompts' token
# ids: no prompt of the trace is cached by the warm-up).
cat >trace.json <<JSON
{"num_requests": $REQUESTS, "seed": 1, "block_tokens": 16,
 "arrival": {"process": "poisson", "rate_per_s": $RATE},
 "input": {"dist": "uniform", "min": 64, "max": 192},
 "output": {"dist": "fixed", "value": $OUTPUT_TOKENS}}
JSON
cat >warmup.json <<JSON
{"num_requests": 2, "seed": 2, "block_tokens": 16,
 "arrival": {"process": "poisson", "rate_per_s": 1000},
 "input": {"dist": "uniform", "min": 64, "max": 192},
 "output": {"dist": "fixed", "value": 8}}
JSON

# The machine's busy CPU seconds so far (/proc/stat: user, nice, system, irq, softirq); and
# children_cpu sets mine_s to those of this script's children waited for so far (bash's `times`,
# run in this shell: in a command substitution it would report the subshell's). Over a run, the
# first less the second is what other processes took: the VM is shared, and the table says how
# much of it they had.
ticks=$(getconf CLK_TCK)
machine_cpu_s() { awk -v hz="$ticks" '/^cpu /{print ($2 + $3 + $4 + $7 + $8) / hz}' /proc/stat; }
children_cpu() {
  times >times.txt
  mine_s=$(awk 'NR == 2 {split($1, u, /[ms]/); split($2, s, /[ms]/);
                         print u[1] * 60 + u[2] + s[1] * 60 + s[2]}' times.txt)
}

# One run: ENGINE REP: the server up, the warm-up and the trace replayed, the server stopped;
# appends "ENGINE REP CORES" to others.txt, CORES the mean CPU other processes took meanwhile.
run() {
  local engine=$1 rep=$2 endpoint machine0 mine0 started_ns
  echo "run $rep/$REPS: $engine" >&2
  children_cpu
  machine0=$(machine_cpu_s) mine0=$mine_s started_ns=$(date +%s%N)
  if [ "$engine" = duet ]; then
    serve_start "$engine-$rep.serve.log" --threads "$THREADS" --max-num-seqs "$SLOTS"
    endpoint="http://127.0.0.1:$port"
  else
    llama_start "$engine-$rep.serve.log"
    endpoint="http://127.0.0.1:$llama_port"
  fi
  "$DUET" replay --endpoint "$endpoint" --trace warmup.json --seed 2 \
    --out "$engine-$rep.warmup" --progress never >"$engine-$rep.warmup.log"
  "$DUET" replay --endpoint "$endpoint" --trace trace.json --seed 1 --out "$engine-$rep" \
    --progress never >"$engine-$rep.log"
  if [ "$engine" = duet ]; then serve_stop; else llama_stop; fi
  children_cpu
  echo "$engine $rep $(awk -v m0="$machine0" -v m1="$(machine_cpu_s)" -v c0="$mine0" \
    -v c1="$mine_s" -v ns="$(($(date +%s%N) - started_ns))" \
    'BEGIN {print ((m1 - m0) - (c1 - c0)) / (ns / 1e9)}')" >>others.txt
}
for rep in $(seq 1 "$REPS"); do
  if ((rep % 2)); then order="duet llama-server"; else order="llama-server duet"; fi
  for engine in $order; do run "$engine" "$rep"; done
done

duet_version="$("$DUET" version | head -n 1) at $(git -C "$root" rev-parse --short HEAD)"
git -C "$root" diff --quiet HEAD -- . ':!bench' || duet_version+="+local changes"
python3 - "$REPS" "$REQUESTS" "$OUTPUT_TOKENS" "$THREADS" "$RATE" "$SLOTS" "$version" \
  "$duet_version" <<'PY'
import csv, json, statistics, sys
reps, requests, asked, threads = map(int, sys.argv[1:5])
rate, slots, version, duet_version = sys.argv[5:9]
others = {(e, int(r)): float(c) for e, r, c in (line.split() for line in open("others.txt"))}
engines = ("duet", "llama-server")
summary = {(e, r): json.load(open(f"{e}-{r}/summary.json"))
           for e in engines for r in range(1, reps + 1)}
print(f"bench model (~125M, bf16, random weights), {threads} threads, {requests} requests at "
      f"{rate}/s (Poisson), prompts of 64..192 random token ids, {asked} output tokens each "
      f"(ignore_eos), greedy, {slots} slots; medians of {reps} alternating runs per engine; "
      f"{duet_version}; llama-server from llama-cpp-python {version}'s llama.cpp")
print()
print("| engine | completed | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | E2E p50 ms "
      "| output tok/s | output tokens recorded (asked) | TPOT > 0 | E2E > TTFT "
      "| prompt tokens mismatched | other processes' CPU, cores (max) |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for engine in engines:
    sums = [summary[engine, r] for r in range(1, reps + 1)]
    rows = [row for r in range(1, reps + 1)
            for row in csv.DictReader(open(f"{engine}-{r}/requests.csv"))
            if row["status"] == "completed"]

    def med(key, stat):
        values = [s[key][stat] for s in sums]
        return float("nan") if None in values else statistics.median(values)

    completed = sum(s["requests"]["completed"] for s in sums)
    tokens = sum(int(row["output_tokens"]) for row in rows)
    tpot_ok = sum(1 for row in rows if row["tpot_ms"] and float(row["tpot_ms"]) > 0)
    e2e_ok = sum(1 for row in rows if float(row["e2e_ms"]) > float(row["ttft_ms"]))
    mismatched = sum(s["replay"]["prompt_tokens_mismatched"] for s in sums)
    tok_s = statistics.median(s["throughput"]["output_tokens_per_s"] for s in sums)
    other = [others[engine, r] for r in range(1, reps + 1)]
    print(f"| {engine} | {completed}/{reps * requests} | {med('ttft_ms', 'p50'):,.1f} "
          f"| {med('ttft_ms', 'p99'):,.1f} | {med('tpot_ms', 'p50'):.2f} "
          f"| {med('e2e_ms', 'p50'):,.1f} | {tok_s:,.1f} "
          f"| {tokens:,} ({reps * requests * asked:,}) | {tpot_ok}/{len(rows)} "
          f"| {e2e_ok}/{len(rows)} | {mismatched} "
          f"| {statistics.median(other):.2f} ({max(other):.2f}) |")
print()
print("| run | engine | TTFT p50 / p99 ms | TPOT p50 / p99 ms | E2E p50 ms | output tok/s "
      "| other processes' CPU, cores |")
print("|---|---|---|---|---|---|---|")
for r in range(1, reps + 1):
    for engine in engines if r % 2 else reversed(engines):
        s = summary[engine, r]
        print(f"| {r} | {engine} | {s['ttft_ms']['p50']:,.1f} / {s['ttft_ms']['p99']:,.1f} "
              f"| {s['tpot_ms']['p50']:.2f} / {s['tpot_ms']['p99']:.2f} "
              f"| {s['e2e_ms']['p50']:,.1f} | {s['throughput']['output_tokens_per_s']:,.1f} "
              f"| {others[engine, r]:.2f} |")
PY
echo "files: $work" >&2

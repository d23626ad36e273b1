#!/usr/bin/env bash
# Synchronous against asynchronous steps (engine.async_steps, issue 43), live on this machine's
# CPU, in one run: the ~125M bench model (bf16, random weights) served by `duet serve --workers
# thread` with a step log, driven by `duet replay` in a closed loop of B users (B = 1 to 64),
# each request a prompt of 128 to 256 random token ids and 64 output tokens; for each B,
# REPEATS (default 3) rounds of the synchronous and the asynchronous server on the same trace,
# alternating which goes first. Per B and mode, the median over the rounds (and the range of
# the throughput): the replay's output tokens/s and TPOT p50/p99, and over the decode-only
# steps of B rows (the steady batch) the engine iteration, the forward pass and the engine
# thread's host phases (schedule, allocate, apply, stream; prepare and sample run on the step
# thread when async). The yardstick is the synchronous server measured beside it. The summary
# can be redone from WORK alone: bench/async_steps.sh --summary WORK [BATCHES].
# SERVE_ARGS adds arguments to both servers (e.g. "--threads 1": one core for the forward pass,
# the other for the engine thread and the HTTP threads).
# Usage: [REPEATS=3] [SERVE_ARGS=...] bench/async_steps.sh [BATCHES] [WORK]
#        (default "1 4 16 64", a temp dir)
set -euo pipefail
cd "$(dirname "$0")/.."
summary_only=0
if [ "${1:-}" = --summary ]; then summary_only=1; shift; set -- "${2:-1 4 16 64}" "$1"; fi
BATCHES="${1:-1 4 16 64}"
work="${2:-$(mktemp -d)}"
source bench/lib.sh
bench_setup "$work"
for mode in sync async; do
  async=false; [ "$mode" = async ] && async=true
  cat > "cluster-$mode.json" <<JSON
{"name": "bench-$mode", "model": "./bench",
 "nodes": [{"count": 1, "gpus": 1, "gpu": "tiny-gpu",
            "nic": {"bandwidth_GBps": 1, "latency_us": 1}}],
 "instances": [{"role": "colocated", "count": 1, "tp": 1, "node": 0}],
 "engine": {"max_num_seqs": 64, "async_steps": $async}}
JSON
done
for b in $BATCHES; do
  [ "$summary_only" = 0 ] || break
  cat > "trace-$b.json" <<JSON
{"num_requests": $((4 * b + 4)), "seed": $b, "block_tokens": 16,
 "arrival": {"process": "poisson", "rate_per_s": 1000},
 "input": {"dist": "uniform", "min": 128, "max": 256},
 "output": {"dist": "uniform", "min": 64, "max": 64}}
JSON
  for r in $(seq "${REPEATS:-3}"); do
    modes="sync async"; [ $((r % 2)) = 0 ] && modes="async sync"
    for mode in $modes; do
      run="$mode-$b-$r"
      # shellcheck disable=SC2086  # SERVE_ARGS: several arguments
      serve_start "serve-$run.log" --cluster "cluster-$mode.json" --workers thread \
        --step-log "steps-$run.jsonl" ${SERVE_ARGS:-}
      "$DUET" replay --endpoint "http://127.0.0.1:$port" --trace "trace-$b.json" \
        --concurrency "$b" --out "replay-$run" --progress never > "replay-$run.log"
      serve_stop
    done
  done
done
python3 - "$BATCHES" <<'PY'
import glob, json, statistics, sys
phases = ["schedule_s", "allocate_s", "prepare_s", "sample_s", "apply_s", "stream_s"]
engine = ["schedule_s", "allocate_s", "apply_s", "stream_s"]  # on the engine thread either way
med = statistics.median
table = []
for b in sys.argv[1].split():
    for mode in ("sync", "async"):
        runs = sorted(glob.glob(f"replay-{mode}-{b}-*/summary.json"))
        per = {k: [] for k in ["tput", "p50", "p99", "iteration", "forward", "engine"] + phases}
        for path in runs:
            s = json.load(open(path))
            per["tput"].append(s["throughput"]["output_tokens_per_s"])
            per["p50"].append(s["tpot_ms"]["p50"])
            per["p99"].append(s["tpot_ms"]["p99"])
            log = path.replace("replay-", "steps-").replace("/summary.json", ".jsonl")
            rows = [d for d in map(json.loads, open(log))
                    if not d["prefill"] and d["decode_tokens"] == int(b)]
            n = max(len(rows), 1)
            mean = lambda f: sum(f(d) for d in rows) / n
            per["iteration"].append(mean(lambda d: d["iteration_s"]))
            per["forward"].append(mean(lambda d: d["seconds"]))
            per["engine"].append(mean(lambda d: sum(d["host"][p] for p in engine)))
            for p in phases:
                per[p].append(mean(lambda d: d["host"][p]))
        table.append((b, mode, len(runs), {k: med(v) for k, v in per.items()}, per["tput"]))
print("| batch | mode | runs | output tok/s (range) | TPOT p50 (ms) | TPOT p99 (ms) |"
      " iteration (ms) | forward (ms) | engine thread host (us) | prepare + sample (us) |")
print("|" + " --- |" * 10)
for b, mode, runs, m, tput in table:
    print(f"| {b} | {mode} | {runs} | {m['tput']:.1f} ({min(tput):.1f}-{max(tput):.1f}) | "
          f"{m['p50']:.2f} | {m['p99']:.2f} | {1e3 * m['iteration']:.3f} | "
          f"{1e3 * m['forward']:.3f} | {1e6 * m['engine']:.1f} | "
          f"{1e6 * (m['prepare_s'] + m['sample_s']):.1f} |")
print()
print("Host time per iteration by phase (us, medians over the rounds):")
print()
print("| batch | mode | " + " | ".join(p[:-2] for p in phases) + " |")
print("|" + " --- |" * (len(phases) + 2))
for b, mode, runs, m, tput in table:
    print(f"| {b} | {mode} | " + " | ".join(f"{1e6 * m[p]:.1f}" for p in phases) + " |")
PY
echo "files: $work"

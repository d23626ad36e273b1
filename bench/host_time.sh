#!/usr/bin/env bash
# The engine's host time per iteration by phase (issue 43), live on this machine's CPU: the
# ~125M bench model (bf16, random weights) served by `duet serve --workers thread` with a step
# log, driven by `duet replay` in a closed loop of B users (B = 1 to 64), each request a prompt
# of 128 to 256 random token ids and 64 output tokens. For each B, over the decode-only steps of
# B rows (the steady batch), the mean of each host phase (docs/serving.md's step log), the rest
# of the iteration outside its forward pass ("other"), the host time's mean and median, the
# forward pass, and the host time's share of the iteration: the yardstick is the forward pass
# measured in the same iterations. The summary can be redone from WORK's step logs alone:
# bench/host_time.sh --summary WORK [BATCHES].
# Usage: bench/host_time.sh [BATCHES] [WORK]   (default "1 2 4 8 16 32 64", a fresh temp dir)
set -euo pipefail
cd "$(dirname "$0")/.."
summary_only=0
if [ "${1:-}" = --summary ]; then summary_only=1; shift; set -- "${2:-1 2 4 8 16 32 64}" "$1"; fi
BATCHES="${1:-1 2 4 8 16 32 64}"
work="${2:-$(mktemp -d)}"
source bench/lib.sh
bench_setup "$work"
for b in $BATCHES; do
  [ "$summary_only" = 0 ] || break
  cat > "trace-$b.json" <<JSON
{"num_requests": $((4 * b)), "seed": $b, "block_tokens": 16,
 "arrival": {"process": "poisson", "rate_per_s": 1000},
 "input": {"dist": "uniform", "min": 128, "max": 256},
 "output": {"dist": "uniform", "min": 64, "max": 64}}
JSON
  serve_start "serve-$b.log" --workers thread --max-num-seqs 64 --step-log "steps-$b.jsonl"
  "$DUET" replay --endpoint "http://127.0.0.1:$port" --trace "trace-$b.json" --concurrency "$b" \
    --out "replay-$b" --progress never > "replay-$b.log"
  serve_stop
done
python3 - "$BATCHES" <<'PY'
import json, sys
phases = ["schedule_s", "allocate_s", "prepare_s", "sample_s", "apply_s", "stream_s"]
print("| batch | steps | " + " | ".join(p[:-2] for p in phases) +
      " | other | host (us) | host p50 (us) | forward (ms) | host share |")
print("|" + " --- |" * (len(phases) + 7))
for b in sys.argv[1].split():
    rows = []
    for line in open(f"steps-{b}.jsonl"):
        d = json.loads(line)
        if not d["prefill"] and d["decode_tokens"] == int(b):
            rows.append(d)
    if not rows:
        print(f"| {b} | 0 |" + " |" * (len(phases) + 5)); continue
    n = len(rows)
    mean = {p: sum(d["host"][p] for d in rows) / n for p in phases}
    outside = sum(d["iteration_s"] - d["seconds"] for d in rows) / n
    forward = sum(d["seconds"] for d in rows) / n
    iteration = sum(d["iteration_s"] for d in rows) / n
    other = outside - sum(mean.values())
    median = sorted(d["iteration_s"] - d["seconds"] for d in rows)[n // 2]
    print(f"| {b} | {n} | " + " | ".join(f"{1e6 * mean[p]:.1f}" for p in phases) +
          f" | {1e6 * other:.1f} | {1e6 * outside:.1f} | {1e6 * median:.1f} | "
          f"{1e3 * forward:.2f} | {100 * outside / iteration:.2f}% |")
PY
echo "files: $work"

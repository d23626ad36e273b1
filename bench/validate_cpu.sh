#!/usr/bin/env bash
# The simulator's error against live serving on this machine's CPU (docs/validation.md): the
# ~125M bench model (bf16, random weights) calibrated with `duet calibrate`, then `duet
# validate` at three loads of one synthetic trace (Poisson arrivals, fixed seed, prompts of
# 64..1024 random token ids, 16..128 output tokens) on
#   colocated: one colocated instance (engine threads, all cores), or
#   1p1d: a prefill and a decode worker process, one thread each, KV over UCX (its own choice
#         of transport on this machine), the profile calibrated on one thread with the UCX
#         transfers fitted as the link between the node's two devices.
# With HOST_TIME=1 the profile also prices the engine's host time outside the forward pass
# (issue 43): fitted (`duet calibrate --host-steps`) to the step log of a live run of another
# trace (seed 11) at rate scale 1, so the validated loads are not what it was fitted on; each
# load is then also simulated without it. With ASYNC=1 both worlds run engine.async_steps, into
# WORK/validation-async. A WORK that holds a profile.json already keeps it (no calibration, no
# host fit): a synchronous and an asynchronous run compare on one profile.
# Prints calibrate's fit and validate's table; the run's files stay in WORK.
# Usage: [HOST_TIME=1] [ASYNC=1] bench/validate_cpu.sh [RATE_SCALES] [WORK] [colocated|1p1d]
#        (default 0.25,1,2, a fresh temp dir, colocated)
set -euo pipefail
cd "$(dirname "$0")/.."
SCALES="${1:-0.25,1,2}"
work="${2:-$(mktemp -d)}"
layout="${3:-colocated}"
case "$layout" in
  colocated) threads=0; serve_args="--workers thread" ;;
  1p1d) threads=1; serve_args="--threads 1" ;;
  *) echo "layout must be colocated or 1p1d" >&2; exit 2 ;;
esac
async=false; out=validation
if [ "${ASYNC:-0}" = 1 ]; then async=true; out=validation-async; fi
source bench/lib.sh
bench_setup "$work"
bench_cluster "$layout" \
  "{\"max_num_seqs\": 32, \"max_num_batched_tokens\": 2048, \"reserved_gib\": 0.25,
    \"async_steps\": $async}" 50 \
  "\"name\": \"cpu-bench-$layout\",
   \"network\": {\"switch\": {\"bandwidth_GBps\": 10, \"latency_us\": 1},
               \"frontend\": {\"bandwidth_GBps\": 10, \"latency_us\": 20}}"

calibrated=0
if [ -f profile.json ]; then
  echo "keeping $work/profile.json"
else
  "$DUET" calibrate --model bench --out profile.json --progress never --threads "$threads" \
    "${calibrate_args[@]}"
  calibrated=1
fi
cat > trace.json <<'EOF'
{"description": "bench/validate_cpu.sh: 48 requests, 1 per second at rate scale 1",
 "num_requests": 48, "seed": 7, "block_tokens": 16,
 "arrival": {"process": "poisson", "rate_per_s": 1},
 "input": {"dist": "uniform", "min": 64, "max": 1024},
 "output": {"dist": "uniform", "min": 16, "max": 128}}
EOF
if [ "${HOST_TIME:-0}" = 1 ] && [ "$calibrated" = 1 ]; then
  sed 's/"seed": 7/"seed": 11/' trace.json > host-trace.json
  "$DUET" validate --cluster cluster.json --model bench --trace host-trace.json \
    --rate-scales 1 --serve-args "$serve_args" --out host-training > host-training.log
  "$DUET" calibrate --profile profile.json --host-steps host-training/rate-1/steps.jsonl \
    --out profile.json
fi
"$DUET" validate --cluster cluster.json --model bench --trace trace.json \
  --rate-scales "$SCALES" --serve-args "$serve_args" --out "$out"
echo "files: $work"

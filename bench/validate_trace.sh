#!/usr/bin/env bash
# The simulator's error against live serving on a real trace it was not calibrated on
# (docs/validation.md, issue 44): the ~125M bench model calibrated on one core with shapes drawn
# from another window of the same trace (30 to 40 minutes in), then `duet validate` on the
# trace's first 200 requests at three loads, 3 live runs each, with its HTML report, on
#   colocated: one colocated instance, one engine thread (the other core left to the HTTP,
#              streaming and replay threads), or
#   1p1d: a prefill and a decode worker process, one thread each, KV over UCX (the profile's
#         link fitted to its transfers, calibrated on one thread).
# Traces (../shared/traces): mooncake (lengths x1/32, prefix blocks kept: prefix caching on) or
# azure (the conversation trace, lengths x1/4, no prefix information).
# Usage: bench/validate_trace.sh mooncake|azure colocated|1p1d [WORK] [RATE_SCALES]
#        (default: a fresh temp dir, 0.25,0.5,1)
set -euo pipefail
cd "$(dirname "$0")/.."
trace_name="${1:?mooncake or azure}"
layout="${2:?colocated or 1p1d}"
work="${3:-$(mktemp -d)}"
scales="${4:-0.25,0.5,1}"
case "$trace_name" in
  mooncake) trace=mooncake_conversation.jsonl; length_scale=0.03125 ;;
  azure) trace=azure_conv_2023.csv; length_scale=0.25 ;;
  *) echo "the trace must be mooncake or azure" >&2; exit 2 ;;
esac
case "$layout" in
  colocated) serve_args="--workers thread --threads 1"; calibrate_args=()
             instances='[{"role": "colocated"}]'; devices=1; nvlink='' ;;
  1p1d) serve_args="--threads 1"; calibrate_args=(--transport ucx)
        instances='[{"role": "prefill", "node": 0}, {"role": "decode", "node": 0}]'; devices=2
        nvlink='"nvlink": {"fitted": "ucx"},' ;;
  *) echo "the layout must be colocated or 1p1d" >&2; exit 2 ;;
esac
trace="$PWD/../shared/traces/$trace"
[ -f "$trace" ] || { echo "needs $trace (the shared traces beside the checkout)" >&2; exit 1; }
DUET="$PWD/build/bin/duet"
[ -x "$DUET" ] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
mkdir -p "$work"
cd "$work"
[ -d bench ] || "$DUET" make-test-model --preset bench --out bench >/dev/null

"$DUET" calibrate --model bench --out profile.json --threads 1 --progress never --repeats 3 \
  --max-tokens 1024 --max-batch 16 --trace "$trace" --window 1800:2400 \
  --length-scale "$length_scale" "${calibrate_args[@]}"
# The host as the simulator's "GPU": only its memory matters under a fitted profile.
cat > host.json <<'EOF'
{"name": "host-cpu", "bf16_tflops": 0.1, "hbm_gib": 2, "hbm_bandwidth_gbps": 20,
 "nvlink_bandwidth_gbps": 10, "pcie_bandwidth_gbps": 10}
EOF
cat > cluster.json <<EOF
{"model": "./bench",
 "nodes": [{"gpus": $devices, "gpu": "host.json", $nvlink
            "nic": {"bandwidth_GBps": 10, "latency_us": 1}}],
 "instances": $instances,
 "engine": {"max_num_seqs": 16, "max_num_batched_tokens": 1024, "reserved_gib": 0.25},
 "cost_model": {"kind": "fitted", "profile": "profile.json"}}
EOF
"$DUET" validate --cluster cluster.json --model bench --trace "$trace" --limit 200 \
  --length-scale "$length_scale" --rate-scales "$scales" --repeats 3 \
  --serve-args "$serve_args" --report --out validation
echo "files: $work (the page: $work/validation/report.html)"

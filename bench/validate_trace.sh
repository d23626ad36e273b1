#!/usr/bin/env bash
# The simulator's error against live serving on a real trace it was not calibrated on
# (docs/validation.md, issue 44): the ~125M bench model calibrated on one core with shapes drawn
# from another window of the same trace (30 to 40 minutes in), then `duet validate` on the
# trace's first 200 requests at three loads, 3 live runs each, with its HTML report, on
#   colocated: one colocated instance, one engine thread (the other core left to the HTTP,
#              streaming and replay threads), or
#   1p1d: a prefill and a decode worker process, one thread each, KV over UCX (the profile's
#         link fitted to its transfers, calibrated on one thread).
# The same sweep is timed again after the live runs and pooled with the first (calibrate --pool),
# and the live runs simulated again from that profile of the machine over the whole validation
# (validate --again) into WORK/validation-pooled: the live runs go round the loads, and a VM's
# speed moves by 10% between two calibrations half an hour apart (docs/validation.md).
# Traces (../shared/traces): mooncake (lengths x1/32, prefix blocks kept: prefix caching on),
# azure (the conversation trace, lengths x1/4, no prefix information) or sessions (multi-turn
# conversations whose first turns are Azure rows, bench/sessions_azure.json, lengths x1/4; the
# profile calibrated on the spec's draw with another seed).
# Usage: bench/validate_trace.sh mooncake|azure|sessions colocated|1p1d [WORK] [RATE_SCALES]
#        (default: a fresh temp dir, 0.25,0.5,1)
set -euo pipefail
cd "$(dirname "$0")/.."
trace_name="${1:?mooncake or azure}"
layout="${2:?colocated or 1p1d}"
work="${3:-$(mktemp -d)}"
scales="${4:-0.25,0.5,1}"
case "$trace_name" in
  mooncake) trace="$PWD/../shared/traces/mooncake_conversation.jsonl"; length_scale=0.03125 ;;
  azure) trace="$PWD/../shared/traces/azure_conv_2023.csv"; length_scale=0.25 ;;
  sessions) trace="$PWD/bench/sessions_azure.json"; length_scale=0.25 ;;
  *) echo "the trace must be mooncake, azure or sessions" >&2; exit 2 ;;
esac
# The calibration's shapes: another window of the trace, or another draw of the spec.
if [ "$trace_name" = sessions ]; then calibration_draw=(--seed 2); else calibration_draw=(--window 1800:2400); fi
case "$layout" in
  colocated) serve_args="--workers thread --threads 1" ;;
  1p1d) serve_args="--threads 1" ;;
  *) echo "the layout must be colocated or 1p1d" >&2; exit 2 ;;
esac
[ -f "$PWD/../shared/traces/azure_conv_2023.csv" ] ||
  { echo "needs ../shared/traces (the shared traces beside the checkout)" >&2; exit 1; }
source bench/lib.sh
bench_setup "$work"
bench_cluster "$layout" \
  '{"max_num_seqs": 16, "max_num_batched_tokens": 1024, "reserved_gib": 0.25}' 1

calibrate() {  # PROFILE
  "$DUET" calibrate --model bench --out "$1" --threads 1 --progress never --repeats 3 \
    --max-tokens 1024 --max-batch 16 --trace "$trace" "${calibration_draw[@]}" \
    --length-scale "$length_scale" "${calibrate_args[@]}"
}
calibrate profile.json
# Held to the issue's goal (p50 within 5%, p99 within 10%): the report marks what misses it and
# where the goal is finer than the machine's drift over the load; a miss (exit 1) is a finding.
validate() {  # CLUSTER OUT MORE...
  "$DUET" validate --cluster "$1" --model bench --trace "$trace" --limit 200 \
    --length-scale "$length_scale" --tolerance p50=5,p99=10 --serve-args "$serve_args" --report \
    --out "$2" "${@:3}"
}
status=0
validate cluster.json validation --rate-scales "$scales" --repeats 3 || status=$?
[ "$status" -le 1 ] || exit "$status"
calibrate profile-after.json
"$DUET" calibrate --profile profile.json --pool profile-after.json --out profile-pooled.json
sed 's/"profile": "profile.json"/"profile": "profile-pooled.json"/' cluster.json >cluster-pooled.json
rm -rf validation-pooled
cp -r validation validation-pooled
validate cluster-pooled.json validation-pooled --again || status=$?
echo "files: $work (the pages: $work/validation/report.html, as calibrated before the live runs;"
echo "  $work/validation-pooled/report.html, calibrated before and after)"
[ "$status" -le 1 ] || exit "$status"

#!/usr/bin/env bash
# The accuracy gate (docs/validation.md): the bench model calibrated on this machine's CPU, one
# colocated instance served live and simulated from that profile at two loads. Medians must
# agree within 80%; the same run with a wrong profile (every step priced 4 times too high) must
# fail the same tolerance. The bound is loose because live medians on this 2-core VM moved by up
# to 50% between runs of the same load (docs/validation.md): the gate catches a simulator off
# by 2x or more, not a fine error; a miss is calibrated and run once more, so that the VM's
# drift within one run does not fail it. Runs alone (RUN_SERIAL): timings.
set -euo pipefail
DUET="${DUET:?DUET=path/to/duet}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
"$DUET" make-test-model --preset bench --out bench >/dev/null
calibrate() {
  "$DUET" calibrate --model bench --out profile.json --progress never --repeats 3 \
    --max-tokens 512 --max-context 1024 --max-batch 16 >calibrate.log
}
calibrate
# The wrong profile: every coefficient of every piece times 4.
python3 - <<'PY'
import json
p = json.load(open("profile.json"))
for fit in p["fits"]:
    for pieces in fit["pieces"].values():
        for piece in pieces:
            for k in piece:
                piece[k] *= 4
json.dump(p, open("wrong.json", "w"))
PY
cat > host.json <<'JSON'
{"name": "host-cpu", "bf16_tflops": 0.1, "hbm_gib": 2, "hbm_bandwidth_gbps": 20,
 "nvlink_bandwidth_gbps": 10, "pcie_bandwidth_gbps": 10}
JSON
for profile in profile wrong; do
  cat > "$profile-cluster.json" <<JSON
{"model": "./bench",
 "nodes": [{"gpus": 1, "gpu": "host.json", "nic": {"bandwidth_GBps": 10, "latency_us": 1}}],
 "instances": [{"role": "colocated"}],
 "engine": {"max_num_seqs": 16, "max_num_batched_tokens": 1024, "reserved_gib": 0.25},
 "cost_model": {"kind": "fitted", "profile": "$profile.json"}}
JSON
done
cat > trace.json <<'JSON'
{"num_requests": 24, "seed": 7, "block_tokens": 16,
 "arrival": {"process": "poisson", "rate_per_s": 1},
 "input": {"dist": "uniform", "min": 64, "max": 512},
 "output": {"dist": "uniform", "min": 16, "max": 64}}
JSON
validate() {
  "$DUET" validate --cluster "$1-cluster.json" --model bench --trace trace.json \
    --rate-scales 1,2 --tolerance p50=80 --serve-args "--workers thread" --out "$1-out"
}
# One more calibration and run after a miss: this VM's speed drifts by tens of percent within a
# minute (a CI run missed a median by 115% with its live steps 26% faster in the run's last
# quarter than in its first, then passed twice in a row), and a real error of 2x misses twice.
if ! validate profile >profile.log 2>&1; then
  echo "validate_gate: first try missed; calibrating and running again" >&2
  cat calibrate.log profile.log >&2
  calibrate
  if ! validate profile >profile.log 2>&1; then
    cat calibrate.log profile.log >&2
    echo "FAIL: the calibrated simulator missed the live run's medians by more than 80%, twice" >&2
    exit 1
  fi
fi
if validate wrong >wrong.log 2>&1 || ! grep -q "exceeds its --tolerance" wrong.log; then
  cat wrong.log >&2
  echo "FAIL: a profile 4 times too slow passed the gate" >&2
  exit 1
fi
cat profile.log
echo "gate: the calibrated profile passes, the wrong one fails"

#!/usr/bin/env bash
# The accuracy gate (docs/validation.md#the-gate-in-ci): a short live validation on real traffic.
# The bench model calibrated on one of this machine's cores, one colocated instance served live
# on one core (the other left to the HTTP, streaming and replay threads: on two cores, a
# two-thread engine loses 9% of its speed to them, which no calibration sees), the first 30
# requests of the Mooncake trace (four bursts) at 1/64 of their lengths and a quarter of their
# rate, served 3 times and simulated from the profile. The medians and p90s of TTFT and E2E must
# agree within 15% at the live runs' speed (validate --tolerance-at live-speed: every step priced
# at what the live steps took over what the profile's fits price them at, times what the fits
# price calibration's own measurements at over what it measured); the same trace against the
# profile with every coefficient times 1.3 (one live run) must fail that tolerance. The live
# speed, not the plain simulation: this VM's speed moves by more than the tolerance between a
# calibration and the live runs (27% within ten minutes; the fixture's profile priced the live
# steps from -24% to +23% off), which the plain errors carry as they are, so that the 1.3 profile
# and the calibrated one overlapped; at the live speed a fit off its own measurements stays off
# and the machine's drift does not count. At 1/32 of the lengths the engine fell behind the
# bursts and the schedule amplified step price errors (E2E p50 by 40% for 11%); at 1/64 the
# bursts stay apart. Either outcome is tried once more before the gate fails (the second try
# calibrates here). Runs alone (RUN_SERIAL): timings. docs/validation.md#the-gate-in-ci has the
# measurements.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
DUET="${DUET:?DUET=path/to/duet}"
TRACE="${DUET_SHARED_DIR:?DUET_SHARED_DIR=path/to/shared}/traces/mooncake_conversation.jsonl"
if [[ ! -f "$TRACE" ]]; then
  echo "duet-test-skip: needs $TRACE (the shared traces beside the checkout)"
  exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
calibrate() { "$here/bench_profile.sh" . >calibrate.log; }
# The profile ctest made for this test (the fixture bench_profile, DUET_BENCH_PROFILE), or one
# made here.
if [[ -n "${DUET_BENCH_PROFILE:-}" ]]; then
  ln -s "$DUET_BENCH_PROFILE/bench" bench
  cp "$DUET_BENCH_PROFILE/profile.json" profile.json
  echo "(the fixture's profile, $DUET_BENCH_PROFILE)" >calibrate.log
else
  calibrate
fi
# The wrong profile: every coefficient of every piece times 1.3.
python3 - <<'PY'
import json
p = json.load(open("profile.json"))
for fit in p["fits"]:
    # Each class's pieces, and those above its split (decode batches of many rows) where it has one.
    lists = list(fit["pieces"].values()) + [s["pieces"] for s in fit.get("split", {}).values()]
    for pieces in lists:
        for piece in pieces:
            for k in piece:
                piece[k] *= 1.3
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
validate() {  # PROFILE REPEATS
  "$DUET" validate --cluster "$1-cluster.json" --model bench --trace "$TRACE" --limit 30 \
    --length-scale 0.015625 --rate-scales 0.25 --repeats "$2" \
    --tolerance ttft_ms.p50=15,e2e_ms.p50=15,ttft_ms.p90=15,e2e_ms.p90=15 --tolerance-at live-speed \
    --serve-args "--workers thread --threads 1" --out "$1-out"
}
if ! validate profile 3 >profile.log 2>&1; then
  echo "validate_gate: first try missed; calibrating and running again" >&2
  cat calibrate.log profile.log >&2
  calibrate
  if ! validate profile 3 >profile.log 2>&1; then
    cat calibrate.log profile.log >&2
    echo "FAIL: the calibrated simulator missed the live runs by more than 15%, twice" >&2
    exit 1
  fi
fi
wrong_passes() { validate wrong 1 >wrong.log 2>&1 || ! grep -q "exceeds its --tolerance" wrong.log; }
if wrong_passes; then
  echo "validate_gate: the wrong profile passed once; running it again" >&2
  cat wrong.log >&2
  if wrong_passes; then
    cat wrong.log >&2
    echo "FAIL: a profile 1.3 times too slow passed the gate, twice" >&2
    exit 1
  fi
fi
cat profile.log
grep -E "^at the live runs' speed" wrong.log
echo "gate: the calibrated profile passes, the one 1.3 times too slow fails"

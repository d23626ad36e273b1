#!/usr/bin/env bash
# The bench model and its step profile, calibrated on one of this machine's cores: DIR/bench and
# DIR/profile.json. The accuracy gate (validate_gate_test.sh) and the sim-vs-live notebook read
# them; ctest makes them once for both (the fixture `bench_profile`, run alone: timings). The
# model is made only where DIR has none; the profile is measured again each time.
# Usage: DUET=path/to/duet tests/cli/bench_profile.sh DIR
set -euo pipefail
DUET="${DUET:?DUET=path/to/duet}"
dir="${1:?DIR}"
mkdir -p "$dir"
[[ -f "$dir/bench/config.json" ]] || "$DUET" make-test-model --preset bench --out "$dir/bench" >/dev/null
"$DUET" calibrate --model "$dir/bench" --out "$dir/profile.json" --threads 1 --progress never \
  --repeats 3 --max-tokens 1024 --max-context 3072 --max-batch 16

#!/usr/bin/env bash
# Makes the bundled H100 step profile, sim/profiles/h100-sxm-llama-3.1-8b.json, from NVIDIA
# aiconfigurator's measured H100 SXM database: scripts/aiconfigurator_steps.py asks the
# package (pinned in scripts/requirements.txt) for step times of Llama-3.1-8B at TP 1, 2 and 4,
# and `duet calibrate --measurements` fits the simulator's cost model to them, reporting the
# fit's and the roofline's error on held-out shapes. Usage: scripts/aiconfigurator_profile.sh
# [OUT.json] (default: the bundled file).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT="${1:-sim/profiles/h100-sxm-llama-3.1-8b.json}"
DUET="${DUET:-build/bin/duet}"
scripts/venv.sh >/dev/null
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

.venv/bin/python scripts/aiconfigurator_steps.py --out "$work/steps.jsonl" \
  --source-out "$work/source.json"
"$DUET" calibrate --measurements "$work/steps.jsonl" --source "$work/source.json" \
  --model llama-3.1-8b --device h100-sxm --roofline h100-sxm --out "$OUT"

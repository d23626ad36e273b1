#!/usr/bin/env bash
# Makes a step profile from NVIDIA aiconfigurator's measured databases: for MODEL on GPU at the
# TP degrees TPS, scripts/aiconfigurator_steps.py asks the package (pinned in scripts/
# requirements.txt) for step times, and `duet calibrate --measurements` fits the simulator's
# cost model to them, reporting the fit's and the roofline's error on held-out shapes. Shapes
# whose KV cache does not fit one instance (`duet model`'s plan) are left out, and so is a TP
# degree whose weights do not fit. Which models and GPUs aiconfigurator knows, under which
# names: MODELS and SYSTEMS in scripts/aiconfigurator_steps.py.
# Usage: scripts/aiconfigurator_profile.sh [MODEL [GPU [TPS [OUT.json]]]]
# (default: llama-3.1-8b h100-sxm 1,2,4, the bundled sim/profiles/h100-sxm-llama-3.1-8b.json;
# OUT defaults to sim/profiles/GPU-MODEL.json).
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL="${1:-llama-3.1-8b}"
GPU="${2:-h100-sxm}"
TPS="${3:-1,2,4}"
OUT="${4:-sim/profiles/$GPU-$MODEL.json}"
DUET="${DUET:-build/bin/duet}"

scripts/venv.sh >/dev/null
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

capacity=""
for tp in ${TPS//,/ }; do
  if plan="$("$DUET" model --model "$MODEL" --gpu "$GPU" --tp "$tp" --json 2>"$work/err")"; then
    tokens="$(.venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["plan"]["kv_tokens"])' <<<"$plan")"
    capacity="${capacity:+$capacity,}$tp:$tokens"
  else
    echo "aiconfigurator_profile: tp $tp left out: $(cat "$work/err")" >&2
  fi
done
[[ -n "$capacity" ]] || { echo "aiconfigurator_profile: $MODEL fits $GPU at none of tp $TPS" >&2; exit 1; }

.venv/bin/python scripts/aiconfigurator_steps.py --model "$MODEL" --gpu "$GPU" \
  --capacity "$capacity" --out "$work/steps.jsonl" --source-out "$work/source.json"
"$DUET" calibrate --measurements "$work/steps.jsonl" --source "$work/source.json" \
  --model "$MODEL" --device "$GPU" --roofline "$GPU" --out "$OUT"

#!/usr/bin/env bash
# Makes a step profile from NVIDIA aiconfigurator's measured databases: for MODEL on GPU at the
# TP degrees TPS, scripts/aiconfigurator_steps.py asks the package (pinned in scripts/
# requirements.txt) for step times, and `duet calibrate --measurements` fits the simulator's
# cost model to them, reporting the fit's and the roofline's error on held-out shapes. Shapes
# whose KV cache does not fit one instance (`duet model`'s plan) are left out, and so is a TP
# degree whose weights do not fit.
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

# Duet's bundled names and aiconfigurator's, for the models and systems both have.
moe=() quant=bfloat16
case "$MODEL" in
  llama-3.1-8b) aic_model=meta-llama/Meta-Llama-3.1-8B ;;
  llama-3.1-70b) aic_model=meta-llama/Meta-Llama-3.1-70B ;;
  qwen3-32b) aic_model=Qwen/Qwen3-32B ;;
  qwen3-30b-a3b) aic_model=Qwen/Qwen3-30B-A3B moe=(--moe) ;;
  qwen3-235b-a22b) aic_model=Qwen/Qwen3-235B-A22B moe=(--moe) ;;
  deepseek-v3) aic_model=deepseek-ai/DeepSeek-V3 moe=(--moe) quant=fp8_block ;;
  *) echo "aiconfigurator_profile: no aiconfigurator model known for '$MODEL'" >&2; exit 2 ;;
esac
case "$GPU" in
  h100-sxm) system=h100_sxm ;;
  h200) system=h200_sxm ;;
  b200) system=b200_sxm ;;
  a100-80gb) system=a100_sxm ;;
  *) echo "aiconfigurator_profile: no aiconfigurator system known for '$GPU'" >&2; exit 2 ;;
esac

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

.venv/bin/python scripts/aiconfigurator_steps.py --system "$system" --model "$aic_model" \
  --capacity "$capacity" --quant "$quant" "${moe[@]}" --out "$work/steps.jsonl" \
  --source-out "$work/source.json"
"$DUET" calibrate --measurements "$work/steps.jsonl" --source "$work/source.json" \
  --model "$MODEL" --device "$GPU" --roofline "$GPU" --out "$OUT"

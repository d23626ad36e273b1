#!/usr/bin/env bash
# `duet plan` beside AIConfigurator's recommendations on the Mooncake conversation trace
# (scripts/beside_aiconfigurator.py): Llama-3.1-70B (TTFT 2 s, TPOT 100 ms) and DeepSeek-V3
# (TTFT 2 s, TPOT 50 ms) on H100 and H200, 90% of requests within both. Prints the tables of
# docs/planning.md. Usage: bench/beside_aiconfigurator.sh [OUT_DIR] (default
# out/beside-aiconfigurator). Needs ../shared/traces, a build and scripts/venv.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-out/beside-aiconfigurator}"
scripts/venv.sh >/dev/null
echo "$(date -u +%F), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
common=(--attainment 0.9 --out "$out")
space=(--token-budgets 8192 --dram-gib 0 --ssd-tib 0 --routers kv-aware --max-gpus 64)
for gpu in h100-sxm h200; do
  echo
  .venv/bin/python scripts/beside_aiconfigurator.py --model llama-3.1-70b --gpu "$gpu" \
    --ttft 2000 --tpot 100 "${common[@]}" -- --tp 2,4,8 --decode-tp 2,4,8 "${space[@]}"
done
for gpu in h100-sxm h200; do
  echo
  # Data-parallel attention needs the roofline (a profile prices dp 1 only): the roofline base.
  .venv/bin/python scripts/beside_aiconfigurator.py --model deepseek-v3 --gpu "$gpu" \
    --ttft 2000 --tpot 50 "${common[@]}" -- --base sim/clusters/h200-3p1d-deepseek-v3.json \
    --tp 4,8 --dp 1,2 --decode-tp 1,8 --decode-dp 1,8,16 "${space[@]}"
done

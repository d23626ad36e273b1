#!/usr/bin/env bash
# `duet plan` on the Mooncake conversation trace (Llama-3.1-8B on H100, TTFT 2 s and TPOT
# 100 ms at 99% attainment): the search's wall time and simulations on the default space, the
# winner and its cheaper neighbours simulated in full (the check), and as the yardstick the
# pruned and the exhaustive search on a space small enough to search exhaustively here. Then a
# larger model: Llama-3.1-70B on H200 (its bundled profile's TP degrees, up to 32 GPUs, 90% of
# requests; the other options the default space's), and the same over H100, H200 and B200 in one
# search at the bundled prices per GPU-hour.
# Usage: bench/plan.sh [OUT_DIR] (default out/bench-plan). Needs ../shared/traces and a build.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-out/bench-plan}"
trace=../shared/traces/mooncake_conversation.jsonl
duet=build/bin/duet
slo=ttft=2000,tpot=100
rm -rf "$out"
mkdir -p "$out"
echo "$(date -u +%F), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"

summary() {  # plan.json -> two lines
  python3 - "$1" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
w = p["winner"]
print(f"{p['candidates']} candidates, {p['out_of_reach']} out of reach, {p['simulated']} "
      f"simulated, {p['cancelled']} cancelled, {p['wall_s']} s in the search; winner "
      f"{w['key'] if w else None}")
print("frontier:", ", ".join(f"{f['rate']}x {f['key']} ${f['cost_per_hour']:.2f}/h"
                             for f in p["frontier"]))
PY
}

echo "## default space"
start=$(date +%s.%N)
$duet plan --trace $trace --slo $slo --out "$out/default" --progress never > "$out/default.log"
echo "wall $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s (process, trace loading and bounds included)"
summary "$out/default/plan.json"

echo "## check: the winner and its cheaper neighbours, simulated in full"
check() {
  $duet simulate --cluster "$1" --trace $trace --slo $slo --out "$out/check" --progress never \
    | grep -E 'goodput' | sed "s|^ *|$(basename "$1" .json): |"
}
check "$out/default/winner.json"
for n in "$out"/default/neighbours/*.json; do [ -e "$n" ] && check "$n"; done

echo "## yardstick: pruned and exhaustive search of a smaller space"
small=(--max-gpus 8 --tp 2,4 --token-budgets 8192 --dram-gib 0,512 --ssd-tib 0 --routers kv-aware
       --rates 1,2)
for mode in pruned exhaustive; do
  extra=()
  [ $mode = exhaustive ] && extra=(--exhaustive)
  start=$(date +%s.%N)
  $duet plan --trace $trace --slo $slo "${small[@]}" "${extra[@]}" --out "$out/$mode" \
    --progress never > "$out/$mode.log"
  echo "$mode: wall $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s"
  summary "$out/$mode/plan.json"
done

echo "## a larger model: llama-3.1-70b on h200, --tp 2,4,8 --max-gpus 32, 90% of requests"
start=$(date +%s.%N)
# At $2.50 per H200-hour, the price docs/planning.md's result was found at (the bundled table's
# H200 price is higher).
$duet plan --model llama-3.1-70b --gpu h200 --tp 2,4,8 --max-gpus 32 --attainment 0.9 \
  --gpu-hour-cost 2.5 --trace $trace --slo $slo --out "$out/llama70b" --progress never \
  > "$out/llama70b.log" || true
echo "wall $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s (process, trace loading and bounds included)"
summary "$out/llama70b/plan.json"

echo "## GPU types in one search: llama-3.1-70b on h100-sxm, h200 and b200 at the bundled prices"
start=$(date +%s.%N)
$duet plan --model llama-3.1-70b --gpu h100-sxm,h200,b200 --tp 2,4,8 --max-gpus 32 \
  --attainment 0.9 --trace $trace --slo $slo --out "$out/types" --progress never \
  > "$out/types.log" || true
echo "wall $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s (process, trace loading and bounds included)"
summary "$out/types/plan.json"

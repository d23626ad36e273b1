#!/usr/bin/env bash
# Speed of `duet simulate` on the whole Mooncake conversation trace (12,031 requests, one
# hour). For each bundled cluster it reports wall time, simulated seconds per wall second,
# events per second and peak memory, beside yardsticks from the same run: the previous
# version of Duet (PREV_COMMIT, built from `git archive` in build-prev/, Release, no CUDA)
# on the same inputs; the same simulation with decode-step coalescing off (one engine step
# per simulated event); for the clusters with KV tiers, the same cluster without tiers, and
# the tiered PD cluster with one of its two tiers only; the clusters of the models beyond Llama,
# and DeepSeek-V3 with speculative decoding.
# The two versions' runs of a row are taken in turn (this, previous, this, ...).
# Usage: bench/simulate_speed.sh [REPEATS] [PREV_COMMIT]
#   (median of REPEATS runs, default 3; PREV_COMMIT default 8a629b9, main before the
#    2026-11-24 speed work of issue 12; it must read today's cluster files (fitted cost models
#    came in after 05a30f1); "none" skips the previous version)
set -euo pipefail
cd "$(dirname "$0")/.."
REPEATS="${1:-3}"
PREV_COMMIT="${2:-8a629b9}"
TRACE=../shared/traces/mooncake_conversation.jsonl
DUET=build/bin/duet
[ -x "$DUET" ] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
[ -f "$TRACE" ] || { echo "missing $TRACE" >&2; exit 1; }
PREV=""
if [ "$PREV_COMMIT" != none ]; then
  rev=$(git rev-parse --short "$PREV_COMMIT")
  if [ ! -x "build-prev/$rev/build/bin/duet" ]; then
    echo "building the previous version $rev in build-prev/$rev (once)" >&2
    rm -rf "build-prev/$rev" && mkdir -p "build-prev/$rev/src"
    git archive "$rev" | tar -x -C "build-prev/$rev/src"
    cmake -S "build-prev/$rev/src" -B "build-prev/$rev/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DDUET_WITH_CUDA=OFF -DDUET_BUILD_TESTS=OFF >/dev/null
    cmake --build "build-prev/$rev/build" --target duet >&2
  fi
  PREV="build-prev/$rev/build/bin/duet"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

run() {  # run LABEL CLUSTER ROUTER [WITH_PREV] -> its row (median wall of REPEATS), and with
  # WITH_PREV=prev the previous version's row, the two versions' runs taken in turn so that
  # both see the same stretch of this VM's speed, which drifts by tens of percent
  local label=$1 cluster=$2 router=$3 with_prev=${4:-}
  local binaries=("$DUET") labels=("$label")
  if [ "$with_prev" = prev ] && [ -n "$PREV" ]; then
    binaries+=("$PREV")
    labels+=("$label, previous version (yardstick)")
  fi
  local b
  for b in "${!binaries[@]}"; do : >"$work/walls.$b" && echo 0 >"$work/rss.$b"; done
  for ((i = 0; i < REPEATS; i++)); do
    for b in "${!binaries[@]}"; do
      /usr/bin/time -f "%e %M" -o "$work/time" "${binaries[$b]}" simulate --cluster "$cluster" \
        --trace "$TRACE" --router "$router" --out "$work/out.$b" --progress never >/dev/null
      read -r wall kb <"$work/time"
      echo "$wall" >>"$work/walls.$b"
      ((kb > $(cat "$work/rss.$b"))) && echo "$kb" >"$work/rss.$b"
    done
  done
  for b in "${!binaries[@]}"; do
    python3 - "${labels[$b]}" "$work/out.$b/summary.json" "$(cat "$work/rss.$b")" \
      $(cat "$work/walls.$b") <<'PY'
import json, statistics, sys
label, path, rss_kb, walls = sys.argv[1], sys.argv[2], int(sys.argv[3]), [float(w) for w in sys.argv[4:]]
s = json.load(open(path))
wall = statistics.median(walls)
sim = s["sim"]
done = s["requests"]["completed"] + s["requests"]["rejected"]
print(f"| {label} | {done}/{s['requests']['total']} | {wall:.2f} | {sim['simulated_s']/wall:,.0f} "
      f"| {sim['events']:,} | {sim['events']/wall:,.0f} | {sim['engine_steps']:,} | {rss_kb/1024:.0f} |")
PY
  done
}

variant() {  # variant CLUSTER NAME EDIT: the path of a copy of CLUSTER with EDIT (Python on its
  # dict c) applied
  local out
  out="$work/$(basename "$1" .json)-$2.json"
  python3 - "$1" "$out" "$3" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
exec(sys.argv[3])
json.dump(c, open(sys.argv[2], "w"))
PY
  echo "$out"
}

echo "duet simulate speed: $(date -u +%Y-%m-%d), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "trace: $TRACE; median of $REPEATS runs; peak RSS is the largest of the runs"
echo "this version: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!bench' || echo ' + changes'); previous: ${PREV_COMMIT}"
echo
echo "| run | requests done | wall s | simulated s / wall s | events | events / s | engine steps | peak MiB |"
echo "|---|---|---|---|---|---|---|---|"
for cluster in sim/clusters/h100-8p8d-llama8b.json sim/clusters/h100-16colo-llama8b.json; do
  name=$(basename "$cluster" .json)
  run "$name, prefix-aware" "$cluster" prefix-aware prev
  run "$name, round-robin" "$cluster" round-robin
  run "$name, prefix-aware, no coalescing (yardstick)" \
    "$(variant "$cluster" uncoalesced 'c.setdefault("engine", {})["coalesce_decode_steps"] = False')" \
    prefix-aware
done
for cluster in sim/clusters/h100-8p8d-llama8b-tiered.json sim/clusters/h100-16colo-llama8b-tiered.json; do
  name=$(basename "$cluster" .json)
  run "$name, cache-aware" "$cluster" cache-aware prev
  run "${name%-tiered}, cache-aware (GPU-only yardstick)" "${cluster%-tiered.json}.json" cache-aware
done
# What each tier of the tiered PD cluster costs alone.
cluster=sim/clusters/h100-8p8d-llama8b-tiered.json
run "h100-8p8d-llama8b-tiered without its SSD tier, cache-aware (yardstick)" \
  "$(variant "$cluster" dram-only 'del c["tiers"]["ssd"]')" cache-aware
run "h100-8p8d-llama8b-tiered without its DRAM tier, cache-aware (yardstick)" \
  "$(variant "$cluster" ssd-only 'del c["tiers"]["dram"]')" cache-aware
# The models beyond Llama (issue 46): experts, latent attention, DP decode; their all-to-alls
# move over the simulated network. Yardstick: the same DeepSeek-V3 cluster without coalescing.
for cluster in sim/clusters/h100-4p4d-qwen3-32b.json sim/clusters/h100-4p4d-qwen3-30b-a3b.json \
  sim/clusters/h200-2p2d-qwen3-235b-a22b.json sim/clusters/h200-3p1d-deepseek-v3.json \
  sim/clusters/h100-2p1d-deepseek-v3.json; do
  run "$(basename "$cluster" .json), prefix-aware" "$cluster" prefix-aware
done
cluster=sim/clusters/h200-3p1d-deepseek-v3.json
run "h200-3p1d-deepseek-v3, prefix-aware, no coalescing (yardstick)" \
  "$(variant "$cluster" uncoalesced 'c.setdefault("engine", {})["coalesce_decode_steps"] = False')" \
  prefix-aware
# Speculative decoding (its decode steps are never coalesced): DeepSeek-V3 with its MTP layer.
run "h200-3p1d-deepseek-v3 with MTP (k 1, acceptance 0.85), prefix-aware" \
  "$(variant "$cluster" mtp 'c["speculative"] = {"method": "mtp", "num_speculative_tokens": 1, "acceptance_rate": 0.85}')" \
  prefix-aware

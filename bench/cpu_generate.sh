#!/usr/bin/env bash
# CPU backend speed: prefill and decode tokens per second of `duet generate` on the tiny test
# model and on the ~125M-parameter benchmark model (bf16, random weights), beside this
# machine's memory-bandwidth roofline measured in the same run (read-only streaming of 256 MiB
# with the same thread count, Google Benchmark's BM_ReadBandwidth). The decode roofline is
# bandwidth / bytes a decode step must read (all weights once; the KV cache of a short context
# adds under 1%).
# Usage: bench/cpu_generate.sh [THREADS]   (default: all hardware threads)
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS="${1:-$(nproc)}"
DUET=build/bin/duet
BENCH=build/bin/duet_kernels_bench
[ -x "$DUET" ] && [ -x "$BENCH" ] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$DUET" make-test-model --out "$work/tiny" >/dev/null
"$DUET" make-test-model --preset bench --out "$work/bench" >/dev/null
"$BENCH" --benchmark_filter="BM_ReadBandwidth/$THREADS/" --benchmark_repetitions=3 \
  --benchmark_report_aggregates_only=true --benchmark_format=json >"$work/bw.json" 2>/dev/null

PROMPT="The history of computing is the history of people who wanted answers faster than they could \
work them out by hand, and of the machines they built to get them: tables, slide rules, \
mechanical calculators, punched cards, vacuum tubes, transistors and integrated circuits."
for model in tiny bench; do
  for rep in 1 2 3; do
    "$DUET" generate --model "$work/$model" --prompt "$(printf '%s ' $PROMPT $PROMPT $PROMPT)" \
      --max-tokens 128 --threads "$THREADS" --timings "$work/$model-$rep.jsonl" >/dev/null 2>&1
  done
done

python3 - "$work" "$THREADS" <<'PY'
import glob, json, os, statistics, sys
work, threads = sys.argv[1], sys.argv[2]
bw = next(b for b in json.load(open(f"{work}/bw.json"))["benchmarks"]
          if b.get("aggregate_name") == "median")["bytes_per_second"]
print(f"memory read bandwidth ({threads} threads, median of 3): {bw/1e9:.2f} GB/s")
print()
print("| model | weights MB | prompt tokens | prefill tok/s | decode tok/s (median step) | decode roofline tok/s | of roofline |")
print("|---|---|---|---|---|---|---|")
for model in ("tiny", "bench"):
    weights = sum(os.path.getsize(p) for p in glob.glob(f"{work}/{model}/*.safetensors"))
    prefill, decode, prompt = [], [], 0
    for path in sorted(glob.glob(f"{work}/{model}-*.jsonl")):
        steps = [json.loads(l) for l in open(path)]
        p = [s for s in steps if s["prefill"]]
        prompt = sum(c[0] for s in p for c in s["prefill"])
        prefill.append(prompt / sum(s["seconds"] for s in p))
        decode += [s["seconds"] for s in steps if not s["prefill"] and s["decode_tokens"] == 1]
    dec = 1 / statistics.median(decode)
    roof = bw / weights
    print(f"| {model} | {weights/1e6:.1f} | {prompt} | {statistics.median(prefill):,.0f} | "
          f"{dec:,.1f} | {roof:,.1f} | {dec/roof:.0%} |")
PY

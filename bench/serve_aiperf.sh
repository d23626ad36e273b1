#!/usr/bin/env bash
# `duet serve` under aiperf (NVIDIA's load generator, from the project's venv) with the ~125M
# bench model, beside `duet generate` on the same prompts in the same run (the yardstick: the
# same engine loop and model with no server, one request at a time). Eight prompts of about 300
# tokens for generate and for aiperf at concurrency 1, 32 others for concurrency 8 (no prompt is
# served twice: no prefix-cache hits), 64 output tokens each (ignore_eos), greedy; aiperf takes token counts from the server's
# usage counts (usage.completion_tokens). Prints a markdown table.
# Usage: bench/serve_aiperf.sh [THREADS]   (default: all hardware threads)
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS="${1:-$(nproc)}"
OSL=64
DUET=build/bin/duet
[ -x "$DUET" ] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
scripts/venv.sh >/dev/null
work=$(mktemp -d)
server=""
cleanup() {
  [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

"$DUET" make-test-model --preset bench --out "$work/model" >/dev/null
python3 - "$work" <<'PY'
import json, sys
words = ("the history of computing is the history of people who wanted answers faster than "
         "they could work them out by hand and of the machines they built to get them").split()
def write(name, first, count):
    with open(f"{sys.argv[1]}/{name}", "w") as f:
        for i in range(first, first + count):
            text = f"request {i}: " + " ".join(words[(i * 7 + k) % len(words)] for k in range(110))
            f.write(json.dumps({"text": text}) + "\n")
write("prompts-1.jsonl", 0, 8)   # generate, then aiperf at concurrency 1
write("prompts-8.jsonl", 8, 32)  # aiperf at concurrency 8: none served before (no cache hits)
PY

# The yardstick: duet generate, one prompt at a time.
i=0
while IFS= read -r line; do
  text=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["text"])' "$line")
  start=$(date +%s.%N)
  "$DUET" generate --model "$work/model" --prompt "$text" --max-tokens "$OSL" --ignore-eos \
    --threads "$THREADS" >/dev/null 2>"$work/gen-$i.err"
  end=$(date +%s.%N)
  echo "$start $end" >"$work/gen-$i.wall"
  i=$((i + 1))
done <"$work/prompts-1.jsonl"

# The server, then aiperf at concurrency 1 (the same requests one at a time) and 8.
"$DUET" serve --model "$work/model" --port 0 --threads "$THREADS" >"$work/serve.out" \
  2>"$work/serve.err" &
server=$!
for _ in $(seq 1 300); do grep -q "serving" "$work/serve.out" && break; sleep 0.1; done
url=$(grep -o 'http://[0-9.]*:[0-9]*' "$work/serve.out")
for c in 1 8; do
  n=$((c == 1 ? 8 : 32))
  .venv/bin/aiperf profile --model "$work/model" --url "$url" --endpoint-type completions \
    --streaming --tokenizer "$work/model" --input-file "$work/prompts-$c.jsonl" \
    --custom-dataset-type single_turn --dataset-sampling-strategy sequential --osl "$OSL" --extra-inputs ignore_eos:true \
    --extra-inputs temperature:0 --use-server-token-count \
    --concurrency "$c" --request-count "$n" --ui-type none --artifact-dir "$work/aiperf-$c" \
    >"$work/aiperf-$c.log" 2>&1 || { cat "$work/aiperf-$c.log"; exit 1; }
done

python3 - "$work" "$THREADS" "$OSL" <<'PY'
import glob, json, re, statistics, sys
work, threads, osl = sys.argv[1], sys.argv[2], int(sys.argv[3])
ttft, itl, e2e = [], [], []
for err in sorted(glob.glob(f"{work}/gen-*.err")):
    m = re.search(r"(\d+) prompt tokens in ([0-9.]+) s .* (\d+) generated, decode ([0-9.]+) tok/s",
                  open(err).read())
    prompt, prefill_s, generated, decode = int(m[1]), float(m[2]), int(m[3]), float(m[4])
    assert generated == osl, open(err).read()
    ttft.append(prefill_s * 1000)
    itl.append(1000 / decode)
    start, end = map(float, open(err.replace(".err", ".wall")).read().split())
    e2e.append((prefill_s + (generated - 1) / decode) * 1000)
print(f"bench model (~125M, bf16, random weights), {threads} CPU threads, prompts of "
      f"{prompt} tokens, {osl} output tokens each, greedy")
print()
print("| run | concurrency | requests | TTFT p50 ms | ITL p50 ms | request latency p50 ms "
      "| output tok/s |")
print("| --- | --- | --- | --- | --- | --- | --- |")
print(f"| duet generate (yardstick; engine time, no process start) | 1 | {len(ttft)} "
      f"| {statistics.median(ttft):.1f} | {statistics.median(itl):.2f} "
      f"| {statistics.median(e2e):.1f} | {osl * len(e2e) / (sum(e2e) / 1000):.1f} |")
for c in (1, 8):
    d = json.load(open(f"{work}/aiperf-{c}/profile_export_aiperf.json"))
    print(f"| duet serve + aiperf | {c} | {d['request_count']['avg']:.0f} "
          f"| {d['time_to_first_token']['p50']:.1f} | {d['inter_token_latency']['p50']:.2f} "
          f"| {d['request_latency']['p50']:.1f} | {d['output_token_throughput']['avg']:.1f} |")
PY

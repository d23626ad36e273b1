#!/usr/bin/env bash
# The HTTP frontend's cost per token under many concurrent SSE streams: `duet_sse_bench` (one
# process, one steady clock) sets the moment each token left the engine against the moment the
# client had received it (counted through continuous usage stats), with STREAMS streams of the
# tiny test model opened at once; beside it, in the same run and interleaved, the same streams
# submitted in-process (listeners on the engine thread: no HTTP, detokenization or JSON), and
# the floor: the same streams as raw loopback TCP connections, one 300-byte send per token by
# one writer thread and read by the same kind of client (what any server that gives each stream
# a connection and each token a write spends at least).
# Prints one markdown row per mode with the medians over RUNS runs.
# Usage: bench/serve_sse.sh [STREAMS] [RUNS]   (default 1000 streams, 5 runs)
set -euo pipefail
cd "$(dirname "$0")/.."
STREAMS="${1:-1000}"
RUNS="${2:-5}"
BENCH=build/bin/duet_sse_bench
[ -x "$BENCH" ] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$BENCH" --streams "$STREAMS" --prompt-tokens 32 --max-tokens 64 --runs "$RUNS" >"$out"
python3 - "$out" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    rows.setdefault(r["mode"], []).append(r)
def med(rs, path):
    def get(r):
        for k in path.split("."):
            r = r[k]
        return r
    return statistics.median(get(r) for r in rs)
first = next(iter(rows.values()))
print(f"{first[0]['streams']} streams opened at once, 32-token prompts, 64 tokens each; "
      f"medians of {len(first)} interleaved runs")
print()
print("| mode | tokens/s | CPU µs/token | delivery p50 ms | delivery p99 ms | ITL p50 ms "
      "| ITL p99 ms | TTFT p50 ms | TTFT p99 ms | incomplete streams |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for mode, rs in rows.items():
    print(f"| {mode} | {med(rs, 'tokens_per_s'):,.0f} | {med(rs, 'cpu_us_per_token'):.1f} "
          f"| {med(rs, 'delivery_ms.p50'):.2f} "
          f"| {med(rs, 'delivery_ms.p99'):.2f} | {med(rs, 'itl_ms.p50'):.2f} "
          f"| {med(rs, 'itl_ms.p99'):.2f} | {med(rs, 'ttft_ms.p50'):.1f} "
          f"| {med(rs, 'ttft_ms.p99'):.1f} | {max(r['incomplete_streams'] for r in rs)} |")
PY

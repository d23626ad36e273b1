#!/usr/bin/env bash
# TTFT and TPOT of `duet serve` with the ~125M bench model (bf16, random weights) laid out two
# ways on the same CPU cores, under the same live request trace (`duet replay`, one synthetic
# trace: Poisson arrivals, fixed seed, prompts of 200..300 random token ids so no prefix-cache
# hits, 32..64 output tokens each with ignore_eos, greedy):
#   colocated            --instances 2 --threads 1 (--max-num-seqs 16 --max-num-batched-tokens
#                        8192: the engine limits of the cluster file below)
#   PD 1P1D, loopback    --cluster 1p1d (tests/data/1p1d-tiny.json) --threads 1
#                        --workers thread --kv-transport loopback (instances are threads of
#                        the server; decode copies the KV in process)
#   PD 1P1D, UCX shm     the same with --kv-transport ucx --ucx-tls posix,cma
#   PD 1P1D, processes   --workers process --ucx-tls posix,cma: a duet worker process per
#                        instance, KV over UCX shared memory between them
# The yardstick is the colocated layout: two instances that each prefill and decode, on the
# same two threads the PD layouts split into a prefill and a decode instance. Each server is
# stopped with SIGTERM (it drains, exits 0) before the next starts; every request must complete
# in every layout. KV transfer times (PD) come from the server's /metrics
# (duet:kv_transfer_seconds), their parts' medians from replay's summary.json (the replies'
# duet.kv_transfer_parts_ms): the KvReady message (with worker processes the frontend relays it),
# its wait on the decode instance, the pull; and their tail: the p99s, and the largest transfers
# split into their parts (replay's requests.csv). Prints two markdown tables.
# Usage: bench/serve_pd.sh [RATE] [REQUESTS]   (default: 1 request/s, 40 requests)
set -euo pipefail
cd "$(dirname "$0")/.."
RATE="${1:-1}"
REQUESTS="${2:-40}"
SEED=1
DUET=build/bin/duet
[ -x "$DUET" ] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
work=$(mktemp -d)
server=""
cleanup() {
  [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

"$DUET" make-test-model --preset bench --out "$work/model" >/dev/null
vocab=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' \
  "$work/model/config.json")

# The trace and the PD cluster file (1p1d-tiny as is: 1 prefill + 1 decode instance, its
# engine section gives max_num_seqs 16, max_num_batched_tokens 8192).
python3 - "$work" "$RATE" "$REQUESTS" "$SEED" <<'PY'
import json, sys
work, rate, n, seed = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
spec = {"num_requests": n, "seed": seed, "block_tokens": 16,
        "arrival": {"process": "poisson", "rate_per_s": rate},
        "input": {"dist": "uniform", "min": 200, "max": 300},
        "output": {"dist": "uniform", "min": 32, "max": 64}}
json.dump(spec, open(f"{work}/trace.json", "w"))
cluster = json.load(open("tests/data/1p1d-tiny.json"))
roles = sorted((i["role"], i.get("count", 1)) for i in cluster["instances"])
assert roles == [("decode", 1), ("prefill", 1)], roles
engine = cluster["engine"]
assert engine["max_num_seqs"] == 16 and engine["max_num_batched_tokens"] == 8192, engine
json.dump(cluster, open(f"{work}/1p1d.json", "w"), indent=2)
PY

layouts=(colocated pd-loopback pd-ucx-shm pd-processes)
declare -A args=(
  [colocated]="--instances 2 --threads 1 --max-num-seqs 16 --max-num-batched-tokens 8192"
  [pd-loopback]="--threads 1 --cluster $work/1p1d.json --workers thread --kv-transport loopback"
  [pd-ucx-shm]="--threads 1 --cluster $work/1p1d.json --workers thread --kv-transport ucx
    --ucx-tls posix,cma"
  [pd-processes]="--threads 1 --cluster $work/1p1d.json --workers process --ucx-tls posix,cma"
)
for layout in "${layouts[@]}"; do
  # shellcheck disable=SC2086  # the flags are meant to split
  "$DUET" serve --model "$work/model" --port 0 ${args[$layout]} >"$work/$layout.serve.out" \
    2>"$work/$layout.serve.err" &
  server=$!
  for _ in $(seq 1 300); do
    grep -qs "serving" "$work/$layout.serve.out" && break
    kill -0 "$server" 2>/dev/null || break
    sleep 0.1
  done
  grep -q "serving" "$work/$layout.serve.out" || {
    echo "$layout: the server did not come up:" >&2
    cat "$work/$layout.serve.out" "$work/$layout.serve.err" >&2
    exit 1
  }
  grep -o 'serving .*' "$work/$layout.serve.out" >"$work/$layout.ready"
  url=$(grep -o 'http://[0-9.]*:[0-9]*' "$work/$layout.serve.out")
  "$DUET" replay --endpoint "$url" --trace "$work/trace.json" --vocab-size "$vocab" \
    --out "$work/$layout" --progress never >"$work/$layout.replay.log" 2>&1 ||
    { cat "$work/$layout.replay.log" >&2; exit 1; }
  curl -sf "$url/metrics" >"$work/$layout.metrics"
  kill -TERM "$server"
  rc=0
  wait "$server" || rc=$?
  server=""
  [ "$rc" -eq 0 ] || {
    echo "$layout: duet serve exited $rc after SIGTERM:" >&2
    cat "$work/$layout.serve.err" >&2
    exit 1
  }
  completed=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["requests"]["completed"])' \
    "$work/$layout/summary.json")
  [ "$completed" -eq "$REQUESTS" ] || {
    echo "FAIL: $layout completed $completed of $REQUESTS requests:" >&2
    cat "$work/$layout.replay.log" >&2
    exit 1
  }
done

python3 - "$work" "$RATE" "$REQUESTS" "$SEED" "$vocab" "$0 $RATE $REQUESTS" "${layouts[@]}" <<'PY'
import csv, datetime, json, re, subprocess, sys
work, rate, n, seed, vocab, command = sys.argv[1:7]
layouts = sys.argv[7:]
cpu = re.search(r"Model name:\s*(.*)", subprocess.run(["lscpu"], capture_output=True,
                                                     text=True).stdout)
nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
print(f"{datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}, {nproc} CPUs "
      f"({cpu[1].strip() if cpu else 'unknown CPU'}); `{command}`")
print(f"bench model (~125M, bf16, random weights, vocab {vocab}); trace: {n} requests, Poisson "
      f"{rate} req/s, seed {seed}, prompts uniform 200..300 random tokens (no prefix hits), "
      f"outputs uniform 32..64 tokens (ignore_eos), greedy; `duet replay`, streamed")
for layout in layouts:
    print(f"- {layout}: `{open(f'{work}/{layout}.ready').read().strip()}`")
print()
summaries = {layout: json.load(open(f"{work}/{layout}/summary.json")) for layout in layouts}
def parts_text(parts, stat):  # "message / wait / pull" at one statistic
    return " / ".join(f"{parts[k][stat]:.3f}" for k in ("message", "wait", "pull"))
print("| layout | completed | TTFT mean / p50 / p99 (ms) | TPOT mean / p50 / p99 (ms) "
      "| E2E p50 (ms) | KV transfer mean (ms) | KV message / wait / pull p50 (ms) "
      "| output tok/s |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for layout in layouts:
    d = summaries[layout]
    t, p = d["ttft_ms"], d["tpot_ms"]
    metrics = open(f"{work}/{layout}.metrics").read()
    def metric(name):
        m = re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", metrics, re.M)
        return float(m[1]) if m else 0.0
    count = metric("duet:kv_transfer_seconds_count")
    kv = (f"{metric('duet:kv_transfer_seconds_sum') / count * 1000:.2f} ({count:.0f})"
          if count else "n/a")
    parts = d.get("kv_transfer", {}).get("parts_ms")
    split = parts_text(parts, "p50") if parts and count else "n/a"
    print(f"| {layout} | {d['requests']['completed']} / {d['requests']['total']} "
          f"| {t['mean']:.1f} / {t['p50']:.1f} / {t['p99']:.1f} "
          f"| {p['mean']:.2f} / {p['p50']:.2f} / {p['p99']:.2f} "
          f"| {d['e2e_ms']['p50']:.1f} | {kv} | {split} "
          f"| {d['throughput']['output_tokens_per_s']:.1f} |")

# The transfers' tail, from the replies (replay's requests.csv): where the slowest spent it.
print()
print("| layout | KV transfer mean / p99 (ms) | message / wait / pull mean (ms) "
      "| message / wait / pull p99 (ms) "
      "| the 3 largest: transfer = message + wait + pull (ms) |")
print("| --- | --- | --- | --- | --- |")
for layout in layouts:
    rows = [r for r in csv.DictReader(open(f"{work}/{layout}/requests.csv"))
            if r["kv_transfer_ms"] and r["kv_message_ms"]]
    if not rows:
        continue
    d = summaries[layout]["kv_transfer"]
    largest = sorted(rows, key=lambda r: -float(r["kv_transfer_ms"]))[:3]
    split = "; ".join(f"{float(r['kv_transfer_ms']):.2f} = {float(r['kv_message_ms']):.2f} + "
                      f"{float(r['kv_wait_ms']):.2f} + {float(r['kv_pull_ms']):.2f}"
                      for r in largest)
    print(f"| {layout} | {d['time_ms']['mean']:.2f} / {d['time_ms']['p99']:.2f} "
          f"| {parts_text(d['parts_ms'], 'mean')} | {parts_text(d['parts_ms'], 'p99')} "
          f"| {split} |")
PY

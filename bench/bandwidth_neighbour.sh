#!/usr/bin/env bash
# How much the bench model's steps lose to a neighbour that only moves memory (docs/validation.md,
# issue 44): `duet generate` on one thread (a 300-token prompt's prefill, then 300 one-row decode
# steps) alone, and beside `dd` copying /dev/zero to /dev/null in 64 MiB blocks on the other core
# (a memory-bandwidth load with no arithmetic), alternating, ROUNDS times each. A decode step
# reads every weight for one token and is bound by memory bandwidth; a prefill pass reads them
# once for hundreds of tokens. Prints each timing's prefill pass and median decode step, and the
# medians' ratios beside over alone.
# Usage: bench/bandwidth_neighbour.sh [WORK] [ROUNDS]   (default: a fresh temp dir, 3)
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-$(mktemp -d)}"
rounds="${2:-3}"
source bench/lib.sh
bench_setup "$work"
prompt=$(printf 'the quick brown fox jumps over the lazy dog %.0s' $(seq 13))
neighbour=
stop_neighbour() { [ -z "$neighbour" ] || { kill "$neighbour" 2>/dev/null; wait "$neighbour" 2>/dev/null || true; neighbour=; }; }
trap stop_neighbour EXIT
for k in $(seq "$rounds"); do
  for mode in alone beside; do
    if [ "$mode" = beside ]; then
      dd if=/dev/zero of=/dev/null bs=64M count=1000000 2>/dev/null &
      neighbour=$!
      sleep 0.5
    fi
    "$DUET" generate --model bench --prompt "$prompt" --ignore-eos --max-tokens 300 --threads 1 \
      --warmup --timings "$mode-$k.jsonl" > /dev/null 2> "$mode-$k.log"
    stop_neighbour
  done
done
python3 - "$rounds" <<'EOF'
import json, statistics, sys

rounds = int(sys.argv[1])
times = {}
for mode in ("alone", "beside"):
    for k in range(1, rounds + 1):
        lines = [json.loads(l) for l in open(f"{mode}-{k}.jsonl")]
        prefill = next(l["seconds"] for l in lines if l["prefill"])
        decode = statistics.median(l["seconds"] for l in lines if l["decode_tokens"] == 1)
        times.setdefault(mode, []).append((prefill, decode))
        print(f"{mode:6} {k}: prefill {1e3 * prefill:.1f} ms, decode step {1e3 * decode:.2f} ms (median)")
for i, name in ((0, "prefill"), (1, "decode step")):
    alone = statistics.median(t[i] for t in times["alone"])
    beside = statistics.median(t[i] for t in times["beside"])
    print(f"{name}: beside the neighbour x{beside / alone:.3f} of alone (medians {1e3 * beside:.2f} / {1e3 * alone:.2f} ms)")
EOF
echo "files: $work"

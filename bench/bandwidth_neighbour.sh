#!/usr/bin/env bash
# How much the bench model's steps lose to a neighbour on the other core (docs/validation.md,
# issue 44): `duet generate` on one thread (a 300-token prompt's prefill, then 300 one-row decode
# steps) alone, and beside the neighbour, alternating, ROUNDS times each. NEIGHBOUR:
#   memory     `dd` copying /dev/zero to /dev/null in 64 MiB blocks: a memory-bandwidth load with
#              no arithmetic (the default);
#   prefill-N  the same model prefilling a prompt of about N tokens over and over, one thread, in
#              a process of its own: a 1P1D prefill worker's load beside its decode worker.
# A decode step reads every weight for one token and is bound by memory bandwidth; a prefill pass
# reads them once for hundreds of tokens. Prints each timing's prefill pass and median decode
# step, the medians' ratios beside over alone, and for a prefill neighbour its passes' median.
# Usage: bench/bandwidth_neighbour.sh [WORK] [ROUNDS] [NEIGHBOUR]   (default: a fresh temp dir,
#        3, memory)
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-$(mktemp -d)}"
rounds="${2:-3}"
kind="${3:-memory}"
case "$kind" in
  memory) ;;
  prefill-[0-9]*) prefill_tokens="${kind#prefill-}" ;;
  *) echo "the neighbour must be memory or prefill-N (N tokens)" >&2; exit 2 ;;
esac
source bench/lib.sh
bench_setup "$work"
# About 23 tokens each with the bench model's tokenizer.
phrase() { printf 'the quick brown fox jumps over the lazy dog %.0s' $(seq "$1"); }
prompt=$(phrase 13)
neighbour=
stop_neighbour() {
  [ -z "$neighbour" ] || { kill -- -"$neighbour" 2>/dev/null; wait "$neighbour" 2>/dev/null || true; neighbour=; }
}
trap stop_neighbour EXIT
start_neighbour() {
  set -m  # the neighbour in a process group of its own, to stop its loop and its child at once
  if [ "$kind" = memory ]; then
    dd if=/dev/zero of=/dev/null bs=64M count=1000000 2>/dev/null &
  else
    local long
    long=$(phrase $(( (prefill_tokens + 22) / 23 )))
    (for i in $(seq 100000); do
       "$DUET" generate --model bench --prompt "$long" --max-tokens 1 --threads 1 \
         --timings "neighbour-$k-$i.jsonl" > /dev/null 2>&1 || exit 0
     done) &
  fi
  neighbour=$!
  set +m
  sleep 0.5
}
for k in $(seq "$rounds"); do
  for mode in alone beside; do
    [ "$mode" = beside ] && start_neighbour
    "$DUET" generate --model bench --prompt "$prompt" --ignore-eos --max-tokens 300 --threads 1 \
      --warmup --timings "$mode-$k.jsonl" > /dev/null 2> "$mode-$k.log"
    stop_neighbour
  done
done
python3 - "$rounds" <<'EOF'
import glob, json, statistics, sys

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
def whole(f):  # a pass stopped with its neighbour wrote nothing, or a part
    try:
        return [json.loads(l) for l in open(f)]
    except ValueError:
        return []
passes = [p for f in sorted(glob.glob("neighbour-*.jsonl")) for p in whole(f) if p["prefill"]]
if passes:
    tokens = statistics.median(sum(c[0] for c in p["prefill"]) for p in passes)
    print(f"the neighbour: {len(passes)} prefill passes of {tokens:.0f} tokens, "
          f"{1e3 * statistics.median(p['seconds'] for p in passes):.1f} ms (median)")
EOF
echo "files: $work"

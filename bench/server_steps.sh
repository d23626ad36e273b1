#!/usr/bin/env bash
# A live server's steps against two calibrations, one just before its runs and one just after
# (docs/validation.md, issue 44): whether the server runs a shape at the speed `duet calibrate`
# timed it, told from the machine's drift, which moves both calibrations. The ~125M bench model
# calibrated on one thread (the ladders: prompts to 512 tokens, contexts to 1,024, batches to 8
# rows), then `duet validate` on a synthetic trace of 40 requests spaced about 2 s apart
# (prompts of 64 to 512 tokens, 32 to 96 output tokens: at x1 the server serves one at a time,
# at x8 a few side by side), 3 live runs per load, on
#   colocated: one colocated instance, one engine thread, or
#   1p1d: a prefill and a decode worker process, one thread each, KV over UCX;
# then calibrated again, and `duet validate --again` prices the same live steps with the second
# profile. Prints, per load and profile, how the profile priced the live forward passes
# (overall, decode, prefill, one-row decodes; decode's median step and tail) and the live decode
# steps' speed over the prefill ones' against calibration's (1.00: as calibrated). The yardstick,
# timed before the first calibration, between the live runs and the second, and after it: one
# sequence decoded without a server (`duet generate --timings`, a 300-token prompt, 500 tokens,
# one thread), whose one-row steps' tail against the median of their 51 neighbours (the time
# they took over what they would at that median, less one; the share of them beyond 1.25 times
# it) is printed beside the server's one-row decode steps' at each load.
# Usage: bench/server_steps.sh colocated|1p1d [WORK] [RATE_SCALES]
#        (default: a fresh temp dir, 1,8)
set -euo pipefail
cd "$(dirname "$0")/.."
layout="${1:?colocated or 1p1d}"
work="${2:-$(mktemp -d)}"
scales="${3:-1,8}"
case "$layout" in
  colocated) serve_args="--workers thread --threads 1" ;;
  1p1d) serve_args="--threads 1" ;;
  *) echo "the layout must be colocated or 1p1d" >&2; exit 2 ;;
esac
source bench/lib.sh
bench_setup "$work"
bench_cluster "$layout" '{"max_num_seqs": 16, "max_num_batched_tokens": 1024, "reserved_gib": 0.25}' 1
cat > trace.json <<'EOF'
{"num_requests": 40, "seed": 11, "block_tokens": 16,
 "arrival": {"process": "gamma", "rate_per_s": 0.5, "cv": 0.1},
 "input": {"dist": "uniform", "min": 64, "max": 512},
 "output": {"dist": "uniform", "min": 32, "max": 96}}
EOF
calibrate() {
  "$DUET" calibrate --model bench --out "$1" --threads 1 --progress never --repeats 3 \
    --max-tokens 512 --max-context 1024 --max-batch 8 "${calibrate_args[@]}"
}
validate() {
  "$DUET" validate --cluster cluster.json --model bench --trace trace.json \
    --serve-args "$serve_args" --out validation "$@"
}
prompt=$(printf 'the quick brown fox jumps over the lazy dog %.0s' $(seq 13))
generate() {
  "$DUET" generate --model bench --prompt "$prompt" --ignore-eos --max-tokens 500 --threads 1 \
    --warmup --timings "generate-$1.jsonl" > /dev/null 2> "generate-$1.log"
}
generate 1
echo "$(date -u +%H:%M:%S) calibrating before the live runs" >&2
calibrate profile-before.json
cp profile-before.json profile.json
validate --rate-scales "$scales" --repeats 3 > validate-before.txt
cp validation/validation.json validation-before.json
generate 2
echo "$(date -u +%H:%M:%S) calibrating after the live runs" >&2
calibrate profile-after.json
generate 3
cp profile-after.json profile.json
validate --again > validate-after.txt
cp validation/validation.json validation-after.json
python3 - validation-before.json validation-after.json <<'EOF'
import glob, json, statistics, sys

def pct(v):
    return "n/a" if v is None else f"{v:+.1f}%"

def tail(seconds):
    # Each step against the median of the 51 around it (its context moves slowly): the steps'
    # time over the time at those medians, less one, and the share beyond 1.25 times theirs.
    medians = [statistics.median(seconds[max(0, i - 25):i + 26]) for i in range(len(seconds))]
    over = sum(t > 1.25 * m for t, m in zip(seconds, medians))
    return f"{100 * (sum(seconds) / sum(medians) - 1):+.1f}% ({100 * over / len(seconds):.1f}% of {len(seconds)})"

def one_row(lines):
    return [l for l in lines if l["decode_tokens"] == 1 and not l["prefill"]]

print("one-row decode steps: tail against their neighbours' median (share beyond 1.25 times it)")
for k in (1, 2, 3):
    steps = one_row(json.loads(l) for l in open(f"generate-{k}.jsonl"))
    print(f"  duet generate, timing {k}: {tail([s['seconds'] for s in steps])}")
for rate in sorted(glob.glob("validation/rate-*")):
    runs = []
    for log in sorted(glob.glob(f"{rate}/steps*.jsonl")):
        lines = sorted(one_row(json.loads(l) for l in open(log)), key=lambda l: l["start_s"])
        for instance in sorted({l["instance"] for l in lines}):
            seconds = [l["seconds"] for l in lines if l["instance"] == instance]
            if len(seconds) >= 51:
                runs.append(f"{log.split('/')[-1]} instance {instance}: {tail(seconds)}")
    print(f"  duet serve, {rate.split('/')[-1]}: " + ("; ".join(runs) or "fewer than 51 steps"))

print("load  profile  steps priced: all / decode / prefill / 1-row decode   decode over prefill")
for name, path in zip(("before", "after"), sys.argv[1:]):
    for load in json.load(open(path))["loads"]:
        steps = load["steps"]
        classes = steps["classes"]
        err = {k: classes.get(k, {}).get("error_pct") for k in ("decode", "prefill")}
        one_row_error = next((b["error_pct"] for b in steps["decode_by_rows"] if b["rows_from"] == 1), None)
        # error = price / live - 1, so the live decode steps' time over the prefill ones', each
        # against its price: (1 + prefill error) / (1 + decode error).
        ratio = ("n/a" if None in err.values()
                 else f"{(1 + err['prefill'] / 100) / (1 + err['decode'] / 100):.3f}")
        decode = classes.get("decode", {})
        print(f"x{load['rate_scale']:<4g} {name:8} {pct(steps['priced_error_pct'])} / "
              f"{pct(err['decode'])} / {pct(err['prefill'])} / {pct(one_row_error)}   {ratio}   "
              f"decode's median step {pct(decode.get('median_step_error_pct'))}, "
              f"tail {pct(decode.get('tail_pct'))}")
EOF
echo "files: $work"

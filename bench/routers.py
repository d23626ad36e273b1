#!/usr/bin/env python3
"""Compares every router on the Mooncake conversation trace and the bundled prefix-heavy
synthetic trace, on the 16-GPU colocated and 8P8D H100 clusters (GPU memory only), at 1x and 4x
the traces' rates, with `duet simulate`; prints a Markdown table of prefix hit rate beside the
pooled reference (one LRU prefix cache with the prefill instances' summed GPU KV blocks, seeing
every request: summary.json prefix_cache.pooled_reference), TTFT p99 and TPOT p99, and for
kv-aware whether it meets the goal of issue 13: a hit rate of at least 90% of the pooled
reference with TTFT p99 and TPOT p99 within 10% of least-loaded's.

Usage: bench/routers.py [--out FILE] [--rates 1,4] [--routers a,b] [--traces a,b]
(traces: mooncake, prefix-heavy (the default pair) and multi-turn, the bundled session trace;
its rate scale speeds up conversation starts, not think times). Standard library only.
Needs ../shared/traces/mooncake_conversation.jsonl (skipped with a message when absent)."""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROUTERS = ["round-robin", "least-loaded", "power-of-two", "prefix-aware", "cache-aware", "kv-aware"]
CLUSTERS = ["h100-16colo-llama8b", "h100-8p8d-llama8b"]
TRACES = {"mooncake": "../shared/traces/mooncake_conversation.jsonl",
          "prefix-heavy": "traces/bundled/prefix-heavy.json",
          "multi-turn": "traces/bundled/multi-turn.json"}


def simulate(duet, cluster, trace, rate, router, out):
    cmd = [duet, "simulate", "--cluster", f"sim/clusters/{cluster}.json", "--trace", trace,
           "--rate-scale", str(rate), "--router", router, "--out", out, "--progress", "never"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.load(open(os.path.join(out, "summary.json")))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", help="also write the table here")
    ap.add_argument("--rates", default="1,4")
    ap.add_argument("--routers", default=",".join(ROUTERS))
    ap.add_argument("--traces", default="mooncake,prefix-heavy")
    ap.add_argument("--duet", default=os.path.join(ROOT, "build", "bin", "duet"))
    args = ap.parse_args()
    os.chdir(ROOT)
    routers = args.routers.split(",")
    if "least-loaded" not in routers:
        routers.insert(0, "least-loaded")  # the yardstick
    lines = [
        f"`bench/routers.py`, {datetime.date.today().isoformat()}, {os.cpu_count()} cores, "
        f"{platform.processor() or platform.machine()}; GPU memory only (no KV tiers).",
        "",
        "| trace | cluster | rate | router | hit rate | pooled ref. | of pooled | TTFT p99 ms "
        "| vs least-loaded | TPOT p99 ms | vs least-loaded | goal |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for trace_name in args.traces.split(","):
            trace = TRACES[trace_name]
            if not os.path.exists(trace):
                print(f"skipping {trace_name}: {trace} not found", file=sys.stderr)
                continue
            for cluster in CLUSTERS:
                for rate in args.rates.split(","):
                    runs = {}
                    for router in routers:
                        out = os.path.join(tmp, f"{trace_name}-{cluster}-{rate}-{router}")
                        runs[router] = simulate(args.duet, cluster, trace, rate, router, out)
                        print(f"{trace_name} {cluster} x{rate} {router} done", file=sys.stderr)
                    base = runs["least-loaded"]
                    for router in routers:
                        s = runs[router]
                        pc = s["prefix_cache"]
                        pooled = pc["pooled_reference"]["hit_rate"]
                        share = pc["hit_rate"] / pooled if pooled > 0 else 0.0
                        ttft, tpot = s["ttft_ms"]["p99"], s["tpot_ms"]["p99"]
                        dttft = ttft / base["ttft_ms"]["p99"] - 1
                        dtpot = tpot / base["tpot_ms"]["p99"] - 1
                        goal = ""
                        if router == "kv-aware":
                            met = share >= 0.9 and dttft <= 0.10 and dtpot <= 0.10
                            goal = "met" if met else "missed"
                        lines.append(
                            f"| {trace_name} | {cluster} | {rate}x | {router} "
                            f"| {pc['hit_rate']:.1%} | {pooled:.1%} | {share:.0%} | {ttft:.0f} "
                            f"| {dttft:+.0%} | {tpot:.1f} | {dtpot:+.0%} | {goal} |")
    table = "\n".join(lines) + "\n"
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table)


if __name__ == "__main__":
    main()

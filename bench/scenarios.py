#!/usr/bin/env python3
"""Runs a scenario file (sim/scenarios/*.json): every setup at every rate scale on one trace with
`duet simulate`, then prints a Markdown table of TTFT, TPOT, throughput, prefix hit rate and
concurrency, one row per run.

Usage: bench/scenarios.py [SCENARIO] [--out FILE]   (default sim/scenarios/pd-offload.json)

Concurrency is computed from requests.csv: the mean is the sum of the requests' end-to-end
times over the run's duration (Little's law); the peak is the most requests in flight (from
arrival to completion) at any instant. Standard library only."""
import argparse
import csv
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def concurrency(requests_csv):
    events, e2e_sum, start, end = [], 0.0, None, None
    with open(requests_csv) as f:
        for row in csv.DictReader(f):
            if row["status"] != "completed":
                continue
            arrival = float(row["arrival_s"])
            finish = arrival + float(row["e2e_ms"]) / 1e3
            events += [(arrival, 1), (finish, -1)]
            e2e_sum += finish - arrival
            start = arrival if start is None else min(start, arrival)
            end = finish if end is None else max(end, finish)
    events.sort(key=lambda e: (e[0], e[1]))  # completions before arrivals at one instant
    peak = live = 0
    for _, d in events:
        live += d
        peak = max(peak, live)
    return (e2e_sum / (end - start) if end and end > start else 0.0), peak


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", nargs="?", default="sim/scenarios/pd-offload.json")
    ap.add_argument("--out", help="also write the table here")
    ap.add_argument("--duet", default=os.path.join(ROOT, "build", "bin", "duet"))
    args = ap.parse_args()
    os.chdir(ROOT)
    sc = json.load(open(args.scenario))
    lines = [
        f"Scenario `{args.scenario}` ({sc['name']}), {datetime.date.today().isoformat()}, "
        f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}",
        "",
        f"Trace `{sc['trace']}`, router `{sc['router']}`.",
        "",
        "| setup | rate | completed | TTFT mean ms | TTFT p90 ms | TTFT p99 ms | TPOT mean ms "
        "| output tok/s | prefix hit rate | from DRAM / SSD | mean concurrency | peak concurrency |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as work:
        for scale in sc["rate_scales"]:
            for setup in sc["setups"]:
                out = os.path.join(work, "out")
                cmd = [args.duet, "simulate", "--cluster", setup["cluster"], "--trace", sc["trace"],
                       "--router", sc["router"], "--rate-scale", str(scale), "--out", out,
                       "--progress", "never"]
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
                s = json.load(open(os.path.join(out, "summary.json")))
                mean_c, peak_c = concurrency(os.path.join(out, "requests.csv"))
                by = s["prefix_cache"]["by_tier"]
                lines.append(
                    f"| {setup['name']} | {scale}x | {s['requests']['completed']}/{s['requests']['total']} "
                    f"| {s['ttft_ms']['mean']:.0f} | {s['ttft_ms']['p90']:.0f} | {s['ttft_ms']['p99']:.0f} "
                    f"| {s['tpot_ms']['mean']:.2f} | {s['throughput']['output_tokens_per_s']:,.0f} "
                    f"| {100 * s['prefix_cache']['hit_rate']:.1f}% "
                    f"| {100 * by['dram']['hit_rate']:.1f}% / {100 * by['ssd']['hit_rate']:.1f}% "
                    f"| {mean_c:.1f} | {peak_c} |")
                print(lines[-1], flush=True)
    table = "\n".join(lines) + "\n"
    if args.out:
        open(args.out, "w").write(table)
    else:
        print()
        print(table)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Runs a scenario file (sim/scenarios/*.json) with `duet sweep` (every setup at every rate
scale, one simulation per core, or on a Ray cluster with --ray) and prints its results.csv as a
Markdown table of TTFT, TPOT, throughput, prefix hit rate and concurrency, one row per run.

Usage: bench/scenarios.py [SCENARIO] [--out FILE] [--ray ADDRESS]
       (default sim/scenarios/pd-offload.json)

Standard library only; the figures are duet's (docs/scenarios.md says what each column is)."""
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", nargs="?", default="sim/scenarios/pd-offload.json")
    ap.add_argument("--out", help="also write the table here")
    ap.add_argument("--ray", help="run the sweep on the Ray cluster at this address")
    ap.add_argument("--duet", default=os.path.join(ROOT, "build", "bin", "duet"))
    args = ap.parse_args()
    os.chdir(ROOT)
    sc = json.load(open(args.scenario))
    lines = [
        f"Scenario `{args.scenario}` ({sc['name']}), {datetime.date.today().isoformat()}, "
        f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}",
        "",
        f"Trace `{sc['trace']}`, router `{sc.get('router', 'prefix-aware')}`.",
        "",
        "| setup | rate | completed | TTFT mean ms | TTFT p90 ms | TTFT p99 ms | TPOT mean ms "
        "| output tok/s | prefix hit rate | from DRAM / SSD | mean concurrency | peak concurrency |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as work:
        cmd = [args.duet, "sweep", "--scenario", args.scenario, "--out", work]
        if args.ray:
            cmd += ["--ray", args.ray]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(work, "results.csv")) as f:
            for r in csv.DictReader(f):
                pct = lambda key: f"{100 * float(r[key]):.1f}%"  # noqa: E731
                lines.append(
                    f"| {r['setup']} | {r['rate_scale']}x | {r['completed']}/{r['total']} "
                    f"| {float(r['ttft_mean_ms']):.0f} | {float(r['ttft_p90_ms']):.0f} "
                    f"| {float(r['ttft_p99_ms']):.0f} | {float(r['tpot_mean_ms']):.2f} "
                    f"| {float(r['output_tokens_per_s']):,.0f} | {pct('prefix_hit_rate')} "
                    f"| {pct('dram_hit_rate')} / {pct('ssd_hit_rate')} "
                    f"| {float(r['mean_concurrency']):.1f} | {r['peak_concurrency']} |")
    table = "\n".join(lines) + "\n"
    if args.out:
        open(args.out, "w").write(table)
    print(table)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""`duet plan` beside NVIDIA AIConfigurator's recommendation, both simulated on a real trace.

For one model on one GPU type, an SLO (TTFT, TPOT) and a trace:

1. AIConfigurator (`aiconfigurator cli default`, pinned in scripts/requirements.txt) recommends
   its cheapest aggregated and disaggregated deployments for the trace's mean prompt and output
   lengths at the trace's request rate: replicas of one layout, sized from static step
   estimates.
2. Each recommendation becomes a Duet cluster file (colocated instances, or prefill and decode
   instances, on nodes of 8 GPUs, an instance larger than a node over whole nodes; steps priced with the bundled profile of that GPU and model,
   else the roofline) and `duet simulate` replays the real trace on it: the fraction of requests
   that meet the SLO.
3. `duet plan` searches the same model and GPU for the cheapest cluster that meets the SLO for
   the given fraction of requests, and its winner is reported the same way.

Prints a Markdown table (docs/planning.md). Usage:
  scripts/beside_aiconfigurator.py --model llama-3.1-70b --gpu h200 --ttft 2000 --tpot 100 \\
      [--attainment 0.9] [--trace FILE] [--out DIR] [plan options after --]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import pathlib
import shutil
import subprocess
import sys

from aiconfigurator_steps import MODELS, SYSTEMS  # Duet's names -> aiconfigurator's

ROOT = pathlib.Path(__file__).resolve().parent.parent
DUET = os.environ.get("DUET", str(ROOT / "build/bin/duet"))
GPUS_PER_NODE = 8


def trace_stats(path: pathlib.Path) -> tuple[float, float, float]:
    """Mean prompt and output tokens and the request rate of a Mooncake JSONL trace."""
    n, isl, osl, last_ms = 0, 0, 0, 0
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            n += 1
            isl += r["input_length"]
            osl += r["output_length"]
            last_ms = max(last_ms, r["timestamp"])
    return isl / n, osl / n, n / (last_ms / 1e3)


def recommend(model: str, gpu: str, isl: float, osl: float, rate: float, ttft: float,
              tpot: float, out: pathlib.Path) -> dict[str, dict]:
    """AIConfigurator's top aggregated and disaggregated configurations at `rate` (CSV rows)."""
    save = out / "aiconfigurator"
    shutil.rmtree(save, ignore_errors=True)
    cmd = [str(ROOT / ".venv/bin/aiconfigurator"), "cli", "default",
           "--model-path", MODELS[model][0], "--system", SYSTEMS[gpu], "--backend", "vllm",
           "--isl", str(round(isl)), "--osl", str(round(osl)),
           "--target-request-rate", f"{rate:.3f}", "--ttft", str(ttft), "--tpot", str(tpot),
           "--save-dir", str(save), "--no-color", "--log-level", "ERROR"]
    log = out / "aiconfigurator.log"
    with open(log, "w") as f:
        subprocess.run(cmd, check=True, stdout=f, stderr=subprocess.STDOUT)
    picks = {}
    for mode in ("agg", "disagg"):
        tables = sorted(save.rglob(f"{mode}/best_config_topn.csv"))
        if not tables:
            continue
        rows = list(csv.DictReader(open(tables[0])))
        if rows:
            picks[mode] = rows[0]
    return picks


def cluster_doc(model: str, gpu: str, mode: str, row: dict, rate: float) -> tuple[dict, int]:
    """The recommendation as a Duet cluster file (replicas to serve `rate`), and its GPUs."""
    replicas = max(1, math.ceil(rate / float(row["seq/s"]) - 1e-9))

    def group(role: str, count: int, prefix: str) -> dict:
        if int(row[f"{prefix}pp"]) != 1:
            sys.exit(f"{mode}: pipeline parallelism ({prefix}pp {row[f'{prefix}pp']}) is not "
                     "in Duet's clusters")
        g = {"role": role, "count": count, "tp": int(row[f"{prefix}tp"])}
        if int(row[f"{prefix}dp"]) > 1:
            g["dp"] = int(row[f"{prefix}dp"])
        return g

    if mode == "agg":
        instances = [group("colocated", replicas, "")]
    else:
        instances = [group("prefill", replicas * int(row["(p)workers"]), "(p)"),
                     group("decode", replicas * int(row["(d)workers"]), "(d)")]
    gpus = sum(i["count"] * i["tp"] * i.get("dp", 1) for i in instances)
    free: list[int] = []  # the nodes' free GPUs, filled first fit as a cluster file places them
    for i in instances:
        size = i["tp"] * i.get("dp", 1)
        for _ in range(i["count"]):
            if size > GPUS_PER_NODE:  # whole nodes of its own
                free.extend([0] * math.ceil(size / GPUS_PER_NODE))
                continue
            k = next((k for k, f in enumerate(free) if f >= size), None)
            if k is None:
                free.append(GPUS_PER_NODE)
                k = len(free) - 1
            free[k] -= size
    profile = ROOT / "sim/profiles" / f"{gpu}-{model}.json"
    dp = any(i.get("dp", 1) > 1 for i in instances)
    cost_model = ({"kind": "fitted", "profile": f"{gpu}-{model}"}
                  if profile.exists() and not dp else {"kind": "roofline"})
    base = json.loads((ROOT / "sim/clusters/h100-8p8d-llama8b.json").read_text())
    doc = {
        "name": f"aiconfigurator-{mode}",
        "description": f"AIConfigurator's {mode} recommendation, {replicas} replicas",
        "model": model,
        "nodes": [dict(base["nodes"][0], gpu=gpu, gpus=GPUS_PER_NODE,
                       count=len(free))],
        "network": base["network"],
        "instances": instances,
        "engine": base["engine"],
        "router": "kv-aware",
        "cost_model": cost_model,
    }
    return doc, gpus


def simulate(cluster: pathlib.Path, trace: pathlib.Path, slo: str, out: pathlib.Path) -> dict:
    subprocess.run([DUET, "simulate", "--cluster", str(cluster),
                    "--trace", str(trace), "--slo", slo, "--out", str(out), "--progress",
                    "never"], check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "summary.json").read_text())


def priced_by(cluster: dict) -> str:
    cost = cluster.get("cost_model", {})
    return f"profile {cost['profile']}" if cost.get("kind") == "fitted" else "roofline"


def row_of(name: str, layout: str, gpus: int, price: float, cluster: dict, s: dict) -> str:
    return (f"| {name} | {layout} | {gpus} | {gpus * price:.2f} | {priced_by(cluster)} | "
            f"{100 * s['goodput']['attainment']:.2f}% | {s['ttft_ms']['p90']:.0f} | "
            f"{s['ttft_ms']['p99']:.0f} | {s['tpot_ms']['p99']:.1f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, choices=sorted(MODELS))
    parser.add_argument("--gpu", required=True, choices=sorted(SYSTEMS))
    parser.add_argument("--ttft", type=float, required=True, help="TTFT SLO, ms")
    parser.add_argument("--tpot", type=float, required=True, help="TPOT SLO, ms")
    parser.add_argument("--attainment", type=float, default=0.9)
    parser.add_argument("--gpu-hour-cost", type=float, default=2.5)
    parser.add_argument("--trace", type=pathlib.Path,
                        default=ROOT.parent / "shared/traces/mooncake_conversation.jsonl")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "out/beside-aiconfigurator")
    parser.add_argument("plan_args", nargs="*", help="more `duet plan` options (after --)")
    args = parser.parse_args()
    out = args.out / f"{args.gpu}-{args.model}"
    out.mkdir(parents=True, exist_ok=True)
    slo = f"ttft={args.ttft:g},tpot={args.tpot:g}"

    isl, osl, rate = trace_stats(args.trace)
    print(f"{args.model} on {args.gpu}, {args.trace.name}: mean prompt {isl:.0f} and output "
          f"{osl:.0f} tokens, {rate:.2f} req/s; SLO {slo} for {100 * args.attainment:g}% of "
          f"requests")
    print()
    print("| who | layout | GPUs | $/hour | steps priced by | attainment | TTFT p90 ms "
          "| TTFT p99 ms | TPOT p99 ms |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    picks = recommend(args.model, args.gpu, isl, osl, rate, args.ttft, args.tpot, out)
    for mode in ("agg", "disagg"):
        if mode not in picks:
            print(f"| AIConfigurator {mode} | none meets the SLO by its estimate | | | | | | | |")
            continue
        row = picks[mode]
        doc, gpus = cluster_doc(args.model, args.gpu, mode, row, rate)
        layout = " + ".join(f"{i['count']}x TP{i['tp']}" + (f"xDP{i['dp']}" if "dp" in i else "")
                            + f" {i['role']}" for i in doc["instances"])
        path = out / f"aiconfigurator-{mode}.json"
        path.write_text(json.dumps(doc, indent=1) + "\n")
        s = simulate(path, args.trace, slo, out / f"sim-{mode}")
        print(row_of(f"AIConfigurator {mode} (its estimate: TTFT {float(row['ttft']):.0f} ms, "
                     f"TPOT {float(row['tpot']):.1f} ms)", layout, gpus, args.gpu_hour_cost,
                     doc, s))
    plan_out = out / "plan"
    with open(out / "plan.log", "w") as log:
        subprocess.run([DUET, "plan", "--model", args.model, "--gpu",
                        args.gpu, "--trace", str(args.trace), "--slo", slo, "--attainment",
                        str(args.attainment), "--gpu-hour-cost", str(args.gpu_hour_cost),
                        "--rates", "1", "--progress", "never", "--out", str(plan_out),
                        *args.plan_args], stdout=log, stderr=subprocess.STDOUT, check=False)
    if not (plan_out / "plan.json").exists():  # it failed before searching: say why
        refused = [line.split("instances[0]: ", 1)[-1]
                   for line in (out / "plan.log").read_text().splitlines() if "left out" in line]
        print(f"| duet plan | no candidate left to simulate"
              f"{': e.g. ' + refused[0] if refused else ''} | | | | | | | |")
        return 0
    plan = json.loads((plan_out / "plan.json").read_text())
    if plan.get("winner"):
        w = plan["winner"]
        s = simulate(pathlib.Path(w["cluster"]), args.trace, slo, out / "sim-duet")
        cluster = json.loads(pathlib.Path(w["cluster"]).read_text())
        print(row_of("duet plan", w["layout"], w["gpus"], args.gpu_hour_cost, cluster, s))
    else:
        print(f"| duet plan | none meets the SLO within its space ({plan['candidates']} "
              f"candidates, {plan['out_of_reach']} out of reach) | | | | | | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

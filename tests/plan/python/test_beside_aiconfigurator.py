"""scripts/beside_aiconfigurator.py end to end on a small Mooncake-format trace: AIConfigurator's
recommendations become Duet clusters of as many replicas as the trace's rate needs, each is
simulated on the trace, and `duet plan`'s winner meets the SLO where they may not."""
import csv
import json
import math
import os
import pathlib
import subprocess

DUET = os.environ["DUET_BIN"]
ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_recommendations_are_simulated_beside_the_plan(tmp_path):
    trace = tmp_path / "trace.jsonl"
    with open(trace, "w") as f:
        for i in range(120):  # 2 req/s of 3000-token prompts, no shared prefixes
            ids = list(range(6 * i, 6 * i + 6))  # ceil(3000 / 512) blocks
            f.write(json.dumps({"timestamp": 500 * i, "input_length": 3000, "output_length": 80,
                                "hash_ids": ids}) + "\n")
    out = tmp_path / "out"
    run = subprocess.run(
        [str(ROOT / ".venv/bin/python"), str(ROOT / "scripts/beside_aiconfigurator.py"),
         "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--ttft", "1000", "--tpot", "50",
         "--attainment", "0.9", "--trace", str(trace), "--out", str(out), "--",
         "--layouts", "colocated", "--tp", "1,2", "--max-gpus", "8", "--token-budgets", "8192",
         "--dram-gib", "0", "--ssd-tib", "0", "--routers", "kv-aware", "--jobs", "2"],
        env=dict(os.environ, DUET=DUET), capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = [line for line in run.stdout.splitlines() if line.startswith("| ")][2:]
    assert [r.split(" | ")[0] for r in rows if "duet plan" in r] == ["| duet plan"], run.stdout
    work = out / "h100-sxm-llama-3.1-8b"
    for mode in ("agg", "disagg"):
        table = next(work.rglob(f"{mode}/best_config_topn.csv"), None)
        if table is None:  # AIConfigurator found none: the table says so
            assert any(f"AIConfigurator {mode} | none" in r for r in rows), run.stdout
            continue
        pick = next(csv.DictReader(open(table)))
        replicas = math.ceil(120 / 59.5 / float(pick["seq/s"]) - 1e-9)  # the trace's 2.02 req/s
        per_replica = (int(pick["tp"]) if mode == "agg" else
                       int(pick["(p)workers"]) * int(pick["(p)tp"]) +
                       int(pick["(d)workers"]) * int(pick["(d)tp"]))
        cluster = json.loads((work / f"aiconfigurator-{mode}.json").read_text())
        gpus = sum(i["count"] * i["tp"] * i.get("dp", 1) for i in cluster["instances"])
        assert gpus == replicas * per_replica, (mode, cluster["instances"], pick)
        assert cluster["cost_model"] == {"kind": "fitted", "profile": "h100-sxm-llama-3.1-8b"}
        summary = json.loads((work / f"sim-{mode}" / "summary.json").read_text())
        assert summary["requests"]["completed"] == 120
        assert any(f"AIConfigurator {mode} (its estimate" in r and f"| {gpus} |" in r
                   for r in rows), run.stdout
    plan = json.loads((work / "plan" / "plan.json").read_text())
    assert plan["winner"], run.stdout
    winner = json.loads((work / "sim-duet" / "summary.json").read_text())
    assert winner["goodput"]["attainment"] >= 0.9

"""`duet sweep --ray` and `duet plan --ray` against a real Ray head started on loopback from the
project's .venv/: each gives the same result files as the same command run locally."""
import json
import os
import pathlib
import shutil
import socket
import subprocess
import tempfile

import pytest

DUET = os.environ["DUET_BIN"]
ROOT = pathlib.Path(__file__).resolve().parents[3]
RAY = ROOT / ".venv" / "bin" / "ray"
TRACE = str(ROOT / "traces" / "bundled" / "default.json")
ENV = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_address():
    # Ray's sockets live under its temp dir: keep the path short (sun_path is 108 bytes).
    temp = tempfile.mkdtemp(prefix="dr", dir="/tmp")
    port = free_port()
    subprocess.run([str(RAY), "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1",
                    "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats",
                    f"--temp-dir={temp}"], check=True, env=ENV, timeout=180,
                   stdout=subprocess.DEVNULL)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([str(RAY), "stop", "--force"], env=ENV, timeout=120,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(temp, ignore_errors=True)


def duet(*args):
    run = subprocess.run([DUET, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def cluster(tmp, name, instances):
    c = json.loads((ROOT / "sim" / "clusters" / "h100-16colo-llama8b.json").read_text())
    c["nodes"][0]["count"] = 1
    c["instances"] = instances
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(c))
    return str(path)


def same_files(a, b, ignore=()):
    """The files two results directories share, byte for byte; summary.json apart from the
    simulator's wall time. Logs and the names in `ignore` aside."""
    files = sorted(p.relative_to(a) for p in a.rglob("*")
                   if p.is_file() and p.name not in ("log.txt", "ray.log", *ignore))
    assert files, f"{a} holds no results"
    for rel in files:
        x, y = a / rel, b / rel
        assert y.exists(), f"{rel} is missing from {b}"
        if rel.name == "summary.json":
            sx, sy = json.loads(x.read_text()), json.loads(y.read_text())
            sx["sim"].pop("wall_s")
            sy["sim"].pop("wall_s")
            assert sx == sy, rel
        else:
            assert x.read_bytes() == y.read_bytes(), rel
    return len(files)


def test_a_sweep_on_ray_writes_the_files_a_local_sweep_writes(ray_address, tmp_path):
    scenario = {
        "name": "ray-test",
        "trace": TRACE,
        "router": "kv-aware",
        "slo": "ttft=1000,tpot=50",
        "rate_scales": [2, 6],
        "setups": [
            {"name": "colocated x2", "cluster": cluster(tmp_path, "colo", [
                {"role": "colocated", "count": 2, "tp": 1}])},
            {"name": "PD 1+1", "cluster": cluster(tmp_path, "pd", [
                {"role": "prefill", "count": 1, "tp": 1}, {"role": "decode", "count": 1, "tp": 1}]),
             "router": "least-loaded"},
        ],
    }
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(scenario))
    duet("sweep", "--scenario", str(path), "--out", str(tmp_path / "local"), "--progress", "never")
    out = duet("sweep", "--scenario", str(path), "--out", str(tmp_path / "ray"), "--ray",
               ray_address, "--progress", "never")
    assert "4 runs (0 resumed)" in out
    assert (tmp_path / "ray" / "results.csv").read_bytes() == \
        (tmp_path / "local" / "results.csv").read_bytes()
    # 4 runs: summary.json, requests.csv, links.csv each; results.csv and inputs.json.
    assert same_files(tmp_path / "local", tmp_path / "ray") == 14
    rows = (tmp_path / "ray" / "results.csv").read_text().splitlines()
    assert len(rows) == 5 and rows[1].startswith('"colocated x2",2,')


def test_a_plan_on_ray_finds_what_a_local_plan_finds(ray_address, tmp_path):
    args = ["plan", "--trace", TRACE, "--rate-scale", "6", "--slo", "ttft=1000,tpot=50",
            "--max-gpus", "4", "--tp", "1,2", "--token-budgets", "8192", "--dram-gib", "0",
            "--ssd-tib", "0", "--routers", "kv-aware", "--rates", "1,2", "--jobs", "1",
            "--progress", "never"]
    duet(*args, "--out", str(tmp_path / "local"))
    duet(*args, "--out", str(tmp_path / "ray"), "--ray", ray_address)
    local = json.loads((tmp_path / "local" / "plan.json").read_text())
    ray = json.loads((tmp_path / "ray" / "plan.json").read_text())
    assert ray["frontier"] == local["frontier"] and ray["winner"]["key"] == local["winner"]["key"]
    assert ray["simulated"] == local["simulated"] > 0
    # One job at a time: the same simulations in the same order, so the same files (plan.json
    # apart: it holds the search's wall time and the results directory's name).
    same_files(tmp_path / "local", tmp_path / "ray", ignore=("plan.json",))


def test_an_unreachable_ray_head_is_a_clear_error(tmp_path):
    run = subprocess.run([DUET, "plan", "--trace", TRACE, "--slo", "ttft=1000", "--max-gpus", "1",
                          "--ray", f"127.0.0.1:{free_port()}", "--out", str(tmp_path / "p"),
                          "--progress", "never"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600, env=ENV)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "Ray" in run.stderr and "could not connect" in run.stderr, run.stderr

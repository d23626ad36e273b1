"""TTFT of a repeated long prompt served from each KV tier, beside recomputing it (issue 42).

For each setup (no tiers: recompute; dram; ssd; remote), one `duet serve` process on the bench
model (engine threads, the CPU backend) with a KV cache of just over one prompt: prompt A (token
ids, PROMPT tokens), then prompt B of the same length, which evicts A's blocks from the KV cache,
then A again. The TTFT of that last A (its prefix loaded from the tier, or recomputed without
one) is the measurement; the first A's TTFT (computed cold) is shown beside it. Streaming
requests of one output token; TTFT is the client's time to the first token. ROUNDS rounds, each
with fresh prompts; medians.

Usage (from the repository root, after scripts/setup.sh and scripts/venv.sh):
  .venv/bin/python bench/tiers/tier_ttft.py [PROMPT_TOKENS] [ROUNDS]
"""

import json
import os
import random
import re
import selectors
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import openai

DUET = os.environ.get("DUET_BIN", "build/bin/duet")
PROMPT = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
BLOCK = 16


def start(args, log):
    proc = subprocess.Popen([DUET, "serve", "--port", "0", *args], stdout=subprocess.PIPE,
                            stderr=log, text=True)
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if sel.select(timeout=0.5):
            line = proc.stdout.readline()
            m = re.search(r" at (http://[0-9.]+:\d+) ", line)
            if m:
                return proc, m.group(1)
        if proc.poll() is not None:
            break
    proc.kill()
    raise SystemExit("duet serve did not start; see " + log.name)


def ttft(client, model, ids):
    t = time.perf_counter()
    stream = client.completions.create(model=model, prompt=ids, max_tokens=1, temperature=0,
                                       stream=True)
    first = None
    for _ in stream:
        if first is None:
            first = time.perf_counter() - t
    return first


def main():
    work = tempfile.mkdtemp(prefix="duet-tier-ttft-")
    model = os.path.join(work, "model")
    subprocess.run([DUET, "make-test-model", "--preset", "bench", "--out", model], check=True,
                   capture_output=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        redis_port = s.getsockname()[1]
    redis = subprocess.Popen(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1",
                              "--save", "", "--appendonly", "no"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    gib = 1.0  # room for every block of the run in each tier
    tiers = {
        "none (recompute)": None,
        "dram": {"dram": {"capacity_gib": gib}},
        "ssd": {"ssd": {"capacity_gib": gib, "read_GBps": 1, "write_GBps": 1,
                        "directory": os.path.join(work, "ssd")}},
        "remote (redis)": {"remote": {"capacity_gib": gib, "bandwidth_GBps": 1,
                                      "endpoint": f"127.0.0.1:{redis_port}"}},
    }
    kv_blocks = PROMPT // BLOCK + 8  # one prompt and a little: B evicts A
    rng = random.Random(42)
    results = {}
    try:
        for name, spec in tiers.items():
            with open("tests/data/2colo-tiny-dram.json") as f:
                doc = json.load(f)
            doc["model"] = model
            doc["instances"] = [{"role": "colocated", "count": 1, "tp": 1, "node": 0}]
            doc.pop("tiers")
            doc["engine"]["overlap_tier_loads"] = False  # as the live server runs tiers
            if spec:
                doc["tiers"] = spec
            path = os.path.join(work, "cluster.json")
            with open(path, "w") as f:
                json.dump(doc, f)
            shutil.rmtree(os.path.join(work, "ssd"), ignore_errors=True)
            subprocess.run(["redis-cli", "-p", str(redis_port), "flushall"],
                           capture_output=True)
            log = open(os.path.join(work, "serve.log"), "w")
            proc, url = start(["--model", model, "--cluster", path, "--workers", "thread",
                               "--threads", "2", "--kv-blocks", str(kv_blocks)], log)
            client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=600)
            cold, warm = [], []
            try:
                for _ in range(ROUNDS):
                    a = [rng.randrange(3, 32000) for _ in range(PROMPT)]
                    b = [rng.randrange(3, 32000) for _ in range(PROMPT)]
                    cold.append(ttft(client, model, a))
                    ttft(client, model, b)
                    warm.append(ttft(client, model, a))
            finally:
                proc.terminate()
                proc.wait(timeout=120)
                log.close()
            results[name] = (statistics.median(cold), statistics.median(warm))
            print(f"{name}: cold {results[name][0] * 1e3:.0f} ms, repeated {results[name][1] * 1e3:.0f} ms",
                  file=sys.stderr)
    finally:
        redis.kill()
        shutil.rmtree(work, ignore_errors=True)
    base = results["none (recompute)"][1]
    print(f"| served from | TTFT of the repeated {PROMPT}-token prompt, ms | of recomputing it | "
          "TTFT of its first (cold) request, ms |")
    print("|---|---|---|---|")
    for name, (cold, warm) in results.items():
        print(f"| {name} | {warm * 1e3:.0f} | {warm / base:.0%} | {cold * 1e3:.0f} |")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The simulator's network model against real links (issue 45, docs/validation.md): 1P1D with
the prefill and the decode worker each on a host of its own (a network namespace on a bridged
LAN, tests/serve/python/hosts.py) whose eth0 sends at most RATE (tc tbf, both hosts), the
frontend and the client on the LAN's fourth address (this process's namespace), KV over UCX tcp
between the two hosts; the same trace simulated on a cluster of two nodes whose NICs have that
rate. For each rate, `duet validate` compares KV transfer time, TTFT, TPOT and E2E.

The ~125M bench model, calibrated once on one thread (its profile prices the steps in both
worlds; no link is fitted: the cluster file gives the NIC the shaped rate and 50 us). The trace
(bench/links_trace.json): 32 requests of 64..1024 prompt tokens at 0.25 a second, light enough
that the KV cache never binds (the workers size their own: duet validate's --kv-blocks reaches
only workers it starts). Workers are started by this script, on their hosts, again after each
live run (duet validate starts a fresh frontend for each; --spawn-workers false), each with the
run's step log.

Needs root (network namespaces, tc). Usage: sudo bench/validate_links.py [WORK] [RATES_GBIT]
[REPEATS] (default: a fresh temp dir, 0.1,0.5,2, 2). Prints each rate's table and its KV
transfers, request by request where two overlapped; files stay in WORK
(WORK/validation-RATE). With ANALYSE=1, only the transfers of the runs in WORK."""
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "serve", "python"))
import hosts  # noqa: E402  (the tests' hosts, one place)

DUET = os.path.join(ROOT, "build", "bin", "duet")
WORKER_PORT = 9000
SECRET = "the worker secret of bench/validate_links.py"


def run(*args, **kwargs):
    print("+", " ".join(args), flush=True)
    subprocess.run(args, check=True, **kwargs)


def setup(work):
    """The model, host.json and the profile (bench/lib.sh's, one place), in WORK."""
    script = (f'cd "{ROOT}" && source bench/lib.sh && bench_setup "{work}" && '
              'bench_cluster 1p1d "{}" 50')
    run("bash", "-c", script)
    if not os.path.exists(os.path.join(work, "profile.json")):
        run(DUET, "calibrate", "--model", "bench", "--out", "profile.json", "--progress", "never",
            "--threads", "1", cwd=work)
    with open(os.path.join(work, "secret"), "w") as f:
        f.write(SECRET)


def cluster_file(work, rate_gbit):
    """Two nodes of one device each, prefill on node 0 and decode on node 1: the KV crosses both
    NICs at the shaped rate."""
    doc = {"name": f"cpu-bench-1p1d-{rate_gbit}gbit",
           "model": "./bench",
           "nodes": [{"count": 2, "gpus": 1, "gpu": "host.json",
                      "nic": {"bandwidth_GBps": rate_gbit / 8, "latency_us": 50}}],
           "network": {"switch": {"bandwidth_GBps": 10, "latency_us": 1},
                       "frontend": {"bandwidth_GBps": 10, "latency_us": 20}},
           "instances": [{"role": "prefill", "node": 0}, {"role": "decode", "node": 1}],
           "engine": {"max_num_seqs": 32, "max_num_batched_tokens": 2048, "reserved_gib": 0.25},
           "cost_model": {"kind": "fitted", "profile": "profile.json"}}
    path = os.path.join(work, f"cluster-{rate_gbit}gbit.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    return path


def frontend_listens():
    """Whether a frontend listens for workers (its worker port in LISTEN, this namespace)."""
    return any(a.endswith(f":{WORKER_PORT}") for a in hosts.listening())


def run_suffix(k):
    """duet validate's name for live run k (1, 2, ...): cli/validate_report.cpp RunSuffix."""
    return "" if k == 1 else f"-{k}"


class Workers:
    """A prefill and a decode worker on their hosts, each started again when it exits, once a
    frontend listens (not while duet validate times the machine between runs: a worker loads
    and warms its model up first); run k's (k counts the exits with status 0: a frontend that
    shut it down) logs its steps where duet validate reads run k's."""

    def __init__(self, lan, work, out):
        self.stop = threading.Event()
        self.procs = {}
        self.threads = [threading.Thread(target=self.keep, args=(lan, work, out, role))
                        for role in ("prefill", "decode")]
        for t in self.threads:
            t.start()

    def keep(self, lan, work, out, role):
        k = 1
        while not self.stop.is_set():
            steps = os.path.join(out, "rate-1", f"steps{run_suffix(k)}.jsonl")
            if not os.path.isdir(os.path.dirname(steps)) or not frontend_listens():
                self.stop.wait(0.1)
                continue
            p = subprocess.Popen([*lan.run(role), DUET, "worker", "--frontend",
                                  f"{lan.client}:{WORKER_PORT}", "--role", role, "--model",
                                  "bench", "--threads", "1", "--ucx-tls", "tcp",
                                  "--worker-secret-file", "secret", "--connect-timeout", "20",
                                  "--step-log", steps],
                                 cwd=work, stdout=subprocess.DEVNULL,
                                 stderr=open(os.path.join(work, f"worker-{role}.log"), "a"))
            self.procs[role] = p
            while p.poll() is None and not self.stop.is_set():
                self.stop.wait(0.2)
            if p.poll() is None:
                p.kill()
                p.wait()
            elif p.returncode == 0:
                k += 1
            else:
                self.stop.wait(0.5)

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join()


def transfers(out, rate_gbit):
    """Each request's KV transfer, live (run 1) and simulated, beside the bytes over the rate
    (the bench model's KV is 12 KiB a token), split by whether another live transfer overlapped
    it: a line per group with the median of live/ideal and sim/ideal, and the overlapped ones
    request by request."""
    def read(path):
        with open(path) as f:
            return {r["request_id"]: r for r in csv.DictReader(f)}
    live = read(os.path.join(out, "rate-1", "live", "requests.csv"))
    sim = read(os.path.join(out, "rate-1", "sim", "requests.csv"))
    spans = {}
    for k, r in live.items():  # [start, end] of the live transfer, ending at the first token
        end = float(r["arrival_s"]) + float(r["ttft_ms"]) / 1e3
        spans[k] = (end - float(r["kv_transfer_ms"]) / 1e3, end)
    groups = {"alone": [], "overlapped": []}
    for k, r in live.items():
        ideal = int(r["input_tokens"]) * 12288 / (rate_gbit * 1e9 / 8) * 1e3
        a, b = spans[k]
        overlapped = any(j != k and spans[j][0] < b and a < spans[j][1] for j in spans)
        groups["overlapped" if overlapped else "alone"].append(
            (k, int(r["input_tokens"]), ideal, float(r["kv_transfer_ms"]),
             float(sim[k]["kv_transfer_ms"])))
    print(f"KV transfers at {rate_gbit:g} Gbit/s (ms; ideal: the KV's bytes over the rate):")
    for name, rows in groups.items():
        if not rows:
            continue
        live_x = statistics.median(r[3] / r[2] for r in rows)
        sim_x = statistics.median(r[4] / r[2] for r in rows)
        over = statistics.median(r[3] - r[2] for r in rows)
        print(f"  {name}: {len(rows)} requests, live/ideal median {live_x:.3f} (live - ideal "
              f"{over:.1f} ms), sim/ideal {sim_x:.3f}")
    for k, tokens, ideal, lv, sm in sorted(groups["overlapped"], key=lambda r: spans[r[0]][0]):
        print(f"    request {k}: {tokens} tokens, ideal {ideal:.1f}, live {lv:.1f}, sim {sm:.1f}")


def main():
    if os.geteuid() != 0:
        sys.exit("bench/validate_links.py needs root (network namespaces and tc)")
    why = hosts.available()
    if why:
        sys.exit(f"no hosts here: {why}")
    work = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else tempfile.mkdtemp()
    rates = [float(r) for r in (sys.argv[2] if len(sys.argv) > 2 else "0.1,0.5,2").split(",")]
    repeats = sys.argv[3] if len(sys.argv) > 3 else "2"
    if os.environ.get("ANALYSE") == "1":
        for rate in rates:
            transfers(os.path.join(work, f"validation-{rate:g}gbit"), rate)
        return
    setup(work)
    trace = os.path.join(ROOT, "bench", "links_trace.json")
    for rate in rates:
        out = os.path.join(work, f"validation-{rate:g}gbit")
        cluster = cluster_file(work, rate)
        with hosts.Hosts(["prefill", "decode"]) as lan:
            # A bucket of two 64 KiB segments (veth's largest): a transfer runs at the rate from
            # its start; a queue of 2 s (no packet dropped while a KV transfer waits).
            for role in ("prefill", "decode"):
                lan.shape(role, f"{rate:g}gbit", burst="128kb", latency="2s")
            workers = Workers(lan, work, out)
            try:
                serve_args = (f"--threads 1 --ucx-tls tcp --spawn-workers false --worker-host "
                              f"{lan.client} --worker-port {WORKER_PORT} "
                              "--worker-secret-file secret")
                run(DUET, "validate", "--cluster", cluster, "--model", "bench", "--trace", trace,
                    "--rate-scales", "1", "--repeats", repeats, "--serve-args", serve_args,
                    "--out", out, cwd=work)
            finally:
                workers.close()
        transfers(out, rate)
    print(f"files: {work}")


if __name__ == "__main__":
    main()

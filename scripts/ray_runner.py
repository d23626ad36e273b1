#!/usr/bin/env python3
"""Runs `duet simulate` as Ray tasks for `duet plan --ray` and `duet sweep --ray` (cli/sim_runner.cpp
starts it from the project's .venv/ and speaks to it in JSON lines).

Usage: ray_runner.py --address HOST:PORT --duet PATH

Protocol, one JSON object per line:
  out  {"cpus": N}                        connected; the cluster has N CPUs
  out  {"error": "..."}                   could not connect (then it exits 1)
  in   {"op": "start", "id": I, "args": [...]}
                                          run `duet simulate ARGS` as a task; ARGS hold
                                          --cluster FILE and --out DIR
  in   {"op": "cancel", "id": I}          stop task I; it is not reported
  out  {"id": I, "exit": STATUS}          task I ended; its files are in its --out DIR
End of input: it cancels what is left, disconnects and exits.

A task runs on whichever node Ray picks, in a directory of its own: the cluster file travels
with it (its text, used where the file is not at the same path on that node), and it sends back the files the run wrote (summary.json, requests.csv,
links.csv) and its output, which this process writes into --out DIR. The duet binary and the
trace must be at the same paths on every node."""
import argparse
import json
import os
import queue
import socket
import subprocess
import sys
import tempfile
import threading

# No usage statistics leave the machine; no dashboard.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray  # noqa: E402

OUTPUTS = ("summary.json", "requests.csv", "links.csv")


@ray.remote(num_cpus=1, max_retries=0)
def simulate(duet, args, cluster_text):
    with tempfile.TemporaryDirectory(prefix="duet-ray-") as work:
        args = list(args)
        # The cluster file where it is on this node (its relative references resolve there),
        # else the text that travelled with the task.
        cluster = args[args.index("--cluster") + 1]
        if not os.path.exists(cluster):
            cluster = os.path.join(work, "cluster.json")
            with open(cluster, "w") as f:
                f.write(cluster_text)
            args[args.index("--cluster") + 1] = cluster
        out = os.path.join(work, "out")
        args[args.index("--out") + 1] = out
        run = subprocess.run([duet, "simulate", *args], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
        files = {}
        for name in OUTPUTS:
            path = os.path.join(out, name)
            if os.path.exists(path):
                with open(path, "rb") as f:
                    files[name] = f.read()
        # The log names the task's own directory; the local one says where the files are.
        log = run.stdout.replace(out.encode(), b"<out>")
        return run.returncode if run.returncode >= 0 else 128 - run.returncode, log, files


def reply(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--address", required=True)
    ap.add_argument("--duet", required=True)
    a = ap.parse_args()
    # Ray keeps retrying an address where nothing listens for minutes: ask first.
    host, _, port = a.address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except (OSError, ValueError) as e:
        reply({"error": f"nothing answers at {a.address}: {e}"})
        return 1
    try:
        ray.init(address=a.address, logging_level="WARNING", log_to_driver=False)
    except Exception as e:  # noqa: BLE001 - any failure to connect is reported the same way
        reply({"error": f"{type(e).__name__}: {e}"})
        return 1
    reply({"cpus": int(ray.cluster_resources().get("CPU", 1))})

    commands = queue.Queue()

    def read():
        for line in sys.stdin:
            commands.put(json.loads(line))
        commands.put(None)

    threading.Thread(target=read, daemon=True).start()
    pending = {}  # ObjectRef -> (id, out dir)
    by_id = {}
    open_input = True
    while open_input or pending:
        while True:
            try:
                c = commands.get(timeout=0 if pending else 0.5)
            except queue.Empty:
                break
            if c is None:
                open_input = False
                for ref in list(pending):
                    ray.cancel(ref, force=True)
                pending.clear()
                break
            if c["op"] == "start":
                args = c["args"]
                with open(args[args.index("--cluster") + 1]) as f:
                    ref = simulate.remote(a.duet, args, f.read())
                pending[ref] = (c["id"], args[args.index("--out") + 1])
                by_id[c["id"]] = ref
            elif c["op"] == "cancel":
                ref = by_id.pop(c["id"], None)
                if ref is not None and ref in pending:
                    del pending[ref]
                    ray.cancel(ref, force=True)
        if not pending:
            continue
        done, _ = ray.wait(list(pending), num_returns=1, timeout=0.05)
        for ref in done:
            task_id, out = pending.pop(ref)
            by_id.pop(task_id, None)
            try:
                status, log, files = ray.get(ref)
            except Exception as e:  # noqa: BLE001 - a task that failed in Ray itself
                status, log, files = 125, f"ray task failed: {e}\n".encode(), {}
            os.makedirs(out, exist_ok=True)
            for name, data in files.items():
                with open(os.path.join(out, name + ".tmp"), "wb") as f:
                    f.write(data)
            for name in files:  # summary.json last: its presence says the run is complete
                if name != "summary.json":
                    os.replace(os.path.join(out, name + ".tmp"), os.path.join(out, name))
            if "summary.json" in files:
                os.replace(os.path.join(out, "summary.json.tmp"), os.path.join(out, "summary.json"))
            with open(os.path.join(out, "log.txt"), "wb") as f:
                f.write(log)
            reply({"id": task_id, "exit": status})
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

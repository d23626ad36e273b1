"""Hostile values at the edge (issue 40, findings 1 and 2): every numeric field of both
generation endpoints set to 1e-300, -0.0, 1e300 and denormals (of a double and of a float) gets a
400 or a normal reply, from a server whose instances are engine threads and from a PD server of
worker processes; neither goes down, no worker exits, and the server serves afterwards. The
values are checked in the engine's own types at the edge (top_p 1e-300 is positive as a double
and 0 as the engine's float). And a worker process's restart budget recovers once it has run
healthy for --worker-healthy-after seconds, while a crash loop still spends it."""

import json
import os
import signal
import time

import pytest

from conftest import cluster_file, has_ucx, wait_for

VALUES = [1e-300, -0.0, 1e300, 5e-324, 1e-40]

# The numeric fields each endpoint takes, and where the number goes in each.
COMMON_FIELDS = {
    "max_tokens": lambda x: x,
    "temperature": lambda x: x,
    "top_p": lambda x: x,
    "top_k": lambda x: x,
    "seed": lambda x: x,
    "n": lambda x: x,
    "frequency_penalty": lambda x: x,
    "presence_penalty": lambda x: x,
    "stop_token_ids": lambda x: [x],
    "logit_bias": lambda x: {"1": x},
}
COMPLETION_FIELDS = dict(COMMON_FIELDS, best_of=lambda x: x, logprobs=lambda x: x,
                         prompt=lambda x: [x])
CHAT_FIELDS = dict(COMMON_FIELDS, max_completion_tokens=lambda x: x, top_logprobs=lambda x: x)


def hostile_requests(model):
    """(path, body) for every numeric field of both endpoints and every value."""
    for path, fields, base in [
        ("/v1/completions", COMPLETION_FIELDS, {"prompt": "Hello there", "max_tokens": 4}),
        ("/v1/chat/completions", CHAT_FIELDS,
         {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}),
    ]:
        for field, shape in fields.items():
            for value in VALUES:
                body = dict(base, model=model)
                body[field] = shape(value)
                yield path, body


def check_served_or_refused(server, path, body):
    status, _, reply = server.request("POST", path, body)
    what = f"{path} {json.dumps(body)}"
    assert status in (200, 400), f"{what}: {status} {reply!r}"
    doc = json.loads(reply)
    if status == 400:
        assert doc["error"]["message"], what
        return "refused"
    choice = doc["choices"][0]
    assert choice["finish_reason"] in ("stop", "length"), f"{what}: {doc}"
    assert doc["usage"]["completion_tokens"] >= 1, f"{what}: {doc}"
    return "served"


def hammer(server):
    outcomes = {}
    for path, body in hostile_requests(server.model):
        outcomes[(path, json.dumps(body))] = check_served_or_refused(server, path, body)
        assert server.proc.poll() is None, f"duet serve exited: {server.stderr()}"
    return outcomes


def still_serves(server):
    status, _, body = server.request("GET", "/health")
    assert status == 200, body
    client = server.client()
    reply = client.completions.create(model=server.model, prompt="Hello there", max_tokens=4,
                                      temperature=0)
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_engine_threads_refuse_or_serve_every_hostile_number(tiny_model, start_server):
    s = start_server(tiny_model, "--threads", "1")
    outcomes = hammer(s)
    # The values that reach the engine's float as something else are refused, naming the field.
    status, _, reply = s.request("POST", "/v1/completions",
                                 {"model": s.model, "prompt": "Hi", "top_p": 1e-300})
    assert status == 400, reply
    error = json.loads(reply)["error"]
    assert error["param"] == "top_p" and "32-bit float" in error["message"], error
    # Subnormal temperatures are valid (greedy in effect), and served.
    assert "served" in outcomes.values()
    still_serves(s)
    s.assert_idle()
    assert s.stop() == 0, s.stderr()


def test_pd_workers_never_see_a_value_they_cannot_hold(tiny_model, start_server, tmp_path):
    if not has_ucx():
        pytest.skip("this build has no UCX (libucx-dev): PD worker processes are not tested")
    s = start_server(tiny_model, "--threads", "1", "--ucx-tls", "tcp",
                     "--cluster", cluster_file(tmp_path, 1, 1), "--worker-restarts", "5")
    hammer(s)
    # Finding 2: top_p 1e-300 six times over used to spend every restart of the prefill worker.
    for _ in range(7):
        status, _, reply = s.request("POST", "/v1/chat/completions", {
            "model": s.model, "messages": [{"role": "user", "content": "Hi"}], "top_p": 1e-300})
        assert status == 400, reply
    still_serves(s)
    log = s.stderr()
    for sign in ["exited (status", ") lost: ", "refused request", "rejected a message"]:
        assert sign not in log, log
    s.assert_idle()
    assert s.stop() == 0, s.stderr()


def read_proc(path):
    """A /proc file's bytes; b"" when its thread or process has just exited."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except (FileNotFoundError, ProcessLookupError):
        return b""


def worker_pids(server):
    """The `duet worker` children of a server, by role (each child is listed under the thread
    that started it: the main one, or the restarting supervisor's)."""
    pids = {}
    for task in os.listdir(f"/proc/{server.proc.pid}/task"):
        for pid in read_proc(f"/proc/{server.proc.pid}/task/{task}/children").split():
            args = read_proc(f"/proc/{pid.decode()}/cmdline").split(b"\0")
            if b"worker" in args and b"--role" in args:
                pids[args[args.index(b"--role") + 1].decode()] = int(pid)
    return pids


def restarted(server, role, old_pid):
    """Waits until the worker of `role` is a new process and serves; returns its pid."""
    def new_pid():
        pid = worker_pids(server).get(role)
        return pid if pid != old_pid else None

    pid = wait_for(new_pid, 60, f"a new {role} worker")
    wait_for(lambda: f"pid {pid}) joined" in server.stderr(), 60, f"{role} worker {pid} joined")
    return pid


def test_a_worker_restart_budget_recovers_after_healthy_running(tiny_model, start_server,
                                                                tmp_path):
    if not has_ucx():
        pytest.skip("this build has no UCX (libucx-dev): PD worker processes are not tested")
    healthy_s = 3
    s = start_server(tiny_model, "--threads", "1", "--ucx-tls", "tcp",
                     "--cluster", cluster_file(tmp_path, 1, 1), "--worker-restarts", "1",
                     "--worker-healthy-after", str(healthy_s))
    pid = worker_pids(s)["decode"]
    # A crash after healthy running: restarted, its one restart spent.
    time.sleep(healthy_s + 0.5)
    os.kill(pid, signal.SIGKILL)
    pid = restarted(s, "decode", pid)
    # It runs healthy again: the budget is back, and the next crash is restarted too.
    time.sleep(healthy_s + 0.5)
    os.kill(pid, signal.SIGKILL)
    pid = restarted(s, "decode", pid)
    assert s.stderr().count("(restart 1 of 1)") == 2, s.stderr()
    still_serves(s)
    # A crash loop still spends it: killed again at once, it stays down.
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: "not starting it again after 1 restarts" in s.stderr(), 60,
             "the restart budget spent")
    assert s.stop() == 0, s.stderr()

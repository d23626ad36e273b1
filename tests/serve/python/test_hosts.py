"""PD across hosts: the frontend and each worker on a host of its own (network namespaces on one
bridged LAN, hosts.py; each worker also in a time namespace, its monotonic clock tens of
thousands of seconds off the frontend's), the client on another. The workers register over the
LAN at the address the frontend was told to bind, holding its secret; the KV moves between the
worker hosts over UCX tcp on their eth0 (the device their route to the frontend leaves by, or
the one --advertise names); greedy text equals the colocated server's. A process on another host
without the secret is refused and logged. In 2P2D, a decode worker SIGKILLed mid-stream loses no
token: its streams go on through the other decode host."""

import subprocess
import threading

import pytest

import hosts
from conftest import DUET, cluster_file, has_ucx, health, stop_processes, wait_for
from test_workers import SLOW_MAX_TOKENS, check_after_fault, kill_mid_stream, reference

PROMPTS = [f"Request {i}: tell me a story about the sea" for i in range(6)]
MAX_TOKENS = 24
SECRET = "the worker secret of the hosts test"
WORKER_PORT = 9000


@pytest.fixture(scope="module", autouse=True)
def needs_hosts():
    if not has_ucx():
        pytest.skip("this build has no UCX (libucx-dev): PD worker processes are not tested")
    why = hosts.available()
    if why:
        pytest.skip(f"duet-test-skip: no network namespaces here ({why})")


def greedy(server, prompts):
    """Greedy completions of `prompts`, each on a thread of its own: their texts."""
    client = server.client()
    texts = [None] * len(prompts)

    def run(i):
        texts[i] = client.completions.create(model=server.model, prompt=prompts[i],
                                             max_tokens=MAX_TOKENS, temperature=0).choices[0].text

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return texts


def frontend(lan, start_server, model, cluster, secret_file, *args):
    """`duet serve` on host "frontend" of `lan`, taking workers at its LAN address."""
    fe = lan.address("frontend")
    return start_server(model, "--host", fe, "--threads", "1", "--ucx-tls", "tcp", "--cluster",
                        cluster, "--spawn-workers", "false", "--worker-host", fe, "--worker-port",
                        str(WORKER_PORT), "--worker-secret-file", secret_file, *args,
                        prefix=lan.run("frontend"))


def worker(lan, host, role, model, secret_file, *args, shift=0):
    """`duet worker` on `host` of `lan`, its monotonic clock `shift` seconds ahead."""
    return subprocess.Popen([*lan.run(host), "unshare", "--time", "--monotonic", str(shift), DUET,
                             "worker", "--frontend", f"{lan.address('frontend')}:{WORKER_PORT}",
                             "--role", role, "--model", model, "--threads", "1",
                             "--ucx-tls", "tcp", "--worker-secret-file", secret_file, *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def test_pd_with_the_frontend_and_each_worker_on_a_host_of_its_own(tiny_model, start_server,
                                                                    tmp_path):
    colocated = start_server(tiny_model, "--threads", "1", "--workers", "thread")
    expected = greedy(colocated, PROMPTS)
    assert colocated.stop() == 0, colocated.stderr()

    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    wrong = tmp_path / "wrong"
    wrong.write_text("not the secret of this frontend")
    with hosts.Hosts(["frontend", "prefill", "decode", "stranger"]) as lan:
        fe = lan.address("frontend")
        workers = [worker(lan, "prefill", "prefill", tiny_model, str(secret), shift=30_000),
                   worker(lan, "decode", "decode", tiny_model, str(secret),
                          "--advertise", lan.address("decode"), shift=70_000)]
        try:
            s = frontend(lan, start_server, tiny_model, cluster_file(tmp_path, 1, 1), str(secret))
            # The frontend listens where it was told, nowhere else (not on its loopback).
            listened = hosts.listening(lan.run("frontend"))
            assert sorted(listened) == sorted([f"{fe}:{s.port}", f"{fe}:{WORKER_PORT}"]), listened
            listed = wait_for(lambda: (lambda h: h if all("clock_error_s" in w for w in h)
                                       else None)(health(s)), 15, lambda: health(s))
            assert all(w["up"] and w["clock_error_s"] < 0.2 for w in listed), listed
            for role in ("prefill", "decode"):
                assert f"({role}, pid " in s.stderr()
                assert f") joined from {lan.address(role)}" in s.stderr(), s.stderr()

            assert greedy(s, PROMPTS) == expected, s.stderr()
            m = s.wait_metric("duet:kv_transfer_seconds_count", lambda v: v == len(PROMPTS))
            assert m["duet:kv_load_failures_total"] == 0
            assert 0 <= m["duet:time_to_first_token_seconds_sum"] < 60, m

            # A process on another host that does not hold the secret is refused, and logged.
            stranger = worker(lan, "stranger", "decode", tiny_model, str(wrong))
            _, err = stranger.communicate(timeout=60)
            assert stranger.returncode != 0
            assert "did not prove it holds the worker secret" in err, err
            wait_for(lambda: "its proof of the worker secret is wrong" in s.stderr()
                     or "no proof that it holds the worker secret" in s.stderr(), 10, s.stderr)
            assert [w["joins"] for w in health(s)] == [1, 1]

            s.assert_idle()
            assert s.stop() == 0, s.stderr()
        finally:
            logs = stop_processes(workers)
        for w, host in zip(workers, ["prefill", "decode"]):
            assert f"KV reachable at {lan.address(host)} (device eth0)" in logs[w.pid], logs[w.pid]


def test_2p2d_across_hosts_loses_no_token_when_a_decode_host_dies_mid_stream(slow_model,
                                                                            start_server,
                                                                            tmp_path):
    expected = reference(slow_model, SLOW_MAX_TOKENS, start_server)
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    names = ["prefill0", "prefill1", "decode0", "decode1"]
    with hosts.Hosts(["frontend", *names]) as lan:
        workers = [worker(lan, name, name[:-1], slow_model, str(secret), shift=10_000 * (i + 1))
                   for i, name in enumerate(names)]
        try:
            s = frontend(lan, start_server, slow_model, cluster_file(tmp_path, 2, 2), str(secret),
                         "--router", "round-robin", "--worker-restarts", "0")
            listed = health(s)
            assert [w["role"] for w in listed] == ["prefill"] * 2 + ["decode"] * 2, listed
            streams = kill_mid_stream(s, listed[3]["pid"])  # as test_workers does on one host
            m = check_after_fault(s, streams, expected, lost=3)
            assert streams.tokens == [SLOW_MAX_TOKENS] * len(streams.tokens), streams.tokens
            assert m["duet:requests_retried_total"] >= 1, s.stderr()
            assert m["duet:kv_transfer_seconds_count"] >= len(streams.tokens)
            assert s.stop() == 0, s.stderr()
        finally:
            stop_processes(workers)

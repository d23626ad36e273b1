"""Several frontends over one worker pool, each process on a host of its own (hosts.py): etcd,
two `duet serve --discovery` frontends and `duet worker --discovery` workers (each worker also in a
time namespace, its monotonic clock tens of thousands of seconds off), the client on the LAN. Both frontends give each worker the same instance id (the slot one of them claimed for it in
etcd) and route to every worker; greedy text through either equals the colocated server's. A
frontend SIGKILLed mid-stream costs only its own streams: the other frontend's all finish, whole,
and the workers let go of everything the dead one sent; a stranger at a worker's port without the
secret is refused and logged. In 2P2D, a decode worker SIGKILLed
mid-stream loses no token; etcd stopped for 10 s while both frontends serve loses no request, and
a worker started during the outage joins both once etcd is back."""

import os
import re
import signal
import socket
import subprocess
import threading
import time

import pytest

import hosts
from conftest import (DUET, Etcd, cluster_file, has_ucx, health, require_etcd, stop_processes,
                      wait_for)
from test_workers import (PROMPTS, SLOW_MAX_TOKENS, Streams, check_after_fault, kill_mid_stream,
                          reference, run_until)

SECRET = "the worker secret of the frontends test"
WORKER_PORT = 9000
TTL_S = 2


@pytest.fixture(scope="module", autouse=True)
def needs_hosts():
    if not has_ucx():
        pytest.skip("this build has no UCX (libucx-dev): PD worker processes are not tested")
    require_etcd()
    why = hosts.available()
    if why:
        pytest.skip(f"duet-test-skip: no network namespaces here ({why})")


def frontend(lan, name, etcd, start_server, model, cluster, secret_file, *args):
    """`duet serve --discovery` on host `name` of `lan`."""
    return start_server(model, "--host", lan.address(name), "--threads", "1", "--ucx-tls", "tcp",
                        "--cluster", cluster, "--spawn-workers", "false", "--discovery", etcd.url,
                        "--worker-secret-file", secret_file, "--router", "round-robin", *args,
                        prefix=lan.run(name))


def worker(lan, host, role, etcd, model, secret_file, shift):
    """`duet worker --discovery` on `host`, listening on its LAN address, its monotonic clock
    `shift` seconds ahead of the frontends'."""
    return subprocess.Popen([*lan.run(host), "unshare", "--time", "--monotonic", str(shift), DUET,
                             "worker", "--discovery", etcd.url, "--listen",
                             f"{lan.address(host)}:{WORKER_PORT}", "--discovery-ttl", str(TTL_S),
                             "--role", role, "--model", model, "--threads", "1", "--ucx-tls",
                             "tcp", "--worker-secret-file", secret_file],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def greedy(server, max_tokens):
    client = server.client()
    choices = [client.completions.create(model=server.model, prompt=p, max_tokens=max_tokens,
                                         temperature=0).choices[0] for p in PROMPTS]
    return [c.text for c in choices], [c.finish_reason for c in choices]


def same_pool(a, b):
    """Both frontends hold every worker, each in the same slot."""
    wa, wb = health(a), health(b)
    return all(x["up"] for x in wa + wb) and [x["pid"] for x in wa] == [x["pid"] for x in wb]


def test_two_frontends_share_1p1d_and_one_killed_mid_stream_costs_only_its_streams(
        slow_model, start_server, tmp_path):
    expected = reference(slow_model, SLOW_MAX_TOKENS, start_server)
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    with hosts.Hosts(["etcd", "front-a", "front-b", "prefill", "decode"]) as lan:
        etcd = Etcd(tmp_path, lan.address("etcd"), lan.run("etcd"))
        workers = [worker(lan, role, role, etcd, slow_model, str(secret), shift)
                   for role, shift in (("prefill", 20_000), ("decode", 50_000))]
        try:
            cluster = cluster_file(tmp_path, 1, 1)
            a = frontend(lan, "front-a", etcd, start_server, slow_model, cluster, str(secret))
            b = frontend(lan, "front-b", etcd, start_server, slow_model, cluster, str(secret))
            wait_for(lambda: same_pool(a, b), 30, lambda: (health(a), health(b)))
            # Each worker's engine runs on the clock of the frontend that reached it first;
            # times reach each frontend on its own clock (b started seconds after a): every
            # request's end-to-end time through either is what its client saw, within the
            # clocks' errors.
            for s in (a, b):
                began = time.monotonic()
                assert greedy(s, SLOW_MAX_TOKENS) == expected, s.stderr()
                seen = time.monotonic() - began
                bound = sum(w["clock_error_s"] for w in health(s))
                m = s.wait_metric("duet:e2e_request_latency_seconds_count",
                                  lambda v: v == len(PROMPTS))
                e2e = m["duet:e2e_request_latency_seconds_sum"]
                assert 0.5 * seen <= e2e <= seen + len(PROMPTS) * bound, (e2e, seen, bound)
                assert m["duet:kv_leases_expired_total"] == 0

            # Streams through both; once each of a's has a token, a is SIGKILLed.
            sa, sb = Streams(a, SLOW_MAX_TOKENS), Streams(b, SLOW_MAX_TOKENS)
            decode = health(b)[1]["pid"]
            os.kill(decode, signal.SIGSTOP)  # holds every stream at its first token
            try:
                run_until(decode, lambda: all(t > 0 for t in sa.tokens + sb.tokens))
            finally:
                os.kill(decode, signal.SIGCONT)
            a.proc.kill()
            a.proc.wait()
            sb.join()
            assert not sb.errors, sb.errors
            assert (sb.texts, sb.reasons) == expected, b.stderr()
            assert sb.tokens == [SLOW_MAX_TOKENS] * len(PROMPTS), sb.tokens
            sa.join()
            assert len(sa.errors) + sum(r is None for r in sa.reasons) >= 1, sa.reasons

            # A stranger at a worker's port, holding no secret, costs only its own connection.
            with socket.create_connection((lan.address("prefill"), WORKER_PORT), timeout=10) as c:
                c.sendall(b"GET / HTTP/1.0\r\n\r\n" * 100)

            # The workers let go of what a sent: b sees them idle, and serves on.
            b.assert_idle()
            assert [w["joins"] for w in health(b)] == [1, 1]
            assert greedy(b, SLOW_MAX_TOKENS) == expected, b.stderr()
            assert b.stop() == 0, b.stderr()
        finally:
            logs = stop_processes(workers)
            etcd.stop()
        assert "refused a frontend: a connection that is no frontend" in logs[workers[0].pid]
        for w in workers:
            assert re.search(r"lost frontend \d+", logs[w.pid]), logs[w.pid]
            assert re.search(r"frontend \d+ left", logs[w.pid]), logs[w.pid]


def test_two_frontends_over_2p2d_lose_nothing_to_a_dead_decode_worker_or_etcd_down(
        slow_model, start_server, tmp_path):
    expected = reference(slow_model, SLOW_MAX_TOKENS, start_server)
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    names = ["prefill0", "prefill1", "decode0", "decode1", "decode2"]
    with hosts.Hosts(["etcd", "front-a", "front-b", *names]) as lan:
        etcd = Etcd(tmp_path, lan.address("etcd"), lan.run("etcd"))
        workers = [worker(lan, name, name[:-1], etcd, slow_model, str(secret), 10_000 * (i + 1))
                   for i, name in enumerate(names[:4])]
        try:
            cluster = cluster_file(tmp_path, 2, 2)
            a = frontend(lan, "front-a", etcd, start_server, slow_model, cluster, str(secret),
                         "--worker-restarts", "0")
            b = frontend(lan, "front-b", etcd, start_server, slow_model, cluster, str(secret),
                         "--worker-restarts", "0")
            wait_for(lambda: same_pool(a, b), 30, lambda: (health(a), health(b)))
            listed = health(a)
            assert [w["role"] for w in listed] == ["prefill"] * 2 + ["decode"] * 2, listed

            # A decode worker SIGKILLed mid-stream (streams through a): no token lost.
            victim = listed[3]["pid"]
            streams = kill_mid_stream(a, victim)
            check_after_fault(a, streams, expected, lost=3)
            assert streams.tokens == [SLOW_MAX_TOKENS] * len(PROMPTS), streams.tokens
            wait_for(lambda: not health(b)[3]["up"], 10, lambda: health(b))

            # etcd down for 10 s while both serve, a decode worker started meanwhile.
            results, stop = [], threading.Event()

            def load(server):
                while not stop.is_set():
                    results.append(greedy(server, SLOW_MAX_TOKENS))

            threads = [threading.Thread(target=load, args=(s,)) for s in (a, b)]
            for t in threads:
                t.start()
            try:
                time.sleep(1)
                etcd.stop()
                down = time.monotonic()
                workers.append(worker(lan, "decode2", "decode", etcd, slow_model, str(secret),
                                      60_000))
                time.sleep(max(0.0, 10 - (time.monotonic() - down)))
                assert [w["up"] for w in health(a)] == [True, True, True, False], health(a)
                etcd.start()
                for s in (a, b):
                    wait_for(lambda: health(s)[3]["up"] and health(s)[3]["joins"] == 2, 30,
                             lambda: (health(s), s.stderr()))
                time.sleep(1)
            finally:
                stop.set()
                for t in threads:
                    t.join(timeout=300)
            assert results and all(r == expected for r in results), (len(results), a.stderr())
            assert health(a)[3]["pid"] == health(b)[3]["pid"] == workers[-1].pid
            for s in (a, b):
                assert "cannot read " + etcd.url in s.stderr()
                assert greedy(s, SLOW_MAX_TOKENS) == expected
                s.assert_idle()
            for s in (a, b):
                assert s.stop() == 0, s.stderr()
        finally:
            stop_processes(workers)
            etcd.stop()

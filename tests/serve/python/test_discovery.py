"""Workers found through etcd (Debian's etcd-server; each test starts its own): `duet worker
--discovery etcd://... --listen ...` registers under a lease and waits; `duet serve --discovery`
connects to each worker etcd lists. Greedy text equals the colocated server's; a worker whose
lease lapses (stopped, so it renews nothing) stops getting requests within the lease's time,
before the frontend's own 5 s heartbeat check would notice; etcd down for 10 s while serving
loses no request, and a worker started during the outage joins once etcd is back."""

import os
import signal
import socket
import subprocess
import threading
import time

import pytest

from conftest import (DUET, Etcd, cluster_file, free_port, has_ucx, health, require_etcd,
                      stop_processes, wait_for)

PROMPTS = [f"Request {i}: tell me a story about the sea" for i in range(4)]
MAX_TOKENS = 24
SECRET = "the worker secret of the discovery test"
TTL_S = 2


@pytest.fixture(scope="module", autouse=True)
def needs_etcd():
    if not has_ucx():
        pytest.skip("this build has no UCX (libucx-dev): PD worker processes are not tested")
    require_etcd()



@pytest.fixture
def etcd(tmp_path):
    e = Etcd(tmp_path)
    yield e
    e.stop()


def worker(etcd, role, model, secret_file, port=0):
    return subprocess.Popen([DUET, "worker", "--discovery", etcd.url, "--listen",
                             f"127.0.0.1:{port}",
                             "--discovery-ttl", str(TTL_S), "--role", role, "--model", model,
                             "--threads", "1", "--ucx-tls", "tcp", "--worker-secret-file",
                             secret_file], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)


def greedy(server):
    client = server.client()
    return [client.completions.create(model=server.model, prompt=p, max_tokens=MAX_TOKENS,
                                      temperature=0).choices[0].text for p in PROMPTS]


def reference(model, start_server):
    s = start_server(model, "--threads", "1", "--workers", "thread")
    texts = greedy(s)
    assert s.stop() == 0, s.stderr()
    return texts


def serve_1p2d(tiny_model, start_server, etcd, tmp_path):
    """A prefill and two decode workers registered in `etcd`, and the server that finds them
    (round-robin over the decode workers): (server, workers, the secret file). Strangers reach
    the prefill worker's port first."""
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    ports = [free_port() for _ in range(3)]
    workers = [worker(etcd, role, tiny_model, str(secret), port)
               for role, port in zip(("prefill", "decode", "decode"), ports)]
    try:
        # Whatever connects to a worker's port first costs only its own connection: here a
        # stranger that says nothing and one that sends garbage, before the frontend starts.
        wait_for(lambda: connects(ports[0]), 60, "the prefill worker never listened")
        with socket.create_connection(("127.0.0.1", ports[0]), timeout=10) as c:
            c.sendall(b"GET / HTTP/1.0\r\n\r\n" * 100)
        silent = socket.create_connection(("127.0.0.1", ports[0]), timeout=10)
        s = start_server(tiny_model, "--threads", "1", "--ucx-tls", "tcp", "--cluster",
                         cluster_file(tmp_path, 1, 2), "--discovery", etcd.url,
                         "--worker-secret-file", str(secret), "--router", "round-robin")
        silent.close()
    except BaseException:
        stop_processes(workers)
        raise
    return s, workers, str(secret)


def connects(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def test_workers_found_in_etcd_serve_and_a_lapsed_lease_stops_requests(tiny_model, start_server,
                                                                      etcd, tmp_path):
    expected = reference(tiny_model, start_server)
    s, workers, secret = serve_1p2d(tiny_model, start_server, etcd, tmp_path)
    try:
        assert f"finding workers in {etcd.url}" in s.stderr()
        assert greedy(s) == expected, s.stderr()
        # A decode worker stopped: it renews no lease, and its record lapses after TTL_S.
        victim = health(s)[2]
        os.kill(victim["pid"], signal.SIGSTOP)
        stopped = time.monotonic()
        wait_for(lambda: not health(s)[2]["up"], 10, lambda: (health(s), s.stderr()))
        # Within the lease (and etcd's half-second expiry check and the frontend's polling),
        # before the heartbeat check's 5 s.
        assert time.monotonic() - stopped < 4.5, s.stderr()
        assert "worker 2 (decode, pid " in s.stderr()
        assert "its registration in " + etcd.url + " is gone (its lease lapsed)" in s.stderr()
        assert "silent for" not in s.stderr()
        assert greedy(s) == expected, s.stderr()  # the other decode worker serves them all
        s.assert_idle()
        assert s.stop() == 0, s.stderr()
    finally:
        stop_processes(workers)


def test_etcd_down_for_10_s_loses_no_request_and_a_worker_started_meanwhile_joins(
        tiny_model, start_server, etcd, tmp_path):
    expected = reference(tiny_model, start_server)
    s, workers, secret = serve_1p2d(tiny_model, start_server, etcd, tmp_path)
    try:
        # Requests all along, each checked.
        results, stop = [], threading.Event()

        def load():
            while not stop.is_set():
                results.append(greedy(s))

        t = threading.Thread(target=load)
        t.start()
        try:
            time.sleep(1)
            etcd.stop()
            down = time.monotonic()
            # While etcd is down: a decode worker dies (its requests move to the other one) and
            # a new one starts, which cannot register yet.
            victim = health(s)[2]["pid"]
            os.kill(victim, signal.SIGKILL)
            workers.append(worker(etcd, "decode", tiny_model, secret))
            time.sleep(max(0.0, 10 - (time.monotonic() - down)))
            assert [w["up"] for w in health(s)] == [True, True, False], health(s)
            etcd.start()
            wait_for(lambda: health(s)[2]["up"] and health(s)[2]["joins"] == 2, 30,
                     lambda: (health(s), s.stderr()))
            time.sleep(1)
        finally:
            stop.set()
            t.join(timeout=120)
        assert results and all(r == expected for r in results), (len(results), s.stderr())
        assert "cannot read " + etcd.url in s.stderr()
        assert "reading " + etcd.url + " again" in s.stderr()
        assert greedy(s) == expected
        s.assert_idle()
        assert s.stop() == 0, s.stderr()
    finally:
        stop_processes(workers)

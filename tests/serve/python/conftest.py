"""Fixtures for the `duet serve` tests: test models written by `duet make-test-model`, a real
`duet serve` process on an ephemeral loopback port (started, waited for, stopped with SIGTERM
and required to exit 0), and small helpers for raw HTTP and /metrics. Everything is bounded
by timeouts so that a hung server fails a test instead of hanging the suite."""

import http.client
import json
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import time

import openai
import pytest

DUET = os.environ.get("DUET_BIN", "build/bin/duet")
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 60


def run_duet(*args, timeout=120):
    return subprocess.run([DUET, *args], capture_output=True, text=True, timeout=timeout)


def cluster_file(tmp_path, prefill, decode, **engine):
    """tests/data/1p1d-tiny.json with `prefill` + `decode` instances (one node each) and the
    engine settings given (docs/clusters.md)."""
    with open("../../data/1p1d-tiny.json") as f:
        doc = json.load(f)
    doc["nodes"][0]["gpus"] = max(prefill, decode)
    doc["instances"] = [{"role": "prefill", "count": prefill, "tp": 1, "node": 0},
                        {"role": "decode", "count": decode, "tp": 1, "node": 1}]
    doc.setdefault("engine", {}).update(engine)
    path = tmp_path / f"{prefill}p{decode}d.json"
    path.write_text(json.dumps(doc))
    return str(path)


def has_ucx():
    """Whether this build has the UCX transport (scripts/setup.sh installs libucx-dev)."""
    r = run_duet("serve", "--model", "/nonexistent", "--kv-transport", "ucx", timeout=30)
    return "has no UCX" not in r.stderr


class Server:
    """One `duet serve` process."""

    def __init__(self, model_dir, *args, log_dir, prefix=()):
        """`prefix`: a command that runs it (`ip netns exec NS`, as another host)."""
        self.model_dir = model_dir
        self.stderr_path = os.path.join(log_dir, f"serve-{time.monotonic_ns()}.log")
        self._stderr = open(self.stderr_path, "w")
        self.proc = subprocess.Popen(
            [*prefix, DUET, "serve", "--model", model_dir, "--port", "0", *args],
            stdout=subprocess.PIPE, stderr=self._stderr, text=True)
        self.ready_line = self._wait_ready()
        m = re.search(r" at (http://([0-9.]+):(\d+)) ", self.ready_line)
        assert m, self.ready_line
        self.url = m.group(1)
        self.host = m.group(2)
        self.port = int(m.group(3))
        self.model = model_dir

    def _wait_ready(self):
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if sel.select(timeout=0.5):
                line = self.proc.stdout.readline()
                if line:
                    return line
            if self.proc.poll() is not None:
                break
        self.proc.kill()
        raise AssertionError(f"duet serve did not start: {self.stderr()}")

    def stderr(self):
        self._stderr.flush()
        with open(self.stderr_path) as f:
            return f.read()

    def client(self, api_key="unused", **kwargs):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0,
                             timeout=120, **kwargs)

    def connection(self, timeout=60):
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None):
        """One request on a new connection: (status, headers dict, body bytes)."""
        conn = self.connection()
        try:
            if isinstance(body, (dict, list)):
                body = json.dumps(body)
            hdrs = {"Content-Type": "application/json"} if body is not None else {}
            hdrs.update(headers or {})
            conn.request(method, path, body=body, headers=hdrs)
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def metrics(self):
        status, _, body = self.request("GET", "/metrics")
        assert status == 200, body
        values = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    def wait_metric(self, series, predicate, timeout=15):
        """Polls /metrics until predicate(value of series) holds; returns the last metrics."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            if predicate(m.get(series)):
                return m
            if time.monotonic() > deadline:
                raise AssertionError(f"{series} = {m.get(series)} after {timeout} s")
            time.sleep(0.05)

    def assert_idle(self, timeout=15):
        """No request in flight and no KV block in use. The engines publish these gauges after
        each step, so they may trail the replies: this polls briefly."""
        names = ["duet:kv_blocks_used", "duet:kv_cache_usage_perc", "duet:num_requests_running",
                 "duet:num_requests_waiting"]
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            if all(m[n] == 0 for n in names):
                return
            if time.monotonic() > deadline:
                raise AssertionError({n: m[n] for n in names})
            time.sleep(0.05)

    def send_signal(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)

    def stop(self, sig=signal.SIGTERM):
        """Stops the server; returns its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"duet serve did not stop on {sig}: {self.stderr()}")
        self._stderr.close()
        return self.proc.returncode


def wait_for(condition, timeout, what):
    """Polls condition() until it gives a true value, which it returns; after `timeout` seconds
    fails with `what` (a string, or a function called for the message then)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(what() if callable(what) else what)
        time.sleep(0.02)


def free_port():
    """A loopback port free now (a process that binds it later may find it taken meanwhile)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def require_etcd():
    """Skips the calling test module (saying why) where there is no etcd to start."""
    if shutil.which("etcd") is None:
        pytest.skip("duet-test-skip: no etcd here (Debian's etcd-server; scripts/setup.sh "
                    "installs it)")


class Etcd:
    """An etcd of a test's own (Debian's etcd-server; each test starts its own), on loopback or,
    with `prefix` (Hosts.run), on a test host at `host`; its data stays across a restart."""

    def __init__(self, tmp_path, host="127.0.0.1", prefix=()):
        self.data = str(tmp_path / "etcd")
        self.host, self.prefix = host, list(prefix)
        self.port, self.peer = (free_port(), free_port()) if not prefix else (2379, 2380)
        self.url = f"etcd://{host}:{self.port}"
        self.proc = None
        self.start()

    def start(self):
        client = f"http://{self.host}:{self.port}"
        peer = f"http://{self.host}:{self.peer}"
        self.proc = subprocess.Popen(
            [*self.prefix, "etcd", "--data-dir", self.data, "--listen-client-urls", client,
             "--advertise-client-urls", client, "--listen-peer-urls", peer,
             "--initial-advertise-peer-urls", peer, "--initial-cluster", f"default={peer}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self.answers, 20, "etcd did not start")

    def answers(self):
        try:
            with socket.create_connection((self.host, self.port), timeout=1) as s:
                s.sendall(b"GET /health HTTP/1.0\r\n\r\n")
                return b'"health":"true"' in s.recv(4096)
        except OSError:
            return False

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def stop_processes(procs):
    """Kills those of `procs` (subprocess.Popen, stderr piped) still running, stopped or not;
    returns each one's stderr by pid."""
    logs = {}
    for p in procs:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
        _, logs[p.pid] = p.communicate(timeout=30)
    return logs


def health(server):
    """/health's worker list of a server with worker processes, checking its status: 503 while a
    role has no worker up, else 200."""
    status, _, body = server.request("GET", "/health")
    workers = json.loads(body)["workers"]
    down = {w["role"] for w in workers} - {w["role"] for w in workers if w["up"]}
    assert status == (503 if down else 200), body
    return workers


def wait_up(server, instance, joins, timeout=60):
    """Until worker slot `instance` is up after its `joins`-th registration."""
    wait_for(lambda: health(server)[instance]["up"] and health(server)[instance]["joins"] == joins,
             timeout, lambda: (health(server), server.stderr()))


def worker_address(server):
    """Where a server's workers register (its log says)."""
    m = re.search(r"workers register at ([0-9.]+:\d+)", server.stderr())
    assert m, server.stderr()
    return m.group(1)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("tiny"))
    made = run_duet("make-test-model", "--out", out)
    assert made.returncode == 0, made.stderr
    return out


@pytest.fixture(scope="session")
def slow_model(tmp_path_factory):
    """The ~125M-parameter benchmark preset: on one thread it decodes slowly enough (tens of
    tokens per second) that a test can act while streams are in flight."""
    out = str(tmp_path_factory.mktemp("bench"))
    made = run_duet("make-test-model", "--preset", "bench", "--out", out)
    assert made.returncode == 0, made.stderr
    return out


@pytest.fixture(scope="session")
def start_server(tmp_path_factory):
    """Starts servers; each is stopped at the end of the session if a test left it running."""
    log_dir = str(tmp_path_factory.mktemp("logs"))
    servers = []

    def start(model_dir, *args, prefix=()):
        s = Server(model_dir, *args, log_dir=log_dir, prefix=prefix)
        servers.append(s)
        return s

    yield start
    for s in servers:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()


@pytest.fixture(scope="module")
def server(tiny_model, start_server):
    """A server on the tiny test model for a whole module. At the end: nothing in flight, no KV
    block in use, and SIGTERM stops it with status 0."""
    s = start_server(tiny_model, "--threads", "1")
    yield s
    s.assert_idle()
    assert s.stop() == 0, s.stderr()


def generate(model_dir, prompt, max_tokens, chat=False):
    """What `duet generate` prints for a greedy continuation (its trailing newline removed)."""
    args = ["generate", "--model", model_dir, "--prompt", prompt, "--max-tokens", str(max_tokens),
            "--threads", "1"]
    if chat:
        args.append("--chat")
    r = run_duet(*args)
    assert r.returncode == 0, r.stderr
    assert r.stdout.endswith("\n")
    m = re.search(r"(\d+) prompt tokens", r.stderr)
    return r.stdout[:-1], int(m.group(1))


def sse_events(response):
    """The data payloads of an SSE response (http.client), checking the framing."""
    assert response.getheader("Content-Type") == "text/event-stream"
    events = []
    buf = b""
    while True:
        chunk = response.read1(65536) if hasattr(response, "read1") else response.read(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            assert event.startswith(b"data: "), event
            events.append(event[len(b"data: "):].decode())
    assert buf == b"", buf
    return events

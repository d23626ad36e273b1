"""HTTP per the RFCs, against a real `duet serve` driven over raw sockets (issue 40): requests
sent while one generates (pipelined ones, stray empty lines) are answered in order after it, and
a client that leaves after sending them has its request aborted; a client that half-closes gets
its replies; a transfer coding other than chunked, or one with Content-Length, is refused and
the connection closed (no smuggled second request); idle connections make way for new ones,
within a per-client limit; log lines escape control characters and stay short; HTTP/1.0 streams
end with the connection; /health answers 503 while a role has no worker and shows worker PIDs
only with the API key; `bearer` in any case; HEAD on the GET endpoints; the server's sockets
are close-on-exec. The slow benchmark-size model keeps streams in flight while a test acts."""

import http.client
import io
import json
import os
import resource
import select
import signal
import socket
import time

import pytest

from conftest import cluster_file, has_ucx

ABORT = 'duet:request_success_total{finished_reason="abort"}'
LONG = {"prompt": "Tell me a long story", "max_tokens": 200, "ignore_eos": True,
        "temperature": 0}
SHORT = {"prompt": "Hello", "max_tokens": 4, "temperature": 0}


def post(body, version="1.1", path="/v1/completions", headers=""):
    payload = json.dumps(body).encode()
    return (f"POST {path} HTTP/{version}\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"{headers}Content-Length: {len(payload)}\r\n\r\n").encode() + payload


def get(path, version="1.1", method="GET"):
    return f"{method} {path} HTTP/{version}\r\nHost: x\r\n\r\n".encode()


def connect(server, source="127.0.0.1", timeout=60):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.bind((source, 0))
    s.connect(("127.0.0.1", server.port))
    return s


class Reader:
    """HTTP/1.x responses read one after another from a socket (Content-Length, chunked, or to
    the end of the connection), so that pipelined replies can be told apart. `first`: bytes of
    the socket read already."""

    def __init__(self, sock, first=b""):
        rest = sock.makefile("rb")  # (the socket's descriptor stays open while this is)

        class Raw(io.RawIOBase):
            pending = first

            def readable(self):
                return True

            def readinto(self, b):
                data = self.pending[:len(b)] if self.pending else rest.read1(len(b))
                self.pending = self.pending[len(data):]
                b[:len(data)] = data
                return len(data)

        self.f = io.BufferedReader(Raw())

    def response(self, head=False):
        """(status, headers with lower-case names, body bytes), or None at the end."""
        line = self.f.readline()
        if not line:
            return None
        version, status = line.split(b" ", 2)[:2]
        assert version in (b"HTTP/1.1", b"HTTP/1.0"), line
        headers = {}
        while (line := self.f.readline()) not in (b"\r\n", b""):
            name, value = line.decode().split(":", 1)
            assert name.lower() not in headers, line
            headers[name.lower()] = value.strip()
        if head:
            return int(status), headers, b""
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                size = int(self.f.readline().split(b";")[0], 16)
                chunk = self.f.read(size + 2)
                assert chunk.endswith(b"\r\n")
                if size == 0:
                    break
                body += chunk[:-2]
        elif "content-length" in headers:
            body = self.f.read(int(headers["content-length"]))
        else:
            body = self.f.read()
        return int(status), headers, body

    def at_end(self):
        return self.f.read() == b""


def sse(body):
    events = [e for e in body.decode().split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events), body
    return [e[len("data: "):] for e in events]


def stream_text(body):
    events = sse(body)
    assert events[-1] == "[DONE]", events
    return "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]
                   if json.loads(e)["choices"])


def wait_first_text(sock):
    """Reads a stream's first bytes until a text chunk arrives; returns what was read."""
    received = b""
    while b'"text":"' not in received.replace(b'"text":""', b""):
        chunk = sock.recv(65536)
        assert chunk, received
        received += chunk
    return received


@pytest.fixture(scope="module")
def slow_server(slow_model, start_server):
    s = start_server(slow_model, "--threads", "1")
    yield s
    s.assert_idle()
    assert s.stop() == 0, s.stderr()


# Finding 5: bytes that arrive while a request generates.

@pytest.mark.parametrize("stream", [True, False])
def test_requests_pipelined_during_a_generation_are_answered_in_order(slow_server, stream):
    sock = connect(slow_server)
    sock.sendall(post(dict(LONG, max_tokens=24, stream=stream)))
    if stream:
        first = wait_first_text(sock)
    else:
        first = b""
        slow_server.wait_metric("duet:num_requests_running", lambda v: v == 1)
    # While it generates: a stray empty line, a whole request, empty lines and a streamed one.
    sock.sendall(b"\r\n" + post(SHORT) + b"\r\n\r\n" + post(dict(SHORT, stream=True)))
    reader = Reader(sock, first)
    status, headers, body = reader.response()
    assert status == 200, body
    if stream:
        assert headers["transfer-encoding"] == "chunked" and stream_text(body)
    else:
        assert json.loads(body)["usage"]["completion_tokens"] == 24
    status, _, body = reader.response()
    assert status == 200, body
    whole = json.loads(body)
    assert whole["usage"]["completion_tokens"] == 4
    status, _, body = reader.response()
    assert status == 200, body
    assert stream_text(body) == whole["choices"][0]["text"]  # greedy: the same text
    # The connection is still usable, and nothing more was sent.
    sock.sendall(get("/health"))
    assert reader.response()[0] == 200
    sock.close()
    slow_server.assert_idle()


def test_more_pipelined_requests_than_the_read_ahead_bound_all_get_their_reply(slow_server):
    sock = connect(slow_server)
    sock.sendall(post(dict(LONG, max_tokens=16, stream=True)))
    first = wait_first_text(sock)
    count = 3000  # about 100 KB of requests: past the 64 KiB read ahead, the rest waits in TCP
    sock.sendall(get("/health") * count)
    reader = Reader(sock, first)
    status, _, body = reader.response()
    assert status == 200 and stream_text(body)
    for i in range(count):
        assert reader.response()[0] == 200, i
    sock.close()
    slow_server.assert_idle()


def test_a_client_that_leaves_mid_stream_after_sending_more_has_its_request_aborted(slow_server):
    # (A client that leaves during a whole reply cannot be told from one that half-closed until
    # the reply is written: that request runs to its end.)
    before = slow_server.metrics()[ABORT]
    sock = connect(slow_server)
    sock.sendall(post(dict(LONG, stream=True)))
    slow_server.wait_metric("duet:num_requests_running", lambda v: v == 1)
    sock.sendall(b"\r\n")
    time.sleep(0.2)
    sock.sendall(post(SHORT))
    time.sleep(0.2)
    sock.close()
    # 200 tokens take this model many seconds: an abort shows well before.
    slow_server.wait_metric(ABORT, lambda v: v == before + 1, timeout=5)
    slow_server.assert_idle(timeout=5)


# Finding 11: half-close.

@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_half_closes_after_its_requests_gets_every_reply(server, stream):
    sock = connect(server)
    sock.sendall(post(dict(SHORT, stream=stream)) + post(dict(SHORT, stream=stream)))
    sock.shutdown(socket.SHUT_WR)
    reader = Reader(sock)
    texts = []
    for _ in range(2):
        status, headers, body = reader.response()
        assert status == 200, body
        texts.append(stream_text(body) if stream else json.loads(body)["choices"][0]["text"])
    assert texts[0] == texts[1] and texts[0]
    assert reader.at_end()  # and then the server closes
    sock.close()


def test_a_half_closed_client_mid_generation_still_gets_its_reply(slow_server):
    sock = connect(slow_server)
    # 64 tokens: the request runs long enough (~0.5 s of decode) for a scrape on a loaded
    # machine to see it (8 ran ~60 ms after its prefill, and a CI run's scrapes missed it).
    sock.sendall(post(dict(LONG, max_tokens=64)))
    slow_server.wait_metric("duet:num_requests_running", lambda v: v == 1)
    sock.shutdown(socket.SHUT_WR)
    reader = Reader(sock)
    status, _, body = reader.response()
    assert status == 200, body
    assert json.loads(body)["usage"]["completion_tokens"] == 64
    assert reader.at_end()
    sock.close()


# Finding 10: transfer codings.

SMUGGLED = post(SHORT)


@pytest.mark.parametrize("framing", [
    "Transfer-Encoding: gzip\r\n",
    "Transfer-Encoding: gzip, chunked\r\n",
    "Transfer-Encoding: chunked, gzip\r\n",
    "Transfer-Encoding: identity\r\n",
    "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n",
    f"Transfer-Encoding: gzip\r\nContent-Length: {len(SMUGGLED)}\r\n",
    f"Content-Length: {len(SMUGGLED)}\r\nTransfer-Encoding: chunked\r\n",
    f"Transfer-Encoding: chunked\r\nContent-Length: {len(SMUGGLED)}\r\n",
])
def test_transfer_codings_other_than_chunked_are_refused_and_the_connection_closed(server,
                                                                                 framing):
    sock = connect(server)
    sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\n{framing}\r\n".encode() + SMUGGLED)
    sock.shutdown(socket.SHUT_WR)
    reader = Reader(sock)
    status, headers, body = reader.response()
    assert status == 400, body
    assert headers.get("connection") == "close"
    assert json.loads(body)["error"]["type"] == "invalid_request_error"
    assert reader.at_end()  # the body is never read as a second request
    sock.close()


def test_chunked_in_any_case_is_accepted(server):
    payload = json.dumps(SHORT).encode()
    sock = connect(server)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: ChUnKeD\r\n\r\n"
                 + b"%x\r\n" % len(payload) + payload + b"\r\n0\r\n\r\n")
    status, _, body = Reader(sock).response()
    assert status == 200, body
    sock.close()


# Finding 7: connection limits.

def raise_open_files(needed):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"the open files hard limit ({hard}) is below {needed}")
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def closed_by_server(sock, timeout=5):
    """Whether the server closed the connection (EOF) within `timeout`."""
    poll = select.poll()  # (select.select takes no descriptor past 1023)
    poll.register(sock, select.POLLIN)
    if not poll.poll(timeout * 1000):
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except ConnectionResetError:
        return True


def health_from(server, source):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10,
                                      source_address=(source, 0))
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status
    finally:
        conn.close()


def test_thousands_of_idle_connections_from_one_client_do_not_lock_others_out(tiny_model,
                                                                             start_server):
    count = 5000  # past the default --max-connections of 4096
    raise_open_files(count + 1000)
    s = start_server(tiny_model, "--threads", "1")
    # duet serve raised its soft open-files limit to the hard one.
    with open(f"/proc/{s.proc.pid}/limits") as f:
        soft, hard = next(line for line in f if line.startswith("Max open files")).split()[3:5]
    assert soft == hard, (soft, hard)
    socks = []
    try:
        for _ in range(count):
            socks.append(connect(s, "127.0.0.1"))
        time.sleep(1.0)  # all accepted
        assert health_from(s, "127.0.0.2") == 200
        # The client's oldest idle connections made way (the per-client limit, 1024): its
        # newest are open.
        assert closed_by_server(socks[0])
        assert not closed_by_server(socks[-1], timeout=0.2)
        open_ = sum(not closed_by_server(x, timeout=0) for x in socks)
        assert open_ <= 1024, open_
    finally:
        for x in socks:
            x.close()
    assert s.stop() == 0, s.stderr()


def test_new_connections_take_the_place_of_the_oldest_idle_ones(tiny_model, start_server):
    s = start_server(tiny_model, "--threads", "1", "--max-connections", "16",
                     "--max-connections-per-client", "0")
    socks = [connect(s, "127.0.0.1") for _ in range(16)]
    busy = socks[0]
    busy.sendall(b"GET /health HTTP/1.1\r\n")  # a request on its way: not idle
    time.sleep(0.5)
    newer = [connect(s, "127.0.0.3") for _ in range(4)]
    time.sleep(0.5)
    # The four oldest idle ones are gone, the one receiving a request is not.
    assert [closed_by_server(x, timeout=2) for x in socks[1:5]] == [True] * 4
    assert not closed_by_server(busy, timeout=0.2)
    assert not any(closed_by_server(x, timeout=0) for x in socks[5:] + newer)
    assert health_from(s, "127.0.0.2") == 200
    busy.sendall(b"Host: x\r\n\r\n")
    assert Reader(busy).response()[0] == 200
    # With no connection idle, a new one is closed at once.
    time.sleep(0.5)  # the server has seen the closes
    open_ = [x for x in socks + newer if not closed_by_server(x, timeout=0)]
    open_ += [connect(s, "127.0.0.3") for _ in range(16 - len(open_))]
    for x in open_:
        x.sendall(b"GET /health HTTP/1.1\r\n")
    time.sleep(0.5)
    late = connect(s, "127.0.0.2")
    assert closed_by_server(late), s.stderr()
    assert not any(closed_by_server(x, timeout=0) for x in open_)
    for x in socks + open_ + [late]:
        x.close()
    assert s.stop() == 0, s.stderr()


def test_per_client_connection_limit(tiny_model, start_server):
    s = start_server(tiny_model, "--threads", "1", "--max-connections-per-client", "4")
    socks = [connect(s, "127.0.0.1") for _ in range(4)]
    for x in socks:
        x.sendall(b"GET /health HTTP/1.1\r\n")  # each receiving a request: none idle
    time.sleep(0.5)
    assert closed_by_server(connect(s, "127.0.0.1"))  # a fifth from the same address
    assert health_from(s, "127.0.0.2") == 200  # another client is not limited by it
    for x in socks:
        x.close()
    assert s.stop() == 0, s.stderr()


# Finding 12: logs.

def test_client_text_in_log_lines_is_escaped_and_cut(tiny_model, start_server):
    s = start_server(tiny_model, "--threads", "1")
    forged = "x`\nduet serve: 200 POST /v1/completions: forged\x1b[31m\x07\r\u009b\xff"
    status, _, _ = s.request("POST", "/v1/completions", dict(SHORT, model=forged))
    assert status == 404
    status, _, _ = s.request("POST", "/v1/completions", dict(SHORT, **{"bad\nfield\x1b": 1}))
    assert status == 400
    raw = b'{"prompt": "x", "model": "a\xffb\\u0000"}'
    status, _, _ = s.request("POST", "/v1/completions", raw)
    before = len(s.stderr())
    status, _, _ = s.request("POST", "/v1/completions", dict(SHORT, model="m" * (3 << 20)))
    assert status == 404
    time.sleep(0.2)
    log = s.stderr()
    assert len(log) - before < 4096, len(log) - before  # not 3 MiB per request
    assert "bytes)" in log[before:]
    assert s.stop() == 0
    with open(s.stderr_path) as f:
        log = f.read()
    for line in log.splitlines():
        assert not line.startswith("duet serve: 200"), line
    for c in "\x1b\x07\r\u009b":
        assert c not in log, repr(c)
    assert "\\n" in log and "\\x1b" in log and "\\u009b" in log


# Finding 13: HTTP/1.0 streams.

def test_an_http_1_0_stream_is_close_delimited(server):
    sock = connect(server)
    sock.sendall(post(dict(SHORT, stream=True), version="1.0"))
    reader = Reader(sock)
    status, headers, body = reader.response()
    assert status == 200
    assert "transfer-encoding" not in headers and "content-length" not in headers
    assert headers["connection"].lower() == "close"
    assert stream_text(body)  # every event, [DONE] last, then the end of the connection
    sock.close()


# Finding 16: bearer in any case, HEAD.

def test_the_bearer_scheme_in_any_case(tiny_model, start_server):
    s = start_server(tiny_model, "--threads", "1", "--api-key", "sekrit")
    for header, status in [("Bearer sekrit", 200), ("bearer sekrit", 200), ("BEARER sekrit", 200),
                           ("bearer  sekrit", 200), ("bearer sekrit2", 401), ("bearer sekri", 401),
                           ("Basic sekrit", 401), ("sekrit", 401), ("bearer", 401)]:
        assert s.request("GET", "/v1/models", headers={"Authorization": header})[0] == status, \
            header
    reply = s.request("POST", "/v1/completions", SHORT, {"Authorization": "bearer sekrit"})
    assert reply[0] == 200, reply
    assert s.stop() == 0


@pytest.mark.parametrize("path", ["/health", "/metrics", "/v1/models"])
def test_head_on_every_get_endpoint(server, path):
    sock = connect(server)
    sock.sendall(get(path) + get(path, method="HEAD") + get(path))
    reader = Reader(sock)
    status, headers, body = reader.response()
    assert status == 200
    status, head_headers, _ = reader.response(head=True)
    assert status == 200
    assert head_headers["content-type"] == headers["content-type"]
    if path != "/metrics":  # the metrics change between scrapes
        assert int(head_headers["content-length"]) == len(body)
    # No body after HEAD's headers: the next bytes are the third reply.
    assert reader.response()[0] == 200
    sock.close()
    status, _, _ = server.request("HEAD", "/v1/completions")
    assert status == 405


# Finding 14: /health with worker processes.

@pytest.fixture(scope="module")
def pd_server(tiny_model, start_server, tmp_path_factory):
    if not has_ucx():
        pytest.skip("this build has no UCX (libucx-dev): PD worker processes are not tested")
    s = start_server(tiny_model, "--threads", "1", "--ucx-tls", "tcp", "--api-key", "sekrit",
                     "--cluster", cluster_file(tmp_path_factory.mktemp("pd"), 1, 1),
                     "--worker-restarts", "0")
    yield s
    assert s.stop() == 0, s.stderr()


def test_health_shows_worker_pids_only_with_the_api_key(pd_server):
    status, _, body = pd_server.request("GET", "/health")
    assert status == 200, body
    workers = json.loads(body)["workers"]
    assert [w["role"] for w in workers] == ["prefill", "decode"]
    assert all("pid" not in w and w["up"] for w in workers), workers
    status, _, body = pd_server.request("GET", "/health", headers={"Authorization": "bearer sekrit"})
    assert status == 200
    assert all(w["pid"] > 0 for w in json.loads(body)["workers"])


def test_health_is_503_while_a_role_has_no_worker_up(pd_server):
    _, _, body = pd_server.request("GET", "/health", headers={"Authorization": "Bearer sekrit"})
    prefill = [w["pid"] for w in json.loads(body)["workers"] if w["role"] == "prefill"]
    for pid in prefill:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while True:
        status, _, body = pd_server.request("GET", "/health")
        if status != 200 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert status == 503, body
    reply = json.loads(body)
    assert reply["error"]["code"] == "no_worker_up"
    assert "prefill" in reply["error"]["message"] and "decode" not in reply["error"]["message"]
    assert [w["up"] for w in reply["workers"]] == [False, True]


# Finding 8, the HTTP part: no socket of the server is inherited by a process it starts.

def test_the_servers_sockets_are_close_on_exec(server):
    sock = connect(server)
    sock.sendall(get("/health"))
    assert Reader(sock).response()[0] == 200  # an accepted connection is open now
    pid = server.proc.pid
    sockets = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                info = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
        except FileNotFoundError:
            continue
        if target.startswith("socket:"):
            sockets += 1
            assert int(info["flags"], 8) & 0o2000000, (fd, target, info["flags"])  # O_CLOEXEC
    assert sockets >= 2  # the listener and this connection
    sock.close()

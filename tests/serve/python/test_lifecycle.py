"""The server's life around its requests, on the slow benchmark-size test model (one thread,
tens of tokens per second) so that streams are surely in flight while the test acts: a client
that disconnects mid-stream has its request aborted and its KV blocks freed; admission is
bounded (429 with Retry-After); SIGTERM/SIGINT make /health answer 503 and new requests 503
while the streams in flight finish, then the process exits 0; the API key is enforced."""

import json
import signal
import socket
import struct
import time

import openai
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

ABORT = 'duet:request_success_total{finished_reason="abort"}'
LONG = {"prompt": "Tell me a long story", "max_tokens": 200, "ignore_eos": True,
        "temperature": 0}


def open_stream(server, body=LONG, headers=None):
    """Starts a streamed completion on a raw socket and reads until its first text chunk."""
    s = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    payload = json.dumps(dict(body, stream=True)).encode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items()).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + extra + b"Content-Length: %d\r\n\r\n" % len(payload) + payload)
    received = b""
    while b'"text":"' not in received.split(b"\r\n\r\n", 1)[-1].replace(b'"text":""', b""):
        chunk = s.recv(65536)
        assert chunk, received
        received += chunk
    assert received.startswith(b"HTTP/1.1 200"), received[:300]
    return s, received


def read_to_end(s):
    received = b""
    while chunk := s.recv(65536):
        received += chunk
    return received


@pytest.fixture
def slow_server(slow_model, start_server):
    s = start_server(slow_model, "--threads", "1")
    yield s
    if s.proc.poll() is None:
        s.assert_idle()
        assert s.stop() == 0, s.stderr()


def test_client_disconnect_aborts_and_frees_blocks(slow_server):
    s = slow_server
    sock, _ = open_stream(s)
    # The engines publish their load after each step, so the gauges may trail the first token.
    m = s.wait_metric("duet:kv_blocks_used", lambda v: v > 0)
    assert m["duet:num_requests_running"] == 1
    assert m[ABORT] == 0
    sock.close()
    m = s.wait_metric("duet:kv_blocks_used", lambda v: v == 0)
    assert m[ABORT] == 1
    assert m["duet:generation_tokens_total"] < 200  # it did not run to its end
    assert m["duet:num_requests_running"] == 0

    # The same over WebSocket.
    with connect(s.url.replace("http://", "ws://") + "/v1/ws") as ws:
        ws.send(json.dumps(dict(LONG, endpoint="/v1/completions")))
        while not json.loads(ws.recv(timeout=60))["choices"][0]["text"]:
            pass
        s.wait_metric("duet:kv_blocks_used", lambda v: v > 0)
    s.wait_metric(ABORT, lambda v: v == 2)
    s.assert_idle()

    # Not streamed: the client gives up before the reply and resets the connection.
    conn = s.connection(timeout=0.5)
    conn.request("POST", "/v1/completions", body=json.dumps(LONG),
                 headers={"Content-Type": "application/json"})
    with pytest.raises(socket.timeout):
        conn.getresponse()
    conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()
    s.wait_metric(ABORT, lambda v: v == 3)
    s.assert_idle()
    # A client that only closes (a FIN) cannot be told from one that half-closed and still
    # reads (RFC 9112 9.6): a whole reply's request runs to its end, then the reply is dropped.
    conn = s.connection(timeout=0.5)
    conn.request("POST", "/v1/completions", body=json.dumps(dict(LONG, max_tokens=8)),
                 headers={"Content-Type": "application/json"})
    conn.close()
    s.wait_metric('duet:request_success_total{finished_reason="length"}', lambda v: v == 1)
    assert s.metrics()[ABORT] == 3
    s.assert_idle()


def test_admission_is_bounded(slow_model, start_server):
    s = start_server(slow_model, "--threads", "1", "--max-pending", "2")
    streams = [open_stream(s)[0] for _ in range(2)]
    status, headers, body = s.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 1})
    assert status == 429, body
    assert headers["retry-after"] == "1"
    assert json.loads(body)["error"]["code"] == "rate_limit_exceeded"
    with pytest.raises(openai.RateLimitError):
        s.client().completions.create(model=s.model, prompt="x", max_tokens=1)
    for sock in streams:
        sock.close()
    s.wait_metric(ABORT, lambda v: v == 2)
    status, _, body = s.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 1})
    assert status == 200, body
    s.assert_idle()
    assert s.stop() == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_drains_streams_in_flight_then_exits_0(slow_model, start_server, sig):
    s = start_server(slow_model, "--threads", "1")
    body = dict(LONG, max_tokens=100)
    streams = [open_stream(s, body) for _ in range(3)]
    # An idle keep-alive connection, to ask /health on while draining.
    probe = s.connection()
    probe.request("GET", "/health")
    assert probe.getresponse().read() == b""

    s.send_signal(sig)
    deadline = time.monotonic() + 10
    while True:  # the signal is taken asynchronously
        probe.request("GET", "/health")
        resp = probe.getresponse()
        body = resp.read()
        if resp.status != 200 or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert resp.status == 503
    assert json.loads(body)["error"]["code"] == "server_draining"
    status, _, raw = s.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 1})
    assert status == 503, raw
    status, _, _ = s.request("GET", "/health")
    assert status == 503
    assert s.proc.poll() is None  # still serving the streams

    for sock, first in streams:
        rest = first + read_to_end(sock)
        sock.close()
        events = [e for e in rest.split(b"\r\n\r\n", 1)[1].split(b"\n") if e.startswith(b"data: ")]
        assert events[-1] == b"data: [DONE]", rest[-300:]
        last = json.loads(events[-2][len(b"data: "):])
        assert last["choices"][0]["finish_reason"] == "length"
        text = "".join(json.loads(e[len(b"data: "):])["choices"][0]["text"]
                       for e in events[:-1])
        assert text
    s.proc.wait(timeout=60)
    assert s.proc.returncode == 0, s.stderr()
    log = s.stderr()
    assert "draining 3 replies in flight" in log, log
    assert "stopped" in log and "aborted" not in log, log


def test_api_key_is_enforced(tiny_model, start_server):
    s = start_server(tiny_model, "--threads", "1", "--api-key", "sekrit")
    for key in (None, "wrong"):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        status, _, body = s.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 1},
                                    headers)
        assert status == 401, body
        assert json.loads(body)["error"]["code"] == "invalid_api_key"
        status, _, _ = s.request("GET", "/v1/models", headers=headers)
        assert status == 401
    with pytest.raises(openai.AuthenticationError):
        s.client(api_key="wrong").completions.create(model=s.model, prompt="x", max_tokens=1)
    reply = s.client(api_key="sekrit").completions.create(model=s.model, prompt="x", max_tokens=1)
    assert reply.usage.completion_tokens == 1
    assert s.request("GET", "/health")[0] == 200  # open: for load balancers and probes
    assert s.request("GET", "/metrics")[0] == 200
    url = s.url.replace("http://", "ws://") + "/v1/ws"
    with pytest.raises(InvalidStatus) as e:
        connect(url)
    assert e.value.response.status_code == 401
    with connect(url, additional_headers={"Authorization": "Bearer sekrit"}) as ws:
        ws.send(json.dumps({"endpoint": "/v1/completions", "prompt": "x", "max_tokens": 1}))
        while ws.recv(timeout=30) != "[DONE]":
            pass
    s.assert_idle()
    assert s.stop() == 0

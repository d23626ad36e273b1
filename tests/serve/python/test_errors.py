"""Every bad request gets its 4xx with an OpenAI-style error body naming what is wrong, the
official client raises the matching exception, and the server stays up and serves the next
request (checked after each case)."""

import json
import os
import socket

import openai
import pytest

from conftest import DUET, has_ucx, run_duet

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


def completion(**fields):
    body = {"prompt": "Hello", "max_tokens": 4}
    body.update(fields)
    return body


def chat(**fields):
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    body.update(fields)
    return body


CASES = [
    # (id, path, body, status, param, words in the message)
    ("malformed-json", COMPLETIONS, '{"prompt": "x",', 400, None, "not valid JSON"),
    ("not-an-object", COMPLETIONS, "[1, 2]", 400, None, "JSON object"),
    ("empty-body", COMPLETIONS, "", 400, None, "not valid JSON"),
    ("number-overflow", COMPLETIONS, '{"prompt": "x", "max_tokens": 1e400}', 400, None,
     "not valid JSON"),
    ("invalid-utf8", COMPLETIONS, b'{"prompt": "\xff\xfe"}', 400, None, "not valid JSON"),
    ("deep-nesting", COMPLETIONS, "[" * 100000, 400, None, "not valid JSON"),
    ("missing-prompt", COMPLETIONS, {"max_tokens": 3}, 400, "prompt", "required"),
    ("missing-messages", CHAT, {"max_tokens": 3}, 400, "messages", "required"),
    ("wrong-type", COMPLETIONS, completion(temperature="hot"), 400, "temperature", "number"),
    ("out-of-range", COMPLETIONS, completion(top_p=0), 400, "top_p", "(0, 1]"),
    ("max-tokens-zero", COMPLETIONS, completion(max_tokens=0), 400, "max_tokens", "[1,"),
    ("unknown-field", COMPLETIONS, completion(frobnicate=True), 400, "frobnicate", "Unrecognized"),
    ("n", COMPLETIONS, completion(n=2), 400, "n", "not supported"),
    ("logprobs", COMPLETIONS, completion(logprobs=1), 400, "logprobs", "not supported"),
    ("chat-logprobs", CHAT, chat(logprobs=True), 400, "logprobs", "not supported"),
    ("best_of", COMPLETIONS, completion(best_of=2), 400, "best_of", "not supported"),
    ("echo", COMPLETIONS, completion(echo=True), 400, "echo", "not supported"),
    ("tools", CHAT, chat(tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tools",
     "not supported"),
    ("response_format", CHAT, chat(response_format={"type": "json_object"}), 400,
     "response_format", "not supported"),
    ("penalty", CHAT, chat(presence_penalty=1.0), 400, "presence_penalty", "not supported"),
    ("several-prompts", COMPLETIONS, completion(prompt=["a", "b"]), 400, "prompt", "2 prompts"),
    ("empty-messages", CHAT, chat(messages=[]), 400, "messages", "empty"),
    ("bad-role", CHAT, chat(messages=[{"role": "robot", "content": "x"}]), 400, "messages",
     "role"),
    ("image-part", CHAT, chat(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]), 400,
     "messages[0].content[0].type", "only text"),
    ("token-outside-vocab", COMPLETIONS, completion(prompt=[1, 999999]), 400, "prompt",
     "vocabulary"),
    ("prompt-too-long", COMPLETIONS, completion(prompt=[5] * 300, max_tokens=None), 400,
     "prompt", "maximum context length"),
    ("max-tokens-cannot-fit", COMPLETIONS, completion(prompt=[5] * 10, max_tokens=250), 400,
     "max_tokens", "maximum context length"),
    ("stream-options-without-stream", COMPLETIONS,
     completion(stream_options={"include_usage": True}), 400, "stream_options", "stream"),
    ("unknown-model", COMPLETIONS, completion(model="gpt-17"), 404, "model", "does not exist"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_request_gets_its_4xx_and_the_server_stays_up(server, case):
    _, path, body, status, param, words = case
    if isinstance(body, dict):
        body = {k: v for k, v in body.items() if v is not None}
    got, headers, raw = server.request("POST", path, body)
    assert got == status, raw
    assert headers["content-type"] == "application/json"
    error = json.loads(raw)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert words in error["message"], error["message"]
    assert_still_serving(server)


def assert_still_serving(server):
    status, _, body = server.request("POST", COMPLETIONS, {"prompt": "Hi", "max_tokens": 2})
    assert status == 200, body
    assert server.proc.poll() is None


def test_the_client_raises_the_matching_exceptions(server):
    client = server.client()
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=server.model, prompt="Hi", n=2)
    assert e.value.status_code == 400 and e.value.body["param"] == "n"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=server.model,
                                       messages=[{"role": "user", "content": "x"}],
                                       max_completion_tokens=1000)
    assert e.value.body["code"] == "context_length_exceeded"


@pytest.mark.parametrize("method,path,status,allow", [
    ("GET", COMPLETIONS, 405, "POST"),
    ("PUT", CHAT, 405, "POST"),
    ("POST", "/v1/models", 405, "GET, HEAD"),
    ("POST", "/health", 405, "GET, HEAD"),
    ("GET", "/v1/embeddings", 404, None),
    ("GET", "/", 404, None),
])
def test_wrong_method_and_unknown_path(server, method, path, status, allow):
    got, headers, raw = server.request(method, path)
    assert got == status, raw
    assert json.loads(raw)["error"]["message"]
    if allow:
        assert headers["allow"] == allow
    assert_still_serving(server)


def test_body_too_large_gets_413(server):
    big = json.dumps({"prompt": "x" * (5 << 20)})
    got, headers, raw = server.request("POST", COMPLETIONS, big)
    assert got == 413
    assert json.loads(raw)["error"]["code"] == "request_too_large"
    assert headers["connection"] == "close"
    assert_still_serving(server)


def test_body_too_large_without_content_length_gets_413(server):
    # Chunked upload: the limit trips while reading the body.
    conn = server.connection()
    def chunks():
        for _ in range(6):
            yield b"x" * (1 << 20)
    conn.request("POST", COMPLETIONS, body=chunks(), encode_chunked=True,
                 headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
    resp = conn.getresponse()
    assert resp.status == 413
    conn.close()
    assert_still_serving(server)


def raw_exchange(server, data, timeout=10):
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as s:
        s.sendall(data)
        received = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return received
            received += chunk


def test_malformed_http_gets_400_and_a_closed_connection(server):
    reply = raw_exchange(server, b"THIS IS NOT HTTP\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 400"), reply
    assert_still_serving(server)


def test_huge_headers_get_431(server):
    reply = raw_exchange(server, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"y" * 40000 +
                         b"\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 431"), reply[:200]
    assert_still_serving(server)


def test_expect_100_continue_and_pipelined_requests(server):
    body = json.dumps({"prompt": "Hi", "max_tokens": 2}).encode()
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n" % len(body))
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(head + b"Expect: 100-continue\r\n\r\n")
        assert s.recv(1024).startswith(b"HTTP/1.1 100 Continue")
        # The body, then two more requests at once; the last one asks to close.
        s.sendall(body + head + b"\r\n" + body + b"GET /health HTTP/1.1\r\nHost: x\r\n"
                  b"Connection: close\r\n\r\n")
        received = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            received += chunk
    assert received.count(b"HTTP/1.1 200 OK") == 3, received
    assert received.count(b'"object":"text_completion"') == 2


def test_idle_connection_is_closed_after_the_read_timeout(tiny_model, start_server):
    s = start_server(tiny_model, "--threads", "1", "--read-timeout", "1")
    with socket.create_connection(("127.0.0.1", s.port), timeout=10) as conn:
        conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert conn.recv(1024).startswith(b"HTTP/1.1 200")
        # Keep-alive, then silence: the server hangs up.
        assert conn.recv(1024) == b""
    with socket.create_connection(("127.0.0.1", s.port), timeout=10) as conn:
        conn.sendall(b"GET /health HT")  # a request that never completes
        assert conn.recv(1024) == b""
    assert s.stop() == 0


@pytest.mark.parametrize("flags, words", [
    (["--threads", "100000"], "--threads"),
    (["--threads", "-1"], "--threads"),
    (["--instances", "0"], "--instances"),
    (["--port", "70000"], "--port"),
    (["--max-pending", "0"], "--max-pending"),
    (["--max-num-seqs", "0"], "--max-num-seqs"),
    (["--max-num-batched-tokens", "0"], "--max-num-batched-tokens"),
    (["--router", "cache-aware"], "cache-aware"),
    (["--router", "nope"], "--router"),
    (["stray-positional"], "stray-positional"),
    (["--kv-transport", "nope"], "--kv-transport"),
    (["--cluster", "../../data/1p1d-tiny.json", "--instances", "2"], "--instances and --cluster"),
    (["--cluster", "../../data/1p1d-tiny.json", "--max-num-seqs", "4"], "--max-num-seqs"),
    (["--workers", "bogus"], "--workers"),
    (["--workers", "process"], "--workers process needs --cluster"),
    (["--cluster", "../../data/1p1d-tiny.json", "--kv-transport", "loopback"], "--workers thread"),
    (["--cluster", "../../data/1p1d-tiny.json", "--worker-port", "70000"], "--worker-port"),
    (["--cluster", "../../data/1p1d-tiny.json", "--worker-host", "localhost"], "--worker-host"),
    (["--discovery", "etcd://127.0.0.1:2379"], "--discovery is for --workers process"),
    (["--cluster", "../../data/1p1d-tiny.json", "--discovery", "http://h:1"], "--discovery"),
    (["--cluster", "../../data/1p1d-tiny.json", "--discovery", "etcd://127.0.0.1:2379",
      "--spawn-workers", "true"], "not with --spawn-workers true"),
    (["--worker-restarts", "-1"], "--worker-restarts"),
])
def test_bad_flags_are_usage_errors(tiny_model, flags, words):
    # One error line naming the flag, exit 2, and no server started (the command returns).
    r = run_duet("serve", "--model", tiny_model, "--port", "0", *flags, timeout=30)
    assert r.returncode == 2, r
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("duet: error:") and words in lines[0], r.stderr


@pytest.mark.parametrize("flags, words", [
    (["--role", "router"], "--role"),
    (["--role", "decode", "--block-tokens", "0"], "--block-tokens"),
    (["--role", "decode", "--kv-blocks", "-1"], "--kv-blocks"),
    (["--role", "decode", "--connect-timeout", "0"], "--connect-timeout"),
    (["--role", "decode", "--threads", "-1"], "--threads"),
    # An address of no device of this host: its peers could not reach its KV there.
    (["--role", "prefill", "--advertise", "192.0.2.77"], "192.0.2.77 is the address of no "),
    (["--role", "prefill", "--advertise", "eth0"], "'eth0' is not an IPv4 address"),
])
def test_bad_worker_flags_are_usage_errors(tiny_model, flags, words, monkeypatch):
    monkeypatch.delenv("UCX_NET_DEVICES", raising=False)
    r = run_duet("worker", "--model", tiny_model, "--frontend", "127.0.0.1:9", *flags, timeout=30)
    assert r.returncode == 2, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("duet: error:") and words in lines[0], r.stderr


def kv_transports_built():
    """The KV transports this build has, by what makes each: loopback always, ucx with UCX, and
    cuda-ipc where the CUDA plugin was built (beside the binary, in ../lib)."""
    plugin = os.path.join(os.path.dirname(os.path.realpath(DUET)), "..", "lib",
                          "libduet_cuda_plugin.so")
    return ["loopback"] + ["ucx"] * has_ucx() + ["cuda-ipc"] * os.path.exists(plugin)


def test_kv_transport_names_what_this_build_has_and_refuses_what_cannot_serve(tiny_model):
    built = kv_transports_built()
    # --help describes each, in the registry's order.
    r = run_duet("serve", "--help", timeout=30)
    assert r.returncode == 0, r
    text = " ".join(r.stdout.split())
    at = [text.find(f"{name} (") for name in built]
    assert -1 not in at and at == sorted(at), text
    assert ("cuda-ipc (" in text) == ("cuda-ipc" in built), text

    def usage_error(*flags, command="serve"):
        r = run_duet(command, "--model", tiny_model, *flags, timeout=30)
        assert r.returncode == 2, r
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("duet: error: "), r.stderr
        return lines[0][len("duet: error: "):]

    # An unknown name: the error lists the names.
    assert usage_error("--port", "0", "--kv-transport", "pigeon") == (
        f"--kv-transport: unknown KV transport 'pigeon' (this build has: {', '.join(built)})")
    # CUDA IPC maps GPU memory; the CPU backend's KV is in host memory. Refused at start, with
    # threads or worker processes, PD or not.
    cluster = "../../data/1p1d-tiny.json"
    for flags in [[], ["--cluster", cluster, "--workers", "thread"], ["--cluster", cluster]]:
        message = usage_error("--port", "0", "--kv-transport", "cuda-ipc", *flags)
        if "cuda-ipc" in built:
            assert message == ("--kv-transport cuda-ipc moves KV in GPU memory, and the CPU "
                               "backend (--device cpu) keeps its KV in host memory: use --device "
                               "cuda"), message
        else:
            assert message == "--kv-transport: this build of Duet has no CUDA plugin " \
                              "(configure with nvcc present)", message
    # A worker refuses what cannot cross processes, before it loads anything.
    assert usage_error("--role", "decode", "--frontend", "127.0.0.1:9", "--kv-transport",
                       "loopback", command="worker") == (
        "--kv-transport loopback moves KV within one process: use --workers thread")


@pytest.mark.parametrize("flags, words", [
    (["--role", "decode"], "give --frontend HOST:PORT or --discovery"),
    (["--role", "decode", "--frontend", "127.0.0.1:9", "--discovery", "etcd://127.0.0.1:1"],
     "give --frontend HOST:PORT or --discovery"),
    (["--role", "decode", "--discovery", "etcd://127.0.0.1:1"], "--discovery needs --listen"),
    (["--role", "decode", "--discovery", "etcd://127.0.0.1:1", "--listen", "0.0.0.0:0"],
     "--listen: '0.0.0.0' is not an IPv4 address of this host that frontends reach"),
    (["--role", "decode", "--discovery", "etcd://127.0.0.1:1", "--listen", "127.0.0.1:x"],
     "the port must be in 0..65535"),
    (["--role", "decode", "--discovery", "etcd:/127.0.0.1:1", "--listen", "127.0.0.1:0"],
     "--discovery: "),
    (["--role", "decode", "--discovery", "etcd://127.0.0.1:1", "--listen", "127.0.0.1:0",
      "--discovery-ttl", "0"], "--discovery-ttl"),
])
def test_bad_worker_discovery_flags_are_usage_errors(tiny_model, flags, words):
    r = run_duet("worker", "--model", tiny_model, *flags, timeout=30)
    assert r.returncode == 2, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("duet: error:") and words in lines[0], r.stderr


def test_a_step_log_that_cannot_be_written_fails_at_start(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("DUET_WORKER_SECRET", "a worker secret of enough bytes")
    missing = str(tmp_path / "no" / "steps.jsonl")
    for command in (["serve", "--port", "0"],
                    ["worker", "--frontend", "127.0.0.1:9", "--role", "colocated"]):
        r = run_duet(*command, "--model", tiny_model, "--step-log", missing, timeout=30)
        assert r.returncode == 1, r
        assert f"--step-log: {missing}: cannot open for writing" in r.stderr, r.stderr


def test_a_worker_with_no_frontend_to_reach_fails_saying_so(tiny_model, monkeypatch):
    monkeypatch.setenv("DUET_WORKER_SECRET", "a worker secret of enough bytes")
    # Nothing listens on the discard port of loopback: the worker gives up after its timeout.
    r = run_duet("worker", "--model", tiny_model, "--frontend", "127.0.0.1:9", "--role",
                 "colocated", "--threads", "1", "--connect-timeout", "0.5", timeout=30)
    assert r.returncode == 1, r
    assert "reaching the frontend" in r.stderr and "127.0.0.1:9" in r.stderr, r.stderr

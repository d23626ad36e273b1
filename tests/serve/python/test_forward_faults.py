"""A forward pass that fails ends the requests of its step with an error, and the server keeps
serving (issue 41, part 6). The test-only hook DUET_FAULT_INJECTION_FAIL_FORWARD_WHILE
(docs/development.md) makes every forward pass of a real `duet serve` fail while a file exists;
the tests create and remove it. A stream then gets a last choice chunk with finish_reason
"error", an error chunk (internal_error) and [DONE]; a whole reply a 500 error. /metrics counts
the failed steps, no KV block stays in use, and once the file is gone the same request gets the
same reply as before. With engine threads and with a worker process (which must not exit)."""

import json

import openai
import pytest

from conftest import cluster_file, sse_events, wait_for

HOOK = "DUET_FAULT_INJECTION_FAIL_FORWARD_WHILE"
PROMPT = "The quick brown fox"


def colocated_cluster(tmp_path):
    """tests/data/1p1d-tiny.json with one colocated instance in place of its PD pair."""
    with open("../../data/1p1d-tiny.json") as f:
        doc = json.load(f)
    doc["instances"] = [{"role": "colocated", "count": 1, "tp": 1, "node": 0}]
    path = tmp_path / "1colo-tiny.json"
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.fixture(params=["thread", "process", "pd-threads"])
def faulty(request, tiny_model, start_server, tmp_path, monkeypatch):
    """A server whose forward passes fail while the returned switch file exists: a colocated
    engine thread, a colocated worker process, or a prefill and a decode engine thread."""
    switch = tmp_path / "fail-forward"
    monkeypatch.setenv(HOOK, str(switch))  # inherited by duet serve and its worker
    args = ["--threads", "1"]
    if request.param == "thread":
        args += ["--workers", "thread"]
    elif request.param == "process":
        args += ["--workers", "process", "--cluster", colocated_cluster(tmp_path)]
    else:
        args += ["--workers", "thread", "--cluster", cluster_file(tmp_path, 1, 1)]
    s = start_server(tiny_model, *args)
    yield s, switch
    switch.unlink(missing_ok=True)
    s.assert_idle()
    log = s.stderr()
    for sign in ["exited (status", ") lost: "]:
        assert sign not in log, log
    assert s.stop() == 0, s.stderr()


def failures(server):
    m = server.metrics()
    return (m["duet:forward_failures_total"],
            m['duet:request_success_total{finished_reason="error"}'])


def streamed(server, path, body):
    """The SSE payloads of one streamed request (raw HTTP), and the status."""
    conn = server.connection()
    try:
        conn.request("POST", path, body=json.dumps(dict(body, stream=True)),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, sse_events(resp)
    finally:
        conn.close()


def check_failed_stream(status, events):
    assert status == 200, events
    assert events[-1] == "[DONE]", events
    error = json.loads(events[-2])["error"]
    assert error["type"] == "internal_error", error
    assert "the forward pass failed" in error["message"], error
    last = json.loads(events[-3])
    assert last["choices"][0]["finish_reason"] == "error", last
    # Every earlier choice chunk was still open.
    for event in events[:-3]:
        for choice in json.loads(event)["choices"]:
            assert choice["finish_reason"] is None, event


def test_a_failed_forward_pass_ends_its_requests_with_an_error_and_the_server_serves_on(faulty):
    s, switch = faulty
    client = s.client()
    before = client.completions.create(model=s.model, prompt=PROMPT, max_tokens=8, temperature=0)
    assert before.choices[0].finish_reason in ("stop", "length")
    assert failures(s) == (0, 0)

    switch.touch()
    # Streamed, completions and chat: the finish chunk says "error", then the error chunk.
    check_failed_stream(*streamed(s, "/v1/completions",
                                  {"model": s.model, "prompt": PROMPT, "max_tokens": 8}))
    check_failed_stream(*streamed(s, "/v1/chat/completions", {
        "model": s.model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}))
    # The openai client sees the finish reason, then raises on the error chunk.
    reasons = []
    with pytest.raises(openai.APIError, match="the forward pass failed"):
        for chunk in client.completions.create(model=s.model, prompt=PROMPT, max_tokens=8,
                                               temperature=0, stream=True):
            reasons += [c.finish_reason for c in chunk.choices]
    assert reasons and reasons[-1] == "error", reasons
    # Not streamed: a 500 with the error body.
    status, _, body = s.request("POST", "/v1/completions",
                                {"model": s.model, "prompt": PROMPT, "max_tokens": 8})
    assert status == 500, body
    error = json.loads(body)["error"]
    assert error["type"] == "internal_error" and "the forward pass failed" in error["message"]
    with pytest.raises(openai.InternalServerError):
        client.completions.create(model=s.model, prompt=PROMPT, max_tokens=8, temperature=0)

    # One request at a time: each failed in its first step, which held it alone. The engines
    # publish the count after the step, a moment after the reply.
    wait_for(lambda: failures(s) == (5, 5), 15, lambda: failures(s))
    s.assert_idle()

    switch.unlink()
    after = client.completions.create(model=s.model, prompt=PROMPT, max_tokens=8, temperature=0)
    assert after.choices[0].text == before.choices[0].text
    assert after.choices[0].finish_reason == before.choices[0].finish_reason
    assert s.proc.poll() is None
    status, _, body = s.request("GET", "/health")
    assert status == 200, body
    assert failures(s) == (5, 5)


def test_a_stream_in_flight_gets_its_text_then_the_error(slow_model, start_server, tmp_path,
                                                         monkeypatch):
    """Passes start failing while a stream decodes: its text so far, then the error."""
    switch = tmp_path / "fail-forward"
    monkeypatch.setenv(HOOK, str(switch))
    s = start_server(slow_model, "--threads", "1")
    conn = s.connection()
    # The bench model decodes tens of tokens a second on one thread: 400 take many seconds,
    # far longer than the test needs to create the file after the first chunk.
    conn.request("POST", "/v1/completions", body=json.dumps(
        {"model": s.model, "prompt": PROMPT, "max_tokens": 400, "ignore_eos": True,
         "stream": True}), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    first = b""
    while b"\n\n" not in first:  # each read waits at most the connection's timeout
        chunk = resp.read1(65536)
        assert chunk, first
        first += chunk
    switch.touch()
    rest = b""
    while chunk := resp.read1(65536):
        rest += chunk
    conn.close()
    events = [e[len(b"data: "):].decode() for e in (first + rest).split(b"\n\n") if e]
    check_failed_stream(200, events)
    text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-2])
    assert text, events[:3]
    wait_for(lambda: failures(s) == (1, 1), 15, lambda: failures(s))
    s.assert_idle()
    switch.unlink()
    reply = s.client().completions.create(model=s.model, prompt=PROMPT, max_tokens=4,
                                          temperature=0)
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert s.stop() == 0, s.stderr()

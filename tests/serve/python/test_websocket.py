"""The same replies over WebSocket (/v1/ws) with the `websockets` client: one JSON request per
text message ({"endpoint": ..., ...the HTTP body}), each chunk a text message, "[DONE]" last;
errors as a JSON message ({"error": ..., "status": ...}) followed by "[DONE]"; several
requests on one connection, one after another."""

import json

import pytest
from websockets.sync.client import connect

from conftest import generate


def ws_url(server):
    return server.url.replace("http://", "ws://") + "/v1/ws"


def exchange(ws, request, timeout=60):
    """Sends one request; returns its messages up to (without) [DONE]."""
    ws.send(json.dumps(request))
    messages = []
    while True:
        m = ws.recv(timeout=timeout)
        assert isinstance(m, str)
        if m == "[DONE]":
            return messages
        messages.append(json.loads(m))


def test_completion_stream_equals_http_and_duet_generate(server):
    expected, prompt_tokens = generate(server.model, "Hello there", 12)
    with connect(ws_url(server)) as ws:
        chunks = exchange(ws, {"endpoint": "/v1/completions", "model": server.model,
                               "prompt": "Hello there", "max_tokens": 12, "temperature": 0,
                               "stream_options": {"include_usage": True}})
    assert all(c["object"] == "text_completion" for c in chunks)
    choice_chunks = [c for c in chunks if c["choices"]]
    assert "".join(c["choices"][0]["text"] for c in choice_chunks) == expected
    assert choice_chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["prompt_tokens"] == prompt_tokens
    assert chunks[-1]["duet"]["instance"] == 0


def test_chat_stream_and_whole_reply_on_one_connection(server):
    expected, _ = generate(server.model, "Hi there", 8, chat=True)
    request = {"endpoint": "/v1/chat/completions", "messages": [
        {"role": "user", "content": "Hi there"}], "max_tokens": 8, "temperature": 0}
    with connect(ws_url(server)) as ws:
        chunks = exchange(ws, request)
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == expected
        assert "duet" in chunks[-1]
        whole = exchange(ws, dict(request, stream=False))
        assert len(whole) == 1
        assert whole[0]["object"] == "chat.completion"
        assert whole[0]["choices"][0]["message"]["content"] == expected
        assert whole[0]["usage"]["completion_tokens"] >= 1


def test_pipelined_requests_are_answered_in_order(server):
    with connect(ws_url(server)) as ws:
        for i in range(3):
            ws.send(json.dumps({"endpoint": "/v1/completions", "prompt": f"Number {i}",
                                "max_tokens": 3 + i, "temperature": 0, "ignore_eos": True,
                                "stream": False}))
        for i in range(3):
            reply = json.loads(ws.recv(timeout=60))
            assert reply["usage"]["completion_tokens"] == 3 + i
            assert ws.recv(timeout=60) == "[DONE]"


@pytest.mark.parametrize("message,status,param", [
    ("not json", 400, None),
    (json.dumps([1]), 400, None),
    (json.dumps({"prompt": "x"}), 400, "endpoint"),
    (json.dumps({"endpoint": "/v1/embeddings", "prompt": "x"}), 404, "endpoint"),
    (json.dumps({"endpoint": "/v1/completions", "prompt": "x", "n": 3}), 400, "n"),
    (json.dumps({"endpoint": "/v1/completions", "prompt": "x", "model": "other"}), 404, "model"),
    (json.dumps({"endpoint": "/v1/chat/completions", "messages": []}), 400, "messages"),
])
def test_errors_are_messages_and_the_connection_stays_usable(server, message, status, param):
    with connect(ws_url(server)) as ws:
        ws.send(message)
        error = json.loads(ws.recv(timeout=30))
        assert error["status"] == status
        assert error["error"]["param"] == param
        assert error["error"]["type"] == "invalid_request_error"
        assert ws.recv(timeout=30) == "[DONE]"
        ok = exchange(ws, {"endpoint": "/v1/completions", "prompt": "Hi", "max_tokens": 2})
        assert ok[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_binary_messages_are_refused(server):
    with connect(ws_url(server)) as ws:
        ws.send(b'{"endpoint": "/v1/completions", "prompt": "x"}')
        error = json.loads(ws.recv(timeout=30))
        assert error["status"] == 400 and "text" in error["error"]["message"]
        assert ws.recv(timeout=30) == "[DONE]"


def test_upgrade_elsewhere_is_refused(server):
    from websockets.exceptions import InvalidStatus
    with pytest.raises(InvalidStatus) as e:
        connect(server.url.replace("http://", "ws://") + "/v1/completions")
    assert e.value.response.status_code == 404
    status, _, _ = server.request("GET", "/v1/ws")  # not an upgrade
    assert status == 400

"""Many streams at once: 64 concurrent streamed completions through the openai client and 16
concurrent WebSocket connections all complete with the text each prompt gives alone (greedy,
so batching must not change it), and the server ends idle with no KV block in use."""

import json
from concurrent.futures import ThreadPoolExecutor

from websockets.sync.client import connect

N_STREAMS = 64


def prompt(i):
    return f"Request {i}: tell me about item {i * 7 % 13}"


def test_64_concurrent_streams_complete_with_correct_text(server):
    client = server.client()
    # References one at a time, not streamed.
    expected = [client.completions.create(model=server.model, prompt=prompt(i), max_tokens=16,
                                          temperature=0).choices[0].text
                for i in range(N_STREAMS)]

    def stream(i):
        chunks = list(server.client().completions.create(
            model=server.model, prompt=prompt(i), max_tokens=16, temperature=0, stream=True,
            stream_options={"include_usage": True}))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        return text, chunks[-1].usage.completion_tokens

    with ThreadPoolExecutor(N_STREAMS) as pool:
        results = list(pool.map(stream, range(N_STREAMS)))
    assert [text for text, _ in results] == expected
    assert all(1 <= tokens <= 16 for _, tokens in results)
    server.assert_idle()


def test_concurrent_websocket_connections(server):
    url = server.url.replace("http://", "ws://") + "/v1/ws"
    client = server.client()
    expected = [client.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": prompt(i)}], max_tokens=8,
        temperature=0).choices[0].message.content for i in range(16)]

    def run(i):
        with connect(url) as ws:
            ws.send(json.dumps({"endpoint": "/v1/chat/completions", "temperature": 0,
                                "max_tokens": 8,
                                "messages": [{"role": "user", "content": prompt(i)}]}))
            text = ""
            while (m := ws.recv(timeout=60)) != "[DONE]":
                choices = json.loads(m)["choices"]
                if choices:
                    text += choices[0]["delta"].get("content", "")
            return text

    with ThreadPoolExecutor(16) as pool:
        assert list(pool.map(run, range(16))) == expected

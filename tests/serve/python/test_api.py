"""The OpenAI endpoints of `duet serve` driven by the official openai client on the tiny test
model: completions and chat completions, streamed and not; greedy output equal to `duet
generate`; usage; the `duet` extension field; stop strings; sampling settings; /v1/models,
/health, /metrics."""

import json

import pytest

from conftest import generate, sse_events

PROMPTS = ["Hello there", "The quick brown fox jumps over", "Once upon a time, in a land"]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_completion_greedy_equals_duet_generate(server, prompt):
    expected, prompt_tokens = generate(server.model, prompt, 12)
    reply = server.client().completions.create(model=server.model, prompt=prompt, max_tokens=12,
                                               temperature=0)
    assert reply.object == "text_completion"
    assert reply.id.startswith("cmpl-")
    assert reply.model == server.model
    assert len(reply.choices) == 1
    choice = reply.choices[0]
    assert choice.text == expected
    assert choice.index == 0
    assert choice.finish_reason in ("length", "stop")
    assert reply.usage.prompt_tokens == prompt_tokens
    if choice.finish_reason == "length":
        assert reply.usage.completion_tokens == 12
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    duet = reply.model_extra["duet"]
    assert duet["instance"] == 0
    # The frontend's part (parsing, hashing) is within the queue time, both from arrival.
    assert duet["prefill_done_ms"] >= duet["queue_ms"] >= duet["frontend_ms"] > 0
    assert duet["kv_transfer_ms"] is None and duet["kv_transfer_bytes"] is None  # colocated


@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_chat_greedy_equals_duet_generate_chat(server, prompt):
    expected, prompt_tokens = generate(server.model, prompt, 10, chat=True)
    client = server.client()
    reply = client.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": prompt}], max_tokens=10,
        temperature=0)
    assert reply.object == "chat.completion"
    assert reply.id.startswith("chatcmpl-")
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == expected
    assert reply.usage.prompt_tokens == prompt_tokens
    assert reply.model_extra["duet"]["instance"] == 0

    # Streamed: the role first, then content, finish_reason only on the last choice chunk,
    # then the usage chunk with no choices.
    chunks = list(client.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": prompt}], max_tokens=10,
        temperature=0, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    choice_chunks = [c for c in chunks if c.choices]
    assert all(c.choices[0].finish_reason is None for c in choice_chunks[:-1])
    assert choice_chunks[-1].choices[0].finish_reason == reply.choices[0].finish_reason
    assert all(c.choices[0].delta.role is None for c in choice_chunks[1:])
    text = "".join(c.choices[0].delta.content or "" for c in choice_chunks)
    assert text == expected
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage.prompt_tokens == prompt_tokens
    assert usage_chunk.usage.completion_tokens == reply.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])
    assert usage_chunk.model_extra["duet"]["instance"] == 0


def test_completion_stream_with_usage(server):
    client = server.client()
    whole = client.completions.create(model=server.model, prompt=PROMPTS[0], max_tokens=16,
                                      temperature=0, extra_body={"ignore_eos": True})
    chunks = list(client.completions.create(
        model=server.model, prompt=PROMPTS[0], max_tokens=16, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert all(c.object == "text_completion" for c in chunks)
    choice_chunks = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in choice_chunks) == whole.choices[0].text
    assert choice_chunks[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in choice_chunks[:-1])
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 16
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    assert chunks[-1].model_extra["duet"]["queue_ms"] >= 0
    assert "duet" not in (choice_chunks[-1].model_extra or {})


def test_continuous_usage_stats_count_every_chunk(server):
    # vLLM's extension: each chunk's usage counts the tokens generated up to it.
    chunks = list(server.client().completions.create(
        model=server.model, prompt=PROMPTS[0], max_tokens=16, temperature=0, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        extra_body={"ignore_eos": True}))
    choice_chunks = [c for c in chunks if c.choices]
    counts = [c.usage.completion_tokens for c in choice_chunks]
    assert all(c.usage.prompt_tokens == chunks[-1].usage.prompt_tokens for c in choice_chunks)
    assert counts == sorted(counts) and counts[0] >= 1 and counts[-1] == 16
    assert chunks[-1].usage.completion_tokens == 16
    # Without it, only the last chunk has a usage.
    plain = list(server.client().completions.create(
        model=server.model, prompt=PROMPTS[0], max_tokens=4, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert all(c.usage is None for c in plain[:-1])


def test_sse_framing_and_duet_field_without_usage(server):
    conn = server.connection()
    conn.request("POST", "/v1/completions", headers={"Content-Type": "application/json"},
                 body=json.dumps({"prompt": PROMPTS[1], "max_tokens": 8, "temperature": 0,
                                  "stream": True}))
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.getheader("Transfer-Encoding") == "chunked"
    events = sse_events(resp)
    conn.close()
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] in ("stop", "length")
    assert last["duet"]["instance"] == 0 and last["duet"]["queue_ms"] >= 0
    assert all("duet" not in c and "usage" not in c for c in chunks[:-1])
    assert list(chunks[0])[:5] == ["id", "object", "created", "model", "choices"]


def test_keep_alive_serves_requests_one_after_another(server):
    conn = server.connection()
    replies = []
    for stream in (False, True, False):
        conn.request("POST", "/v1/completions", headers={"Content-Type": "application/json"},
                     body=json.dumps({"prompt": "Hi", "max_tokens": 3, "stream": stream}))
        resp = conn.getresponse()
        assert resp.status == 200
        replies.append(sse_events(resp) if stream else json.loads(resp.read()))
    conn.close()
    assert replies[1][-1] == "[DONE]"
    assert replies[2]["usage"]["completion_tokens"] <= 3


def long_text(server, prompt, tokens=40):
    reply = server.client().completions.create(
        model=server.model, prompt=prompt, max_tokens=tokens, temperature=0,
        extra_body={"ignore_eos": True})
    return reply.choices[0].text, reply.usage.completion_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_cuts_the_text_and_ends_the_request(server, stream):
    full, full_tokens = long_text(server, PROMPTS[2])
    assert len(full) >= 12, full
    stop = full[len(full) // 2: len(full) // 2 + 3]
    expected = full[: full.find(stop)]
    client = server.client()
    kwargs = dict(model=server.model, prompt=PROMPTS[2], max_tokens=40, temperature=0,
                  stop=[stop, "never appears \u2603"], extra_body={"ignore_eos": True})
    if stream:
        chunks = list(client.completions.create(stream=True,
                                                stream_options={"include_usage": True}, **kwargs))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        usage = chunks[-1].usage
    else:
        reply = client.completions.create(**kwargs)
        text, finish, usage = reply.choices[0].text, reply.choices[0].finish_reason, reply.usage
    assert text == expected
    assert finish == "stop"
    assert 1 <= usage.completion_tokens < full_tokens


def test_chat_stop_string(server):
    client = server.client()
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me."}]
    full = client.chat.completions.create(model=server.model, messages=msgs, max_tokens=30,
                                          temperature=0, extra_body={"ignore_eos": True})
    text = full.choices[0].message.content
    assert len(text) >= 8, text
    stop = text[4:6]
    cut = client.chat.completions.create(model=server.model, messages=msgs, max_tokens=30,
                                         temperature=0, stop=stop,
                                         extra_body={"ignore_eos": True})
    assert cut.choices[0].message.content == text[: text.find(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_seeded_sampling_repeats_and_settings_take_effect(server):
    client = server.client()

    def sample(top_k=None, **kw):
        extra = {"ignore_eos": True}
        if top_k is not None:
            extra["top_k"] = top_k
        return client.completions.create(model=server.model, prompt=PROMPTS[0], max_tokens=16,
                                         extra_body=extra, **kw).choices[0].text

    a = sample(temperature=1.0, seed=7)
    assert a == sample(temperature=1.0, seed=7)
    assert sample(temperature=0) == sample(temperature=0.7, top_k=1)
    # Different seeds at a high temperature over 16 tokens of a 519-token vocabulary.
    assert len({sample(temperature=1.5, seed=s) for s in range(4)}) > 1


def test_default_max_tokens_fills_the_context(server):
    models = server.client().models.list()
    max_len = models.data[0].model_extra["max_model_len"]
    reply = server.client().completions.create(model=server.model, prompt="Hi",
                                               extra_body={"ignore_eos": True}, temperature=0)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.prompt_tokens + reply.usage.completion_tokens == max_len


def test_prompt_as_token_ids(server):
    reply = server.client().completions.create(model=server.model, prompt=[5, 6, 7, 8],
                                               max_tokens=4, temperature=0)
    assert reply.usage.prompt_tokens == 4
    again = server.client().completions.create(model=server.model, prompt=[[5, 6, 7, 8]],
                                               max_tokens=4, temperature=0)
    assert again.choices[0].text == reply.choices[0].text


def test_model_name_is_optional_and_harmless_fields_are_ignored(server):
    status, _, body = server.request("POST", "/v1/completions", {
        "prompt": "Hi", "max_tokens": 2, "user": "someone", "metadata": {"k": "v"},
        "n": 1, "logprobs": None, "frequency_penalty": 0, "stream": False})
    assert status == 200, body


def test_models_health_and_metrics(server):
    models = server.client().models.list()
    assert [m.id for m in models.data] == [server.model]
    assert models.data[0].model_extra["max_model_len"] == 256  # the test model's context
    status, _, body = server.request("GET", "/health")
    assert status == 200 and body == b""
    status, headers, body = server.request("GET", "/metrics")
    assert status == 200
    assert headers["content-type"].startswith("text/plain; version=0.0.4")
    text = body.decode()
    for name in ["duet:num_requests_running", "duet:num_requests_waiting",
                 "duet:kv_cache_usage_perc", "duet:kv_blocks_used", "duet:kv_blocks_free",
                 "duet:prompt_tokens_total", "duet:generation_tokens_total",
                 "duet:request_success_total", "duet:prefix_cache_queries_total",
                 "duet:prefix_cache_hits_total", "duet:time_to_first_token_seconds",
                 "duet:inter_token_latency_seconds", "duet:e2e_request_latency_seconds",
                 "duet:request_queue_time_seconds"]:
        assert f"# TYPE {name} " in text, name


def test_metrics_count_what_was_served(server):
    before = server.metrics()
    client = server.client()
    for _ in range(2):  # the same prompt twice: the second hits the prefix cache
        client.completions.create(model=server.model, prompt="A shared prefix " * 6,
                                  max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
    after = server.wait_metric('duet:request_success_total{finished_reason="length"}',
                               lambda v: v >= before['duet:request_success_total{finished_reason="length"}'] + 2)
    assert after["duet:generation_tokens_total"] - before["duet:generation_tokens_total"] == 10
    assert after["duet:prompt_tokens_total"] > before["duet:prompt_tokens_total"]
    assert after["duet:prefix_cache_hits_total"] > before["duet:prefix_cache_hits_total"]
    assert (after["duet:time_to_first_token_seconds_count"]
            == before["duet:time_to_first_token_seconds_count"] + 2)
    assert (after["duet:inter_token_latency_seconds_count"]
            == before["duet:inter_token_latency_seconds_count"] + 8)
    server.assert_idle()

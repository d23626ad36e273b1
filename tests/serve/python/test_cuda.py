"""`duet serve --device cuda` driven by the official openai client: the bench model (~125M,
bf16) answers streamed and non-streamed completions and chat completions on the GPU, the
stream is what the whole reply is, and greedy text equals the CPU server's. Where no CUDA
device (or no CUDA build) is present the tests skip, saying so."""

import pytest

PROMPT = "The history of computing is the history of people who wanted answers faster"
TOKENS = 32


@pytest.fixture(scope="module")
def cuda_server(slow_model, start_server):
    try:
        s = start_server(slow_model, "--device", "cuda", "--kv-blocks", "256")
    except AssertionError as e:
        if "no CUDA device" in str(e) or "no CUDA backend" in str(e):
            pytest.skip(f"duet-test-skip: needs a CUDA device and a CUDA build ({e})")
        raise
    yield s
    s.assert_idle()
    assert s.stop() == 0, s.stderr()


def test_streamed_completion_on_the_gpu_is_the_whole_reply(cuda_server):
    client = cuda_server.client()
    whole = client.completions.create(model=cuda_server.model, prompt=PROMPT, max_tokens=TOKENS,
                                      temperature=0, extra_body={"ignore_eos": True})
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == TOKENS
    chunks = list(client.completions.create(
        model=cuda_server.model, prompt=PROMPT, max_tokens=TOKENS, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    choice_chunks = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in choice_chunks) == whole.choices[0].text
    assert choice_chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == TOKENS
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_greedy_text_on_the_gpu_equals_the_cpu(cuda_server, slow_model, start_server):
    cpu = start_server(slow_model, "--kv-blocks", "256")
    request = dict(prompt=PROMPT, max_tokens=TOKENS, temperature=0,
                   extra_body={"ignore_eos": True})
    expected = cpu.client().completions.create(model=cpu.model, **request).choices[0].text
    assert cpu.stop() == 0, cpu.stderr()
    actual = cuda_server.client().completions.create(model=cuda_server.model,
                                                     **request).choices[0].text
    assert actual == expected


def test_streamed_chat_on_the_gpu(cuda_server):
    chunks = list(cuda_server.client().chat.completions.create(
        model=cuda_server.model, messages=[{"role": "user", "content": PROMPT}],
        max_tokens=TOKENS, temperature=0, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    choice_chunks = [c for c in chunks if c.choices]
    assert choice_chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == TOKENS

"""`duet serve --cluster` with PD instances, as engine threads of one process or as a worker
process each: prefill instances hand each prompt's KV to a decode instance, which pulls it
through a real transport (loopback between threads; UCX over tcp and over shared memory).
Greedy replies, plain and streamed, equal the colocated server's token for token; /metrics counts one KV transfer per request that decodes, and no lease, failure or block
is left behind; a reply's `duet` field says how long its KV took and how many bytes moved. A
cluster file that cannot be served is an error naming it."""

import json
import time
from pathlib import Path

import pytest

from conftest import cluster_file, has_ucx, run_duet

PROMPTS = ["Hello", "The quick brown fox jumps over the lazy dog and keeps on running",
           "one two three four five six seven eight nine ten eleven twelve thirteen fourteen",
           "a"]
MAX_TOKENS = [1, 7, 12, 3]


def replies(server, stream):
    client = server.client()
    texts = []
    for prompt, max_tokens in zip(PROMPTS, MAX_TOKENS):
        args = dict(model=server.model, prompt=prompt, max_tokens=max_tokens, temperature=0)
        if stream:
            chunks = list(client.completions.create(stream=True, **args))
            assert chunks[-1].choices[0].finish_reason == "length"
            texts.append("".join(c.choices[0].text for c in chunks))
        else:
            r = client.completions.create(**args)
            assert r.choices[0].finish_reason == "length"
            assert r.usage.completion_tokens == max_tokens
            texts.append(r.choices[0].text)
    return texts


@pytest.fixture(scope="module")
def colocated(tiny_model, start_server):
    s = start_server(tiny_model, "--threads", "1")
    texts = replies(s, stream=False)
    assert s.stop() == 0, s.stderr()
    return texts


@pytest.mark.parametrize("layout", [(1, 1), (2, 2)], ids=["1p1d", "2p2d"])
@pytest.mark.parametrize("transport", [
    ["--workers", "thread", "--kv-transport", "loopback"],
    ["--workers", "thread", "--kv-transport", "ucx", "--ucx-tls", "tcp"],
    ["--workers", "thread", "--kv-transport", "ucx", "--ucx-tls", "posix,cma"],
    ["--workers", "process", "--ucx-tls", "tcp"],
    ["--workers", "process", "--ucx-tls", "posix,cma"]],
    ids=["threads-loopback", "threads-ucx-tcp", "threads-ucx-shm", "processes-ucx-tcp",
         "processes-ucx-shm"])
def test_pd_replies_equal_the_colocated_server(tiny_model, start_server, colocated, tmp_path,
                                               layout, transport):
    prefill, decode = layout
    if "loopback" not in transport and not has_ucx():
        pytest.skip("this build has no UCX (libucx-dev): PD over UCX is not tested")
    s = start_server(tiny_model, "--threads", "1",
                     "--cluster", cluster_file(tmp_path, prefill, decode), *transport)
    assert f"{prefill} prefill + {decode} decode instances" in s.ready_line, s.ready_line
    if "process" in transport:
        assert "a worker process each" in s.ready_line, s.ready_line
    assert replies(s, stream=False) == colocated
    assert replies(s, stream=True) == colocated
    # The reply's own account of its KV: every prompt token's keys and values, in the model's
    # dtype, moved after its prefill and before its first decode.
    config = json.loads((Path(tiny_model) / "config.json").read_text())
    dtype_bytes = {"float32": 4, "bfloat16": 2, "float16": 2}[config["torch_dtype"]]
    per_token = (config["num_hidden_layers"] * 2 * config["num_key_value_heads"] *
                 config["head_dim"] * dtype_bytes)
    sent = time.monotonic()
    r = s.client().completions.create(model=s.model, prompt=PROMPTS[1], max_tokens=4,
                                      temperature=0)
    elapsed_ms = (time.monotonic() - sent) * 1000
    duet = r.model_extra["duet"]
    assert duet["kv_transfer_bytes"] == r.usage.prompt_tokens * per_token, duet
    # Both times count from the request's arrival at the server: the transfer ended within
    # what the client waited for the whole reply.
    assert duet["prefill_done_ms"] >= duet["queue_ms"] >= 0, duet
    assert 0 <= duet["kv_transfer_ms"] <= elapsed_ms - duet["prefill_done_ms"], (duet, elapsed_ms)
    s.assert_idle()
    m = s.metrics()
    decoding = sum(1 for n in MAX_TOKENS if n > 1)
    assert m["duet:kv_transfer_seconds_count"] == 2 * decoding + 1
    # And in its parts, which add up to it. Worker processes stamp the end of the prefill and
    # the message's arrival on two clocks: each transfer's whole and its message part are off by
    # up to both workers' clock errors (and read 0 where that takes them below it).
    parts = [f'{{part="{part}"}}' for part in ("message", "wait", "pull")]
    for part in parts:
        assert m["duet:kv_transfer_part_seconds_count" + part] == 2 * decoding + 1, part
    parts_s = sum(m["duet:kv_transfer_part_seconds_sum" + part] for part in parts)
    clocks_s = sum(v for k, v in m.items() if k.startswith("duet:worker_clock_error_seconds{"))
    assert (abs(parts_s - m["duet:kv_transfer_seconds_sum"]) <=
            (2 * decoding + 1) * clocks_s + 1e-6), (parts_s, clocks_s, m)
    assert m["duet:kv_leases_held"] == 0
    assert m["duet:kv_leases_expired_total"] == 0
    assert m["duet:kv_load_failures_total"] == 0
    assert s.stop() == 0, s.stderr()


def test_a_cluster_file_that_cannot_be_served_is_an_error(tiny_model, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x", "instances": [')
    r = run_duet("serve", "--model", tiny_model, "--port", "0", "--cluster", str(bad), timeout=30)
    assert r.returncode == 1, r
    assert str(bad) in r.stderr and r.stderr.startswith("duet: error:"), r.stderr
    # UCX refuses a transport list it does not know; the server does not start.
    if not has_ucx():
        pytest.skip("this build has no UCX (libucx-dev): the UCX case is not tested")
    for workers in ["thread", "process"]:
        r = run_duet("serve", "--model", tiny_model, "--port", "0", "--threads", "1",
                     "--cluster", "../../data/1p1d-tiny.json", "--workers", workers,
                     "--kv-transport", "ucx", "--ucx-tls", "no-such-transport", timeout=60)
        assert r.returncode == 1, r
        assert "KV transport" in r.stderr, r.stderr

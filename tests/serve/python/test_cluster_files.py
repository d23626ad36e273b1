"""`duet serve --cluster` reads a cluster file's deployment (instances, roles, engine settings)
with the simulator's own parser (deploy/), and hands every engine setting to its worker processes
through the same codec (issue 41). So a cluster file that `duet simulate` accepts is served, by
engine threads and by worker processes alike, with settings far from their defaults (a
watermark of 0.6 used to simulate fine and leave `duet serve` restarting its workers until it
gave up); a file the simulator refuses, serve refuses at start with the same message."""

import json
import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import cluster_file, has_ucx, run_duet

# Every engine setting away from its default, within the bounds both worlds share.
ENGINE = {
    "block_tokens": 32,
    "max_num_batched_tokens": 1 << 30,
    "max_num_seqs": 7,
    "watermark": 0.6,
    "overlap_tier_loads": False,
    "gpu_memory_utilization": 0.5,
    "reserved_gib": 0.125,
    "kv_cache_dtype": "float16",
    "enable_prefix_caching": False,
    "coalesce_decode_steps": False,
    "kv_lease_s": 30.5,
    "kv_load_failure_policy": "recompute",
}
KV_BLOCKS = 50


def colocated(path):
    """The same file with two colocated instances instead of prefill and decode."""
    with open(path) as f:
        doc = json.load(f)
    doc["instances"] = [{"role": "colocated", "count": 2, "tp": 1, "node": 0}]
    doc["nodes"][0]["gpus"] = 2
    out = path.replace(".json", "-colocated.json")
    with open(out, "w") as f:
        json.dump(doc, f)
    return out


def simulate(path, tmp_path):
    return run_duet("simulate", "--cluster", path, "--out", str(tmp_path / "sim"), timeout=300)


@pytest.mark.parametrize("layout", ["colocated", "1p1d"])
@pytest.mark.parametrize("workers", ["thread", "process"])
def test_a_cluster_file_the_simulator_accepts_is_served(tiny_model, start_server, tmp_path,
                                                         workers, layout):
    if layout == "1p1d" and not has_ucx():
        pytest.skip("this build has no UCX (libucx-dev): PD is not served across processes")
    path = cluster_file(tmp_path, 1, 1, **ENGINE)
    if layout == "colocated":
        path = colocated(path)
    simulated = simulate(path, tmp_path)
    assert simulated.returncode == 0, simulated.stderr

    args = ["--cluster", path, "--workers", workers, "--threads", "1",
            "--kv-blocks", str(KV_BLOCKS)]
    s = start_server(tiny_model, *args)
    # Requests may hold the blocks the watermark leaves (50 blocks less 30, of 32 tokens), within
    # the model's context.
    with open(os.path.join(tiny_model, "config.json")) as f:
        context = json.load(f)["max_position_embeddings"]
    assert f"max_model_len {min(context, (KV_BLOCKS - 30) * 32)})" in s.ready_line, s.ready_line
    client = s.client()
    for i in range(3):
        reply = client.completions.create(model=s.model, prompt=f"Request {i}: once upon a time",
                                          max_tokens=24, temperature=0)
        assert reply.choices[0].finish_reason in ("stop", "length"), reply
        assert reply.usage.completion_tokens >= 1
    s.assert_idle()
    log = s.stderr()
    assert "restart" not in log and "refused" not in log, log
    assert s.stop() == 0, s.stderr()


@pytest.mark.parametrize("engine, words", [
    ({"watermark": 1.5}, ["engine", "'watermark'", "[0, 1)"]),
    ({"kv_cache_dtype": "int4"}, ["'kv_cache_dtype'", "int4"]),
    ({"max_num_sqs": 8}, ["unknown setting", "max_num_sqs"]),
])
def test_a_cluster_file_the_simulator_refuses_serve_refuses_alike(tiny_model, tmp_path, engine,
                                                                  words):
    path = cluster_file(tmp_path, 1, 1, **engine)
    simulated = simulate(path, tmp_path)
    assert simulated.returncode != 0
    served = run_duet("serve", "--model", tiny_model, "--cluster", path, "--port", "0",
                      timeout=120)
    assert served.returncode != 0
    message = simulated.stderr.strip().splitlines()[-1]
    for w in words:
        assert w in message, message
    # The simulator's message, word for word, past its command's prefix.
    assert message.split(": ", 1)[1] in served.stderr, (message, served.stderr)


def test_stop_strings_and_the_record_survive_the_worker_wire(tiny_model, start_server, tmp_path):
    """Through a prefill and a decode worker process: a stop string cuts the text where the
    engine threads' server cuts it, and the reply's record (queue, prefill, KV transfer) is the
    workers' (the request's whole record now travels on the wire)."""
    if not has_ucx():
        pytest.skip("this build has no UCX (libucx-dev): PD is not served across processes")
    path = cluster_file(tmp_path, 1, 1)
    prompt = "Request 7: tell me a story about the sea"
    replies = {}
    for workers in ("thread", "process"):
        s = start_server(tiny_model, "--cluster", path, "--workers", workers, "--threads", "1")
        client = s.client()
        full = client.completions.create(model=s.model, prompt=prompt, max_tokens=40,
                                         temperature=0, extra_body={"ignore_eos": True})
        text = full.choices[0].text
        assert len(text) >= 12, text
        stop = text[len(text) // 2: len(text) // 2 + 3]
        cut = client.completions.create(model=s.model, prompt=prompt, max_tokens=40,
                                        temperature=0, stop=[stop],
                                        extra_body={"ignore_eos": True})
        replies[workers] = (text, stop, cut.choices[0].text, cut.choices[0].finish_reason)
        duet = cut.model_extra["duet"]
        assert duet["instance"] == 1, duet  # the decode instance finished it
        for key in ("queue_ms", "prefill_done_ms", "kv_transfer_ms"):
            assert duet[key] is not None and duet[key] >= 0, duet
        assert duet["kv_transfer_bytes"] > 0, duet
        s.assert_idle()
        assert s.stop() == 0, s.stderr()
    text, stop, cut, finish = replies["process"]
    assert replies["process"] == replies["thread"]
    assert cut == text[: text.find(stop)] and finish == "stop"


@pytest.mark.parametrize("layout", ["colocated", "1p1d"])
@pytest.mark.parametrize("workers", ["thread", "process"])
def test_async_steps_stream_the_synchronous_tokens_and_stop_where_they_do(tiny_model,
                                                                           start_server, tmp_path,
                                                                           workers, layout):
    """engine.async_steps (issue 43): concurrent greedy streams, each stopping at a different
    step (a stop token id taken from the synchronous run's tokens), get the synchronous server's
    text token for token, and nothing sampled past their stop. The simulator runs the same file."""
    if layout == "1p1d" and workers == "process" and not has_ucx():
        pytest.skip("this build has no UCX (libucx-dev): PD is not served across processes")
    deploy = colocated if layout == "colocated" else (lambda path: path)
    sync_path = deploy(cluster_file(tmp_path, 1, 1))
    async_dir = tmp_path / "async"
    async_dir.mkdir()
    async_path = deploy(cluster_file(async_dir, 1, 1, async_steps=True))
    simulated = simulate(async_path, tmp_path)
    assert simulated.returncode == 0, simulated.stderr

    prompts = [f"Request {i}: a story about the number {i * 7}" for i in range(6)]

    def serve(path, stops):
        s = start_server(tiny_model, "--cluster", path, "--workers", workers, "--threads", "1")
        client = s.client()

        def one(i):
            extra = {"ignore_eos": True, "return_token_ids": True}
            if stops:
                extra["stop_token_ids"] = [stops[i]]
            reply = client.completions.create(model=s.model, prompt=prompts[i], max_tokens=16,
                                              temperature=0, extra_body=extra)
            choice = reply.choices[0]
            return choice.text, choice.finish_reason, reply.usage.completion_tokens, \
                choice.model_extra.get("token_ids")

        with ThreadPoolExecutor(len(prompts)) as pool:
            replies = list(pool.map(one, range(len(prompts))))
        s.assert_idle()
        assert s.stop() == 0, s.stderr()
        return replies

    full = serve(sync_path, None)
    # Request i stops at its token i + 2 (request 5 at its 7th); a stop id seen earlier in
    # its stream stops it there, as in the synchronous run.
    stops = [ids[i + 2] for i, (_, _, _, ids) in enumerate(full)]
    assert all(ids is not None and len(ids) == 16 for _, _, _, ids in full), full
    expected = serve(sync_path, stops)
    got = serve(async_path, stops)
    assert got == expected
    assert all(finish == "stop" for _, finish, _, _ in got), got
    assert sorted({tokens for _, _, tokens, _ in got}) != [got[0][2]], "all stopped alike"


@pytest.mark.parametrize("edit, words", [
    (lambda doc: doc["instances"][0].update(tp=2), ["instance p0 has tp 2 and dp 1"]),
    (lambda doc: doc["instances"][1].update(dp=2), ["instance d0 has tp 1 and dp 2"]),
    (lambda doc: doc.update(speculative={"method": "draft", "draft_model": "tiny-test",
                                         "num_speculative_tokens": 2, "acceptance_rate": 0.5}),
     ["speculative decoding is simulated only"]),
])
def test_what_only_the_simulator_prices_serve_refuses_at_start(tiny_model, tmp_path, edit, words):
    """A parallel layout or speculative decoding simulates, and serve says at start that no
    backend runs it, rather than serving something else under its name."""
    path = cluster_file(tmp_path, 1, 1)
    with open(path) as f:
        doc = json.load(f)
    doc["nodes"][0]["gpus"] = 2
    edit(doc)
    with open(path, "w") as f:
        json.dump(doc, f)
    simulated = simulate(path, tmp_path)
    assert simulated.returncode == 0, simulated.stderr
    served = run_duet("serve", "--model", tiny_model, "--cluster", path, "--port", "0",
                      timeout=120)
    assert served.returncode == 2, served.stderr
    for w in words:
        assert w in served.stderr, served.stderr

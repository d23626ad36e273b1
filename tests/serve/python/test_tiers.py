"""KV offload in the live server (issue 42): `duet serve --cluster` with a cluster file's "tiers"
runs the simulator's tier policies (policies/kv_tiers.h) against real host memory, block files
and a redis-server. The instance's KV cache is made too small to keep a prompt's blocks while
two other prompts are served, so the prompt's prefix comes back from the tier: its reply is the
same, token for token, as from a server without tiers, and its `duet` field and /metrics say
which tier served how many tokens. A tier that lost the blocks (a corrupt block file, a
redis-server killed) costs a recomputation, never a wrong token or a stuck request."""

import json
import os
import re
import signal
import socket
import subprocess
import time

import pytest

from conftest import run_duet, wait_for

KV_BLOCKS = 12  # of 16 tokens: each prompt below fits, the three together do not
MiB = 1 / 1024  # in GiB
# Three prompts of the tiny test model's tokenizer, 3 to 5 blocks each.
A = "alpha beta gamma delta " * 5
B = "one two three four five " * 5
C = "red green blue yellow " * 5
TIERS = ["dram", "ssd", "remote"]


def tier_file(tmp_path, model, tiers):
    """tests/data/2colo-tiny-dram.json with one colocated instance of `model` and `tiers`."""
    with open("../../data/2colo-tiny-dram.json") as f:
        doc = json.load(f)
    doc["model"] = model
    doc["instances"] = [{"role": "colocated", "count": 1, "tp": 1, "node": 0}]
    doc["engine"]["overlap_tier_loads"] = False  # what the live server runs
    doc["tiers"] = tiers
    path = tmp_path / "tiers.json"
    path.write_text(json.dumps(doc))
    return str(path)


def one_tier(kind, tmp_path, redis_port=None, io="mmap"):
    """A cluster file's "tiers" with `kind` alone, room for 8 MiB of blocks."""
    spec = {"capacity_gib": 8 * MiB, "placement": "write-through"}
    if kind == "ssd":
        spec.update(read_GBps=1, write_GBps=1, directory=str(tmp_path / "ssd"), io=io)
    if kind == "remote":
        spec.update(bandwidth_GBps=1, endpoint=f"127.0.0.1:{redis_port}")
    return {kind: spec}


class Redis:
    """A redis-server of the test's own on a free loopback port, without persistence."""

    def __init__(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = None
        self.start()

    def start(self):
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def answers():
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    return s.recv(16).startswith(b"+PONG")
            except OSError:
                return False
        wait_for(answers, 10, "redis-server did not start (scripts/setup.sh installs it)")

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            self.kill()


@pytest.fixture
def redis():
    r = Redis()
    yield r
    r.stop()


def settled_block_files(directory, timeout=15):
    """The block files in `directory` once no write is in progress there: no .partial file, and
    the same files in two listings 100 ms apart."""
    deadline = time.monotonic() + timeout
    before = None
    while True:
        names = sorted(os.listdir(directory))
        if before == names and not any(n.endswith(".partial") for n in names):
            return [directory / n for n in names]
        assert time.monotonic() < deadline, f"tier writes still in progress: {names}"
        before = names
        time.sleep(0.1)


def complete(server, prompt):
    """A greedy completion of 8 tokens: (text, the reply's duet field, usage)."""
    r = server.client().completions.create(model=server.model, prompt=prompt, max_tokens=8,
                                           temperature=0)
    return r.choices[0].text, r.model_extra["duet"], r.usage


def serve_with_tiers(start_server, model, path):
    return start_server(model, "--cluster", path, "--workers", "thread", "--threads", "1",
                        "--kv-blocks", str(KV_BLOCKS))


@pytest.fixture(scope="module")
def expected(tiny_model, start_server):
    """What a server without tiers answers to A, B and C."""
    s = start_server(tiny_model, "--threads", "1", "--kv-blocks", str(KV_BLOCKS))
    texts = {p: complete(s, p)[0] for p in (A, B, C)}
    assert s.stop() == 0, s.stderr()
    return texts


@pytest.mark.parametrize("kind", TIERS)
def test_a_prefix_forced_out_of_the_kv_cache_comes_back_from_the_tier_unchanged(
        tiny_model, start_server, tmp_path, expected, kind, redis):
    path = tier_file(tmp_path, tiny_model, one_tier(kind, tmp_path, redis.port))
    s = serve_with_tiers(start_server, tiny_model, path)
    first, duet, _ = complete(s, A)
    assert first == expected[A]
    assert duet["tier_hit_tokens"] == {"dram": 0, "ssd": 0, "remote": 0}, duet
    assert complete(s, B)[0] == expected[B]
    assert complete(s, C)[0] == expected[C]  # A's blocks are gone from the KV cache now
    again, duet, usage = complete(s, A)
    assert again == expected[A], "served from the tier, the same tokens"
    # Blocks go from the KV cache tail first: its head may still be there, the rest comes from
    # the tier. All of A's full blocks are served from one or the other.
    hit = duet["tier_hit_tokens"][kind]
    assert hit >= 16, duet["tier_hit_tokens"]
    assert usage.prompt_tokens_details.cached_tokens == (usage.prompt_tokens - 1) // 16 * 16, usage
    m = s.metrics()
    assert m[f'duet:prefix_cache_tier_hits_total{{tier="{kind}"}}'] == hit
    s.assert_idle()
    assert s.stop() == 0, s.stderr()
    if kind == "ssd":
        assert len(os.listdir(tmp_path / "ssd")) > 0, "the block files stay for the next server"


@pytest.mark.parametrize("kind,io", [("ssd", "mmap"), ("ssd", "io_uring"), ("remote", None)])
def test_a_restarted_server_finds_the_blocks_its_predecessor_left(
        tiny_model, start_server, tmp_path, expected, kind, io, redis):
    path = tier_file(tmp_path, tiny_model, one_tier(kind, tmp_path, redis.port, io))
    s = serve_with_tiers(start_server, tiny_model, path)
    assert complete(s, A)[0] == expected[A]
    assert s.stop() == 0, s.stderr()
    s = serve_with_tiers(start_server, tiny_model, path)
    found = re.search(rf"KV tier {kind}: (\d+) blocks found from before are served again",
                      s.stderr())
    assert found and int(found.group(1)) >= 4, s.stderr()  # A's prompt, and its reply's
    text, duet, _ = complete(s, A)
    assert text == expected[A]
    assert duet["tier_hit_tokens"][kind] >= 4 * 16, duet
    assert s.stop() == 0, s.stderr()


def test_corrupt_block_files_are_recomputed_never_served(tiny_model, start_server, tmp_path,
                                                         expected):
    path = tier_file(tmp_path, tiny_model, one_tier("ssd", tmp_path))
    s = serve_with_tiers(start_server, tiny_model, path)
    for p in (A, B, C):
        assert complete(s, p)[0] == expected[p]
    # Every block file: one bit of its payload flipped, once the tier wrote them all (a reply
    # does not wait for its blocks' copies: the I/O thread writes them after).
    files = settled_block_files(tmp_path / "ssd")
    assert files
    for f in files:
        data = bytearray(f.read_bytes())
        data[100] ^= 1
        f.write_bytes(bytes(data))
    text, duet, usage = complete(s, A)
    assert text == expected[A], "recomputed, not served from a corrupt file"
    assert duet["tier_hit_tokens"]["ssd"] == 0, duet
    # Recomputed blocks are written again, and served the next time.
    complete(s, B), complete(s, C)
    text, duet, _ = complete(s, A)
    assert text == expected[A]
    assert duet["tier_hit_tokens"]["ssd"] > 0, duet
    s.assert_idle()
    assert s.stop() == 0, s.stderr()


def test_a_killed_redis_costs_recomputation_and_a_restarted_one_is_used_again(
        tiny_model, start_server, tmp_path, expected, redis):
    path = tier_file(tmp_path, tiny_model, one_tier("remote", tmp_path, redis.port))
    s = serve_with_tiers(start_server, tiny_model, path)
    for p in (A, B, C):
        assert complete(s, p)[0] == expected[p]
    redis.kill()
    text, duet, _ = complete(s, A)
    assert text == expected[A], "the load failed: recomputed"
    assert duet["tier_hit_tokens"]["remote"] == 0, duet
    for p in (B, C):
        assert complete(s, p)[0] == expected[p], "no request is lost while the store is down"
    redis.start()  # empty: it kept nothing
    time.sleep(1)  # past the tier's wait before it reconnects
    for p in (A, B, C, A):
        text, duet, _ = complete(s, p)
        assert text == expected[p]
    assert duet["tier_hit_tokens"]["remote"] > 0, duet
    s.assert_idle()
    assert s.stop() == 0, s.stderr()


def test_a_prefix_one_instance_computed_is_served_to_another_from_the_shared_dram(
        tiny_model, start_server, tmp_path, expected):
    # Two instances on one node share its DRAM tier, as in the simulator. Round-robin sends the
    # second A to the instance that has never seen it.
    path = tier_file(tmp_path, tiny_model, one_tier("dram", tmp_path))
    doc = json.loads(open(path).read())
    doc["instances"][0]["count"] = 2
    doc["nodes"][0]["gpus"] = 2
    with open(path, "w") as f:
        json.dump(doc, f)
    s = start_server(tiny_model, "--cluster", path, "--workers", "thread", "--threads", "1",
                     "--kv-blocks", str(KV_BLOCKS), "--router", "round-robin")
    text, first, _ = complete(s, A)
    assert text == expected[A]
    text, duet, usage = complete(s, A)
    assert text == expected[A]
    assert duet["instance"] != first["instance"]
    full = (usage.prompt_tokens - 1) // 16 * 16
    assert duet["tier_hit_tokens"] == {"dram": full, "ssd": 0, "remote": 0}, duet
    s.assert_idle()
    assert s.stop() == 0, s.stderr()


def test_pd_with_offload_serves_a_repeated_prefix_from_dram_on_the_prefill_side(
        tiny_model, start_server, tmp_path, expected):
    # 1P1D on engine threads: the prefill instance writes what it computes through to DRAM and
    # loads it back when the prefix returns; the decode instance pulls the KV as always.
    with open("../../data/1p1d-tiny-dram.json") as f:
        doc = json.load(f)
    doc["model"] = tiny_model
    doc["engine"]["overlap_tier_loads"] = False
    doc["tiers"] = one_tier("dram", tmp_path)
    path = tmp_path / "pd-dram.json"
    path.write_text(json.dumps(doc))
    s = start_server(tiny_model, "--cluster", str(path), "--workers", "thread", "--threads", "1",
                     "--kv-blocks", str(KV_BLOCKS))
    for p in (A, B, C):
        assert complete(s, p)[0] == expected[p]
    text, duet, _ = complete(s, A)
    assert text == expected[A]
    assert duet["tier_hit_tokens"]["dram"] >= 16, duet["tier_hit_tokens"]
    assert duet["kv_transfer_bytes"] > 0, duet
    s.assert_idle()
    assert s.stop() == 0, s.stderr()


def test_write_back_from_the_gpu_is_refused_at_start_saying_why(tiny_model, tmp_path):
    tiers = one_tier("dram", tmp_path)
    tiers["dram"]["placement"] = "write-back"
    r = run_duet("serve", "--model", tiny_model, "--cluster",
                 tier_file(tmp_path, tiny_model, tiers), "--workers", "thread", "--port", "0")
    assert r.returncode != 0
    assert "tiers.dram: placement 'write-back' from the GPU is not served live yet" in r.stderr


@pytest.mark.parametrize("engine, message", [
    ({"overlap_tier_loads": None}, "tiers: served live with engine.overlap_tier_loads false only"),
    ({"async_steps": True}, "tiers: not served with engine.async_steps yet"),
])
def test_engine_settings_not_served_with_tiers_are_refused_at_start_saying_why(
        tiny_model, tmp_path, engine, message):
    path = tier_file(tmp_path, tiny_model, one_tier("dram", tmp_path))
    doc = json.loads(open(path).read())
    for key, value in engine.items():
        if value is None:
            del doc["engine"][key]  # its default: overlap_tier_loads is true by default
        else:
            doc["engine"][key] = value
    with open(path, "w") as f:
        json.dump(doc, f)
    r = run_duet("serve", "--model", tiny_model, "--cluster", path, "--workers", "thread",
                 "--port", "0")
    assert r.returncode != 0
    assert message in r.stderr

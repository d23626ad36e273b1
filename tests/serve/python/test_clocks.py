"""Worker processes whose clocks are not the frontend's: each worker runs in a Linux time
namespace of its own (`unshare --time --monotonic`), so its monotonic clock reads tens of
thousands of seconds more than the frontend's, as another host's would. The worker link's clock
probes set each worker's clock to the frontend's: every TTFT and KV transfer time the server
reports stays within what the client saw, the prefill worker's KV leases are read right by the
decode worker on another clock, greedy text equals the colocated server's, and /health reports
each worker's offset (the shift between the namespaces, measured) and its error bound."""

import subprocess
import threading
import time

import pytest

from conftest import DUET, cluster_file, free_port, has_ucx, health, stop_processes, wait_for

PROMPTS = [f"Request {i}: tell me a story about the sea" for i in range(6)]
MAX_TOKENS = 24
SECRET = "the worker secret of the clock test"
# Seconds each worker's monotonic clock is ahead of the frontend's.
SHIFTS = {"prefill": 20_000, "decode": 50_000}


@pytest.fixture(scope="module", autouse=True)
def needs_time_namespaces():
    if not has_ucx():
        pytest.skip("this build has no UCX (libucx-dev): PD worker processes are not tested")
    r = subprocess.run(["unshare", "--time", "--monotonic", "1000", "cat", "/proc/uptime"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip("duet-test-skip: no time namespaces here (unshare --time needs root and "
                    "Linux 5.6): "
                    f"{r.stderr.strip()}")



def shifted_worker(role, model, port, secret_file, shift):
    """`duet worker` in a time namespace whose monotonic clock reads `shift` seconds more."""
    return subprocess.Popen(["unshare", "--time", "--monotonic", str(shift), DUET, "worker",
                             "--frontend", f"127.0.0.1:{port}", "--role", role, "--model", model,
                             "--threads", "1", "--ucx-tls", "tcp",
                             "--worker-secret-file", secret_file],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def stream(client, model, prompt):
    """A greedy stream: (text, seconds from the send to the first chunk with text)."""
    sent = time.monotonic()
    first = None
    text = ""
    for chunk in client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS,
                                           temperature=0, stream=True):
        piece = chunk.choices[0].text if chunk.choices else ""
        if piece and first is None:
            first = time.monotonic() - sent
        text += piece
    return text, first


def test_workers_on_clocks_of_their_own_report_times_on_the_frontends(tiny_model, start_server,
                                                                       tmp_path):
    colocated = start_server(tiny_model, "--threads", "1", "--workers", "thread")
    expected = [colocated.client().completions.create(model=colocated.model, prompt=p,
                                                      max_tokens=MAX_TOKENS,
                                                      temperature=0).choices[0].text
                for p in PROMPTS]
    assert colocated.stop() == 0, colocated.stderr()

    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    port = free_port()
    # The workers retry until the frontend listens; the frontend is ready once both joined.
    workers = [shifted_worker(role, tiny_model, port, str(secret), shift)
               for role, shift in SHIFTS.items()]
    try:
        s = start_server(tiny_model, "--threads", "1", "--ucx-tls", "tcp",
                         "--cluster", cluster_file(tmp_path, 1, 1), "--spawn-workers", "false",
                         "--worker-port", str(port), "--worker-secret-file", str(secret))
        # Each worker measured its offset to the frontend's clock: they differ by the shift
        # between the two namespaces, within the two bounds.
        listed = wait_for(lambda: (lambda h: h if all("clock_error_s" in w for w in h) else None)(
            health(s)), 15, lambda: health(s))
        by_role = {w["role"]: w for w in listed}
        bound = by_role["prefill"]["clock_error_s"] + by_role["decode"]["clock_error_s"]
        assert bound < 0.2, listed  # half a probe's round trip, each: small, unless loaded
        apart = by_role["prefill"]["clock_offset_s"] - by_role["decode"]["clock_offset_s"]
        assert abs(apart - (SHIFTS["decode"] - SHIFTS["prefill"])) <= bound + 1e-3, listed

        client = s.client()
        results = [None] * len(PROMPTS)

        def run(i):
            results[i] = stream(client, s.model, PROMPTS[i])

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(PROMPTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert [r[0] for r in results] == expected, s.stderr()
        client_ttfts = [r[1] for r in results]

        m = s.wait_metric("duet:time_to_first_token_seconds_count", lambda v: v == len(PROMPTS))
        # The server's TTFT runs from its arrival stamp (after the client sent) to the first
        # token on the worker's clock (before the client got it): within what the client saw,
        # give or take the worker's clock error. Without the probes it would be ~20000 s off.
        # The bound on each worker's clock error grows with drift between its probes: the larger
        # of the two workers' summed bounds listed at the start and read now holds over the run.
        bound = max(bound, sum(v for k, v in m.items()
                               if k.startswith("duet:worker_clock_error_seconds{")))
        ttft_sum = m["duet:time_to_first_token_seconds_sum"]
        assert 0 <= ttft_sum <= sum(client_ttfts) + len(PROMPTS) * bound, (ttft_sum, client_ttfts)
        # The KV transfer runs from the prefill worker's clock to the decode worker's.
        assert m["duet:kv_transfer_seconds_count"] == len(PROMPTS)
        assert 0 <= m["duet:kv_transfer_seconds_sum"] <= sum(client_ttfts), m
        # Its parts add up to it: the message's (from one worker's clock to the other's) within
        # the clocks' error, each read at 0 where it came out below.
        parts = [f'{{part="{part}"}}' for part in ("message", "wait", "pull")]
        for part in parts:
            assert m["duet:kv_transfer_part_seconds_count" + part] == len(PROMPTS), part
        parts_s = sum(m["duet:kv_transfer_part_seconds_sum" + part] for part in parts)
        assert abs(parts_s - m["duet:kv_transfer_seconds_sum"]) <= len(PROMPTS) * bound + 1e-6, m
        # The decode worker read each prefill lease's end on its own clock, and found it valid.
        assert m["duet:kv_load_failures_total"] == 0
        assert m["duet:kv_leases_expired_total"] == 0
        e2e = m["duet:e2e_request_latency_seconds_sum"]
        assert 0 <= e2e <= 120 * len(PROMPTS), e2e
        assert m['duet:worker_clock_error_seconds{instance="0",role="prefill"}'] < 0.2
        s.assert_idle()
        assert s.stop() == 0, s.stderr()
    finally:
        stop_processes(workers)

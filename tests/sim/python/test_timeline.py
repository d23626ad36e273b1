"""`duet simulate --timeline` read back by Perfetto's own trace processor (perfetto_tp.py): the
trace parses without an import error, and holds every engine step, KV transfer and tier I/O of
the run with the tokens and bytes the run's other outputs report, the flows from prefill over
the transfer to decode, and each request's lifecycle with its end-to-end latency."""
import csv
import json
import os
import subprocess

from perfetto_tp import trace_processor

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
DUET = os.environ.get("DUET_BIN", os.path.join(ROOT, "build", "bin", "duet"))


def simulate(tmp_path, cluster, trace):
    out, timeline = tmp_path / "out", tmp_path / "timeline.json"
    subprocess.run([DUET, "simulate", "--cluster", cluster, "--trace", trace, "--out", str(out),
                    "--timeline", str(timeline), "--progress", "never"],
                   cwd=ROOT, check=True, capture_output=True)
    summary = json.load(open(out / "summary.json"))
    rows = list(csv.DictReader(open(out / "requests.csv")))
    return summary, rows, str(timeline)


def slices_of(tp, process):
    """Slices on the thread tracks of `process`, with their track's name and args."""
    return list(tp.query(f"""
        select s.id, s.name, s.ts, s.dur, t.name as track,
               extract_arg(s.arg_set_id, 'args.prefill_tokens') as prefill_tokens,
               extract_arg(s.arg_set_id, 'args.decode_tokens') as decode_tokens,
               extract_arg(s.arg_set_id, 'args.bytes') as bytes
        from slice s join thread_track tt on s.track_id = tt.id join thread t using (utid)
             join process p using (upid)
        where p.name = '{process}'"""))


def test_pd_run_with_a_dram_tier_is_all_there(tmp_path):
    s, rows, timeline = simulate(tmp_path, "tests/data/1p1d-tiny-dram.json",
                                 "traces/bundled/tiny.json")
    completed = [r for r in rows if r["status"] == "completed"]
    assert len(completed) == len(rows) == 40
    with trace_processor(timeline) as tp:
        errors = list(tp.query("select name, idx, value from stats "
                               "where severity in ('error', 'data_loss') and value > 0"))
        assert errors == [], [(e.name, e.value) for e in errors]

        # Every step, on its instance's track: prompt tokens computed (PD: the prompt less its
        # cache hits) and decode tokens (all but the first, which prefill produced).
        steps = slices_of(tp, "instances")
        assert len(steps) == s["sim"]["engine_steps"]
        assert {x.track for x in steps} == {"p0", "d0"}
        assert all(x.decode_tokens == 0 for x in steps if x.track == "p0")
        assert all(x.prefill_tokens == 0 for x in steps if x.track == "d0")
        assert sum(x.prefill_tokens for x in steps) == sum(
            int(r["input_tokens"]) - int(r["cached_tokens"]) for r in completed)
        assert sum(x.decode_tokens for x in steps) == sum(
            int(r["output_tokens"]) - 1 for r in completed)
        assert all(x.dur > 0 for x in steps)

        # Every KV transfer, with its bytes, on the p0 -> d0 route.
        transfers = slices_of(tp, "KV transfers")
        assert len(transfers) == s["kv_transfer"]["transfers"] == 40
        assert {x.track for x in transfers} == {"p0 -> d0"}
        assert sum(x.bytes for x in transfers) == s["kv_transfer"]["bytes"]

        # Two flow arrows per transfer: prefill step -> transfer -> decode step.
        flows = list(tp.query("""
            select so.name as src, si.name as dst from flow f
            join slice so on f.slice_out = so.id join slice si on f.slice_in = si.id"""))
        assert len(flows) == 2 * len(transfers)
        hops = sorted((f.src.split(" ")[0], f.dst.split(" ")[0]) for f in flows)
        assert hops == sorted([("prefill", "kv")] * 40 + [("kv", "decode")] * 40)

        # Every tier I/O the summary counts.
        ios = slices_of(tp, "KV tiers")
        dram = s["tiers"]["dram"]
        assert len(ios) == dram["read_ios"] + dram["write_ios"] > 0
        assert sum(x.bytes for x in ios) == dram["read_bytes"] + dram["write_bytes"]

        # Each request's lifecycle: the whole request for its E2E, its phases inside it.
        requests = list(tp.query("""
            select name, dur, depth from slice where category = 'request' and depth = 0"""))
        assert len(requests) == s["requests"]["total"]
        e2e_ms = {f"request {r['request_id']}": float(r["e2e_ms"]) for r in completed}
        for r in requests:
            assert abs(r.dur / 1e6 - e2e_ms[r.name]) < 0.002, r.name
        phases = {p.name: p.n for p in tp.query("""
            select name, count(*) as n from slice
            where category = 'request' and depth = 1 group by name""")}
        assert phases == {"queued": 40, "prefill": 40, "kv transfer": 40, "decode": 40}
        # Inside each KV transfer its parts, as requests.csv gives them, adding up to it.
        transfer_ms = {p.request: p.dur / 1e6 for p in tp.query("""
            select s.dur, r.name as request from slice s join slice r on s.parent_id = r.id
            where s.category = 'request' and s.name = 'kv transfer'""")}
        parts = list(tp.query("""
            select s.name, s.dur, r.name as request from slice s
            join slice t on s.parent_id = t.id join slice r on t.parent_id = r.id
            where s.category = 'request' and s.depth = 2 and t.name = 'kv transfer'"""))
        assert len(parts) == 3 * 40
        csv_ms = {f"request {r['request_id']}": r for r in completed}
        sums = {}
        for p in parts:
            column = {"kv message": "kv_message_ms", "kv wait": "kv_wait_ms",
                      "kv pull": "kv_pull_ms"}[p.name]
            assert abs(p.dur / 1e6 - float(csv_ms[p.request][column])) < 0.002, (p.request, p.name)
            sums[p.request] = sums.get(p.request, 0) + p.dur / 1e6
        assert sums.keys() == transfer_ms.keys()
        for request, ms in transfer_ms.items():
            assert abs(sums[request] - ms) < 1e-5, request

"""bench/goal_matrix.py, the table of issue 44's done-when in docs/validation.md, on the
validation.json of a real run (`bench/validate_trace.sh mooncake colocated` of 2026-12-03, its
six goal metrics kept): the cells and counts the docs show, and a clear error with nothing
written for a run it cannot read."""
import json
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]
RUN = pathlib.Path(__file__).resolve().parent / "data" / "mooncake_colocated"


def goal_matrix(*args):
    return subprocess.run([sys.executable, str(ROOT / "bench/goal_matrix.py"), *args],
                          capture_output=True, text=True, timeout=60)


def test_each_miss_is_marked_with_its_spread_and_its_part():
    run = goal_matrix(f"Mooncake colocated={RUN}", f"again={RUN}")
    assert run.returncode == 0, run.stderr
    rows = run.stdout.splitlines()
    assert rows[0] == ("| run | load | ttft.p50 | tpot.p50 | e2e.p50 | ttft.p99 | tpot.p99 | "
                       "e2e.p99 |")
    # Within; a miss where the runs agree closer than the tolerance, put down to the machine's
    # drift; one they do not, put down to the step costs and hand-over; one no part brings within.
    assert rows[3] == ("| Mooncake colocated | x0.5 | +13.0 x [3.7!] drift +3.7 | "
                       "+8.6 x [11.2] step costs, hand-over -2.6 | +18.7 x [9.9] drift +4.5 | "
                       "+9.0 | -2.3 | +3.9 |")
    assert rows[2].startswith("| Mooncake colocated | x0.25 | +3.7 | "
                              "-10.4 x [9.1] none (nearest step costs -9.6) | -1.1 |")
    assert len([r for r in rows if r.startswith("| again | ")]) == 3
    assert rows[-1] == ("28 of 36 within; missed where the live runs differ by less than the "
                        "tolerance: 2 (2 put down to a part, 0 not); where they differ by as "
                        "much or more: 6 (4 put down to a part, 2 not)")


def test_a_metric_without_a_tolerance_is_not_counted(tmp_path):
    report = json.loads((RUN / "validation.json").read_text())
    for load in report["loads"]:
        del load["metrics"]["tpot_ms.p99"]["within"]
    (tmp_path / "validation.json").write_text(json.dumps(report))
    run = goal_matrix(f"r={tmp_path}")
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[4] == "| r | x1 | -3.7 | +2.9 | -2.8 | -2.0 | n/a | -1.3 |"
    assert run.stdout.splitlines()[-1].startswith("11 of 15 within;")


def test_a_run_without_a_goal_fails_before_any_table(tmp_path):
    report = json.loads((RUN / "validation.json").read_text())
    del report["loads"][2]["goal"]
    (tmp_path / "validation.json").write_text(json.dumps(report))
    run = goal_matrix(f"good={RUN}", f"bad={tmp_path}")
    assert run.returncode != 0
    assert run.stdout == ""  # not the good run's rows either
    assert f"{tmp_path / 'validation.json'}: the load x1 holds no goal" in run.stderr


def test_unreadable_runs_and_bad_arguments_fail_saying_why(tmp_path):
    run = goal_matrix(f"missing={tmp_path}")
    assert run.returncode != 0 and run.stdout == ""
    assert str(tmp_path / "validation.json") in run.stderr
    (tmp_path / "validation.json").write_text('{"loads": [')
    run = goal_matrix(f"cut={tmp_path}")
    assert run.returncode != 0 and run.stdout == ""
    assert str(tmp_path / "validation.json") in run.stderr
    for args in ([], [str(RUN)]):  # no run, or one without its LABEL=
        run = goal_matrix(*args)
        assert run.returncode != 0 and "usage: bench/goal_matrix.py LABEL=DIR" in run.stderr

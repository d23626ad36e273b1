#!/usr/bin/env python3
"""Issue 44's done-when as one table: several `duet validate --tolerance ...` runs (their
validation.json, e.g. bench/validate_trace.sh's WORK/validation) side by side, each load a row,
the p50 and p99 of TTFT, TPOT and E2E its columns. A cell gives the error the goal holds (%);
a miss is marked `x`, with the live runs' spread in brackets (`!` where it is below the
tolerance: a miss the runs' own noise does not excuse) and the part `duet validate`'s `goal`
puts it down to (the first simulation pricing one more part as it ran live that is within the
tolerance, with its error), else `none` and the nearest one's error. Then the counts.

Usage: bench/goal_matrix.py LABEL=DIR [LABEL=DIR ...]  (DIR holds validation.json)"""
import json
import os
import sys

METRICS = ["ttft_ms.p50", "tpot_ms.p50", "e2e_ms.p50", "ttft_ms.p99", "tpot_ms.p99", "e2e_ms.p99"]
# validate's parts (cli/validate_report.cpp's kParts), by a word for a table cell.
PARTS = {
    "at_live_speed": "drift",
    "at_machine_speed": "machine speed",
    "as_live": "step costs",
    "at_live_send": "send times",
    "as_live_hand_over": "step costs, hand-over",
    "as_live_at_live_send": "step costs, send times",
}


def pct(value):
    return f"{value:+.1f}"


def cell(metric, miss):
    if miss is None:
        return pct(metric[metric["tolerance_at"]])
    spread = miss["live_spread_pct"]
    text = f"{pct(miss['error_pct'])} x"
    if spread is not None:
        text += f" [{spread:.1f}{'!' if miss['spread_below_tolerance'] else ''}]"
    if miss["within_when"] is not None:
        return f"{text} {PARTS.get(miss['within_when'], miss['within_when'])} " \
               f"{pct(miss['within_when_error_pct'])}"
    if miss["nearest"] is not None:
        return f"{text} none (nearest {PARTS.get(miss['nearest'], miss['nearest'])} " \
               f"{pct(miss['nearest_error_pct'])})"
    return f"{text} none"


def main(args):
    if not args or any("=" not in a for a in args):
        sys.exit("usage: " + __doc__.split("Usage: ")[1])
    runs = []  # every file read and checked before a line is written
    for arg in args:
        label, directory = arg.split("=", 1)
        path = os.path.join(directory, "validation.json")
        try:
            with open(path) as f:
                report = json.load(f)
        except (OSError, ValueError) as e:
            sys.exit(f"{path}: {e}")
        for load in report["loads"]:
            if "goal" not in load:
                sys.exit(f"{path}: the load x{load['rate_scale']:g} holds no goal (run with "
                         "--tolerance)")
        runs.append((label, report))
    print("| run | load | " + " | ".join(m.replace("_ms", "") for m in METRICS) + " |")
    print("| --- | --- |" + " --- |" * len(METRICS))
    counts = {"held": 0, "within": 0, "noise": [0, 0], "below": [0, 0]}
    for label, report in runs:
        for load in report["loads"]:
            misses = {m["metric"]: m for m in load["goal"]["missed"]}
            cells = []
            for name in METRICS:
                metric = load["metrics"].get(name)
                if metric is None or "within" not in metric:
                    cells.append("n/a")
                    continue
                miss = misses.get(name)
                counts["held"] += 1
                if miss is None:
                    counts["within"] += 1
                else:
                    which = counts["below" if miss["spread_below_tolerance"] else "noise"]
                    which[0 if miss["within_when"] is not None else 1] += 1
                cells.append(cell(metric, miss))
            print(f"| {label} | x{load['rate_scale']:g} | " + " | ".join(cells) + " |")
    below, noise = counts["below"], counts["noise"]
    print(f"\n{counts['within']} of {counts['held']} within; missed where the live runs differ by "
          f"less than the tolerance: {sum(below)} ({below[0]} put down to a part, {below[1]} not); "
          f"where they differ by as much or more: {sum(noise)} ({noise[0]} put down to a part, "
          f"{noise[1]} not)")


if __name__ == "__main__":
    main(sys.argv[1:])

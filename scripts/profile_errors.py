#!/usr/bin/env python3
"""Held-out error of the bundled step profiles, as a Markdown table (docs/calibration.md).

For every profile under sim/profiles/ made from aiconfigurator's databases (or the files named),
one row per TP degree: the fit's mean and max error on the shapes held out of the fit, per shape
class, beside the roofline's mean error on the same shapes (`duet calibrate --roofline`).
"""

import json
import pathlib
import sys

CLASSES = ("prefill", "decode", "mixed")


def cell(errors: dict, name: str, with_max: bool = True) -> str:
    e = errors.get(name, {})
    if not e.get("shapes"):
        return "–"
    text = f"{e['mean_pct']:.1f}%"
    return f"{text} ({e['max_pct']:.1f}%)" if with_max else text


def main() -> int:
    root = pathlib.Path(__file__).resolve().parent.parent
    paths = [pathlib.Path(p) for p in sys.argv[1:]] or sorted((root / "sim/profiles").glob("*.json"))
    print("| GPU | model | TP | shapes held out | prefill | decode | mixed "
          "| roofline prefill / decode / mixed |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for path in paths:
        doc = json.loads(path.read_text())
        if doc["source"].get("measured_by", {}).get("package") != "aiconfigurator-core":
            continue
        device = doc["device"]
        model = path.stem[len(device) + 1:]
        for fit in doc["fits"]:
            held, roof = fit["held_out_error"], fit.get("roofline_held_out_error", {})
            shapes = sum(held.get(c, {}).get("shapes", 0) for c in CLASSES)
            print(f"| {device} | {model} | {fit['tp']} | {shapes} | "
                  + " | ".join(cell(held, c) for c in CLASSES) + " | "
                  + " / ".join(cell(roof, c, False) for c in CLASSES) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

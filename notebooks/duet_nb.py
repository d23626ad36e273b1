"""What the notebooks share: where duet, the shared traces, the work directory and the figure
directory are, running `duet sweep` / `duet plan` (the logic is in duet; the notebooks only
plot), and saving a figure. notebooks/run.py sets the directories through the environment:
DUET_BIN, DUET_WORK (runs; default out/notebooks), DUET_FIGURES (default docs/figures)."""
import json
import os
import pathlib
import subprocess

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
DUET = os.environ.get("DUET_BIN", str(ROOT / "build" / "bin" / "duet"))
WORK = pathlib.Path(os.environ.get("DUET_WORK", ROOT / "out" / "notebooks"))
FIGURES = pathlib.Path(os.environ.get("DUET_FIGURES", ROOT / "docs" / "figures"))
MOONCAKE = ROOT.parent / "shared" / "traces" / "mooncake_conversation.jsonl"

plt.rcParams.update({"figure.dpi": 100, "savefig.dpi": 100, "font.size": 9,
                     "axes.grid": True, "grid.alpha": 0.3})


def duet(*args):
    """Runs duet from the repository root; its output if it succeeded, else an error."""
    run = subprocess.run([DUET, *map(str, args)], cwd=ROOT, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"duet {' '.join(map(str, args))} failed:\n{run.stdout}{run.stderr}")
    return run.stdout


def sweep(scenario, *extra):
    """`duet sweep` of a scenario file: its results.csv as a DataFrame (`run`: each run's
    directory, with its summary.json and requests.csv)."""
    name = pathlib.Path(scenario).stem
    out = WORK / name
    duet("sweep", "--scenario", scenario, "--out", out, "--progress", "never", *extra)
    df = pd.read_csv(out / "results.csv")
    df["run"] = [out / r for r in df["run"]]
    return df


def summary(run_dir):
    """A run's summary.json (METRICS.md)."""
    return json.load(open(pathlib.Path(run_dir) / "summary.json"))


def save(fig, name):
    """Writes the figure to FIGURES/name.png."""
    FIGURES.mkdir(parents=True, exist_ok=True)
    fig.savefig(FIGURES / f"{name}.png", bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return FIGURES / f"{name}.png"

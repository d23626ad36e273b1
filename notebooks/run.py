#!/usr/bin/env python3
"""Executes the notebooks headless with nbclient (from the project's .venv/), as CI does, after
checking that each is committed without outputs. Their runs go to a work directory and their
figures to --figures (docs/figures/ to refresh the documentation's; a temporary directory in the
tests, so that they leave the tree as it was).

Usage: .venv/bin/python notebooks/run.py [NAME ...] [--figures DIR] [--work DIR]
       (default: every notebooks/*.ipynb; figures to docs/figures; runs to a temporary directory)

A notebook that reads the Mooncake trace from ../shared/traces is skipped without it, saying
duet-test-skip: (and the exit status is 0)."""
import argparse
import os
import pathlib
import sys
import tempfile
import time

import jupyter_client
import nbclient
import nbformat

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent


def clean(nb):
    """Why the notebook is not committed clean (outputs, execution counts), or None."""
    for k, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and (cell.outputs or cell.execution_count is not None):
            return f"cell {k} holds outputs: commit notebooks without them"
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*")
    ap.add_argument("--figures", default=str(ROOT / "docs" / "figures"))
    ap.add_argument("--work")
    args = ap.parse_args()
    paths = [HERE / f"{n}.ipynb" for n in args.names] or sorted(HERE.glob("*.ipynb"))
    for p in paths:
        if not p.exists():
            sys.exit(f"{p}: no such notebook")
    bad = [f"{p.name}: {why}" for p in paths if (why := clean(nbformat.read(p, as_version=4)))]
    if bad:
        sys.exit("\n".join(bad))
    if not (ROOT.parent / "shared" / "traces" / "mooncake_conversation.jsonl").exists():
        # The scenario files and the plan read the Mooncake trace; the others run without it.
        needs = [p for p in paths if any(k in p.read_text() for k in ("MOONCAKE", "sim/scenarios/"))]
        for p in needs:
            print(f"duet-test-skip: {p.name}: ../shared/traces/mooncake_conversation.jsonl is not there")
        paths = [p for p in paths if p not in needs]
    with tempfile.TemporaryDirectory(prefix="duet-nb-") as tmp:
        os.environ["DUET_WORK"] = args.work or tmp
        os.environ["DUET_FIGURES"] = str(pathlib.Path(args.figures).resolve())
        os.environ.setdefault("DUET_BIN", str(ROOT / "build" / "bin" / "duet"))
        for p in paths:
            start = time.time()
            nb = nbformat.read(p, as_version=4)
            # The kernel speaks to this process over Unix sockets, not TCP.
            km = jupyter_client.KernelManager(kernel_name="python3", transport="ipc",
                                              ip=os.path.join(tmp, "kernel"))
            try:
                nbclient.NotebookClient(nb, km=km, timeout=900,
                                        resources={"metadata": {"path": str(HERE)}}).execute()
            finally:
                if km.has_kernel:  # a kernel it was given, the client does not stop
                    km.shutdown_kernel()
            print(f"{p.name}: executed in {time.time() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

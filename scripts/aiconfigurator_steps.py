#!/usr/bin/env python3
"""Step times of Llama-3.1-8B on an H100 SXM from NVIDIA aiconfigurator's measured database.

aiconfigurator-core (PyPI, Apache-2.0) ships per-kernel latencies measured on H100 SXM GPUs
(GEMMs, prefill and decode attention, all-reduce) for several serving frameworks, and an
estimator that composes them into the time of a whole engine step the way the framework runs
it. This script asks that estimator (the package's own code, not a re-implementation) for a
sweep of step shapes and writes them as Duet step measurements (JSON lines, models/
step_profile.h), with a provenance file. `duet calibrate --measurements` fits the simulator's
cost model to them (scripts/aiconfigurator_profile.sh does both).

What the times are: the sum of the measured GPU kernels of one step. Not in them: the
framework's CPU work (scheduling, sampling, input preparation), which aiconfigurator adds
separately as empirical corrections and this script leaves out.

Shapes, per TP degree: prefill of B equal requests of N new tokens after P cached tokens
(aiconfigurator's static context phase); decode of R requests at C tokens of context each;
mixed steps of one prefill of N tokens beside R decodes at C tokens (aiconfigurator's mixed
step: it prices the chunk's attention as a share of the whole prompt's). Shapes whose weights
and KV cache do not fit in one GPU's 80 GB at that TP are left out.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import logging
import pathlib
import sys

MODEL = "meta-llama/Meta-Llama-3.1-8B"
SYSTEM = "h100_sxm"
WEIGHT_BYTES = 16.06e9  # Llama-3.1-8B in bf16
KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # K and V, 32 layers, 8 KV heads of 128, bf16
GPU_BYTES = 0.9 * 80e9  # what an engine may use of one H100's 80 GB


def fits(tp: int, tokens: int) -> bool:
    return (WEIGHT_BYTES + tokens * KV_BYTES_PER_TOKEN) / tp <= GPU_BYTES


def prefill_shapes():
    for n in (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192):
        for p in (0, 512, 2048, 8192):
            yield 1, n, p
    for b in (2, 4, 8, 16):
        for n in (128, 512, 2048):
            yield b, n, 0


def decode_shapes():
    for r in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512):
        for c in (128, 1024, 4096, 16384):
            yield r, c


def mixed_shapes():
    for n in (256, 1024, 2048):
        for r in (1, 8, 32, 128):
            for c in (4096, 8192):
                yield n, r, c


def sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="step measurements to write (JSON lines)")
    parser.add_argument("--source-out", required=True, help="provenance to write (JSON)")
    parser.add_argument("--backend", default="vllm", help="serving framework's measurements")
    parser.add_argument("--version", default="0.24.0", help="that framework's version")
    parser.add_argument("--tp", default="1,2,4", help="tensor-parallel degrees")
    args = parser.parse_args()

    logging.disable(logging.WARNING)  # the package logs every interpolation
    import aiconfigurator_core
    from aiconfigurator_core.sdk import common, config
    from aiconfigurator_core.sdk import rust_engine_step as engine
    from aiconfigurator_core.sdk.models import get_model
    from aiconfigurator_core.sdk.perf_database import get_database

    database = get_database(SYSTEM, args.backend, args.version)
    if database is None:
        sys.exit(f"aiconfigurator has no {SYSTEM} data for {args.backend} {args.version}")
    lines = []
    for tp in (int(t) for t in args.tp.split(",")):
        model = get_model(
            MODEL,
            config.ModelConfig(
                tp_size=tp,
                gemm_quant_mode=common.GEMMQuantMode.bfloat16,
                kvcache_quant_mode=common.KVCacheQuantMode.bfloat16,
                fmha_quant_mode=common.FMHAQuantMode.bfloat16,
            ),
            args.backend,
        )

        def add(prefill, rows, context, ms):
            lines.append({"prefill": prefill, "decode_tokens": rows,
                          "decode_context_tokens": rows * context, "tp": tp,
                          "seconds": ms / 1e3})

        for b, n, p in prefill_shapes():
            if not fits(tp, b * (n + p)):
                continue
            runtime = config.RuntimeConfig(batch_size=b, isl=n + p, osl=1, prefix=p)
            ops = engine.estimate_static_latency_breakdown_with_rust(
                model, database, runtime, "static_ctx", 32, 1.0)[0]
            add([[n, p]] * b, 0, 0, sum(ops.values()))
        for r, c in decode_shapes():
            if not fits(tp, r * c):
                continue
            ms = engine.estimate_decode_step_breakdown_with_rust(
                model, database, gen_tokens=r, isl=c, osl=1)[0]
            add([], r, c, ms)
        for n, r, c in mixed_shapes():
            if not fits(tp, n + r * c):
                continue
            # Decodes at position c on average: prompts of n tokens, 2 (c - n) output tokens.
            step = engine.estimate_mixed_step_breakdown_with_rust(
                model, database, ctx_tokens=n, gen_tokens=r, isl=n, osl=2 * (c - n), prefix=0)
            add([[n, 0]], r, c, step["latency_ms"])

    pathlib.Path(args.out).write_text("".join(json.dumps(line) + "\n" for line in lines))

    data = pathlib.Path(aiconfigurator_core.__file__).parent / "systems" / "data" / SYSTEM
    tables = ("gemm_perf", "context_attention_perf", "generation_attention_perf",
              "custom_allreduce_perf")  # what a dense model's step reads
    files = sorted(p for p in data.rglob("*.parquet")
                   if f"/{args.backend}/{args.version}/" in p.as_posix() and p.stem in tables)
    source = {
        "package": "aiconfigurator-core",
        "package_version": importlib.metadata.version("aiconfigurator-core"),
        "license": "Apache-2.0",
        "url": "https://github.com/ai-dynamo/aiconfigurator",
        "system": SYSTEM,
        "framework": f"{args.backend} {args.version}",
        "model": MODEL,
        "what": "the package's step estimates (sums of measured kernel times, no framework CPU "
                "overhead) for the shapes in scripts/aiconfigurator_steps.py",
        "data_files": {p.relative_to(data.parent.parent).as_posix(): sha256(p) for p in files},
    }
    pathlib.Path(args.source_out).write_text(json.dumps(source, indent=1) + "\n")
    print(f"aiconfigurator_steps: {len(lines)} step shapes -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

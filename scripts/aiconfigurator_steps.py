#!/usr/bin/env python3
"""Step times of a model on a GPU from NVIDIA aiconfigurator's measured databases.

aiconfigurator-core (PyPI, Apache-2.0) ships per-kernel latencies measured on NVIDIA GPUs
(GEMMs, prefill and decode attention, MLA, mixture-of-experts kernels, all-reduce and expert
all-to-all) for several serving frameworks, and an estimator that composes them into the time
of a whole engine step the way the framework runs it. This script asks that estimator (the
package's own code, not a re-implementation) for a sweep of step shapes of one model on one
system at several TP degrees and writes them as Duet step measurements (JSON lines, models/
step_profile.h), with a provenance file. `duet calibrate --measurements` fits the simulator's
cost model to them (scripts/aiconfigurator_profile.sh does both). MODELS and SYSTEMS below map
Duet's bundled names to aiconfigurator's.

What the times are: the sum of the measured GPU kernels of one step. Not in them: the
framework's CPU work (scheduling, sampling, input preparation), which aiconfigurator adds
separately as empirical corrections and this script leaves out.

Shapes, per TP degree: prefill of B equal requests of N new tokens after P cached tokens
(aiconfigurator's static context phase); decode of R requests at C tokens of context each;
mixed steps of one prefill of N tokens beside R decodes at C tokens (aiconfigurator's mixed
step: it prices the chunk's attention as a share of the whole prompt's). Shapes whose KV cache
does not fit one instance at that TP (--capacity, from `duet model`) are left out.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import logging
import pathlib
import sys

# Duet's bundled models and GPUs under aiconfigurator's names, and how a model runs: its experts
# expert-parallel over the TP degree's GPUs (as Duet's cluster files place them), its weights
# in bf16 or fp8 with block scales. The one table the scripts share.
MODELS = {
    "llama-3.1-8b": ("meta-llama/Meta-Llama-3.1-8B", False, "bfloat16"),
    "llama-3.1-70b": ("meta-llama/Meta-Llama-3.1-70B", False, "bfloat16"),
    "qwen3-32b": ("Qwen/Qwen3-32B", False, "bfloat16"),
    "qwen3-30b-a3b": ("Qwen/Qwen3-30B-A3B", True, "bfloat16"),
    "qwen3-235b-a22b": ("Qwen/Qwen3-235B-A22B", True, "bfloat16"),
    "deepseek-v3": ("deepseek-ai/DeepSeek-V3", True, "fp8_block"),
}
SYSTEMS = {"h100-sxm": "h100_sxm", "h200": "h200_sxm", "b200": "b200_sxm",
           "a100-80gb": "a100_sxm"}


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
        for r in (1, 4, 8, 32, 128):
            for c in (1024, 4096, 8192):
                if c > n:  # the decodes are past their own prompts of n tokens
                    yield n, r, c


def capacities(text: str) -> dict[int, int]:
    """ "1:400000,2:900000" -> {1: 400000, 2: 900000}: KV tokens one instance holds per TP."""
    out = {}
    for item in text.split(","):
        tp, tokens = item.split(":")
        out[int(tp)] = int(tokens)
    return out


def newest_version(data: pathlib.Path, backend: str) -> str:
    """The newest version of `backend` whose GEMM measurements the system's database has."""
    versions = [p.name for p in (data / "gemm" / backend).iterdir() if p.is_dir()]
    if not versions:
        sys.exit(f"aiconfigurator has no GEMM data for {backend} in {data}")
    return max(versions, key=lambda v: [int(x) if x.isdigit() else 0
                                        for x in v.replace("rc", ".").split(".")])


def sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="step measurements to write (JSON lines)")
    parser.add_argument("--source-out", required=True, help="provenance to write (JSON)")
    parser.add_argument("--model", required=True, choices=sorted(MODELS), help="Duet's name")
    parser.add_argument("--gpu", required=True, choices=sorted(SYSTEMS), help="Duet's name")
    parser.add_argument("--capacity", required=True,
                        help="TP:KV-tokens of one instance per TP degree, e.g. 1:450000,2:980000")
    parser.add_argument("--backend", default="vllm", help="serving framework's measurements")
    parser.add_argument("--version", help="that framework's version (default: the newest)")
    args = parser.parse_args()
    capacity = capacities(args.capacity)
    aic_model, moe, quant_mode = MODELS[args.model]
    system = SYSTEMS[args.gpu]

    def fits(tp: int, tokens: int) -> bool:
        return tokens <= capacity[tp]

    logging.disable(logging.WARNING)  # the package logs every interpolation
    import aiconfigurator_core
    from aiconfigurator_core.sdk import common, config
    from aiconfigurator_core.sdk import rust_engine_step as engine
    from aiconfigurator_core.sdk.models import get_model
    from aiconfigurator_core.sdk.perf_database import get_database

    data = pathlib.Path(aiconfigurator_core.__file__).parent / "systems" / "data" / system
    version = args.version or newest_version(data, args.backend)
    database = get_database(system, args.backend, version)
    if database is None:
        sys.exit(f"aiconfigurator has no {system} data for {args.backend} {version}")
    lines = []
    for tp in sorted(capacity):
        quant = dict(gemm_quant_mode=getattr(common.GEMMQuantMode, quant_mode),
                     kvcache_quant_mode=common.KVCacheQuantMode.bfloat16,
                     fmha_quant_mode=common.FMHAQuantMode.bfloat16)
        if moe:
            quant.update(moe_tp_size=1, moe_ep_size=tp,
                         moe_quant_mode=getattr(common.MoEQuantMode, quant_mode))
        model = get_model(aic_model, config.ModelConfig(tp_size=tp, **quant), args.backend)

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

    tables = ("gemm_perf", "context_attention_perf", "generation_attention_perf",
              "custom_allreduce_perf", "mla_context_module_perf", "mla_generation_module_perf",
              "mla_bmm_perf", "moe_perf", "moe_a2a_perf")  # what a step may read
    files = sorted(p for p in data.rglob("*.parquet")
                   if f"/{args.backend}/{version}/" in p.as_posix() and p.stem in tables)
    source = {
        "package": "aiconfigurator-core",
        "package_version": importlib.metadata.version("aiconfigurator-core"),
        "license": "Apache-2.0",
        "url": "https://github.com/ai-dynamo/aiconfigurator",
        "system": system,
        "framework": f"{args.backend} {version}",
        "model": aic_model,
        "weights": quant_mode,
        "what": "the package's step estimates (sums of measured kernel times, no framework CPU "
                "overhead) for the shapes in scripts/aiconfigurator_steps.py",
        "data_files": {p.relative_to(data.parent.parent).as_posix(): sha256(p) for p in files},
    }
    pathlib.Path(args.source_out).write_text(json.dumps(source, indent=1) + "\n")
    print(f"aiconfigurator_steps: {len(lines)} step shapes -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

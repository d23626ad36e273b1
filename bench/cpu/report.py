#!/usr/bin/env python3
"""Summary of bench/cpu_generate.sh's run directory as Markdown: one row per model and engine,
the yardsticks beside them, and the checks that the engines compute the same model.

Files read from WORK (written by cpu_generate.sh and the runners):
  bw-REP.json             duet_kernels_bench BM_ReadBandwidth (Google Benchmark JSON)
  gemm-REP.json           gemm_rate.py
  MODEL/                  the model directory Duet wrote
  MODEL.ids.json          the prompt's token ids
  MODEL-duet-REP.jsonl    duet generate --timings; MODEL-duet-REP.txt the text it printed
  MODEL-ENGINE-REP.json   run_llama_cpp.py / run_torch.py (ENGINE: llama.cpp / torch)
  MODEL-ENGINE-1.npy      their prefill logits in rep 1
  *.err                   each command's stderr (its last line is shown on failure)
Usage: report.py WORK THREADS REPS MAX_TOKENS DUET_VERSION MODEL..."""
import json
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_model  # noqa: E402

ENGINES = ("duet", "llama.cpp", "torch")
PEERS = ("llama.cpp", "torch")
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def kv_element_bytes(engine, cfg):
    """KV cache element size: llama.cpp's default cache type is f16; Duet and transformers
    store K and V in the model's dtype."""
    if engine == "llama.cpp":
        return 2
    return DTYPE_BYTES[cfg.get("torch_dtype", "float32")]


def failure(work, stem):
    """The last line of a failed command's stderr."""
    try:
        with open(f"{work}/{stem}.err", errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
        return lines[-1] if lines else "no output"
    except OSError:
        return "did not run"


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def duet_run(work, model, rep):
    """One `duet generate` run in the runners' terms, or None when it failed."""
    path = f"{work}/{model}-duet-{rep}.jsonl"
    if not os.path.exists(path):
        return None
    with open(path) as f:
        steps = [json.loads(line) for line in f]
    prefill = [s for s in steps if s["prefill"]]
    with open(f"{work}/{model}-duet-{rep}.txt", encoding="utf-8", errors="replace") as f:
        text = f.read()
    return {"prompt_tokens": sum(c[0] for s in prefill for c in s["prefill"]),
            "prefill_s": sum(s["seconds"] for s in prefill),
            "decode_s": [s["seconds"] for s in steps
                         if not s["prefill"] and s["decode_tokens"] == 1],
            "text": text[:-1] if text.endswith("\n") else text}  # generate ends with a newline


def spread(values, fmt, scale=1):
    """How a yardstick varied over the reps."""
    lo, hi = min(values) / scale, max(values) / scale
    return f"median of {len(values)} reps, range {lo:{fmt}}-{hi:{fmt}}"


def run_of(work, model, engine, rep):
    if engine == "duet":
        return duet_run(work, model, rep)
    return load_json(f"{work}/{model}-{engine}-{rep}.json")


def agreement(work, model, runs):
    """One line on whether the engines compute the same model (rep 1): llama.cpp's prefill
    logits against torch's (the GGUF conversion check), their greedy ids, and Duet's printed
    text against the text of their ids (Duet prints text, not ids; ids the tokenizer does not
    name all print as U+FFFD, so only tokenizer ids are told apart)."""
    parts = []
    lc, th = runs.get("llama.cpp"), runs.get("torch")
    if lc and th:
        a, b = f"{work}/{model}-llama.cpp-1.npy", f"{work}/{model}-torch-1.npy"
        if os.path.exists(a) and os.path.exists(b):
            la, lb = np.load(a), np.load(b)
            rel = np.sqrt(np.mean((la - lb) ** 2)) / np.std(lb)
            top = len(set(np.argsort(-la)[:10]) & set(np.argsort(-lb)[:10]))
            parts.append(f"prefill logits llama.cpp vs torch: RMS difference {rel:.1%} of "
                         f"torch's spread, top-10 ids shared {top}/10")
        same = 0
        for x, y in zip(lc["tokens"], th["tokens"]):
            if x != y:
                break
            same += 1
        parts.append(f"greedy ids llama.cpp = torch for the first {same}/{len(lc['tokens'])}")
    if lc or th:
        # Random weights can settle on repeating one token, which makes agreement cheap.
        name, peer = ("llama.cpp", lc) if lc else ("torch", th)
        parts.append(f"distinct ids in {name}'s continuation: {len(set(peer['tokens']))}")
    if runs.get("duet"):
        text = hf_model.DuetText(f"{work}/{model}")
        for engine in PEERS:
            if runs.get(engine):
                ids = runs[engine]["tokens"]
                k = text.match(ids, runs["duet"]["text"])
                known = sum(text.known(i) for i in ids[:k])
                note = "" if known == k else f" ({known} of them tokenizer ids)"
                parts.append(f"Duet's text = the text of {engine}'s first {k}/{len(ids)}{note}")
    return "; ".join(parts) if parts else "no two engines ran"


def main():
    work, threads, reps, max_tokens, duet_version = sys.argv[1:6]
    models = sys.argv[6:]
    reps, max_tokens = int(reps), int(max_tokens)

    # The yardsticks of every rep; their medians go with the engines' medians.
    bws, gemms = [], []
    for rep in range(1, reps + 1):
        doc = load_json(f"{work}/bw-{rep}.json") or {}
        bws += [b["bytes_per_second"] for b in doc.get("benchmarks", [])
                if b.get("aggregate_name") == "median"]
        gemms += [g for g in [load_json(f"{work}/gemm-{rep}.json")] if g]
    bw = statistics.median(bws) if bws else None
    gemm = {k: statistics.median(g[k] for g in gemms) for k in ("bf16", "fp32")} if gemms else None

    rows, checks, versions, notes = [], [], {}, []
    for model in models:
        mdir = f"{work}/{model}"
        if not os.path.exists(f"{mdir}/config.json"):
            error = failure(work, f"{model}-make")
            rows.append(f"| {model} | all |" + " |" * 9 + f" FAILED: {error} |")
            continue
        cfg = hf_model.config(mdir)
        layers, kv_heads, head_dim = hf_model.kv_dims(cfg)
        weights = hf_model.decode_bytes(mdir)
        prompt = len(load_json(f"{work}/{model}.ids.json"))
        flops = hf_model.prefill_flops(mdir, prompt)
        context = prompt + max_tokens // 2  # the mean context of the decode steps
        gemm_rate = gemm and gemm["bf16" if cfg.get("torch_dtype") == "bfloat16" else "fp32"]
        first = {}
        for engine in ENGINES:
            prefill, decode, errors = [], [], []
            for rep in range(1, reps + 1):
                run = run_of(work, model, engine, rep)
                if run is None:
                    errors.append(failure(work, f"{model}-{engine}-{rep}"))
                    continue
                if rep == 1:
                    first[engine] = run
                versions[engine] = run.get("version")
                if run["prompt_tokens"] != prompt:
                    notes.append(f"{model}: {engine} ran {run['prompt_tokens']} prompt tokens, "
                                 f"the tokenizer gives {prompt}")
                prefill.append(run["prompt_tokens"] / run["prefill_s"])
                decode.append(1 / statistics.median(run["decode_s"]))
            kv = 2 * layers * kv_heads * head_dim * context * kv_element_bytes(engine, cfg)
            row = f"| {model} | {engine} | {weights / 1e6:,.1f} | {kv / 1e6:,.1f} | {prompt} |"
            if not prefill:
                rows.append(row + " |" * 6 + f" FAILED: {errors[0]} |")
                continue
            p, d = statistics.median(prefill), statistics.median(decode)
            gflops = flops * p / prompt / 1e9
            row += f" {p:,.0f} | {gflops:,.1f} |"
            row += f" {gflops / gemm_rate:.0%} |" if gemm_rate else " - |"
            row += f" {d:,.1f} |"
            if bw:
                roof = bw / (weights + kv)
                row += f" {roof:,.1f} | {d / roof:.0%} |"
            else:
                row += " - | - |"
            row += f" {len(errors)} of {reps} reps FAILED: {errors[0]} |" if errors else " |"
            rows.append(row)
        checks.append(f"- {model}: {agreement(work, model, first)}")

    print(f"THREADS={threads}, REPS={reps} (medians over reps; in each rep every model runs on "
          f"Duet, llama.cpp, torch in turn); {max_tokens} tokens generated per run (greedy, "
          "EOS ignored)")
    if bw:
        print(f"memory read bandwidth ({threads} threads, duet_kernels_bench BM_ReadBandwidth, "
              f"each rep the median of 3): {bw / 1e9:.2f} GB/s ({spread(bws, '.2f', 1e9)})")
    else:
        print(f"memory read bandwidth: FAILED: {failure(work, 'bw-1')} (no roofline)")
    if gemm:
        n, runs = gemms[0]["n"], gemms[0]["runs"]
        bf16 = spread([g["bf16"] for g in gemms], ",.0f")
        fp32 = spread([g["fp32"] for g in gemms], ",.0f")
        print(f"GEMM rate (torch.matmul {n}^3, {threads} threads, each rep the median of {runs}): "
              f"bf16 {gemm['bf16']:,.0f} GFLOP/s ({bf16}), "
              f"fp32 {gemm['fp32']:,.0f} GFLOP/s ({fp32})")
    else:
        print(f"GEMM rate: FAILED: {failure(work, 'gemm-1')}")
    print(f"versions: {duet_version}; "
          + "; ".join(versions.get(e) or f"{e} did not run" for e in PEERS))
    print()
    print("| model | engine | weights read/step MB | KV read/step MB | prompt tokens "
          "| prefill tok/s | prefill GFLOP/s | of GEMM rate | decode tok/s | roofline tok/s "
          "| of roofline | note |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print()
    print("Read per decode step: every weight but the input embedding table, plus the output "
          "projection (the embedding table again when tied), plus K and V at the mean decode "
          f"context (prompt + {max_tokens // 2}) in the engine's KV type (Duet and torch: the "
          "model's dtype; llama.cpp: f16). Roofline = bandwidth / that (no bound for a model "
          "that fits in the CPU caches, as tiny does). Decode tok/s: 1 / the median step. "
          "Prefill FLOPs: 2 x the layers' matrix parameters per prompt token, the output "
          "projection for the last token, causal attention (QK^T and PV); of GEMM rate: against "
          "the rate in the model's dtype. Every engine runs the prompt and one decode step once, untimed, "
          "before the timed run (Duet: generate --warmup).")
    print("Agreement (rep 1; ids the tokenizer does not name all print as U+FFFD in Duet's "
          "text, so only tokenizer ids are told apart there):")
    print("\n".join(checks + [f"- NOTE {n}" for n in notes]))


if __name__ == "__main__":
    main()

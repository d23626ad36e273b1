#!/usr/bin/env python3
"""llama.cpp's half of bench/cpu_generate.sh: greedy generation from given prompt token ids
through llama-cpp-python (its default CPU build of the vendored llama.cpp), timed step by
step. The prompt is one llama_decode call (n_batch = n_ubatch >= the prompt); then one
llama_decode per generated token. Each step's time includes the greedy pick (argmax over the
last logits), as Duet's step times include its sampling. Settings: n_threads =
n_threads_batch = THREADS, KV cache f16 (llama.cpp's default), flash attention on (what
llama.cpp's default "auto" picks on the CPU; llama-cpp-python alone would turn it off).
Before the timed run, one warm-up pass (the whole prompt and one decode step, then the KV
cache cleared), as every engine in the bench gets, so one-time page-in and setup costs are
not counted.

Usage: run_llama_cpp.py --gguf FILE --prompt-ids FILE --max-tokens N --threads T --out FILE
Writes JSON: engine, version, prompt_tokens, prefill_s, decode_s (one per decode step),
tokens (every generated id, the prefill's first), prefill_top (the prefill's 10 highest
logits as [id, logit])."""
import json
import time

import numpy as np
import llama_cpp

import hf_model  # bench/cpu, beside this script

TOP = 10  # the prefill's highest logits, kept to check the GGUF conversion against torch


def main():
    args, prompt = hf_model.runner_args("--gguf")

    batch = max(512, len(prompt))
    llm = llama_cpp.Llama(model_path=args.gguf, n_ctx=len(prompt) + args.max_tokens + 16,
                          n_batch=batch, n_ubatch=batch, n_threads=args.threads,
                          n_threads_batch=args.threads, flash_attn=True, verbose=True)
    n_vocab = llm.n_vocab()

    def step(ids):
        """Evaluates ids after what is cached and returns the greedy next token."""
        llm.eval(ids)
        step.logits = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(n_vocab,))
        return int(step.logits.argmax())

    # Warm-up, then a cleared cache (eval() drops cached positions from n_tokens on).
    step(prompt)
    step(prompt[:1])
    llm.reset()

    t0 = time.perf_counter()
    token = step(prompt)
    prefill_s = time.perf_counter() - t0
    top = np.argsort(-step.logits)[:TOP]
    prefill_top = [[int(i), float(step.logits[i])] for i in top]
    if args.logits:
        np.save(args.logits, step.logits.astype(np.float32))
    tokens, decode_s = [token], []
    while len(tokens) < args.max_tokens:
        t0 = time.perf_counter()
        token = step([token])
        decode_s.append(time.perf_counter() - t0)
        tokens.append(token)

    with open(args.out, "w") as f:
        json.dump({"engine": "llama.cpp", "version": f"llama-cpp-python {llama_cpp.__version__}",
                   "prompt_tokens": len(prompt), "prefill_s": prefill_s, "decode_s": decode_s,
                   "tokens": tokens,
                   "prefill_top": prefill_top}, f)


if __name__ == "__main__":
    main()

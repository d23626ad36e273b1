#!/usr/bin/env python3
"""PyTorch's half of bench/cpu_generate.sh: greedy generation from given prompt token ids with
Hugging Face transformers on the CPU, timed step by step. The model is loaded from the same
directory Duet reads, in its own dtype (config.json's torch_dtype: bf16 or fp32), default
attention (SDPA), torch.set_num_threads(THREADS), under inference_mode. The prefill is one
forward over the prompt with use_cache (logits of the last position only, as generate() asks
for); then one single-token forward per generated token with past_key_values (a DynamicCache
in the model's dtype). Each step's time includes the greedy pick (argmax), as Duet's step
times include its sampling. Before the timed run, one warm-up pass (the whole prompt and one
decode step on a cache thrown away), as every engine in the bench gets, so one-time setup
costs are not counted.

Usage: run_torch.py --model DIR --prompt-ids FILE --max-tokens N --threads T --out FILE
Writes JSON like run_llama_cpp.py."""
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import hf_model  # noqa: E402  (bench/cpu, beside this script)

TOP = 10  # the prefill's highest logits, kept to check the GGUF conversion against llama.cpp
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def main():
    args, prompt = hf_model.runner_args("--model")
    with open(os.path.join(args.model, "config.json")) as f:
        cfg = json.load(f)
    dtype = DTYPES[cfg.get("torch_dtype") or cfg.get("dtype") or "float32"]

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).eval()

    def step(ids, past):
        """One forward of ids after past's positions: (greedy next token, cache)."""
        out = model(input_ids=torch.tensor([ids]), past_key_values=past, use_cache=True,
                    logits_to_keep=1)
        step.logits = out.logits[0, -1].float()
        return int(step.logits.argmax()), out.past_key_values

    with torch.inference_mode():
        _, past = step(prompt, None)
        step(prompt[:1], past)

        t0 = time.perf_counter()
        token, past = step(prompt, None)
        prefill_s = time.perf_counter() - t0
        top = torch.topk(step.logits, TOP)
        prefill_top = [[int(i), float(v)] for v, i in zip(top.values, top.indices)]
        if args.logits:
            numpy.save(args.logits, step.logits.numpy())
        tokens, decode_s = [token], []
        while len(tokens) < args.max_tokens:
            t0 = time.perf_counter()
            token, past = step([token], past)
            decode_s.append(time.perf_counter() - t0)
            tokens.append(token)

    with open(args.out, "w") as f:
        json.dump({"engine": "torch",
                   "version": f"torch {torch.__version__}, transformers {transformers.__version__}",
                   "prompt_tokens": len(prompt), "prefill_s": prefill_s, "decode_s": decode_s,
                   "tokens": tokens,
                   "prefill_top": prefill_top}, f)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The peer yardstick for bench/cuda_bench.sh: Hugging Face transformers (PyTorch, bf16, SDPA
attention) on the same model shapes with random weights, same prefill lengths and decode
batches/contexts as duet_cuda_bench. Prints Markdown tables. Needs torch with CUDA and
transformers; says so and exits 0 when they are missing (the Duet figures stand alone then).

Usage: torch_reference.py [MODEL_SPEC.json]"""
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    try:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as e:
        print(f"torch_reference: skipped ({e})")
        return 0
    if not torch.cuda.is_available():
        print("torch_reference: skipped (torch sees no CUDA device)")
        return 0
    spec_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "models/specs/llama-3.1-8b.json")
    spec = json.load(open(spec_path))
    spec = {k: v for k, v in spec.items() if k != "name"}
    config = LlamaConfig(**spec)
    config._attn_implementation = "sdpa"
    torch.manual_seed(1)
    # Built in bf16 on the device directly: an fp32 model first would leave its 32 GB in the
    # allocator's cache and crowd out the long prefills.
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).eval()
    torch.set_default_dtype(torch.float32)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")

    def timed(fn, reps):
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    print("\n| prefill tokens | time ms | tokens / s |\n|---|---|---|")
    with torch.inference_mode():
        for n in (1024, 4096, 8192):
            ids = torch.randint(10, 1000, (1, n), device="cuda")
            s = timed(lambda: model(ids, use_cache=False, logits_to_keep=1), 5)
            print(f"| {n} | {s * 1e3:.2f} | {n / s:.0f} |")
        print("\n| decode batch | context | step ms | tokens / s |\n|---|---|---|---|")
        for context in (1024, 8192):
            for batch in (1, 8, 64, 256):
                kv_gb = batch * context * 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 2 / 1e9
                if kv_gb > 0.6 * torch.cuda.mem_get_info()[0] / 1e9:
                    print(f"| {batch} | {context} | KV cache does not fit ({kv_gb:.0f} GB) | |")
                    continue
                ids = torch.randint(10, 1000, (batch, context), device="cuda")
                try:
                    out = model(ids, use_cache=True, logits_to_keep=1)
                except torch.OutOfMemoryError:
                    # Filling the cache is one prefill of batch x context tokens.
                    print(f"| {batch} | {context} | out of memory filling the cache in one pass | |")
                    torch.cuda.empty_cache()
                    continue
                past = out.past_key_values
                step = torch.randint(10, 1000, (batch, 1), device="cuda")

                def one_step():
                    # Decode one token against the same cached context each time.
                    past.crop(context)
                    model(step, past_key_values=past, use_cache=True)

                s = timed(one_step, 10)
                print(f"| {batch} | {context} | {s * 1e3:.3f} | {batch / s:.0f} |")
                del out, past
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The machine's GEMM rate for bench/cpu_generate.sh: torch.matmul of two square N x N
matrices (default 2048) in bf16 and in fp32 with THREADS threads, one untimed warm-up then
the median of RUNS timed products, as GFLOP/s (2 N^3 per product). A yardstick for the
prefill figures: what this CPU's best-known GEMM (oneDNN/MKL behind torch) reaches here.

Usage: gemm_rate.py --threads T --out FILE [--n N] [--runs RUNS]
Writes JSON: {"bf16": GFLOP/s, "fp32": GFLOP/s, "n": N, "runs": RUNS}."""
import argparse
import json
import statistics
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    result = {"n": args.n, "runs": args.runs}
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        a = torch.randn(args.n, args.n).to(dtype)
        b = torch.randn(args.n, args.n).to(dtype)
        torch.matmul(a, b)
        times = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            torch.matmul(a, b)
            times.append(time.perf_counter() - t0)
        result[name] = 2 * args.n ** 3 / statistics.median(times) / 1e9
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()

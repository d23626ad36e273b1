#!/usr/bin/env bash
# GPU speed of the CUDA model (issue 5): prefill tokens per second and decode step times on
# Llama-3.1-8B shapes with random weights, beside the device's measured copy bandwidth and
# bf16 GEMM rate (duet_cuda_bench), then the same shapes on PyTorch/transformers where they
# are installed (bench/cuda/torch_reference.py). Needs a CUDA device: exits 2 without one.
# Usage: bench/cuda_bench.sh [MODEL_SPEC.json]
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/bin/duet_cuda_bench ] || scripts/setup.sh
echo "duet CUDA benchmark: $(date -u +%Y-%m-%d)"
build/bin/duet_cuda_bench "$@"
echo
python3 bench/cuda/torch_reference.py "$@"

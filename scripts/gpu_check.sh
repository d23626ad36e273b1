#!/usr/bin/env bash
# The GPU checks in one go, on a machine with a CUDA device (docs/backend.md, "On a GPU"):
#   1. the GPU tests (ctest label `gpu`: kernels against the CPU reference, the CUDA model
#      against the CPU model);
#   2. the same tests under compute-sanitizer: memcheck, racecheck, initcheck;
#   3. the GPU benchmark beside its measured limits, and PyTorch on the same shapes
#      (bench/cuda_bench.sh);
#   4. `duet serve --device cuda` with the bench model answering the openai client's streamed
#      and non-streamed requests (tests/serve/python/test_cuda.py), its greedy text equal to the CPU's.
# Each step's log goes to LOG_DIR; a table of the steps' outcomes is printed last.
# Usage: scripts/gpu_check.sh [BIN_DIR] [LOG_DIR]   (default build/bin, build/gpu-check)
# STEPS (environment) picks some of: tests sanitizers serve bench (default: all, in that order).
# BIN_DIR holds duet, duet_gpu_tests, duet_cuda_ipc_peer (which the CUDA IPC transport's test
# starts) and duet_cuda_bench, with the CUDA plugin in BIN_DIR/../lib.
# Exit status: the number of steps that failed.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=$(realpath "${1:-build/bin}")
LOG=$(realpath -m "${2:-build/gpu-check}")
mkdir -p "$LOG"
SANITIZER=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
STEPS="${STEPS:-tests sanitizers serve bench}"
summary=()
failed=0

step() {  # step NAME TIMEOUT_S COMMAND...
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS rc
  echo "== $name: $*"
  timeout "$limit" "$@" >"$LOG/$name.log" 2>&1
  rc=$?
  tail -n 25 "$LOG/$name.log"
  summary+=("| $name | $([ $rc -eq 0 ] && echo pass || echo "FAIL (exit $rc)") | $((SECONDS - start)) s |")
  [ $rc -eq 0 ] || failed=$((failed + 1))
}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv \
  >"$LOG/device.txt" 2>&1
cat "$LOG/device.txt"

wanted() { [[ " $STEPS " == *" $1 "* ]]; }
if wanted tests; then
  step gpu-tests 300 "$BIN/duet_gpu_tests" --gtest_brief=1
fi
if wanted sanitizers; then
  # memcheck over every GPU test. racecheck and initcheck over the tests that run only Duet's
  # kernels: racecheck reports a hazard inside cuBLAS's own split-K GEMM kernels (nvjet_*), and
  # initcheck does not see cuBLAS's stores, so every read of a multiply's output looks
  # uninitialized to it (docs/backend.md, "On a GPU").
  step sanitizer-memcheck 300 "$SANITIZER" --tool memcheck --error-exitcode 1 \
    "$BIN/duet_gpu_tests" --gtest_brief=1
  for tool in racecheck initcheck; do
    step "sanitizer-$tool" 300 "$SANITIZER" --tool "$tool" --error-exitcode 1 \
      "$BIN/duet_gpu_tests" --gtest_brief=1 --gtest_filter='CudaOps.*-CudaOps.MatMul*'
  done
fi
if wanted serve; then
  step serve 300 env DUET_BIN="$BIN/duet" python3 -m pytest -q -rs -p no:cacheprovider \
    tests/serve/python/test_cuda.py
fi
if wanted bench; then
  step bench 400 "$BIN/duet_cuda_bench" models/specs/llama-3.1-8b.json
  step torch-reference 400 python3 bench/cuda/torch_reference.py models/specs/llama-3.1-8b.json
fi

echo
echo "| step | outcome | time |"
echo "|---|---|---|"
printf '%s\n' "${summary[@]}"
exit "$failed"

#!/usr/bin/env bash
# CPU backend speed beside its peers (issue 16): prefill and decode tokens per second of
# `duet generate`, llama.cpp (llama-cpp-python) and PyTorch (transformers) on the same models
# and the same prompt token ids, interleaved in one run, with this machine's yardsticks measured
# in the same run (in every rep, beside the engines): memory read bandwidth (duet_kernels_bench
# BM_ReadBandwidth, read-only streaming of 256 MiB with the same thread count) and GEMM rate
# (torch.matmul, bf16 and fp32).
# Models, random weights written by `duet make-test-model`: tiny (fp32), bench (~125M
# parameters, bf16) and llama-3.2-1b (Llama-3.2-1B's dimensions, bf16, tied embeddings). Each
# engine generates 128 tokens greedily (EOS ignored) after the 458-token prompt; decode speed
# is compared with the roofline bandwidth / bytes a step reads (bench/cpu/report.py says what
# is counted). llama.cpp reads a GGUF conversion of the same weights (bench/cpu/to_gguf.py),
# checked against torch's prefill logits.
# The peers run in their own virtual environment, .venv-bench/ at the repository root, made
# from bench/requirements-cpu.txt on the first run (bench/venv.sh); that builds
# llama-cpp-python (llama.cpp) from source, which takes several minutes (and pulls torch, a
# large download).
# Usage: bench/cpu_generate.sh [THREADS]   (default: all hardware threads)
#   REPS=3                       repetitions (medians over them)
#   MODELS="tiny bench llama-3.2-1b"  the models, a subset in any order
#   BENCH_VENV=DIR               use this existing virtual environment instead (nothing installed)
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS="${1:-$(nproc)}"
REPS="${REPS:-3}"
MODELS="${MODELS:-tiny bench llama-3.2-1b}"
MAX_TOKENS=128
DUET=build/bin/duet
BENCH=build/bin/duet_kernels_bench
[ -x "$DUET" ] && [ -x "$BENCH" ] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

# The peers' environment (bench/venv.sh).
source bench/venv.sh
bench_venv bench/requirements-cpu.txt

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
say() { echo "cpu_generate: $*" >&2; }
failed() { say "$1 failed: $(tail -n 1 "$2")"; }

PROMPT="The history of computing is the history of people who wanted answers faster than they could \
work them out by hand, and of the machines they built to get them: tables, slide rules, \
mechanical calculators, punched cards, vacuum tubes, transistors and integrated circuits."
# Three copies, words joined by single spaces (and one after the last): 458 tokens.
# shellcheck disable=SC2086
PROMPT_TEXT="$(printf '%s ' $PROMPT $PROMPT $PROMPT)"

# The models, their GGUF conversions and the prompt's token ids (from each model's own
# tokenizer.json; report.py checks the count against the one Duet's timings show).
for model in $MODELS; do
  say "writing $model"
  if ! "$DUET" make-test-model --preset "$model" --out "$work/$model" \
      >/dev/null 2>"$work/$model-make.err"; then
    rm -rf "${work:?}/$model"
    failed "$model: make-test-model" "$work/$model-make.err"
    continue
  fi
  if [ "$model" = tiny ]; then
    # The tiny model declares a 256-token context (max_position_embeddings), too short for
    # the prompt and 128 tokens; the weights do not depend on it (its Llama 3 RoPE scaling has
    # its own original_max_position_embeddings), so every engine gets 1024 instead.
    "$PY" - "$work/tiny/config.json" <<'PY'
import json, sys
cfg = json.load(open(sys.argv[1]))
cfg["max_position_embeddings"] = 1024
json.dump(cfg, open(sys.argv[1], "w"), indent=2)
PY
  fi
  "$PY" - "$work/$model" "$PROMPT_TEXT" >"$work/$model.ids.json" <<'PY'
import json, sys
sys.path.insert(0, "bench/cpu")
import hf_model
print(json.dumps(hf_model.prompt_ids(sys.argv[1], sys.argv[2])))
PY
  if ! "$PY" bench/cpu/to_gguf.py "$work/$model" "$work/$model.gguf" \
      2>"$work/$model-to_gguf.err"; then
    rm -f "$work/$model.gguf"
    failed "$model: GGUF conversion" "$work/$model-to_gguf.err"
  fi
done

# Interleaved: in each rep, the yardsticks, then every model on Duet, llama.cpp and torch in
# turn. A failure is kept in the run's .err file and shown in its row; the others go on. The
# peers save their prefill logits in rep 1 for the agreement check.
logits() { [ "$rep" != 1 ] || echo "--logits $run-$1-1.npy"; }
for rep in $(seq 1 "$REPS"); do
  say "rep $rep/$REPS: yardsticks: memory bandwidth, GEMM rate"
  "$BENCH" --benchmark_filter="BM_ReadBandwidth/$THREADS/" --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true --benchmark_format=json \
    >"$work/bw-$rep.json" 2>"$work/bw-$rep.err" || failed "bandwidth" "$work/bw-$rep.err"
  "$PY" bench/cpu/gemm_rate.py --threads "$THREADS" --out "$work/gemm-$rep.json" \
    2>"$work/gemm-$rep.err" || failed "GEMM rate" "$work/gemm-$rep.err"
  for model in $MODELS; do
    [ -d "$work/$model" ] || continue
    run="$work/$model"
    say "rep $rep/$REPS: $model: duet"
    "$DUET" generate --model "$run" --prompt "$PROMPT_TEXT" --max-tokens "$MAX_TOKENS" \
      --threads "$THREADS" --ignore-eos --warmup --timings "$run-duet-$rep.jsonl" \
      >"$run-duet-$rep.txt" 2>"$run-duet-$rep.err" || failed "$model: duet" "$run-duet-$rep.err"
    say "rep $rep/$REPS: $model: llama.cpp"
    if [ -f "$run.gguf" ]; then
      # shellcheck disable=SC2046
      "$PY" bench/cpu/run_llama_cpp.py --gguf "$run.gguf" --prompt-ids "$run.ids.json" \
        --max-tokens "$MAX_TOKENS" --threads "$THREADS" --out "$run-llama.cpp-$rep.json" \
        $(logits llama.cpp) 2>"$run-llama.cpp-$rep.err" \
        || failed "$model: llama.cpp" "$run-llama.cpp-$rep.err"
    else
      cp "$work/$model-to_gguf.err" "$run-llama.cpp-$rep.err"
    fi
    say "rep $rep/$REPS: $model: torch"
    # shellcheck disable=SC2046
    "$PY" bench/cpu/run_torch.py --model "$run" --prompt-ids "$run.ids.json" \
      --max-tokens "$MAX_TOKENS" --threads "$THREADS" --out "$run-torch-$rep.json" \
      $(logits torch) 2>"$run-torch-$rep.err" || failed "$model: torch" "$run-torch-$rep.err"
  done
done

# Duet's version line, and the commit (with "+local changes" when files outside bench/ differ).
duet_version="$("$DUET" version | head -n 1) at $(git rev-parse --short HEAD)"
git diff --quiet HEAD -- . ':!bench' || duet_version+="+local changes"
# shellcheck disable=SC2086
"$PY" bench/cpu/report.py "$work" "$THREADS" "$REPS" "$MAX_TOKENS" "$duet_version" $MODELS

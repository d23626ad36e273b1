#!/usr/bin/env bash
# Builds every fuzz target with clang's libFuzzer (plus ASan and UBSan) in build-san/ (see
# scripts/san-configure.sh) and runs each for SECONDS (default 60) on a scratch copy of its
# seed corpus in fuzz/corpus/, as many at a time as there are cores. Any crash, sanitizer
# report or timeout fails the script.
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]   e.g. scripts/fuzz.sh 300 trace_mooncake_fuzz
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH="${1:-60}"
shift || true
scripts/san-configure.sh
targets=("$@")
if ((${#targets[@]} == 0)); then
  for f in fuzz/*_fuzz.cpp; do targets+=("$(basename "$f" .cpp)"); done
fi
cmake --build build-san -j "$(nproc)" --target "${targets[@]}"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
failed=()
artifacts=build-san/fuzz-artifacts
mkdir -p "$artifacts"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# One target: its log and exit status land in $work/TARGET.{log,rc}.
fuzz_one() {
  local t=$1 corpus="$work/$1.corpus" rc=0
  mkdir "$corpus"
  cp -r "fuzz/corpus/${t%_fuzz}/." "$corpus/"
  # -close_fd_mask=3: the targets' own stdout/stderr (help text, error lines) stay quiet;
  # libFuzzer's reports still reach the log.
  # -seed=1: the same sequence of inputs every run (the time budget decides how far it gets).
  build-san/bin/"$t" -seed=1 -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 -timeout=30 \
    -close_fd_mask=3 -print_final_stats=1 -artifact_prefix="$artifacts/$t-" "$corpus" \
    >"$work/$t.log" 2>&1 || rc=$?
  echo "$rc" >"$work/$t.rc"
  rm -rf "$corpus"
}
# As many targets at a time as there are cores (each fuzzer is one process on one core).
parallel=$(nproc)
for t in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= parallel)); do wait -n || true; done
  echo "== $t for ${SECONDS_EACH}s"
  fuzz_one "$t" &
done
wait
for t in "${targets[@]}"; do
  if [ "$(cat "$work/$t.rc" 2>/dev/null)" = 0 ]; then
    echo "$t: $(grep -E "^stat::(number_of_executed_units|new_units_added)" "$work/$t.log" | tr '\n' ' ')"
  else
    failed+=("$t")
    tail -n 60 "$work/$t.log"
    echo "fuzz: $t failed; the input is in $artifacts/ (add it to fuzz/corpus/${t%_fuzz}/ once fixed)"
  fi
done
if ((${#failed[@]})); then
  echo "fuzz: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: ${#targets[@]} targets ran ${SECONDS_EACH}s each, no failure"

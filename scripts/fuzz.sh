#!/usr/bin/env bash
# Builds every fuzz target with clang's libFuzzer (plus ASan and UBSan) into build-fuzz/ and
# runs each for SECONDS (default 60) on a scratch copy of its seed corpus in fuzz/corpus/.
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]   e.g. scripts/fuzz.sh 300 trace_mooncake_fuzz
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH="${1:-60}"
shift || true
command -v clang++ >/dev/null || { echo "fuzz: needs clang (apt-get install clang)" >&2; exit 1; }
cmake -S . -B build-fuzz -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDUET_BUILD_FUZZERS=ON >/dev/null
targets=("$@")
if ((${#targets[@]} == 0)); then
  for f in fuzz/*_fuzz.cpp; do targets+=("$(basename "$f" .cpp)"); done
fi
cmake --build build-fuzz -j "$(nproc)" --target "${targets[@]}"
for t in "${targets[@]}"; do
  corpus=$(mktemp -d)
  cp -r "fuzz/corpus/${t%_fuzz}/." "$corpus/"
  echo "== $t for ${SECONDS_EACH}s"
  build-fuzz/bin/"$t" -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 -print_final_stats=1 \
    "$corpus" 2>&1 | grep -E "^(stat::number_of_executed_units|stat::new_units_added|==[0-9]+==ERROR|SUMMARY)" || true
  rm -rf "$corpus"
done

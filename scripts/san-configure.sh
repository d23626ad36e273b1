#!/usr/bin/env bash
# Configures build-san/ (once): clang with AddressSanitizer and UndefinedBehaviorSanitizer
# (float-cast-overflow included, every report fatal) on every library, and the fuzz targets
# as libFuzzer binaries. Shared by scripts/sanitize.sh and scripts/fuzz.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang++ >/dev/null || { echo "needs clang (scripts/setup.sh installs it)" >&2; exit 1; }
[ -f build-san/CMakeCache.txt ] && exit 0
source scripts/ccache_args.sh
cmake -S . -B build-san -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDUET_BUILD_FUZZERS=ON -DDUET_WITH_CUDA=OFF \
  -DCMAKE_CXX_FLAGS="-fsanitize=float-cast-overflow -fno-sanitize-recover=all" \
  "${launcher[@]}" >/dev/null

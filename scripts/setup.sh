#!/usr/bin/env bash
# Sets up a Debian 12 machine for Duet and builds it: installs the system packages the build
# needs (only those missing; root or sudo), then configures and builds into build/.
# The CLI lands at build/bin/duet. Safe to run again: it only does what is left to do.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libsimgrid-dev                 # the discrete-event simulator behind `duet simulate`
  libboost-program-options-dev   # command-line parsing
  libboost-dev                   # Boost.Beast/Asio (header-only): `duet replay`'s HTTP client, `duet serve`
  prometheus-cpp-dev             # `duet serve`'s /metrics (metric families, text exposition)
  python3-venv                   # .venv/ for the Python tests (scripts/venv.sh)
  nodejs                         # runs Perfetto's trace processor (WebAssembly) in tests/sim/python
  nlohmann-json3-dev             # JSON for specs, traces and outputs
  libpcre2-dev                   # the tokenizer's pre-tokenization regex
  libgtest-dev libgmock-dev      # the test suite
  libbenchmark-dev               # kernel micro-benchmarks (bench/)
  libdnnl-dev                    # oneDNN: the CPU backend's prefill matrix multiplies
  ocl-icd-opencl-dev             # OpenCL headers and loader: Debian's oneDNN CMake config requires them (a Recommends of libdnnl-dev)
  libeigen3-dev                  # least squares for the step-cost fit (duet calibrate)
  libucx-dev                     # optional UCX KV transport (found and reported by CMake)
  libssl-dev                     # libcrypto: HMAC-SHA256 of the worker link's challenge and response
  libhiredis-dev                 # the Redis client of the remote KV tier
  libxxhash-dev                  # XXH3 checksums of KV blocks stored on SSD and in Redis
  redis-server                   # the remote KV tier's store in tests (each starts its own); redis-benchmark
  etcd-server                    # discovery of workers (duet serve/worker --discovery); tests start their own
  fio                            # the SSD tier's yardstick (bench/tier_storage.sh)
  liburing-dev                   # the SSD tier's O_DIRECT engine (io_uring)
  ucx-utils                      # ucx_perftest: the yardstick of bench/kv_transfer.sh
  clang libclang-rt-14-dev       # scripts/sanitize.sh and scripts/fuzz.sh: ASan, UBSan, libFuzzer
  ccache                         # compiler cache: a clean clone (CI) rebuilds what it built before in seconds
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "setup: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    SUDO="sudo"
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

BUILD_TYPE="${DUET_BUILD_TYPE:-Release}"
if [ ! -f build/CMakeCache.txt ]; then
  source scripts/ccache_args.sh
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE="$BUILD_TYPE" "${launcher[@]}" ${DUET_CMAKE_ARGS:-}
fi
cmake --build build -j "$(nproc)"
echo "setup: built build/bin/duet"

#!/usr/bin/env bash
# Sets up (scripts/setup.sh, scripts/venv.sh) and runs every test: unit tests, simulation
# end-to-end tests, fuzz-corpus replays, the server driven by Python clients. Tests that need a
# GPU report that they skipped when none is present.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/venv.sh
ctest --test-dir build --output-on-failure -j "$(nproc)" "$@"

#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs every test: unit tests, simulation end-to-end tests,
# fuzz-corpus replays. Tests that need a GPU report that they skipped when none is present.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ctest --test-dir build --output-on-failure -j "$(nproc)" "$@"

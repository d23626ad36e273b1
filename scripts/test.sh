#!/usr/bin/env bash
# Sets up (scripts/setup.sh, scripts/venv.sh) and runs every test: unit tests, simulation
# end-to-end tests, fuzz-corpus replays, the server driven by Python clients. Tests that need a
# GPU report that they skipped when none is present. Then scripts/sanitize.sh: the unit and
# simulation tests again under ASan and UBSan, and every fuzz target for DUET_FUZZ_SECONDS
# (default 20) each. DUET_SKIP_SANITIZERS=1 skips that step (quick local runs); CI runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/venv.sh
ctest --test-dir build --output-on-failure -j "$(nproc)" "$@"
[ "${DUET_SKIP_SANITIZERS:-0}" = 1 ] || scripts/sanitize.sh

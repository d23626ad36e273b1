#!/usr/bin/env bash
# Builds Duet with clang's AddressSanitizer and UndefinedBehaviorSanitizer (float-cast-overflow
# included; any report fails the test) into build-san/, runs the unit and simulation tests
# there (labels common, traces, models, policies, sim, cli, plan, transport, live, cluster,
# discovery: the KV transports, the live frontend's engine threads, PD included, the
# frontend-worker messages and connections, the etcd client), then every fuzz target for a
# bounded time (scripts/fuzz.sh, same build). Called by scripts/test.sh unless
# DUET_SKIP_SANITIZERS=1; on its own: scripts/sanitize.sh [FUZZ_SECONDS_PER_TARGET] (default 20).
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZ_SECONDS="${1:-${DUET_FUZZ_SECONDS:-20}}"
start=$(date +%s)
scripts/san-configure.sh
modules=(common traces models policies sim cli plan transport tiers live cluster discovery calibrate)
targets=(duet)
for m in "${modules[@]}"; do targets+=("duet_${m}_tests"); done
cmake --build build-san -j "$(nproc)" --target "${targets[@]}"
echo "sanitize: built in $(($(date +%s) - start)) s"
# LeakSanitizer on, no suppressions: every leak a test's process has at exit fails the test.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
label=$(IFS='|'; echo "${modules[*]}")
ctest --test-dir build-san --output-on-failure -j "$(nproc)" -L "^($label)\$"
echo "sanitize: tests passed at $(($(date +%s) - start)) s"
scripts/fuzz.sh "$FUZZ_SECONDS"
echo "sanitize: done in $(($(date +%s) - start)) s"

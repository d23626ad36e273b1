#!/usr/bin/env bash
# A forward pass's time beside another instance's on the machine's other cores (docs/validation.md,
# issue 44): the bench model's one- and eight-row decode steps and a 256-token prefill, each timed
# alone and beside a second copy of the model running a 1,024-token prefill at no context and
# after 1,024 cached tokens, four 256-token chunks at no context and after 768 each (a 1P1D
# prefill worker's steps), or an eight-row decode step, on a thread of the bench's process (as
# `duet calibrate --beside`'s neighbour runs) and, for the 1,024-token prefill, the four 256-token
# chunks and the decode step, in a process of its own (as a live prefill worker runs beside its
# decode worker); ROUNDS rounds with the cases interleaved (build/bin/duet_beside_bench).
# `duet calibrate --beside` times its reference shapes beside one-chunk prefills at no context
# (docs/calibration.md).
# Usage: bench/beside.sh [WORK] [ROUNDS] [THREADS]   (default: a fresh temp dir, 9, 1)
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-$(mktemp -d)}"
bench_binary="$PWD/build/bin/duet_beside_bench"
[ -x "$bench_binary" ] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
source bench/lib.sh
bench_setup "$work"
"$bench_binary" bench "${2:-9}" "${3:-1}"

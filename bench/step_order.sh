#!/usr/bin/env bash
# A forward pass's time after what the engine ran just before it (docs/validation.md, issue 44):
# the bench model's one- and eight-row decode steps and 64- and 256-token prefill passes, each
# timed after two passes of itself (the steady case), of each other shape, of a 1,024-token
# prefill, or after IDLE_MS asleep; ROUNDS rounds with the cases interleaved
# (build/bin/duet_step_order_bench). `duet calibrate` times each shape in a run of itself and a
# step after idle spells (docs/calibration.md); a PD decode worker's steps follow decode steps, a
# prefill worker's often an idle spell, a colocated server's decode steps prefill-carrying ones.
# Usage: bench/step_order.sh [WORK] [ROUNDS] [THREADS] [IDLE_MS]   (default: a fresh temp dir,
#        15, 1, 50)
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-$(mktemp -d)}"
bench_binary="$PWD/build/bin/duet_step_order_bench"
[ -x "$bench_binary" ] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
source bench/lib.sh
bench_setup "$work"
"$bench_binary" bench "${2:-15}" "${3:-1}" "${4:-50}"

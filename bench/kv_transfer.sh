#!/usr/bin/env bash
# KV pull throughput of the UCX transport (issue 10's goal: 90% of ucx_perftest from 64 KiB up)
# beside ucx_perftest's ucp_get on the same UCX transport and message sizes, in the same run,
# over loopback on this machine. Duet: duet_kv_transfer_bench, one block of SIZE per transfer,
# transfers back to back, from a source region in memory UCX allocated (as a prefill worker's
# KV) into one on the heap (as a decode worker's), three ways: same process (two
# UcxKvTransports, the source progressed by a spinning thread), and two processes as
# `duet worker` runs them (a prefill worker's transport, progressed by its thread asleep on
# UCX's wake-up descriptor, pulled from by a decode worker's), once with ucx_perftest's
# footprint (one buffer a side, the goal's comparison) and once cycling through 4 blocks a side
# (a KV cache's access pattern: at 4 MiB and up, past this CPU's cache).
# Peer: ucx_perftest -t ucp_get, server and client processes (ucx-utils), as it runs by default
# (gets in flight without limit: the goal's yardstick) and with one get in flight at a time
# (-O 1), as the bench posts its transfers.
# Every measurement moves BYTES (at least 200 and at most 100,000 transfers, 20 warm-up ones
# before) and is taken ROUNDS times, the five kinds interleaved; the table shows medians.
# Usage: bench/kv_transfer.sh [BYTES] [ROUNDS]   (default 1 GiB, 3 rounds)
set -euo pipefail
cd "$(dirname "$0")/.."
BYTES="${1:-1073741824}"
ROUNDS="${2:-3}"
WARMUP=20
BENCH=build/bin/duet_kv_transfer_bench
[ -x "$BENCH" ] || { echo "build first (needs UCX): scripts/setup.sh" >&2; exit 1; }
command -v ucx_perftest >/dev/null || { echo "needs ucx_perftest (ucx-utils): scripts/setup.sh" >&2; exit 1; }
SIZES=(65536 262144 1048576 4194304 16777216)
port=13500
work=$(mktemp -d)
sources=()
trap 'kill "${sources[@]}" 2>/dev/null || true; rm -rf "$work"' EXIT

iters_for() {  # transfers that move BYTES of SIZE, within [200, 100000]
  local n=$((BYTES / $1))
  ((n < 200)) && n=200
  ((n > 100000)) && n=100000
  echo "$n"
}

# ucx_perftest's overall bandwidth (MiB/s) for one size: a server in the background, then the
# client, both with UCX_TLS.
perftest() {  # perftest TLS SIZE OUTSTANDING (0: no limit)
  local tls=$1 size=$2 outstanding=$3 iters
  iters=$(iters_for "$size")
  port=$((port + 1))
  UCX_TLS="$tls" ucx_perftest -t ucp_get -s "$size" -n "$iters" -w "$WARMUP" -O "$outstanding" \
    -p "$port" >/dev/null 2>&1 &
  local server=$!
  sleep 0.5
  UCX_TLS="$tls" timeout 300 ucx_perftest 127.0.0.1 -t ucp_get -s "$size" -n "$iters" \
    -w "$WARMUP" -O "$outstanding" -p "$port" 2>/dev/null | awk '$1 == "Final:" { print $7 }'
  wait "$server" || true
}

# A source process (a prefill worker's transport) serving every size with BLOCKS blocks a side;
# its descriptors go to $work/descriptors.TLS.BLOCKS.
start_source() {
  local tls=$1 blocks=$2 descriptors="$work/descriptors.$1.$2"
  "$BENCH" --blocks "$blocks" source "$tls" "$descriptors" "${SIZES[@]}" &
  sources+=($!)
  for _ in $(seq 1 100); do [ -s "$descriptors" ] && return; sleep 0.1; done
  echo "the $tls source did not start" >&2
  exit 1
}

# One measurement, MiB/s (empty when it failed): KIND is same, two1 or two4.
duet() {
  local tls=$1 kind=$2 size=$3 iters
  iters=$(iters_for "$size")
  case $kind in
    same) "$BENCH" "$tls" "$iters" "$WARMUP" "$size" ;;
    two1 | two4)
      timeout 300 "$BENCH" --blocks "${kind#two}" sink "$tls" "$work/descriptors.$tls.${kind#two}" \
        "$iters" "$WARMUP" "$size"
      ;;
  esac 2>/dev/null | awk '{ print $2 }' || true
}

median() {  # of the numbers on stdin, empty if none
  sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'
}

ratio() {
  awk -v a="$1" -v b="$2" 'BEGIN { if (a != "" && b > 0) printf "%.0f%%", 100 * a / b; else print "-" }'
}

echo "BYTES=$BYTES per measurement, median of $ROUNDS rounds; MiB/s (2^20 bytes per second);" \
  "$(ucx_info -v | head -1 | sed 's/# //')"
echo
echo "| UCX_TLS | message bytes | transfers | ucx_perftest ucp_get | ucx_perftest, one in flight | Duet, same process | of ucx_perftest | Duet, two worker processes | of ucx_perftest | of one in flight | Duet, two processes, 4 blocks a side | of ucx_perftest |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
for tls in tcp posix,cma; do
  start_source "$tls" 1
  start_source "$tls" 4
  for size in "${SIZES[@]}"; do
    for kind in perftest perftest1 same two1 two4; do : >"$work/$kind"; done
    for ((r = 0; r < ROUNDS; r++)); do
      perftest "$tls" "$size" 0 >>"$work/perftest"
      perftest "$tls" "$size" 1 >>"$work/perftest1"
      for kind in same two1 two4; do duet "$tls" "$kind" "$size" >>"$work/$kind"; done
    done
    peer=$(median <"$work/perftest")
    peer1=$(median <"$work/perftest1")
    same=$(median <"$work/same")
    two1=$(median <"$work/two1")
    two4=$(median <"$work/two4")
    echo "| $tls | $size | $(iters_for "$size") | ${peer:-failed} | ${peer1:-failed} | ${same:-failed}" \
      "| $(ratio "$same" "$peer") | ${two1:-failed} | $(ratio "$two1" "$peer") | $(ratio "$two1" "$peer1")" \
      "| ${two4:-failed} | $(ratio "$two4" "$peer") |"
  done
  kill "${sources[@]}" 2>/dev/null || true
  wait "${sources[@]}" 2>/dev/null || true
  sources=()
done

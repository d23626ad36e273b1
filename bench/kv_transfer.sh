#!/usr/bin/env bash
# KV pull throughput of the UCX transport (issue 10's goal: 90% of ucx_perftest from 64 KiB up)
# beside ucx_perftest's ucp_get on the same UCX transport and message sizes, in the same run,
# over loopback on this machine. Duet: duet_kv_transfer_bench, one block of SIZE per transfer,
# transfers back to back, from a source region in memory UCX allocated (as a prefill worker's KV)
# into one on the heap (as a decode worker's), two ways: same process (two UcxKvTransports, the source progressed by
# a spinning thread), and two processes as `duet worker` runs them (a prefill worker's
# transport, progressed by its thread asleep on UCX's wake-up descriptor, pulled from by a
# decode worker's). Peer: ucx_perftest -t ucp_get, server and client processes (ucx-utils).
# Usage: bench/kv_transfer.sh [ITERS]   (default 200; 20 warm-up iterations each)
set -euo pipefail
cd "$(dirname "$0")/.."
ITERS="${1:-200}"
WARMUP=20
BENCH=build/bin/duet_kv_transfer_bench
[ -x "$BENCH" ] || { echo "build first (needs UCX): scripts/setup.sh" >&2; exit 1; }
command -v ucx_perftest >/dev/null || { echo "needs ucx_perftest (ucx-utils): scripts/setup.sh" >&2; exit 1; }
SIZES=(65536 262144 1048576 4194304 16777216)
port=13500

# ucx_perftest's overall bandwidth (MiB/s) for one size: a server in the background, then the
# client, both with UCX_TLS.
perftest() {
  local tls=$1 size=$2
  port=$((port + 1))
  UCX_TLS="$tls" ucx_perftest -t ucp_get -s "$size" -n "$ITERS" -w "$WARMUP" -p "$port" \
    >/dev/null 2>&1 &
  local server=$!
  sleep 0.5
  UCX_TLS="$tls" timeout 120 ucx_perftest 127.0.0.1 -t ucp_get -s "$size" -n "$ITERS" \
    -w "$WARMUP" -p "$port" 2>/dev/null | awk '$1 == "Final:" { print $7 }'
  wait "$server" || true
}

echo "ITERS=$ITERS; MiB/s (2^20 bytes per second); $(ucx_info -v | head -1 | sed 's/# //')"
echo
# Duet across two processes: "SIZE MiB/s" lines.
two_processes() {
  local tls=$1 descriptors
  descriptors=$(mktemp -u)
  "$BENCH" source "$tls" "$descriptors" "${SIZES[@]}" &
  local source=$!
  for _ in $(seq 1 100); do [ -s "$descriptors" ] && break; sleep 0.1; done
  timeout 300 "$BENCH" sink "$tls" "$descriptors" "$ITERS" "$WARMUP" "${SIZES[@]}" || true
  kill "$source" 2>/dev/null
  wait "$source" 2>/dev/null || true
  rm -f "$descriptors"
}

ratio() {
  awk -v a="$1" -v b="$2" 'BEGIN { if (a != "" && b > 0) printf "%.0f%%", 100 * a / b; else print "-" }'
}

echo "| UCX_TLS | message bytes | ucx_perftest ucp_get MiB/s | Duet, same process MiB/s | of ucx_perftest | Duet, two worker processes MiB/s | of ucx_perftest |"
echo "|---|---|---|---|---|---|---|"
for tls in tcp posix,cma; do
  declare -A same=() two=()
  while read -r size rate; do same[$size]=$rate; done < <("$BENCH" "$tls" "$ITERS" "$WARMUP" "${SIZES[@]}")
  while read -r size rate; do two[$size]=$rate; done < <(two_processes "$tls")
  for size in "${SIZES[@]}"; do
    peer=$(perftest "$tls" "$size")
    a=${same[$size]:-}
    b=${two[$size]:-}
    echo "| $tls | $size | ${peer:-failed} | ${a:-failed} | $(ratio "$a" "$peer") | ${b:-failed} | $(ratio "$b" "$peer") |"
  done
  unset same two
done

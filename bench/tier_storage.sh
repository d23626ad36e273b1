#!/usr/bin/env bash
# Throughput of the real KV tiers (backend/tiers/) through HostTierStorage, each beside its
# yardstick measured in the same run on this machine (issue 42):
#   DRAM tier        memcpy of the same blocks into the DRAM tier's own pool
#   SSD tier         fio, the same block size and I/O engine (mmap), one job, into the same
#                    directory; the page cache dropped before each read pass (root) as before
#                    the SSD tier's. With "io": "io_uring", fio's io_uring engine with O_DIRECT
#                    at a queue depth of PER_IO (the blocks of one I/O the tier has in flight)
#   remote (Redis)   redis-benchmark SET and GET, one client, no pipelining (the tier's one
#                    synchronous connection), the same value size (block + 64-byte header),
#                    against the same redis-server, keys drawn from as many as the tier writes
# Each measurement is taken ROUNDS times (the table shows medians) with blocks of each size in
# BLOCK_SIZES, written in I/Os of 8 blocks (the tier manager posts one I/O per prompt's run of
# blocks).
# Usage: bench/tier_storage.sh [MIB] [ROUNDS] [DIR]   (default 1024 MiB per pass (Redis: a
#   quarter), 3 rounds, a directory under /var/tmp: on the disk, not tmpfs)
set -euo pipefail
cd "$(dirname "$0")/.."
MIB="${1:-1024}"
ROUNDS="${2:-3}"
DIR="${3:-/var/tmp/duet-tier-bench}"
BENCH=build/bin/duet_tier_storage_bench
BLOCK_SIZES=(262144 2097152)  # 256 KiB; 2 MiB: one 16-token block of Llama-3.1-8B in bf16
PER_IO=8
[ -x "$BENCH" ] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
for tool in fio redis-server redis-benchmark; do
  command -v "$tool" >/dev/null || { echo "needs $tool: scripts/setup.sh" >&2; exit 1; }
done
mkdir -p "$DIR"
port=$((16379 + RANDOM % 1000))
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --loglevel warning \
  >/dev/null 2>&1 &
redis=$!
trap 'kill "$redis" 2>/dev/null || true; rm -rf "$DIR"' EXIT
for _ in $(seq 1 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done

drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; }
median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

# fio's bandwidth (MB/s, 10^6) of one pass: fio_pass RW BS BYTES [ENGINE ARGS...]
fio_pass() {
  local rw=$1 bs=$2 bytes=$3
  shift 3
  fio --name=yardstick --directory="$DIR" --filename=fio.dat --rw="$rw" --bs="$bs" --size="$bytes" \
    --numjobs=1 --output-format=json "${@:---ioengine=mmap}" 2>/dev/null |
    python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]; \
print(round(j['$([ "$rw" = write ] && echo write || echo read)']['bw_bytes'] / 1e6))"
}
# redis-benchmark's requests per second of one command, as MB/s of VALUE bytes.
redis_pass() {  # redis_pass set|get VALUE_BYTES REQUESTS
  redis-benchmark -p "$port" -c 1 -P 1 -n "$3" -r "$3" -d "$2" -t "$1" --csv 2>/dev/null |
    awk -F, -v v="$2" 'NR == 2 { gsub(/"/, "", $2); printf "%.0f\n", $2 * v / 1e6 }'
}

declare -A r
for size in "${BLOCK_SIZES[@]}"; do
  blocks=$((MIB * 1048576 / size))
  remote_blocks=$((blocks / 4))
  for _ in $(seq 1 "$ROUNDS"); do
    read -r w rd < <("$BENCH" memcpy "$size" "$blocks" "$PER_IO")
    r[$size.memcpy.w]+="$w "; r[$size.memcpy.r]+="$rd "
    read -r w rd < <("$BENCH" dram "$size" "$blocks" "$PER_IO")
    r[$size.dram.w]+="$w "; r[$size.dram.r]+="$rd "
    rm -rf "${DIR:?}"/*
    read -r w _ < <("$BENCH" ssd "$size" "$blocks" "$PER_IO" write "$DIR/tier")
    drop_caches
    read -r _ rd < <("$BENCH" ssd "$size" "$blocks" "$PER_IO" read "$DIR/tier")
    r[$size.ssd.w]+="$w "; r[$size.ssd.r]+="$rd "
    rm -rf "${DIR:?}"/*
    r[$size.fio.w]+="$(fio_pass write "$size" $((blocks * size))) "
    drop_caches
    r[$size.fio.r]+="$(fio_pass read "$size" $((blocks * size))) "
    rm -rf "${DIR:?}"/*
    read -r w _ < <("$BENCH" ssd-io_uring "$size" "$blocks" "$PER_IO" write "$DIR/tier")
    drop_caches
    read -r _ rd < <("$BENCH" ssd-io_uring "$size" "$blocks" "$PER_IO" read "$DIR/tier")
    r[$size.uring.w]+="$w "; r[$size.uring.r]+="$rd "
    rm -rf "${DIR:?}"/*
    uring=(--ioengine=io_uring --direct=1 --iodepth="$PER_IO")
    r[$size.fiou.w]+="$(fio_pass write "$size" $((blocks * size)) "${uring[@]}") "
    r[$size.fiou.r]+="$(fio_pass read "$size" $((blocks * size)) "${uring[@]}") "
    rm -rf "${DIR:?}"/*
    redis-cli -p "$port" flushall >/dev/null
    read -r w rd < <("$BENCH" remote "$size" "$remote_blocks" "$PER_IO" both "$port")
    r[$size.remote.w]+="$w "; r[$size.remote.r]+="$rd "
    redis-cli -p "$port" flushall >/dev/null
    r[$size.rb.w]+="$(redis_pass set $((size + 64)) "$remote_blocks") "
    r[$size.rb.r]+="$(redis_pass get $((size + 64)) "$remote_blocks") "
    redis-cli -p "$port" flushall >/dev/null
  done
done

m() { tr ' ' '\n' <<<"${r[$1]}" | grep . | median; }
echo "| block | tier | Duet write MB/s | yardstick write MB/s | Duet read MB/s | yardstick read MB/s | yardstick |"
echo "|---|---|---|---|---|---|---|"
for size in "${BLOCK_SIZES[@]}"; do
  k=$((size / 1024))KiB
  echo "| $k | DRAM | $(m $size.dram.w) | $(m $size.memcpy.w) | $(m $size.dram.r) | $(m $size.memcpy.r) | memcpy |"
  echo "| $k | SSD files | $(m $size.ssd.w) | $(m $size.fio.w) | $(m $size.ssd.r) | $(m $size.fio.r) | fio, mmap engine |"
  echo "| $k | SSD files, io_uring | $(m $size.uring.w) | $(m $size.fiou.w) | $(m $size.uring.r) | $(m $size.fiou.r) | fio, io_uring engine, O_DIRECT, iodepth $PER_IO |"
  echo "| $k | Redis | $(m $size.remote.w) | $(m $size.rb.w) | $(m $size.remote.r) | $(m $size.rb.r) | redis-benchmark -c 1 -P 1 |"
done

#!/usr/bin/env bash
# The source material's joint test, live on this machine's CPU beside the simulator's prediction
# (issue 42): (a) colocated baseline, (b) PD, (c) offload, (d) PD + offload, on a trace with
# repeated long prefixes, each setup through `duet validate` (docs/validation.md): served live by
# `duet serve --workers thread` (engine threads, one CPU thread per instance) and replayed with
# `duet replay`, then simulated on the same cluster file with a cost model fitted to this CPU
# (`duet calibrate`, one thread).
#   (a) 2 colocated instances            (b) 1 prefill + 1 decode instance (KV moved in memory)
#   (c) (a) with a host DRAM tier        (d) (b) with the same tier
# The bench model (~125M parameters, bf16 KV: 12 KiB per token), 8 shared prefixes of 1,024
# tokens, each request that prefix and 64..320 tokens of its own, 16..32 output tokens, Poisson
# arrivals. Each instance's KV cache holds about 4,700 tokens (the simulator's plan for a 0.32
# GiB "device"), so the prefixes do not all fit and the GPU prefix cache evicts; the DRAM tier
# (1 GiB) holds every block. A prefix is loaded before its request is scheduled in both worlds
# (overlap_tier_loads false: what the live server runs).
# Prints each validation's table; the run's files stay in WORK.
# Usage: [SETUPS="c-offload ..."] bench/joint_cpu.sh [RATE_SCALES] [WORK]
#        (default all four setups, rate scale 1, a fresh temp dir; WORK keeps the model and the
#        profile of an earlier run)
set -euo pipefail
cd "$(dirname "$0")/.."
SCALES="${1:-1}"
work="${2:-$(mktemp -d)}"
DUET="$PWD/build/bin/duet"
[ -x "$DUET" ] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
mkdir -p "$work"
cd "$work"

[ -d bench ] || "$DUET" make-test-model --preset bench --out bench >/dev/null
[ -f profile.json ] || "$DUET" calibrate --model bench --out profile.json --progress never \
  --threads 1 --max-context 2048

# The host as the simulator's "GPU": its memory sizes each instance's KV cache in both worlds
# (validate gives duet serve the simulator's blocks); the fitted profile prices the steps.
cat > host.json <<'JSON'
{"name": "host-cpu", "notes": "this machine's CPU as an instance's device: weights and a small KV cache",
 "bf16_tflops": 0.1, "hbm_gib": 0.32, "hbm_bandwidth_gbps": 20, "nvlink_bandwidth_gbps": 10,
 "pcie_bandwidth_gbps": 10}
JSON
cat > trace.json <<'JSON'
{"description": "bench/joint_cpu.sh: 96 requests, 1 per second at rate scale 1, 8 shared prefixes",
 "num_requests": 96, "seed": 11, "block_tokens": 16,
 "arrival": {"process": "poisson", "rate_per_s": 1},
 "prefix": {"groups": 8, "tokens": 1024},
 "input": {"dist": "uniform", "min": 1088, "max": 1344},
 "output": {"dist": "uniform", "min": 16, "max": 32}}
JSON
cluster() {  # cluster NAME INSTANCES TIERS
  cat > "$1.json" <<JSON
{"name": "$1", "model": "./bench",
 "nodes": [{"count": 1, "gpus": 2, "gpu": "host.json", "nvlink": {"bandwidth_GBps": 10, "latency_us": 1},
            "nic": {"bandwidth_GBps": 10, "latency_us": 50}}],
 "network": {"switch": {"bandwidth_GBps": 10, "latency_us": 1},
             "frontend": {"bandwidth_GBps": 10, "latency_us": 20}},
 "instances": $2,
 "engine": {"max_num_seqs": 32, "max_num_batched_tokens": 2048, "reserved_gib": 0.01,
            "overlap_tier_loads": false},
 "cost_model": {"kind": "fitted", "profile": "profile.json"},
 "tiers": $3}
JSON
}
colocated='[{"role": "colocated", "count": 2, "node": 0}]'
pd='[{"role": "prefill", "node": 0}, {"role": "decode", "node": 0}]'
dram='{"dram": {"capacity_gib": 1, "bandwidth_GBps": 10}}'
cluster a-colocated "$colocated" null
cluster b-pd "$pd" null
cluster c-offload "$colocated" "$dram"
cluster d-pd-offload "$pd" "$dram"
for setup in ${SETUPS:-a-colocated b-pd c-offload d-pd-offload}; do
  echo "== $setup"
  "$DUET" validate --cluster "$setup.json" --model bench --trace trace.json \
    --rate-scales "$SCALES" --serve-args "--workers thread --threads 1" \
    --out "validation-$setup" || true
done
echo "files: $work"

# Sourced, from the repository root, by the bench scripts that serve the ~125M bench model:
# DUET (this build's binary); bench_setup WORK makes WORK, enters it and makes the model there
# once; serve_start LOG ARGS... starts `duet serve --model bench --port $port ARGS...` logging
# to LOG and returns once it serves; serve_stop stops it, as does the script's exit.
DUET="$PWD/build/bin/duet"
[ -x "$DUET" ] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
port=$((20000 + RANDOM % 20000))
server=

bench_setup() {
  mkdir -p "$1"
  cd "$1"
  [ -d bench ] || "$DUET" make-test-model --preset bench --out bench >/dev/null
}

serve_start() {
  local log=$1
  shift
  "$DUET" serve --model bench --port "$port" "$@" > "$log" 2>&1 &
  server=$!
  for _ in $(seq 100); do grep -q "serving" "$log" && break; sleep 0.1; done
}

serve_stop() {
  [ -z "$server" ] || { kill -INT "$server" 2>/dev/null; wait "$server" || true; server=; }
}
trap serve_stop EXIT

# bench_cluster LAYOUT ENGINE NIC_LATENCY_US [MORE]: in the current directory, host.json (this
# machine's CPU as the simulator's device: only its memory matters under a fitted profile; it
# sizes the KV cache alike in both worlds, validate giving duet serve the simulator's blocks) and
# cluster.json for the bench model priced by profile.json, with ENGINE as its "engine" object and
# MORE as further top-level members ("key": value, ...). LAYOUT: colocated (one instance) or
# 1p1d (a prefill and a decode instance on one node, the KV between its two devices over the
# link calibrate fitted to UCX's transfers, calibration.md; the NIC carries only the frontend's
# messages; the two instances' steps priced beside each other's, calibrate --beside). Sets
# calibrate_args (--transport ucx --beside for 1p1d). Exits 2 on another layout.
bench_cluster() {
  local layout=$1 engine=$2 nic_latency_us=$3 more=${4:-} instances devices nvlink
  case "$layout" in
    colocated) calibrate_args=(); instances='[{"role": "colocated"}]'; devices=1; nvlink='' ;;
    1p1d) calibrate_args=(--transport ucx --beside); devices=2; nvlink='"nvlink": {"fitted": "ucx"},'
          instances='[{"role": "prefill", "node": 0}, {"role": "decode", "node": 0}]' ;;
    *) echo "the layout must be colocated or 1p1d" >&2; exit 2 ;;
  esac
  cat > host.json <<'EOF'
{"name": "host-cpu", "notes": "this machine's CPU as an instance's device: 2 GiB for weights and KV",
 "bf16_tflops": 0.1, "hbm_gib": 2, "hbm_bandwidth_gbps": 20, "nvlink_bandwidth_gbps": 10,
 "pcie_bandwidth_gbps": 10}
EOF
  cat > cluster.json <<EOF
{${more:+$more,}
 "model": "./bench",
 "nodes": [{"count": 1, "gpus": $devices, "gpu": "host.json", $nvlink
            "nic": {"bandwidth_GBps": 10, "latency_us": $nic_latency_us}}],
 "instances": $instances,
 "engine": $engine,
 "cost_model": {"kind": "fitted", "profile": "profile.json"}}
EOF
}

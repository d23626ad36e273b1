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

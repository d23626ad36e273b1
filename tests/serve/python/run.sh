#!/usr/bin/env bash
# Runs one file of the Python tests in this script's directory with pytest (ctest calls this;
# DUET_BIN names the binary). tests/sim/python/run.sh links here. The tests need the project's
# virtual environment: scripts/venv.sh makes it. Their temporary files (test models, server
# logs) go to a directory of their own, removed afterwards.
set -euo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
if [ ! -x "$root/.venv/bin/python" ]; then
  echo "$(dirname "$0"): no .venv/ with the test clients; run scripts/venv.sh first" >&2
  exit 1
fi
file="$1"
shift
tmp="$(mktemp -d "${TMPDIR:-/tmp}/duet-pytest.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
cd "$(dirname "$0")"
"$root/.venv/bin/python" -m pytest -q -rs -p no:cacheprovider --basetemp "$tmp/pytest" "$file" "$@"

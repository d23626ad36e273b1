#!/usr/bin/env bash
# Runs one file of the `duet serve` Python tests (ctest calls this; DUET_BIN names the binary).
# The tests need the project's virtual environment: scripts/venv.sh makes it. Their temporary
# files (test models, server logs) go to a directory of their own, removed afterwards.
set -euo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
if [ ! -x "$root/.venv/bin/python" ]; then
  echo "tests/serve/python: no .venv/ with the test clients; run scripts/venv.sh first" >&2
  exit 1
fi
file="$1"
shift
tmp="$(mktemp -d "${TMPDIR:-/tmp}/duet-serve-test.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
cd "$root/tests/serve/python"
"$root/.venv/bin/python" -m pytest -q -rs -p no:cacheprovider --basetemp "$tmp/pytest" "$file" "$@"

#!/usr/bin/env bash
# Makes the project's Python virtual environment .venv/ and installs scripts/requirements.txt
# into it (pinned versions from PyPI). Idempotent: when .venv/ already holds exactly these
# requirements (a stamp records their hash) it returns at once. Needs python3 with venv
# (Debian: python3-venv, installed by scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

REQUIREMENTS=scripts/requirements.txt
STAMP=.venv/.requirements.sha256
want="$(sha256sum "$REQUIREMENTS" | cut -d' ' -f1)"
if [ -x .venv/bin/python ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  exit 0
fi

# The system interpreter (Debian's), not whatever a version manager puts first on PATH.
PYTHON="${DUET_PYTHON:-}"
if [ -z "$PYTHON" ]; then
  if [ -x /usr/bin/python3 ]; then PYTHON=/usr/bin/python3; else PYTHON="$(command -v python3)"; fi
fi
if [ ! -x .venv/bin/python ]; then
  echo "venv: creating .venv with $PYTHON"
  "$PYTHON" -m venv .venv
fi
echo "venv: installing $REQUIREMENTS"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r "$REQUIREMENTS"
echo "$want" > "$STAMP"
echo "venv: ready (.venv)"

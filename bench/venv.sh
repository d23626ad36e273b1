# shellcheck shell=bash
# Sourced, from the repository root, by the bench scripts that run Duet's peers in Python.
# bench_venv REQUIREMENTS sets PY to the Python of the peers' virtual environment: BENCH_VENV's
# when that is set (used as it is, nothing installed), else .venv-bench/ at the repository root,
# made on first use. REQUIREMENTS (one of bench/requirements-*.txt) is installed into it
# whenever it, or a file it includes with -r, differs from what was installed last (a stamp
# per requirements file in .venv-bench/), so the scripts that need fewer packages
# (bench/requirements-llama-cpp.txt) and those that need more (bench/requirements-cpu.txt,
# which includes it) share one environment.
# shellcheck disable=SC2034  # PY is the caller's
bench_venv() {
  local requirements=$1 venv=.venv-bench dir included want stamp
  if [ -n "${BENCH_VENV:-}" ]; then
    [ -x "$BENCH_VENV/bin/python" ] \
      || { echo "BENCH_VENV=$BENCH_VENV: no bin/python there" >&2; exit 1; }
    PY="$BENCH_VENV/bin/python"
    return
  fi
  # The requirements and the files they include (pip reads -r paths beside the including file).
  dir=$(dirname "$requirements")
  included=$(sed -n 's/^-r[[:space:]]*//p' "$requirements")
  want=$({ cat "$requirements"; for f in $included; do cat "$dir/$f"; done; } | sha256sum \
    | cut -d' ' -f1)
  stamp="$venv/$(basename "$requirements").sha256"
  if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "installing $requirements into $venv (llama-cpp-python builds from source: several" \
      "minutes)" >&2
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -r "$requirements" >&2
    echo "$want" > "$stamp"
  fi
  PY="$venv/bin/python"
}

#!/usr/bin/env bash
# The bundled H100 profile is what scripts/aiconfigurator_profile.sh makes: regenerated from the
# pinned aiconfigurator-core in .venv/ (scripts/venv.sh), it must equal the committed file in
# everything but when and from where it was run (source.date, source.command).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -x .venv/bin/python ] || { echo "no .venv/: run scripts/venv.sh first" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
scripts/aiconfigurator_profile.sh "$work/profile.json" >"$work/log" 2>&1 ||
  { cat "$work/log" >&2; exit 1; }
.venv/bin/python - sim/profiles/h100-sxm-llama-3.1-8b.json "$work/profile.json" <<'PY'
import json, math, sys
committed, made = (json.load(open(p)) for p in sys.argv[1:3])
for doc in (committed, made):
    for key in ("date", "command"):
        doc["source"].pop(key, None)

def same(a, b):  # numbers to 1e-9: the fit's last bits may depend on the CPU's vector unit
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and \
            math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b

differs = [k for k in sorted(set(committed) | set(made)) if not same(committed.get(k), made.get(k))]
if differs:
    sys.exit(f"sim/profiles/h100-sxm-llama-3.1-8b.json is not what "
             f"scripts/aiconfigurator_profile.sh makes: {', '.join(differs)} differ")
print("the bundled H100 profile is reproduced")
PY

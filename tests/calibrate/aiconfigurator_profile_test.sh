#!/usr/bin/env bash
# Every bundled profile made from aiconfigurator's databases (sim/profiles/GPU-MODEL.json whose
# source names aiconfigurator-core) is what scripts/aiconfigurator_profile.sh makes: regenerated
# from the pinned aiconfigurator-core in .venv/ (scripts/venv.sh) for the same model, GPU and TP
# degrees, it must equal the committed file in everything but when and from where it was run
# (source.date, source.command).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -x .venv/bin/python ] || { echo "no .venv/: run scripts/venv.sh first" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
count=0
for committed in sim/profiles/*.json; do
  args="$(.venv/bin/python - "$committed" <<'PY'
import json, pathlib, sys
path = pathlib.Path(sys.argv[1])
doc = json.load(open(path))
if doc["source"].get("measured_by", {}).get("package") == "aiconfigurator-core":
    device = doc["device"]
    print(path.stem[len(device) + 1:], device, ",".join(str(f["tp"]) for f in doc["fits"]))
PY
)"
  [[ -n "$args" ]] || continue
  read -r model gpu tps <<<"$args"
  scripts/aiconfigurator_profile.sh "$model" "$gpu" "$tps" "$work/profile.json" >"$work/log" 2>&1 ||
    { cat "$work/log" >&2; exit 1; }
  .venv/bin/python - "$committed" "$work/profile.json" <<'PY'
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
    sys.exit(f"{sys.argv[1]} is not what scripts/aiconfigurator_profile.sh makes: "
             f"{', '.join(differs)} differ")
print(f"{sys.argv[1]} is reproduced")
PY
  count=$((count + 1))
done
((count >= 1)) || { echo "no bundled aiconfigurator profile found" >&2; exit 1; }

#!/usr/bin/env bash
# The gateway's tests once more, against its request path compiled with mypyc (setup.py), as the
# gateway image ships it. On a copy of the tree: extensions built beside the sources here would
# shadow later edits of them. Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$PWD/.venv/bin/python
tmp=$(mktemp -d /tmp/fleet-compiled.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# Tracked and untracked files, not ignored ones (.venv, caches); a deleted file is skipped.
git ls-files -co --exclude-standard -z | tar --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -xf - -C "$tmp"
cd "$tmp"
VLLM_FLEET_COMPILE=1 "$PY" setup.py -q build_ext --inplace > build.log 2>&1 || { tail -40 build.log; exit 1; }
# A module that still loads from its .py would make this run the interpreted gateway again.
"$PY" - <<'PYEOF'
import importlib
import tomllib

names = tomllib.load(open("pyproject.toml", "rb"))["tool"]["vllm-fleet"]["compiled"]
interpreted = [n for n in names if not importlib.import_module(f"gateway.{n}").__file__.endswith(".so")]
assert not interpreted, f"not compiled: {interpreted}"
print(f"{len(names)} gateway modules compiled with mypyc")
PYEOF
"$PY" -m pytest tests/gateway -m "not realvllm" -p no:cacheprovider "$@"

#!/usr/bin/env bash
# The whole test suite: lint, types, pytest (fake backends and real CPU vLLM), and the gateway's
# tests again against its request path compiled with mypyc, as the gateway image runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
exec scripts/test-compiled.sh "$@"

#!/usr/bin/env bash
# The whole test suite: lint, types, and pytest (fake backends and real CPU vLLM).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
.venv/bin/ruff check .
.venv/bin/mypy
exec .venv/bin/python -m pytest "$@"

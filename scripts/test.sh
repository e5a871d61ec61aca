#!/usr/bin/env bash
# The README's test command, whole on a fresh Debian/Ubuntu machine: installs the system
# packages the tests use when they are missing (scripts/system-packages.sh test), makes (or
# reuses) .venv with the project and its dev extra, and runs the whole test suite. No test
# is skipped for a missing package: if one cannot be installed, this stops and says which.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/system-packages.sh test

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[dev]'

.venv/bin/python -m pytest -q "$@"

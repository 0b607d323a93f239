#!/usr/bin/env bash
# Prepare a fresh Debian machine for deltaflow: Java (for Spark), a virtualenv in .venv, and
# the package with its test extras; with --test also Chromium (the status page's test renders
# it headless). Idempotent; fast when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get update -qq
  as_root apt-get install -y -qq --no-install-recommends "$@"
}

PYTHON=${PYTHON:-python3}
if ! command -v "$PYTHON" >/dev/null; then
  echo "bootstrap: $PYTHON not found; install Python 3.11+ first" >&2; exit 2
fi
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' || {
  echo "bootstrap: deltaflow needs Python >= 3.11, $PYTHON is $("$PYTHON" -V 2>&1)" >&2; exit 2; }

if ! command -v java >/dev/null && [ -z "${JAVA_HOME:-}" ]; then
  echo "bootstrap: installing a Java runtime for Spark"
  apt_install openjdk-17-jre-headless || apt_install default-jre-headless
fi

if [ ! -x .venv/bin/python ]; then
  if ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null; then
    echo "bootstrap: installing python3-venv"
    apt_install python3-venv
  fi
  "$PYTHON" -m venv .venv
fi

if [ "${1:-}" = "--test" ] && ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
  echo "bootstrap: installing Chromium for the status page test"
  apt_install chromium
fi

if [ "${1:-}" = "--test" ] && ! command -v initdb >/dev/null && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  echo "bootstrap: installing PostgreSQL for the CDC tests (the tests start their own server)"
  apt_install postgresql
fi

if [ "${1:-}" = "--test" ] && [ ! -x .venv/node/node_modules/.bin/azurite-blob ]; then
  if ! command -v npm >/dev/null; then
    echo "bootstrap: installing Node.js and npm for the Azure emulator (azurite)"
    apt_install nodejs npm
  fi
  echo "bootstrap: installing azurite (Azure Blob emulator) into .venv/node"
  mkdir -p .venv/node
  npm install --silent --no-audit --no-fund --prefix .venv/node azurite@3 >/dev/null
fi

stamp=.venv/.deltaflow-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "bootstrap: installing deltaflow and its dependencies into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  # compat: the checkout itself goes on sys.path, so pyspark's lookup of pyspark_* modules (a
  # plain directory scan) finds deltaflow's data sources, as it does in a non-editable install.
  .venv/bin/python -m pip install -q -e ".[test]" --config-settings editable_mode=compat
  touch "$stamp"
fi

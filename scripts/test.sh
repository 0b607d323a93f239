#!/usr/bin/env bash
# The whole test suite: lint, strict types, then every test against real Spark and delta-rs.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh --test
.venv/bin/ruff check deltaflow tests benchmarks
.venv/bin/ruff format --check deltaflow tests benchmarks
.venv/bin/mypy
.venv/bin/lint-imports --no-cache
exec .venv/bin/pytest "$@"

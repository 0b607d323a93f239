#!/usr/bin/env bash
# The whole test suite: lint, strict types, then every test against real Spark and delta-rs.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh --test
.venv/bin/ruff check deltaflow tests benchmarks
.venv/bin/ruff format --check deltaflow tests benchmarks
.venv/bin/mypy
.venv/bin/lint-imports --no-cache
# Two test processes (pytest-xdist), a test file at a time in each: most of the suite's time is
# crash tests waiting for Spark drivers they start and kill, so a second process nearly halves it
# (tests/integration/test_exactly_once.py: 204 s alone, 124 s in two). Each process has its own
# Spark session and its own broker, S3, Azure and PostgreSQL servers. DELTAFLOW_TEST_WORKERS=0
# runs everything in this process. Files go out in collection order, the longest first
# (tests/conftest.py: LONGEST_FIRST), so the two processes finish together. --durations lists
# the slowest tests: the suite must stay well under 30 minutes on a 2-core CI machine, and that
# list says where to trim.
exec .venv/bin/pytest -n "${DELTAFLOW_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder --durations=40 "$@"

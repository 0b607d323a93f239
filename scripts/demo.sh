#!/usr/bin/env bash
# The main job on embedded defaults: JSON events -> Spark (local[*]) -> a local Delta table.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
exec .venv/bin/deltaflow demo "$@"

#!/usr/bin/env bash
# The test command: set up the environment, then run the whole suite (CPU, no network).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="$(bash scripts/setup_env.sh | tail -n 1)"
exec "$PY" -m pytest tests "$@"

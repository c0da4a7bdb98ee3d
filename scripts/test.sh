#!/usr/bin/env bash
# The test command: set up the environment, then run the whole suite (CPU, no network). First, the tests that
# need no extra run against the core install alone in its own environment (scripts/test_core.sh); set
# JAXBERT_SKIP_CORE=1 to run only the main suite.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${JAXBERT_SKIP_CORE:-}" ]; then
    bash scripts/test_core.sh -q
fi
PY="$(bash scripts/setup_env.sh | tail -n 1)"
exec "$PY" -m pytest tests "$@"

#!/usr/bin/env bash
# The test command: set up the environment, check lint and format (ruff), then run the whole suite (CPU, no
# network). First, the tests that need no extra run against the core install alone in its own environment
# (scripts/test_core.sh); set JAXBERT_SKIP_CORE=1 to run only the main suite.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${JAXBERT_SKIP_CORE:-}" ]; then
    bash scripts/test_core.sh -q
fi
PY="$(bash scripts/setup_env.sh | tail -n 1)"
# Lint and format first (configured in pyproject.toml): a minute's saving is not worth unreviewed style drift.
"$PY" -m ruff check --quiet .
"$PY" -m ruff format --check --quiet .
# Two workers, whole files each (module fixtures such as the multi-process runs are built once): most tests
# are bound by XLA's single-threaded compiles, so two run side by side in about 3/4 of the time of one after the
# other. JAXBERT_TEST_WORKERS=0 runs them in this process.
exec "$PY" -m pytest -n "${JAXBERT_TEST_WORKERS:-2}" --dist loadfile tests "$@"

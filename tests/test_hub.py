"""Hub ids (`org/name[@revision]`) as model paths: resolved from a Hugging Face cache layout built here (no
network), downloads simulated, errors naming the id and the cache."""

import hashlib
import os
import shutil

import numpy as np
import pytest
from conftest import cli_fails, legacy_layout, model_dir

import jaxbert
from jaxbert import hub
from jaxbert.cli import main

REV = "0123456789abcdef0123456789abcdef01234567"


def _files(source) -> list[str]:
    return sorted(os.path.relpath(os.path.join(top, n), source) for top, _, names in os.walk(source) for n in names)


def _cache_entry(cache, repo: str, source: str, link=None) -> str:
    """huggingface_hub's layout: blobs/<hash> files, snapshots/<commit>/<name> -> ../../blobs/<hash>, refs/main.
    `link` replaces one snapshot file by a symlink to another target: (name, target)."""
    entry = os.path.join(cache, "models--" + repo.replace("/", "--"))
    snapshot = os.path.join(entry, "snapshots", REV)
    os.makedirs(os.path.join(entry, "blobs"))
    os.makedirs(snapshot)
    os.makedirs(os.path.join(entry, "refs"))
    with open(os.path.join(entry, "refs", "main"), "w") as f:
        f.write(REV)
    for name in _files(source):
        data = open(os.path.join(source, name), "rb").read()
        digest = hashlib.sha256(data).hexdigest()
        with open(os.path.join(entry, "blobs", digest), "wb") as f:
            f.write(data)
        os.makedirs(os.path.dirname(os.path.join(snapshot, name)), exist_ok=True)
        up = os.path.join(*[os.pardir] * (name.count(os.sep) + 2))
        os.symlink(os.path.join(up, "blobs", digest), os.path.join(snapshot, name))
    if link:
        os.remove(os.path.join(snapshot, link[0]))
        os.symlink(link[1], os.path.join(snapshot, link[0]))
    return snapshot


@pytest.fixture
def cache(tmp_path, monkeypatch):
    return _cached_tiny_bert(tmp_path, monkeypatch)


def _cached_tiny_bert(tmp_path, monkeypatch, **overrides) -> str:
    """A random BertForMaskedLM (conftest's sizes and `overrides`) as the hub cache's acme/tiny-bert, offline; the
    working directory is tmp_path. Returns the source directory."""
    source = model_dir(tmp_path / "source", "BertForMaskedLM", **overrides)
    cache = tmp_path / "hub"
    _cache_entry(str(cache), "acme/tiny-bert", source)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # so "acme/tiny-bert" is not a local path
    return source


@pytest.mark.parametrize("name", ["acme/tiny-bert", f"acme/tiny-bert@{REV}", "acme/tiny-bert@main"])
def test_load_by_hub_id_from_the_cache(cache, name):
    ids = np.array([[101, 7592, 2088, 102]])
    expected = jaxbert.load(cache)(ids).logits
    model = jaxbert.load(name)
    assert model.directory.endswith(os.path.join("snapshots", REV))
    np.testing.assert_array_equal(model(ids).logits, expected)
    assert model.tokenizer.encode(["hello"]).ids == [[101, 7592, 102]]


def test_commands_take_hub_ids(cache, tmp_path, capsys):
    assert main(["info", "acme/tiny-bert"]) == 0
    assert "BertForMaskedLM" in capsys.readouterr().out
    assert main(["convert", "acme/tiny-bert", str(tmp_path / "jax")]) == 0
    assert not any(os.path.islink(p) for p in (tmp_path / "jax").iterdir())  # copies, never links into the cache
    assert main(["fill-mask", "acme/tiny-bert", "paris is the [MASK] of france.", "--top-k", "1"]) == 0


def test_convert_verify_takes_a_hub_id(cache, tmp_path, capsys):
    """--verify read the hub id as a directory: the conversion was written, then 'acme/tiny-bert/config.json:
    config.json not found' and exit 1, nothing verified."""
    pytest.importorskip("torch")
    assert main(["convert", "acme/tiny-bert", str(tmp_path / "jax"), "--verify"]) == 0
    assert "verify logits" in capsys.readouterr().out


def test_an_absent_id_names_itself_and_the_cache(cache, tmp_path, capsys):
    with pytest.raises(
        FileNotFoundError,
        match=r"acme/absent: no such directory, and not in the Hugging Face "
        r"cache .*hub \(HF_HUB_OFFLINE is set",
    ):
        jaxbert.load("acme/absent")
    cli_fails(capsys, tmp_path, "convert", "acme/absent", match="acme/absent: no such directory")
    cli_fails(capsys, tmp_path, "info", "acme/tiny-bert@v9", match="acme/tiny-bert@v9: no such directory")


def test_download_when_online_and_older_weights_fetched_only_without_safetensors(tmp_path, monkeypatch):
    import huggingface_hub

    source = model_dir(tmp_path / "source", "BertModel")
    calls = []

    def fake(repo, *, local_files_only=False, allow_patterns=(), **kwargs):
        calls.append((repo, kwargs["revision"], local_files_only, tuple(allow_patterns)))
        if local_files_only:
            raise huggingface_hub.errors.LocalEntryNotFoundError("not cached")
        target = tmp_path / "downloaded"
        target.mkdir(exist_ok=True)
        for name in os.listdir(source):  # as if the hub had only a .bin: every allowed file but the safetensors
            if name != "model.safetensors" and (name.endswith(".json") or name == "vocab.txt"):
                shutil.copy(os.path.join(source, name), target)
        if "pytorch_model.bin" in allow_patterns:
            shutil.copy(os.path.join(source, "model.safetensors"), target / "model.safetensors")
        return str(target)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.chdir(tmp_path)
    assert hub.resolve("acme/new@v1") == str(tmp_path / "downloaded")
    assert [c[:3] for c in calls] == [("acme/new", "v1", True), ("acme/new", "v1", False), ("acme/new", "v1", False)]
    assert "*.safetensors" in calls[1][3] and "pytorch_model.bin" in calls[2][3]

    def unreachable(repo, *, local_files_only=False, **kwargs):
        raise OSError("Network is unreachable")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    with pytest.raises(FileNotFoundError, match=r"acme/new: .* and the hub did not provide it \(OSError: Network"):
        hub.resolve("acme/new")


def _fake_hub(monkeypatch, source, target):
    """snapshot_download as the hub would answer it for a repo holding `source`'s files: those matching
    allow_patterns (filtered as huggingface_hub filters them) copied into `target`. With local_files_only, the
    real function reads the cache (HF_HUB_CACHE, empty unless the test fills it)."""
    import huggingface_hub
    from huggingface_hub.utils import filter_repo_objects

    real = huggingface_hub.snapshot_download
    monkeypatch.setenv("HF_HUB_CACHE", os.environ.get("HF_HUB_CACHE") or str(target) + "-cache")

    def fake(repo, *, local_files_only=False, allow_patterns=None, **kwargs):
        if local_files_only:
            return real(repo, local_files_only=True, allow_patterns=allow_patterns, **kwargs)
        for name in filter_repo_objects(_files(source), allow_patterns=allow_patterns):
            os.makedirs(os.path.dirname(os.path.join(target, name)), exist_ok=True)
            shutil.copy(os.path.join(source, name), os.path.join(target, name))
        return str(target)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


def test_a_downloaded_sentence_model_keeps_its_default_prompt(tmp_path, monkeypatch):
    """config_sentence_transformers.json was not downloaded: a model whose default prompt embed refused from its
    directory embedded without it, silently, when loaded by hub id. Now both put it before every text."""
    from jaxbert.sentence_out import write_sentence_files

    source = model_dir(tmp_path / "source", "BertModel")
    write_sentence_files(source, 32, "mean", True, 16)
    with open(os.path.join(source, "config_sentence_transformers.json"), "w") as f:
        f.write('{"default_prompt_name": "query", "prompts": {"query": "query: "}}')
    _fake_hub(monkeypatch, source, tmp_path / "downloaded")
    monkeypatch.chdir(tmp_path)
    want = jaxbert.load(source).embed(["hello"], prompt="query: ")
    assert not np.allclose(want, jaxbert.load(source).embed(["hello"], prompt=""))
    for name in (source, "acme/prompted"):
        np.testing.assert_array_equal(jaxbert.load(name).embed(["hello"]), want)


def _sentence_model(tmp_path):
    from jaxbert.sentence_out import write_sentence_files

    source = model_dir(tmp_path / "source", "BertModel")
    write_sentence_files(source, 32, "mean", True, 16)
    return source


def test_a_downloaded_sentence_model_keeps_its_dense_modules(tmp_path, monkeypatch):
    """LaBSE's layout: a Dense module (its weights as the older pytorch_model.bin) and 3_Normalize. Only
    1_Pooling/config.json and 2_Normalize/* were fetched of the module directories: the Dense had no config."""
    torch = pytest.importorskip("torch")

    from jaxbert.sentence_dense import DenseSpec
    from jaxbert.sentence_out import write_sentence_files

    source = model_dir(tmp_path / "source", "BertModel")
    rng = np.random.default_rng(0)
    dense = ({"kernel": rng.normal(size=(32, 8)).astype(np.float32), "bias": np.ones(8, np.float32)},)
    write_sentence_files(source, 32, "cls", True, 16, steps=(DenseSpec("2_Dense", 32, 8),), dense=dense)
    weights = os.path.join(source, "2_Dense", "model.safetensors")
    state = {"linear.weight": torch.tensor(dense[0]["kernel"].T.copy()), "linear.bias": torch.ones(8)}
    torch.save(state, os.path.join(source, "2_Dense", "pytorch_model.bin"))
    os.remove(weights)
    assert os.path.isdir(os.path.join(source, "3_Normalize"))
    _fake_hub(monkeypatch, source, tmp_path / "downloaded")
    monkeypatch.chdir(tmp_path)
    expected = jaxbert.load(source).embed(["hello world"])
    assert expected.shape == (1, 8)
    np.testing.assert_allclose(jaxbert.load("acme/labse").embed(["hello world"]), expected, atol=1e-6)


@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model.bin"])
def test_a_sentence_model_of_the_older_layout_is_downloaded_and_read_from_the_cache(weights, tmp_path, monkeypatch):
    """A hub model whose Transformer is in 0_Transformer/ (older sentence-transformers; often .bin weights): only
    root files were fetched (no config, tokenizer or .bin of the subfolder), and a cached snapshot's subfolder files,
    links to ../../../blobs, were refused as leaving it. Both now embed as the directory itself."""
    torch = pytest.importorskip("torch")
    from safetensors.numpy import load_file

    source = legacy_layout(_sentence_model(tmp_path), tmp_path / "legacy")
    if weights == "pytorch_model.bin":
        sub = os.path.join(source, "0_Transformer")
        state = {k: torch.tensor(v) for k, v in load_file(os.path.join(sub, "model.safetensors")).items()}
        torch.save(state, os.path.join(sub, weights))
        os.remove(os.path.join(sub, "model.safetensors"))
    expected = jaxbert.load(source).embed(["hello world"])
    _fake_hub(monkeypatch, source, tmp_path / "downloaded")
    monkeypatch.chdir(tmp_path)
    np.testing.assert_allclose(jaxbert.load("acme/legacy").embed(["hello world"]), expected, atol=1e-6)
    assert os.path.isfile(tmp_path / "downloaded" / "0_Transformer" / weights)
    _cache_entry(str(tmp_path / "hub"), "acme/cached", source)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    np.testing.assert_allclose(jaxbert.load("acme/cached").embed(["hello world"]), expected, atol=1e-6)


def test_a_cached_snapshot_that_may_be_incomplete_is_completed_from_the_hub(tmp_path, monkeypatch):
    """transformers caches a model file by file and records no listing of the repo: its snapshot of a
    sentence-transformers model lacks modules.json and the Pooling config. Taken from the cache as it was, the hub
    id embedded with [CLS] pooling, unnormalized, where the directory itself (and sentence-transformers, which
    downloads those files) pools the mean and normalizes."""
    source = _sentence_model(tmp_path)
    transformers_files = tmp_path / "transformers-files"
    shutil.copytree(source, transformers_files, ignore=shutil.ignore_patterns("modules.json", "?_*", "sentence_*"))
    snapshot = _cache_entry(str(tmp_path / "hub"), "acme/st", str(transformers_files))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    _fake_hub(monkeypatch, source, tmp_path / "downloaded")
    monkeypatch.chdir(tmp_path)
    expected = jaxbert.load(source).embed(["hello world"])
    np.testing.assert_allclose(jaxbert.load("acme/st").embed(["hello world"]), expected, atol=1e-6)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing to complete it with: the cache as it is
    assert hub.resolve("acme/st") == snapshot


def test_a_cached_snapshot_its_listing_shows_complete_is_read_without_the_hub(tmp_path, monkeypatch):
    tree_cache = pytest.importorskip("huggingface_hub._tree_cache")
    source = _sentence_model(tmp_path)
    snapshot = _cache_entry(str(tmp_path / "hub"), "acme/st", source)
    listing = {name: tree_cache.TreeCacheEntry(size=1, blob_id="0") for name in _files(source)}
    tree_cache.write_tree_cache(os.path.dirname(os.path.dirname(snapshot)), REV, listing)  # as snapshot_download
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    _fake_hub(monkeypatch, source, tmp_path / "downloaded")
    monkeypatch.chdir(tmp_path)
    assert hub.resolve("acme/st") == snapshot and not (tmp_path / "downloaded").exists()


@pytest.mark.parametrize(
    "env",
    [
        {"XDG_CACHE_HOME": "/xdg"},
        {"HUGGINGFACE_HUB_CACHE": "/legacy", "HF_HOME": "/home-hf"},
        {"HF_HOME": "~/hf"},
        {"HF_HOME": "$JAXBERT_TEST_ROOT/hf", "JAXBERT_TEST_ROOT": "/scratch"},
        {"HF_HUB_CACHE": "/hub", "HUGGINGFACE_HUB_CACHE": "/legacy", "XDG_CACHE_HOME": "/xdg"},
    ],
)
def test_the_cache_is_where_huggingface_hub_puts_it(env, monkeypatch):
    """XDG_CACHE_HOME and HUGGINGFACE_HUB_CACHE were ignored and HF_HOME's ~ and $VARIABLE kept as written: with
    XDG_CACHE_HOME set, a model transformers had cached was 'not in the Hugging Face cache ~/.cache/...'."""
    import subprocess
    import sys

    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    reference = subprocess.run(
        [sys.executable, "-c", "from huggingface_hub import constants; print(constants.HF_HUB_CACHE)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert hub.cache_dir() == reference.stdout.strip()


def test_paths_stay_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "local").mkdir()
    assert hub.resolve("org/local") == "org/local"  # exists: a path, even though shaped like an id
    for name in ("./acme/x", "out/mlm/final", "/abs/dir"):
        assert hub.resolve(name) == name  # not an id: the reader names the missing path itself


def test_a_snapshot_file_linking_out_of_its_cache_entry_is_refused(tmp_path, monkeypatch):
    source = model_dir(tmp_path / "source", "BertModel")
    outside = tmp_path / "elsewhere.json"
    shutil.copy(os.path.join(source, "config.json"), outside)
    _cache_entry(str(tmp_path / "hub"), "acme/sly", source, link=("config.json", str(outside)))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"config.json: resolves to .*elsewhere.json, outside the checkpoint"):
        jaxbert.load("acme/sly")


def test_training_takes_a_hub_id(tmp_path, monkeypatch, capsys):
    # One layer: the hub id is the point, and compiling the train step's unrolled layers was most of the time.
    _cached_tiny_bert(tmp_path, monkeypatch, num_hidden_layers=1)
    (tmp_path / "train.txt").write_text("\n".join(f"line {i} of a small corpus about paris" for i in range(40)))
    rc = main(
        [
            "train-mlm",
            "--model",
            "acme/tiny-bert",
            "--train-file",
            str(tmp_path / "train.txt"),
            "--output-dir",
            str(tmp_path / "out"),
            "--max-steps",
            "1",
            "--per-device-batch-size",
            "2",
            "--max-seq-length",
            "16",
            "--no-progress",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    assert (tmp_path / "out" / "final" / "config.json").is_file()


@pytest.mark.parametrize("command", ["predict", "evaluate"])
def test_predict_and_evaluate_take_hub_ids(tmp_path, monkeypatch, capsys, command):
    """evaluate read the hub id as a directory ('acme/tiny-cls/config.json: config.json not found', exit 1) where
    predict, info and every other command read the cached snapshot."""
    source = model_dir(tmp_path / "source", "BertForSequenceClassification")
    _cache_entry(str(tmp_path / "hub"), "acme/tiny-cls", source)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rows.jsonl").write_text('{"text": "a b", "label": "LABEL_1"}\n{"text": "c d", "label": "LABEL_0"}\n')
    args = ["--input", "rows.jsonl", "--output", "p.jsonl"]
    if command == "evaluate":
        args = ["--task", "sequence-classification", "--file", "rows.jsonl", "--output", "m.json"]
    capsys.readouterr()
    assert main([command, "acme/tiny-cls", *args]) == 0, capsys.readouterr().err
    assert os.path.isfile(args[-1])

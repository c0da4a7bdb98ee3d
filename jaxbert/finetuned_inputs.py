"""How `predict` and `evaluate` (finetuned.py) read a fine-tuned model's inputs: a file's texts, pairs or word lists
(_inputs, _tag_inputs) in the columns the model was trained on (_trained_columns), the question-answering options
it is read with (qa_options), and predict's multiple-choice and question-answering passes (_choose, _answers)."""

from __future__ import annotations

import json

import numpy as np

from jaxbert import batching
from jaxbert.config import padding_id
from jaxbert.inputs import check_encoded


def _inputs(path: str, text_column: str, pair_column: str | None):
    """(texts, pairs or None) of a .txt file (one text per line) or a .jsonl / .csv / .tsv file's columns."""
    if path.endswith(".txt"):
        from jaxbert.texts import read_text_file

        return read_text_file(path, keep_empty=True).texts, None
    from jaxbert.train.task_data import read_rows

    rows = read_rows(path, "--input")
    return [r.text(text_column) for r in rows], [r.text(pair_column) for r in rows] if pair_column else None


def _tag_inputs(path: str, column: str | None, config) -> tuple[list, bool]:
    """A tagger's inputs and whether they are word lists: a .txt file's lines, or a column of texts or of word lists
    as its training data hold them (a JSON array; in CSV/TSV, one in a cell or numbered columns), told by the first
    row. The column: --text-column, else the one it was trained on where the file has it, else "text"."""
    if path.endswith(".txt"):
        return _inputs(path, "text", None)[0], False
    from jaxbert.train.task_data import read_rows

    rows = read_rows(path, "--input")
    trained = _trained_columns(config, None, None)[0]
    has = lambda row, name: name in row.values or f"{name}0" in row.values  # noqa: E731
    column = column or (trained if trained and has(rows[0], trained) else "text")
    value = rows[0].get(column)
    if not rows[0].typed and isinstance(value, str) and value.strip().startswith("["):
        try:  # a cell holding a JSON array of words, as training reads it; else a text starting with "["
            value = json.loads(value)
        except ValueError:
            pass
    words = isinstance(value, list)
    return [r.texts(column) if words else r.text(column) for r in rows], words


def _trained_columns(config, text: str | None, pair: str | None) -> tuple[str | None, str | None]:
    """--text-column and --text-pair-column, else those a sequence classifier or multiple-choice model (or, for
    evaluate, a tagger: its words) was trained with (task_table.COLUMNS_KEY): fed its first texts alone, a pair
    model scores them without a word, and data in the columns it was trained on are its data."""
    from jaxbert.train.task_table import trained_columns

    trained = trained_columns(config)
    return text or trained[0], pair or trained[1]


def _choose(bert, path: str, context: str, options: str, batch_size: int, max_length: int) -> list[dict]:
    """Multiple choice: per example {label: index of the best option, scores: softmax over the options}. Examples
    with the same number of options run `batch_size` at a time, longest first, in (batch, length) buckets."""
    from jaxbert.tokenizer import pad
    from jaxbert.train.task_data import read_rows

    rows = read_rows(path, "--input")
    pairs = [(row.text(context), row.texts(options)) for row in rows]
    for row, (_, opts) in zip(rows, pairs):
        if not opts:
            raise ValueError(f"{row.where(options)}: no options to choose from")
    out: list[dict | None] = [None] * len(rows)
    for count in sorted({len(opts) for _, opts in pairs}):
        group = [i for i, (_, opts) in enumerate(pairs) if len(opts) == count]
        flat = [(pairs[i][0], o) for i in group for o in pairs[i][1]]
        enc = bert.tokenizer.encode([c for c, _ in flat], [o for _, o in flat], max_length=max_length)
        # Named by line and option: the batches' own check names a row of length-sorted batches.
        check_encoded(bert.config, enc, lambda i, g=group, c=count: f"{rows[g[i // c]].where(options)}: option {i % c}")
        longest = np.asarray(enc.lengths()).reshape(len(group), count).max(1)
        for idx, n, length in batching.plan(longest, batch_size, bert.length_buckets):
            order = [e * count + k for e in idx for k in range(count)]
            feed = pad(enc, length, n * count, padding_id(bert.config), order)
            arrays = (feed[k].reshape(n, count, length) for k in ("input_ids", "attention_mask", "token_type_ids"))
            logits = np.asarray(bert(*arrays).logits, np.float64)[: len(idx)]
            probs = np.exp(logits - logits.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            for e, p in zip(idx, probs):
                out[group[e]] = {"label": int(p.argmax()), "scores": [float(x) for x in p]}
    return out


def qa_options(config, task: str, version_2_with_negative=None, null_score_diff_threshold=None) -> dict | None:
    """The question-answering options a model is read with: the ones it was trained with (config.json's
    question_answering block, task_qa.QARun.final_config), each one given here replacing its own; None for a model
    not fine-tuned here when none is given. A model from elsewhere (a SQuAD 2.0 one from the hub, say) gets its
    null answers from `version_2_with_negative`, as run_qa's flag gives them."""
    import math

    given = {"version_2_with_negative": version_2_with_negative, "null_score_diff_threshold": null_score_diff_threshold}
    given = {k: v for k, v in given.items() if v is not None}
    if given and task != "question-answering":
        raise ValueError(f"--{next(iter(given)).replace('_', '-')}: only for question answering, not {task}")
    threshold = given.get("null_score_diff_threshold", 0.0)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
        raise ValueError(f"--null-score-diff-threshold {threshold}: must be a finite number")
    trained = config.extra.get("question_answering")
    if not isinstance(trained, dict) and not given:
        return None
    options = {**(trained if isinstance(trained, dict) else {}), **given}
    # The threshold decides SQuAD 2.0's null answers alone (run_qa's postprocessing reads it only then): without
    # them, every question is answered and the threshold would go unread.
    if "null_score_diff_threshold" in given and options.get("version_2_with_negative") is not True:
        raise ValueError(
            f"--null-score-diff-threshold {threshold}: decides SQuAD 2.0's null answers, and this question answering "
            "model answers every question (as trained, or not fine-tuned here); give --version-2-with-negative too"
        )
    return options


def _answers(bert, path: str, question: str, context: str, batch_size: int, length: int | None, trained) -> list:
    """A model fine-tuned here answers as its validation scored it (its windows, answer length and SQuAD v2 null
    answers, kept in its config: qa.trained_answers), so `predict` and `evaluate` agree, and so does one given
    `trained` options (qa_options); others as transformers' question-answering pipeline with its defaults
    (Bert.answer)."""
    from jaxbert import qa
    from jaxbert.inputs import renaming
    from jaxbert.train.task_data import read_rows
    from jaxbert.train.task_qa import by_row, pipeline_row

    rows = read_rows(path, "--input")
    pairs = [(row.text(question), row.text(context)) for row in rows]
    for row, pair in zip(rows, pairs):
        for column, text in zip((question, context), pair):
            if not text.strip():
                raise ValueError(f"{row.where(column)}: empty text; each row needs a question and a context")
    if trained is not None:  # as evaluate: the trained stride where it fits, else the pipeline's
        trained = qa.check_options(trained)
        saved = trained.get("max_seq_length", 384)  # run_qa's default, as qa._trained_options
        window = min(length or saved, bert.max_length(None))
        # The window as named in a question too long for it: by what set its length and its stride.
        given = "--max-seq-length" if length else "the trained length" if "max_seq_length" in trained else None
        names = (given or "run_qa's default length", "the trained stride" if length else "stride")
        trained = {**trained, "max_seq_length": window}
        if trained.get("doc_stride", window) >= window:
            trained["doc_stride"] = qa.default_stride(window)
            names = (names[0], "its default stride")
        with renaming(by_row(rows, question)):  # the window's example named by its row
            return qa.trained_answers(bert, *map(list, zip(*pairs)), trained, batch_size, names)
    answers = []
    for row, (q, c) in zip(rows, pairs):
        with renaming(pipeline_row(row, question, length is not None)):  # the row and predict's names, not answer's
            answers.append(bert.answer(q, c, batch_size=batch_size, max_seq_len=length)[0])
    return answers

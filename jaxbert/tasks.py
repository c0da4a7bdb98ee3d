"""Text-level tasks on a loaded `Bert`: fill-mask, sequence classification, token tagging (host-side glue
around the jitted forward: tokenization, bucketed batches, softmax), sentence embeddings, generated text. tag's
words, windows' stride and entities are tagging.py's."""

from __future__ import annotations

import warnings

import numpy as np
from tqdm.auto import tqdm

from jaxbert import entities, sentence_dense, sentence_dir, tagging, windows
from jaxbert.inputs import Arg, ArgumentError, check_encoded, check_unicode, items, only, positive_int, renaming
from jaxbert.tokenizer import NO_LIMIT, check_texts

_MLM_HEADS = ("BertForMaskedLM", "BertForPreTraining")


def _shown(n_texts: int, batch_size: int, show: bool | None) -> bool:
    """A bar for long inputs (20 batches of texts or more), or when asked."""
    return -(-n_texts // batch_size) >= 20 if show is None else show


def progress(batches, n_texts: int, batch_size: int, show: bool | None):
    """Wrap the batch iterator in a tqdm bar (on stderr) for long inputs, or when asked."""
    total = -(-n_texts // batch_size)
    return tqdm(batches, total=total, unit="batch", disable=not _shown(n_texts, batch_size, show), leave=False)


def packed(bert, enc, batch_size: int, show: bool | None = None, name="texts", program="forward"):
    """bert.packed_batches (for `program`) with a bar counting texts (a packed batch holds a varying number of them);
    out-of-range ids named by text first (check_encoded: `items(name)` of its index), not by a packed row."""
    check_encoded(bert.config, enc, items(name))
    with tqdm(total=len(enc), unit="text", disable=not _shown(len(enc), batch_size, show), leave=False) as bar:
        for rows, batch in bert.packed_batches(enc, batch_size, program):
            yield rows, batch
            bar.update(sum(map(len, rows)))


def _softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _require(bert, heads: tuple[str, ...], what: str):
    if bert.head not in heads:
        raise ValueError(f"{what} needs a {' or '.join(heads)} head; this checkpoint is {bert.head}")


class TargetWarning(UserWarning):
    """A fill_mask target not in the vocabulary: `piece`, its first word piece, stands for it (None: it has none,
    and is ignored). The command line says it in its own words (cli._show_warning)."""

    def __init__(self, message: str, target: str, piece: str | None):
        super().__init__(message)
        self.target, self.piece = target, piece


def _target_ids(tok, targets, vocab_size: int) -> np.ndarray:
    """The fill-mask pipeline's target ids: a token of the vocabulary is itself, any other text its first word
    piece (warned, as there), an empty one skipped (warned); duplicates once, in ascending order."""
    targets = [targets] if isinstance(targets, str) else targets
    if not isinstance(targets, (list, tuple)) or not all(isinstance(t, str) for t in targets):
        raise TypeError("targets must be a string or a list of strings")
    ids = set()
    for target in targets:
        i = tok.token_to_id(target)
        if i is None:
            enc = tok.encode([target], max_length=NO_LIMIT, truncation=False)
            pieces = [t for t, special in zip(enc.ids[0], enc.special[0]) if not special]
            if not pieces:
                ignored = f"fill_mask target {target!r}: not in the vocabulary, no word piece: ignored"
                warnings.warn(TargetWarning(ignored, target, None), stacklevel=4)
                continue
            i = pieces[0]
            replaced = f"fill_mask target {target!r} is not in the vocabulary: replaced by {tok.id_to_token(i)!r}"
            warnings.warn(TargetWarning(replaced, target, tok.id_to_token(i)), stacklevel=4)  # Bert.fill_mask's caller
        if i >= vocab_size:
            raise ValueError(f"fill_mask target {target!r}: token id {i} is outside the model's {vocab_size} tokens")
        ids.add(i)
    if not ids:
        raise ValueError("fill_mask: targets holds no token")
    return np.asarray(sorted(ids), np.int32)


def _the_model_s(part):
    """fill_mask's bound: the model's length, not a max_length argument (fill_mask has none)."""
    return f"the model's {part.shown}" if isinstance(part, Arg) and part.name == "max_length" else part


def fill_mask(bert, text, top_k: int = 5, batch_size: int = 32, targets=None, *, name="text") -> list:
    """For each [MASK] in `text`, in order: the top_k {token, token_id, score, sequence}. A list of texts gives
    one such list per text, in input order; the texts share packed rows (packing.py) as in `embed`. With
    `targets`, the candidates are those tokens only (at most top_k of them), each scored by its probability over
    the whole vocabulary, as the fill-mask pipeline's `targets`. `name` names a list's texts in errors
    (inputs.items: `text[i]`, or the caller's function of i: the command line's "text 2" counts from 1)."""
    _require(bert, _MLM_HEADS, "fill_mask")
    single = isinstance(text, str)
    if not single and not isinstance(text, (list, tuple)):
        raise TypeError(f"text is {type(text).__name__}, not a string or a list of strings")
    top_k = positive_int("top_k", top_k, bert.config.vocab_size)
    batch_size = positive_int("batch_size", batch_size)
    texts = [text] if single else check_texts(text, "text")
    name = only("text") if single else name
    tok = bert.tokenizer
    target_ids = None if targets is None else _target_ids(tok, targets, bert.config.vocab_size)
    top_k = top_k if target_ids is None else min(top_k, len(target_ids))
    # Not cut to fit: cutting could drop a [MASK] (the pipeline leaves too long a text to fail in the model). The
    # parameter is `text` (one text, or a list of them); max_length is not an argument fill_mask has: it is the
    # model's length.
    limit = bert.max_length(None)
    with renaming(lambda parts: tuple(_the_model_s(p) for p in parts)):
        enc = tok.encode(texts, max_length=limit, truncation=False, hint=None, name=name)
    masks = [np.flatnonzero(np.asarray(ids) == tok.mask_token_id) for ids in enc.ids]
    for i, found in enumerate(masks):
        if found.size == 0:
            raise ValueError(f"no {tok.mask_token} in {items(name)(i)}: {texts[i]!r}")
    results: list = [None] * len(texts)
    for rows, b in packed(bert, enc, batch_size, name=name, program="fill_mask"):
        starts = np.asarray(b["starts"])
        # Each row's [MASK] columns: its segments' own positions moved to where the segment starts.
        at = [np.concatenate([starts[r, s] + masks[i] for s, i in enumerate(texts)]) for r, texts in enumerate(rows)]
        most = max(row.size for row in at)
        # Positions padded to a power of two (repeating column 0): few compiled programs whatever the count.
        asked = np.zeros((b["input_ids"].shape[0], 1 << (most - 1).bit_length()), np.int32)
        for r, row in enumerate(at):
            asked[r, : row.size] = row
        arrays = [b[k] for k in ("input_ids", "attention_mask", "token_type_ids", "position_ids", "segment_ids")]
        found = bert._mask_top_k(bert.weights, *arrays, asked, target_ids, k=top_k)
        token_ids, probs = (np.asarray(x) for x in found)
        for r, members in enumerate(rows):
            col = 0
            for i in members:
                cols = slice(col, col + masks[i].size)
                results[i] = _candidates(tok, enc.ids[i], masks[i], token_ids[r, cols], probs[r, cols])
                col = cols.stop
    return results[0] if single else results


def _candidates(tok, ids, positions, token_ids, probs) -> list[list[dict]]:
    """Per [MASK] of one text, its candidates: token, id, probability and the text with it in that place
    (special tokens dropped when the text has one [MASK], [PAD] always, as transformers' fill-mask pipeline does)."""
    ids = np.asarray(ids)
    kept = ids != tok.token_to_id(tok.special_tokens["pad_token"])  # the pipeline drops padding from the sequence
    results = []
    for pos, best, p in zip(positions, token_ids, probs):
        candidates = []
        for token_id, score in zip(best.tolist(), p.tolist()):
            filled = ids.copy()
            filled[pos] = token_id
            candidates.append(
                {
                    "token": tok.id_to_token(token_id),
                    "token_id": token_id,
                    "score": score,
                    "sequence": tok.decode(filled[kept], skip_special_tokens=positions.size == 1),
                }
            )
        results.append(candidates)
    return results


def _logits(bert, enc, batch_size: int) -> list[np.ndarray]:
    """Per text, its logits (per token ones unpadded), from packed rows (packing.py): `batch_size` rows a call."""
    out: list[np.ndarray | None] = [None] * len(enc)
    pooled = bert.head == "BertForSequenceClassification"
    for rows, b in packed(bert, enc, batch_size):
        arrays = [b[k] for k in ("input_ids", "attention_mask", "token_type_ids", "position_ids")]
        logits = bert._forward(bert.weights, *arrays, None, None, None, b["segment_ids"], b["starts"]).logits
        logits, starts = np.asarray(logits, np.float32), np.asarray(b["starts"])
        for r, members in enumerate(rows):
            for s, i in enumerate(members):
                at = starts[r, s]
                out[i] = logits[r, s] if pooled else logits[r, at : at + len(enc.ids[i])]
    return out


def _named(names: list[str], values) -> dict[str, float]:
    return dict(zip(names, map(float, values)))


def classify(bert, texts, pairs=None, batch_size: int = 32, max_length: int | None = None) -> list[dict]:
    """Sequence classification: per text {label, score, scores: {label: probability}}; for regression
    {score} ({scores: {name: value}} with several outputs); for multi-label {labels: [label with probability >
    0.5], scores}. Texts (with their pairs) longer than `max_length` tokens (default: the model's limit) are cut
    to it, longest first, as training and `evaluate` cut them."""
    _require(bert, ("BertForSequenceClassification",), "classify")
    batch_size = positive_int("batch_size", batch_size)
    names = bert.config.label_names("classify's scores are keyed by label name")
    enc = bert.tokenizer.encode(texts, pairs, max_length=bert.max_length(max_length))
    problem = bert.config.problem_type
    results = []
    for logits in _logits(bert, enc, batch_size):
        if problem == "regression" or (problem is None and len(names) == 1):  # several outputs: each by name
            results.append({"score": float(logits[0])} if len(names) == 1 else {"scores": _named(names, logits)})
            continue
        if problem == "multi_label_classification":
            probs = 1 / (1 + np.exp(-logits.astype(np.float64)))
            scores = _named(names, probs)
            results.append({"labels": [n for n, p in scores.items() if p > 0.5], "scores": scores})
            continue
        # One class under single-label: a softmax would score 1.0 whatever the text; transformers' pipeline gives
        # its sigmoid, and so does this.
        probs = 1 / (1 + np.exp(-logits.astype(np.float64))) if len(names) == 1 else _softmax(logits)
        best = int(probs.argmax())
        scores = _named(names, probs)
        results.append({"label": names[best], "score": float(probs[best]), "scores": scores})
    return results


def tag(
    bert,
    texts,
    batch_size: int = 32,
    max_length: int | None = None,
    stride: int | None = None,
    aggregation_strategy: str | None = None,
    ignore_labels=None,
    is_split_into_words: bool = False,
    delimiter: str = " ",
):
    """Token classification aligned to words: each word takes the label of its first word piece, and carries
    its character span {word, label, score, start, end} in the original text. A text longer than `max_length`
    tokens (default: the model's limit) is read in windows of that length overlapping by `stride` tokens
    (default: half a window, at most 128), each word labelled from the window where it has the most context
    (windows.py): every word of every text is tagged.

    With `aggregation_strategy` (none, simple, first, average, max) each text gives the token-classification
    pipeline's entities instead, `ignore_labels` (default ["O"]) left out (entities.py); a long text as the
    pipeline's `stride` reads it: grouped per window, overlaps resolved ("none": each token from its window of
    most context, where the pipeline refuses a stride).

    With `is_split_into_words`, each text is a list of words (one list alone is one text), read as the pipeline
    reads them: the text is the words joined by `delimiter`, and start / end are characters of that text."""
    _require(bert, ("BertForTokenClassification",), "tag")
    batch_size = positive_int("batch_size", batch_size)
    how = None if aggregation_strategy is None else entities.strategy(aggregation_strategy)
    ignore = entities.ignored(ignore_labels, how)
    length = bert.max_length(max_length)
    if is_split_into_words:
        texts, enc = tagging.joined(bert.tokenizer, texts, delimiter)
    else:
        texts = check_texts(texts)  # read twice: by the tokenizer, then for the words
        enc = bert.tokenizer.encode(texts, max_length=NO_LIMIT, truncation=False)
    stride = tagging.window_stride(stride, length, bert.tokenizer)
    check_encoded(bert.config, enc)  # named by text and position in it, not by window
    pieces, home = windows.split(enc, length, stride)
    names = [bert.config.id2label[i] for i in range(bert.config.num_labels)]
    per_window = _logits(bert, pieces, batch_size)
    if how is not None:
        return tagging.entity_lists(bert.tokenizer, names, texts, enc, pieces, home, per_window, how, ignore)
    joined = windows.join(enc, pieces, home, per_window)
    return [tagging.words(texts[t], enc.offsets[t], enc.word_ids[t], _softmax(x), names) for t, x in enumerate(joined)]


def generate_text(model, prompt: str, **options) -> list[str]:
    """Decoded continuations of `prompt` (num_return_sequences of them), special tokens skipped.

    A causal LM continues [CLS] + the prompt's tokens (no closing [SEP], which would read as the end of the text)
    and its output includes the prompt, as transformers' text-generation pipeline; a bert2bert model reads the
    prompt as its encoder input and returns only what the decoder wrote. Nothing is truncated: a prompt too long
    for the positions is an error naming its length."""
    if not isinstance(prompt, str):
        raise TypeError(f"prompt must be a string, got {type(prompt).__name__}")
    enc = model.tokenizer.encode([prompt], truncation=False, hint=None, name=only("prompt"))
    ids = np.asarray(enc.ids[0], np.int64)
    if model.head == "EncoderDecoderModel":
        rows = model.generate(ids[None], **options)
    else:
        special = np.asarray(enc.special[0], bool)
        if len(ids) > 1 and special[-1]:
            ids = ids[:-1]
        rows = model.generate(ids[None], **options)
    return [model.tokenizer.decode(row, skip_special_tokens=True) for row in rows]


def embed(bert, texts, pooling, normalize, batch_size: int, max_length, show, packing: bool, prompted=(None, None)):
    """Bert.embed: sentence embeddings in input order, from packed rows or bucketed batches; `prompted` its
    (prompt, prompt_name)."""
    defaults = bert.sentence_defaults
    modes, normalize, max_length, lower = sentence_dir.embedding_options(defaults, pooling, normalize, max_length)
    prompt = sentence_dir.resolve_prompt(defaults, *prompted)
    # The directory's Dense modules belong to its pooling: a pooling= given is jaxbert's own, without them.
    steps = defaults.steps if defaults is not None and pooling is None else ()
    pipeline = dict(pooling=modes, normalize=normalize and not steps)

    def finish(emb):  # the Dense modules and the Normalize after them, on the pooled vectors still on the devices
        return bert._project(emb, bert.sentence_dense, steps=steps, normalize=normalize) if steps else emb

    if "pooler" in modes and not bert.has_pooler:
        pooler = Arg.showing("pooling", "pooler", repr, sep="=")
        raise ArgumentError(pooler, f": this {bert.head} checkpoint has no pooler")
    batch_size = positive_int("batch_size", batch_size)
    tok = bert.tokenizer.lowercased() if lower else bert.tokenizer
    limit = bert.max_length(max_length)
    # The prompt is part of each text, as encode puts it: truncated with it, lower-cased with it.
    texts = check_texts(texts)
    try:
        enc = tok.encode([prompt + text for text in texts] if prompt else texts, max_length=limit)
    except ValueError:  # a lone surrogate: in the prompt (not texts[0]), or at a text's own character
        if prompt:
            check_unicode([prompt], only("prompt"))
            check_unicode(texts)
        raise
    include = defaults is None or defaults.include_prompt
    skip = np.int32(0 if include else sentence_dir.prompt_length(tok, prompt, limit))  # traced: one program
    out = np.zeros((len(enc), sentence_dense.out_features(steps, bert.config.hidden_size * len(modes))), np.float32)
    if packing:
        for rows, b in packed(bert, enc, batch_size, show, program="embed"):
            keys = ("input_ids", "attention_mask", "token_type_ids", "position_ids", "segment_ids", "starts")
            emb = np.asarray(finish(bert._embed_packed(bert.weights, *(b[k] for k in keys), skip, **pipeline)))
            for r, members in enumerate(rows):
                out[members] = emb[r, : len(members)]
        return out
    check_encoded(bert.config, enc)  # named by text, not by a length-sorted row
    for idx, batch in progress(bert.batches(enc, batch_size), len(enc), batch_size, show):
        arrays = (batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], skip)
        emb = finish(bert._embed(bert.weights, *arrays, **pipeline))
        out[idx] = np.asarray(emb)[: len(idx)]
    return out

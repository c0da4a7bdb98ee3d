"""Entities of a token classification model as transformers' token-classification pipeline reports them
(`aggregation_strategy` none / simple / first / average / max), for `Bert.tag`.

The pipeline's rules, kept as they are: a token continues a word when its string and the text it covers differ in
length (WordPiece's "##"); [UNK] is the text it covers and starts a word; "first", "average" and "max" give each
word one label (its first token's, its tokens' mean probabilities' best, its most confident token's), "simple"
labels tokens; then adjacent tokens (words) of one type join unless the next is B-: "B-PER", "I-PER" are one PER
entity scored by the mean of their scores, its `word` the decoded tokens, `start` / `end` the characters covered.
Labels in `ignore_labels` (default "O") are dropped after grouping. A text read in several windows is grouped per
window and entities overlapping across windows are resolved as the pipeline's `stride` does: the longer, then the
more confident, wins.
"""

from __future__ import annotations

import warnings

import numpy as np

STRATEGIES = ("none", "simple", "first", "average", "max")


def strategy(value) -> str:
    """`aggregation_strategy` checked: one of STRATEGIES in any case (the pipeline upper-cases it)."""
    if not isinstance(value, str) or value.lower() not in STRATEGIES:
        raise ValueError(f"aggregation_strategy {value!r}: unknown, expected one of {', '.join(STRATEGIES)}")
    return value.lower()


def ignored(labels, given_strategy: str | None) -> tuple[str, ...]:
    """`ignore_labels` checked: labels (strings) to drop, by default ("O",); only with an aggregation_strategy."""
    if labels is None:
        return ("O",)
    if given_strategy is None:
        raise ValueError("ignore_labels applies to entities: give an aggregation_strategy too")
    if not isinstance(labels, (list, tuple, set, frozenset)) or not all(isinstance(x, str) for x in labels):
        raise TypeError(f"ignore_labels must be a list of label names, got {labels!r}")
    return tuple(labels)


def softmax(logits: np.ndarray) -> np.ndarray:
    """The pipeline's float32 softmax."""
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def decode(tok, tokens: list[str]) -> str:
    """transformers' convert_tokens_to_string: the tokenizer's decoder ("##" joined, spaces cleaned) on strings."""
    decoder = tok.backend.decoder
    return decoder.decode(tokens) if decoder is not None else " ".join(tokens)


def tokens(tok, text: str, ids, offsets, special, probs: np.ndarray, warn: bool) -> list[dict]:
    """The pipeline's pre-entities of one window: per token not special, its string (the text it covers for [UNK]),
    probabilities, characters, index in the window and whether it continues a word."""
    prefix = getattr(tok.backend.model, "continuing_subword_prefix", None)
    if not prefix and warn:  # as the pipeline: without "##" a word is told by the spaces around it
        warnings.warn("Tokenizer does not support real words, using fallback heuristic", UserWarning, stacklevel=5)
    unk = tok.token_to_id(tok.special_tokens["unk_token"])
    out = []
    for i, (token_id, (start, end), is_special) in enumerate(zip(ids, offsets, special)):
        if is_special:
            continue
        word, covered = tok.id_to_token(token_id), text[start:end]
        subword = len(word) != len(covered) if prefix else start > 0 and " " not in text[start - 1 : start + 1]
        if token_id == unk:
            word, subword = covered, False
        out.append({"word": word, "scores": probs[i], "start": start, "end": end, "index": i, "subword": subword})
    return out


def _word(tok, names, group: list[dict], how: str) -> dict:
    """One word's label and score from its tokens: the first's, the most confident's, or their mean's best."""
    if how == "average":
        scores = np.nanmean(np.stack([t["scores"] for t in group]), axis=0)
    else:
        scores = (group[0] if how == "first" else max(group, key=lambda t: t["scores"].max()))["scores"]
    best = int(scores.argmax())
    word = decode(tok, [t["word"] for t in group])
    return {"entity": names[best], "score": float(scores[best]), "word": word, **_span(group)}


def _span(members: list[dict]) -> dict:
    return {"start": members[0]["start"], "end": members[-1]["end"]}


def _bi(label: str) -> tuple[str, str]:
    """The pipeline's get_tag: B-X and I-X are (B|I, X); any other label continues (I) a type of its own name."""
    return (label[0], label[2:]) if label.startswith(("B-", "I-")) else ("I", label)


def _groups(tok, found: list[dict]) -> list[dict]:
    """Adjacent tokens (words) of one type joined, a B- starting a new one (the pipeline's group_entities)."""
    groups: list[list[dict]] = []
    for e in found:
        bi, kind = _bi(e["entity"])
        if groups and bi != "B" and kind == _bi(groups[-1][-1]["entity"])[1]:
            groups[-1].append(e)
        else:
            groups.append([e])
    return [
        {
            "entity_group": g[0]["entity"].split("-", 1)[-1],  # the pipeline names a group so, not by _bi
            "score": float(np.nanmean(np.asarray([e["score"] for e in g], np.float32))),
            "word": decode(tok, [e["word"] for e in g]),
            **_span(g),
        }
        for g in groups
    ]


def aggregate(tok, names, pre: list[dict], how: str, ignore: tuple[str, ...]) -> list[dict]:
    """One window's entities (the pipeline's aggregate, then its ignore_labels filter)."""
    if how in ("none", "simple"):
        found = [
            {"entity": names[int(t["scores"].argmax())], "score": float(t["scores"].max()), "index": t["index"]}
            | {"word": t["word"], "start": t["start"], "end": t["end"]}
            for t in pre
        ]
    else:
        words = []
        for t in pre:
            if words and t["subword"]:
                words[-1].append(t)
            else:
                words.append([t])
        found = [_word(tok, names, w, how) for w in words]
    found = found if how == "none" else _groups(tok, found)
    return [e for e in found if e.get("entity") not in ignore and e.get("entity_group") not in ignore]


def merge_overlapping(found: list[dict]) -> list[dict]:
    """Entities of overlapping windows, those sharing characters resolved as the pipeline's
    aggregate_overlapping_entities: in order of start, the longer (then the more confident) of two kept."""
    if not found:
        return found
    found = sorted(found, key=lambda e: e["start"])
    out, previous = [], found[0]
    for e in found:
        if previous["start"] <= e["start"] < previous["end"]:
            length, previous_length = e["end"] - e["start"], previous["end"] - previous["start"]
            if length > previous_length or length == previous_length and e["score"] > previous["score"]:
                previous = e
        else:
            out.append(previous)
            previous = e
    return [*out, previous]

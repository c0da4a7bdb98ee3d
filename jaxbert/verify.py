"""`convert --verify`: run the PyTorch model of the source and the converted jaxbert model on one fixed padded
batch and report max |difference| per output. Needs torch and transformers (the `torch` extra)."""

from __future__ import annotations

import numpy as np

from jaxbert.config import BertConfig, padding_id
from jaxbert.heads import BASE_FIELDS, TABLE, resolve_head
from jaxbert.sentence_dir import transformer_dir
from jaxbert.seq2seq import config_sides, load_config

# Tolerance on max |difference| at real (unpadded) positions: absolute for float32; for half precision,
# relative to max(1, max |reference|), by what an 8- or 11-bit mantissa can hold.
TOLERANCE = {"float32": 1e-5, "float16": 5e-3, "bfloat16": 2e-2}


SENTENCES = (
    ("The quick brown fox jumps over the lazy dog.", "It was not amused."),
    ("Paris is the capital of France.", "Berlin is the capital of Germany."),
    ("Short one.", "Yes."),
)


def fixed_batch(config: BertConfig, head: str, directory: str | None = None) -> dict[str, np.ndarray]:
    """Sentence pairs through the checkpoint's tokenizer when it has one (realistic activations), else
    deterministic random ids; either way with padded rows, and token types 0/1 where the model has two."""
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(directory)
        feed = dict(tokenizer(*map(list, zip(*SENTENCES)), padding=True, return_tensors="np"))
        if _fits(config, feed):
            return {k: v[None] for k, v in feed.items()} if head == "BertForMultipleChoice" else feed
    except (OSError, ValueError, TypeError):  # no tokenizer files in the source: random ids below
        pass
    return _random_batch(config, head)


def _fits(config: BertConfig, feed: dict[str, np.ndarray]) -> bool:
    """Whether the tokenized pairs index inside the model's tables: a model with one token type (or fewer
    positions than the pairs' tokens) made PyTorch's reference fail with a traceback (IndexError) instead of
    verifying."""
    types = feed.get("token_type_ids", np.zeros(1, np.int64))
    return (
        int(feed["input_ids"].max()) < config.vocab_size
        and int(types.max()) < config.type_vocab_size
        and feed["input_ids"].shape[-1] <= config.max_position_embeddings
    )


def _random_batch(config: BertConfig, head: str, batch: int = 3, length: int = 16) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    length = min(length, config.max_position_embeddings)
    ids = rng.integers(1, config.vocab_size, (batch, length))
    mask = np.ones((batch, length), np.int64)
    mask[1, length // 2 :] = 0
    mask[2, 3:] = 0
    ids[mask == 0] = padding_id(config)
    types = np.zeros_like(ids)
    if config.type_vocab_size > 1:
        types[:, length // 3 :] = 1
    feed = dict(input_ids=ids, attention_mask=mask, token_type_ids=types * mask)
    if head == "BertForMultipleChoice":
        feed = {k: v[None] for k, v in feed.items()}
    return feed


def requirements():
    """(torch, transformers), or the one-line ImportError naming the extra: checked before converting."""
    try:
        import torch
        import transformers
    except ImportError:
        raise ImportError("--verify needs torch and transformers: pip install 'jaxbert[torch]'") from None
    except Exception as e:  # noqa: BLE001 - installed but broken (e.g. a transformers built for another torch)
        raise ImportError(f"--verify needs torch and transformers, and importing them failed ({_cause(e)})") from None
    return torch, transformers


def _cause(e: BaseException) -> str:
    """An exception as one short clause: its type and first line, and the next when the first only introduces it
    (huggingface_hub's "Validation error for field 'use_cache':" is followed by what was wrong)."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()] or [""]
    first = f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]
    return f"{type(e).__name__}: {first}"


def _reference(transformers, head: str, src: str):
    """transformers' model of `src`, or a ValueError naming what transformers refused: its config (a field it
    validates more strictly than jaxbert, e.g. use_cache "yes", or dtype "auto", which it reads as a torch
    attribute) or the model it builds from it. Whatever fails inside transformers' loading is the checkpoint's
    meeting transformers, not a fault of the conversion: one line, not a traceback."""
    where = f"transformers {transformers.__version__}"
    try:
        cls = getattr(transformers, head)
        config = cls.config_class.from_pretrained(src)
    except Exception as e:  # noqa: BLE001 - transformers' config validation raises many kinds
        raise ValueError(f"--verify: {where} refuses {src}/config.json ({_cause(e)})") from None
    try:
        return cls.from_pretrained(src, config=config, attn_implementation="eager").eval()
    except Exception as e:  # noqa: BLE001 - as above, for building the model and reading its weights
        raise ValueError(f"--verify: {where} cannot load {src} ({_cause(e)})") from None


def verify(src: str, dst: str) -> dict[str, tuple[float, float]]:
    """Per output: (max |difference|, tolerance). Raises ImportError without torch/transformers, ValueError when
    transformers cannot run the source (e.g. features transformers 5 removed)."""
    torch, transformers = requirements()
    import jaxbert

    transformers.utils.logging.disable_progress_bar()
    config = load_config(src)
    head = resolve_head(None, load_config(dst))  # what convert wrote (a sentence-transformers base model: BertModel)
    sides = config_sides(config) if head == "EncoderDecoderModel" else (config,)
    removed = int(transformers.__version__.split(".")[0]) >= 5  # transformers <= 4.57 runs both
    if removed and any(c.position_embedding_type != "absolute" or c.pruned_heads for c in sides):
        raise ValueError(
            f"--verify: transformers {transformers.__version__} cannot run this checkpoint "
            "(relative position embeddings / pruned heads were removed in transformers 5)"
        )
    src = transformer_dir(src)  # a sentence-transformers 0_Transformer/ subfolder, as transformers reads it
    reference = _reference(transformers, head, src)
    converted = jaxbert.load(dst, head=head)
    feed = fixed_batch(sides[0], head, src)
    if head == "EncoderDecoderModel":  # the decoder reads the start token then the first tokens of the input
        start = config.decoder_start_token_id if config.decoder_start_token_id is not None else 0
        end = min(5, config.decoder.max_position_embeddings)  # 5 positions crashed a decoder of 4 (RuntimeError)
        feed["decoder_input_ids"] = np.concatenate(
            [np.full((len(feed["input_ids"]), 1), start), feed["input_ids"][:, 1:end] % config.decoder.vocab_size],
            axis=1,
        )
        feed.pop("token_type_ids", None)
    try:
        with torch.no_grad():
            expected = reference(**{k: torch.as_tensor(v) for k, v in feed.items()}, return_dict=True)
    except (TypeError, ValueError) as e:  # a config value transformers takes unchecked, e.g. output_hidden_states "x"
        raise ValueError(
            f"--verify: transformers {transformers.__version__}'s {head} fails to run {src} ({_cause(e)})"
        ) from None
    got = converted(**feed)
    if head == "EncoderDecoderModel":  # compare the decoder's logits (every decoder position is real)
        feed = {"attention_mask": np.ones(feed["decoder_input_ids"].shape, np.int64)}
    dtype = str((converted.decoder if head == "EncoderDecoderModel" else converted).params_dtype)
    results = {}
    real = feed["attention_mask"].astype(bool)
    for field in BASE_FIELDS + (TABLE[head].fields if head in TABLE else ("logits",)):
        if expected.get(field) is None or getattr(got, field, None) is None:
            continue
        ref, out = expected[field].float().numpy(), np.asarray(got[field], np.float32)
        diff = np.abs(out - ref)
        if diff.shape[: real.ndim] == real.shape:  # per-token outputs: padded positions carry no meaning
            diff = diff[real]
        # float32 must agree to 1e-5; half precision relative to the outputs' magnitude.
        scale = 1.0 if dtype == "float32" else max(1.0, float(np.abs(ref).max()))
        results[field] = (float(diff.max()), TOLERANCE.get(dtype, 1e-5) * scale)
    if head in ("BertLMHeadModel", "EncoderDecoderModel") and dtype == "float32":
        results["greedy tokens"] = _greedy_mismatches(reference, converted, head, fixed_batch(sides[0], head, src))
    return results


def _greedy_mismatches(reference, converted, head: str, feed: dict, new: int = 8) -> tuple[float, float]:
    """(tokens that differ, 0) between both models' greedy `generate` (half precision may rightly pick another
    token where two are close, so only float32 is compared). A causal LM continues the first sentence, without
    its closing [SEP]; a bert2bert model reads the padded batch."""
    import torch

    if head == "BertLMHeadModel":
        real = int(feed["attention_mask"][0].sum())
        feed = {"input_ids": feed["input_ids"][:1, : max(1, real - 1)]}
        feed["attention_mask"] = np.ones_like(feed["input_ids"])
        limit = converted.config.max_position_embeddings
    else:
        feed = {k: feed[k] for k in ("input_ids", "attention_mask")}
        limit = converted.config.decoder.max_position_embeddings
    new = min(new, limit - feed["input_ids"].shape[1] if head == "BertLMHeadModel" else limit - 1)
    got = converted.generate(
        feed["input_ids"], feed["attention_mask"], max_new_tokens=new, num_beams=1, do_sample=False
    )
    with torch.no_grad():
        expected = reference.generate(
            **{k: torch.as_tensor(v) for k, v in feed.items()}, max_new_tokens=new, num_beams=1, do_sample=False
        ).numpy()
    if expected.shape != got.shape:
        return float(max(expected.size, got.size)), 0.0
    return float((expected != got).sum()), 0.0

"""The options of `generate`, resolved and checked on the host as transformers 5 resolves them, shared by the causal
LM (`Bert.generate`) and bert2bert (`EncoderDecoder.generate`).

Precedence: the caller's arguments, then the checkpoint's generation config, then transformers' defaults. The
generation config is generation_config.json, or without one what transformers derives from config.json
(`GenerationConfig.from_model_config`: the top level, then a bert2bert's `decoder` for what the top level leaves
unset, with the model config's special tokens). A generation_config.json is read alone: a special token it leaves
out is unset even where config.json names one (transformers 5 then pads with eos). An encoder-decoder starts its
decoder from decoder_start_token_id, else bos_token_id (generation/utils.py `_prepare_special_tokens`).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from jaxbert.config import BertConfig
from jaxbert.files import existing_file, read_json
from jaxbert.generate import Search
from jaxbert.inputs import Arg, ArgumentError, ArgumentTypeError, positive_int, renaming

KNOBS = {
    "max_new_tokens": None,
    "num_beams": 1,
    "do_sample": False,
    "temperature": 1.0,
    "top_k": 50,
    "top_p": 1.0,
    "length_penalty": 1.0,
    "early_stopping": False,
    "num_return_sequences": 1,
    "min_new_tokens": None,
    "min_length": 0,
    "no_repeat_ngram_size": 0,
    "repetition_penalty": 1.0,
}
TOKENS = ("eos_token_id", "pad_token_id", "bos_token_id", "decoder_start_token_id")
# generation_config.json settings that change what transformers generates and that jaxbert does not implement,
# with the values that change nothing (transformers' defaults, and the empty ones it treats alike)
_UNSUPPORTED = {
    "bad_words_ids": ([],),
    "forced_bos_token_id": (),
    "forced_eos_token_id": (),
    "forced_decoder_ids": ([],),
    "suppress_tokens": ([],),
    "begin_suppress_tokens": ([],),
    "typical_p": (1.0,),
    "min_p": (),
    "top_h": (),
    "epsilon_cutoff": (0.0,),
    "eta_cutoff": (0.0,),
    "num_beam_groups": (1,),
    "diversity_penalty": (0.0,),
    "sequence_bias": ({},),
    "exponential_decay_length_penalty": (),
    "renormalize_logits": (False,),
    "stop_strings": ([],),
    "encoder_no_repeat_ngram_size": (0,),
    "encoder_repetition_penalty": (1.0,),
    "guidance_scale": (1.0,),  # classifier-free guidance
    "watermarking_config": ({},),
    "penalty_alpha": (0.0,),  # contrastive search, DoLa and constraints: transformers 5 moved them to the Hub
    "dola_layers": (),
    "force_words_ids": ([],),
    "constraints": ([],),
    "max_time": (),  # stops generating after that many seconds
    "token_healing": (False,),  # rewrites the prompt's last token (transformers needs the tokenizer passed)
}
_READ = (*KNOBS, *TOKENS, *_UNSUPPORTED, "max_length")


def _from_model_config(data: dict) -> dict:
    """transformers' GenerationConfig.from_model_config on config.json, for the keys jaxbert reads."""
    settings = {k: data[k] for k in _READ if data.get(k) is not None}
    decoder = data.get("decoder") if isinstance(data.get("decoder"), dict) else {}
    return {**{k: decoder[k] for k in _READ if decoder.get(k) is not None}, **settings}


class FileSettings(dict):
    """A generation config read from `path` (generation_config.json, else config.json), for `resolve`'s errors."""

    path: str | None = None


def _naming_the_file(settings: dict, given: dict):
    """An error about a setting the file gave (the caller did not) starts with the file's path: "num_beams 0: must
    be ≥ 1" from a generation_config.json did not say where the 0 came from, nor that no argument had set it. The
    setting, named as the file names it, is no argument of the caller's any more (a CLI flag does not rename it)."""
    path = getattr(settings, "path", None)

    def change(parts: tuple) -> tuple:
        first = parts[0]
        from_file = isinstance(first, Arg) and settings.get(first.name) is not None and given.get(first.name) is None
        return (f"{path}: {first}", *parts[1:]) if path and from_file else parts

    return renaming(change)


def file_settings(directory: str | None, config: dict | None = None) -> dict:
    """The generation config of `directory` ({} without a directory); settings jaxbert cannot honour are refused.
    `config`: the config.json to read in place of the directory's (one a training run will write beside the
    directory's generation_config.json, which it copies)."""
    from jaxbert.sentence_dir import transformer_dir

    directory = transformer_dir(directory) if directory else None
    path = existing_file(directory, "generation_config.json") if directory else None
    if path:
        # Present (None when the file leaves them out), the special tokens hide config.json's in `resolve`:
        # transformers 5 reads them from this file alone.
        settings = {**dict.fromkeys(TOKENS), **read_json(path)}
    else:  # transformers then reads config.json's generation keys (`from_pretrained`'s fallback)
        path = existing_file(directory, "config.json") if directory else None
        settings = _from_model_config(config if config is not None else read_json(path)) if path else {}
    for key, unchanged in _UNSUPPORTED.items():
        if settings.get(key) is not None and not any(_same(settings[key], v) for v in unchanged):
            raise ValueError(f"{path}: {key}={settings[key]!r} is not implemented by jaxbert's generate")
    named = FileSettings(settings)
    named.path = path
    return named


def _same(a, b) -> bool:
    """Equal JSON values of one kind (1 == 1.0, but true is not 1)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    numbers = isinstance(a, (int, float)) and isinstance(b, (int, float))
    return (numbers or type(a) is type(b)) and a == b


def config_tokens(config) -> dict:
    """The special tokens of a model config (BertConfig, or a bert2bert's: its top level over its decoder's)."""
    if getattr(config, "is_encoder_decoder", False):
        top, decoder = {k: getattr(config, k) for k in TOKENS}, config_tokens(config.decoder)
        return {k: decoder[k] if top[k] is None else top[k] for k in TOKENS}
    return {k: config.pad_token_id if k == "pad_token_id" else config.extra.get(k) for k in TOKENS}


def _number(name: str, value, low: float, high: float, low_open: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ArgumentTypeError(Arg(name), f" must be a number, got {type(value).__name__} {value!r}")
    if not (math.isfinite(value) and (low < value if low_open else low <= value) and value <= high):
        # Infinite bounds are open: "(0.0, inf]" named the refused inf as allowed.
        interval = f"{'(' if low_open or math.isinf(low) else '['}{low}, {high}{')' if math.isinf(high) else ']'}"
        raise ArgumentError(Arg.showing(name, value), f": must be in {interval}")
    return float(value)


def _non_negative(name: str, value) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ArgumentError(Arg.showing(name, value, repr), ": must be an integer ≥ 0")
    return int(value)


def _token_ids(name: str, value, vocab: int) -> tuple[int, ...]:
    if value is None:
        return ()
    # Anything but a list stands for one id, so that true or 5.0 is named below (tuple(True) was a TypeError).
    ids = tuple(value) if isinstance(value, (list, tuple)) or np.ndim(value) > 0 else (value,)
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < vocab:
            raise ArgumentError(
                Arg.showing(name, value, repr), f": token ids must be integers in [0, vocab_size={vocab})"
            )
    return tuple(int(i) for i in ids)


def _one_token(name: str, value, vocab: int) -> int | None:
    if isinstance(value, (list, tuple, np.ndarray)):  # was cut to its first id, silently
        raise ArgumentError(Arg.showing(name, value, repr), ": must be one token id")
    return None if value is None else _token_ids(name, value, vocab)[0]


def _start_tokens(value, vocab: int) -> int | tuple[int, ...] | None:
    """decoder_start_token_id: one id, or (as transformers takes it) a list of one per input row."""
    if isinstance(value, (list, tuple, np.ndarray)):
        return _token_ids("decoder_start_token_id", value, vocab)
    return _one_token("decoder_start_token_id", value, vocab)


@dataclasses.dataclass(frozen=True)
class Options:
    """Resolved and checked; `search` is static under jit, the rest is traced or host-side."""

    search: Search
    max_new_tokens: int | None
    warp: tuple[float, int, float]
    seed: int
    bos: int | None
    expand: int  # rows per prompt row before decoding (sampling's num_return_sequences)
    # an encoder-decoder's first decoder token (decoder_start_token_id, else bos), or one per input row
    start: int | tuple[int, ...] | None = None
    min_new_tokens: int | None = None
    min_length: int = 0  # counts the prompt (an encoder-decoder's: its start token)

    def min_new(self, prompt_length: int) -> int:
        """New tokens before eos may end a row: min_new_tokens when set (even 0: transformers then replaces
        min_length by the prompt length + min_new_tokens), else min_length less the prompt."""
        if self.min_new_tokens is not None:
            return self.min_new_tokens
        return max(self.min_length - prompt_length, 0)


def _search(o: dict) -> tuple[Search, int]:
    """The static search and how many rows each input becomes before decoding (sampling's returned sequences)."""
    beams = positive_int("num_beams", o["num_beams"])
    returned = positive_int("num_return_sequences", o["num_return_sequences"], beams if beams > 1 else None)
    if not isinstance(o["do_sample"], bool):
        raise ArgumentTypeError(Arg("do_sample"), f" must be true or false, got {o['do_sample']!r}")
    if o["do_sample"] and beams > 1:
        sampling, with_beams = Arg.showing("do_sample", True, sep="="), Arg.showing("num_beams", beams, sep="=")
        raise ArgumentError(sampling, " with ", with_beams, ": beam-search sampling is not implemented")
    if returned > 1 and not o["do_sample"] and beams == 1:
        greedy = ": greedy search returns one sequence per prompt"
        raise ArgumentError(Arg.showing("num_return_sequences", returned), greedy)
    if o["early_stopping"] not in (True, False, "never"):
        stopping = Arg.showing("early_stopping", o["early_stopping"], repr)
        raise ArgumentError(stopping, ": must be true, false or 'never'")
    penalty = _number("length_penalty", o["length_penalty"], -math.inf, math.inf)
    seen = dict(
        no_repeat_ngram_size=_non_negative("no_repeat_ngram_size", o["no_repeat_ngram_size"]),
        repetition_penalty=_number("repetition_penalty", o["repetition_penalty"], 0.0, math.inf),
    )
    if beams == 1:  # beam-only settings must not split greedy/sampling programs
        return Search(1, o["do_sample"], o["eos"], o["pad"], **seen), returned
    return Search(beams, False, o["eos"], o["pad"], penalty, o["early_stopping"], returned, **seen), 1


def _warp(o: dict) -> tuple[float, int, float]:
    """Sampling's temperature, top_k and top_p, checked."""
    top_k = o["top_k"]
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 0:
        raise ArgumentError(Arg.showing("top_k", top_k, repr), ": must be an integer ≥ 0 (0 turns it off)")
    return _number("temperature", o["temperature"], 0.0, math.inf), int(top_k), _number("top_p", o["top_p"], 0, 1)


def resolve(config, settings: dict, given: dict) -> Options:
    """`given` (the caller's arguments, None for unset) over `settings` (the generation config) over the model
    config's special tokens (`config_tokens`) where `settings` has no such key, over transformers' defaults (KNOBS)."""
    with _naming_the_file(settings, given):
        return _resolve(config, settings, given)


def _resolve(config, settings: dict, given: dict) -> Options:
    tokens = config_tokens(config)
    fallback = {**KNOBS, **{k: None if k in settings else v for k, v in tokens.items()}}
    o = {k: next((v for v in (given.get(k), settings.get(k)) if v is not None), fallback.get(k)) for k in fallback}
    V = (config.decoder if getattr(config, "is_encoder_decoder", False) else config).vocab_size
    o["eos"] = _token_ids("eos_token_id", o["eos_token_id"], V)
    pad = o["pad_token_id"]
    pad = o["eos"][0] if pad is None and o["eos"] else pad  # transformers pads with eos when the model has none
    o["pad"] = _one_token("pad_token_id", pad, V)
    bos = _one_token("bos_token_id", o["bos_token_id"], V)
    start = _start_tokens(o["decoder_start_token_id"], V)
    search, expand = _search(o)
    warp = _warp(o) if search.do_sample else (1.0, 0, 1.0)  # greedy and beams ignore them, as transformers does
    if o["max_new_tokens"] is not None:  # here, where an error can name the file that set it
        positive_int("max_new_tokens", o["max_new_tokens"])
    seed = given.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ArgumentTypeError(Arg("seed"), f" must be an integer, got {type(seed).__name__} {seed!r}")
    if not 0 <= seed < 2**32:  # JAX's keys hold 32 bits: 2**32 + 7 would sample as 7 does
        raise ArgumentError(Arg.showing("seed", seed), f": must be in [0, {2**32 - 1}]")
    least = tuple(_non_negative(k, o[k]) for k in ("min_new_tokens", "min_length"))
    return Options(search, o["max_new_tokens"], warp, int(seed), bos, expand, bos if start is None else start, *least)


def max_new_tokens(
    options: Options,
    settings: dict,
    config: BertConfig,
    prompt_length: int,
    prompt: str = "prompt length",
    capped: bool = True,
) -> int:
    """transformers' new-token count: max_new_tokens, else max_length (counting the prompt) when a generation
    config sets it, else 20, capped by the positions if `capped`; with the prompt it must fit `config`'s positions.
    An encoder-decoder is not `capped`: transformers caps by the model config's max_position_embeddings, which
    EncoderDecoderConfig lacks, and fails past the decoder's."""
    limit = config.max_position_embeddings
    n = options.max_new_tokens
    # Derived counts below 1 are refused as transformers refuses them, naming what set them (not max_new_tokens).
    if n is None and settings.get("max_length") is not None:  # null: unset, as transformers reads it
        n = positive_int("max_length", settings["max_length"]) - prompt_length
        setting = f"max_length {settings['max_length']} (generation_config.json, else config.json)"
        if n > 0 and prompt_length + n > limit:  # not "max_new_tokens 999999998", a setting never given
            raise ValueError(f"{setting} exceeds max_position_embeddings {limit}")
        if n < 1:
            room = f" leaves no room for new tokens after the {prompt} {prompt_length}; pass "
            raise ArgumentError(setting, room, Arg("max_new_tokens"))
    elif n is None:
        n = min(20, limit - prompt_length) if capped else 20
        if n < 1:
            raise ValueError(f"{prompt} {prompt_length} fills max_position_embeddings {limit}: no room for new tokens")
        if prompt_length + n > limit:
            raise ArgumentError(
                Arg("max_new_tokens"),
                f": unset, so transformers' default 20, but the {prompt} {prompt_length} + 20 exceeds "
                f"the decoder's max_position_embeddings {limit}; pass ",
                Arg("max_new_tokens"),
            )
    n = positive_int("max_new_tokens", n)
    if prompt_length + n > limit:
        raise ArgumentError(
            f"{prompt} {prompt_length} + ",
            Arg.showing("max_new_tokens", n),
            f" = {prompt_length + n} exceeds max_position_embeddings {limit}",
        )
    return n

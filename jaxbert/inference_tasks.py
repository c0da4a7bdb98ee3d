"""Bert's task methods, mixed into `Bert` (inference.py): generate, and the texts-in methods (embed, fill_mask,
classify, tag, answer) with the batching they share. Each checks its options and hands the work to the module that
does it (generate_inputs.py, tasks.py, qa.py); they reach the model through Bert's `weights`, `check_inputs`,
`_put`, `_shards`, `_generate`, `config`, `tokenizer` and `directory`.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from jaxbert import batching, generate_inputs, packing, sentence_dense, sentence_dir, sharding, tasks
from jaxbert.config import padding_id
from jaxbert.inputs import positive_int
from jaxbert.tokenizer import pad


class TaskMethods:
    """`Bert`'s generate, embed, fill_mask, classify, tag and answer, and the batches they run on."""

    def generate(
        self,
        prompt_ids=None,
        attention_mask=None,
        max_new_tokens: int | None = None,
        *,
        num_beams: int | None = None,
        do_sample: bool | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int = 0,
        num_return_sequences: int | None = None,
        length_penalty: float | None = None,
        early_stopping: bool | str | None = None,
        eos_token_id=None,
        pad_token_id=None,
        min_new_tokens: int | None = None,
        min_length: int | None = None,
        no_repeat_ngram_size: int | None = None,
        repetition_penalty: float | None = None,
    ) -> np.ndarray:
        """transformers' `generate` for a causal LM: prompt_ids [B, P] (rows left-padded, with attention_mask) ->
        [B * num_return_sequences, P + steps run] as np.int32. Greedy by default; num_beams > 1 beam search;
        do_sample=True samples (temperature, top_k, top_p) reproducibly from `seed`. eos cannot end a row before
        min_new_tokens new tokens, nor before min_length tokens with the prompt's. no_repeat_ngram_size bans
        repeated n-grams and repetition_penalty (> 1) discourages every token already in the row, the prompt's
        included, as transformers' processors. Unset options come from the
        checkpoint's generation_config.json (else config.json), then transformers' defaults. Compiles one program
        per (batch, prompt length, new-token) bucket and search mode; see generate.py."""
        given = dict(
            max_new_tokens=max_new_tokens,
            num_beams=num_beams,
            do_sample=do_sample,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            num_return_sequences=num_return_sequences,
            length_penalty=length_penalty,
            early_stopping=early_stopping,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            min_new_tokens=min_new_tokens,
            min_length=min_length,
            no_repeat_ngram_size=no_repeat_ngram_size,
            repetition_penalty=repetition_penalty,
        )
        settings = generate_inputs.file_settings(self.directory)
        req = generate_inputs.request(
            self.config, self.head, self.length_buckets, settings, prompt_ids, attention_mask, given
        )
        return req.assemble(*self._generate(self.weights, *req.arrays, search=req.search, bound=req.bound))

    # -- texts in --------------------------------------------------------------------------------------------
    def batches(self, enc, batch_size: int):
        """Yield (indices, padded batch on the devices) over shape buckets, longest texts first."""
        pad_id = padding_id(self.config)
        n = self._shards
        for idx, rows, length in batching.plan(enc.lengths(), batch_size, self.length_buckets, n):
            batch = pad(enc, length, rows, pad_id, order=idx)
            self.check_inputs(batch["input_ids"], token_type_ids=batch["token_type_ids"])
            yield idx, dict(zip(batch, self._put(*batch.values())))

    def packed_batches(self, enc, batch_size: int, program: str = "forward"):
        """Yield (texts per row, packed batch on the devices): see packing.py; `batch_size` rows a batch. The first
        call for `program` (the entry point the batches go to) pads each length's last rows to one batch bucket,
        later ones split them exactly (packing._chunks: fewer programs to compile first, less padding after)."""
        n = self._shards
        with self._lock:
            exact = program in self._packed_programs
            self._packed_programs.add(program)
        for plan in packing.plan(enc.lengths(), batch_size, self.length_buckets, n, exact=exact):
            batch = packing.pad_packed(enc, plan, padding_id(self.config))
            self.check_inputs(batch["input_ids"], token_type_ids=batch["token_type_ids"])
            yield plan.texts, dict(zip(batch, self._put(*batch.values())))

    def embed(
        self,
        texts,
        pooling: str | tuple[str, ...] | None = None,
        normalize: bool | None = None,
        batch_size: int = 32,
        max_length: int | None = None,
        progress: bool | None = None,
        packing: bool = True,
        prompt: str | None = None,
        prompt_name: str | None = None,
    ) -> np.ndarray:
        """Sentence embeddings [N, hidden × pooling modes] (float32) in input order. Unset options come from a
        sentence-transformers directory (its pooling, Dense modules, Normalize, max_seq_length:
        SentenceTransformer(dir)'s vectors, [N, the last Dense's outputs] with Dense modules), else [CLS] pooling,
        not normalized, the model's length (see sentence_dir.py). A `pooling` given embeds without the Dense.

        `prompt` (text) or `prompt_name` (one of the directory's prompts) goes before every text, as in
        SentenceTransformer.encode (`prompt` wins); with neither, the directory's default prompt, if any.
        Truncation cuts prompt and text as one text, and a Pooling with include_prompt false leaves the prompt's
        tokens out (whatever the pooling; never the pooler's [CLS]).

        With `packing` (the default) short texts share rows (packing.py), `batch_size` rows a call, and padding
        is not computed; each text's vector is what it gets alone. `packing=False` pads each text to its
        batch's length bucket, `batch_size` texts a call."""
        prompted = (prompt, prompt_name)
        return tasks.embed(self, texts, pooling, normalize, batch_size, max_length, progress, packing, prompted)

    @functools.cached_property
    def sentence_defaults(self) -> sentence_dir.SentenceDefaults | None:
        """The embedding defaults of a sentence-transformers directory (None for any other)."""
        return sentence_dir.read(self.directory) if self.directory else None

    @functools.cached_property
    def sentence_dense(self) -> tuple:
        """The float32 parameters of the directory's Dense modules, on the devices (read once)."""
        steps = self.sentence_defaults.steps if self.sentence_defaults else ()
        return jax.device_put(sentence_dense.load_steps(self.directory, steps), sharding.replicated(self.mesh))

    def max_length(self, requested: int | None) -> int:
        if requested is not None:
            return positive_int("max_length", requested, self.config.max_position_embeddings)
        return min(self.config.max_position_embeddings, self.tokenizer.model_max_length)

    def fill_mask(self, text: str | list[str], top_k: int = 5, batch_size: int = 32, targets=None) -> list:
        """For each [MASK] of `text`, in order: its top_k {token, token_id, score, sequence}. A list of texts
        gives one such list per text, the texts packed into rows (packing.py), `batch_size` rows a call.
        `targets` (a token or a list of them) limits the candidates to those, as the fill-mask pipeline's."""
        return tasks.fill_mask(self, text, top_k, batch_size, targets)

    def classify(self, texts, pairs=None, batch_size: int = 32, max_length: int | None = None) -> list[dict]:
        """Per text (and pair), its label and scores; texts beyond max_length tokens cut (tasks.classify)."""
        return tasks.classify(self, texts, pairs, batch_size, max_length)

    def tag(
        self,
        texts,
        batch_size: int = 32,
        max_length: int | None = None,
        stride: int | None = None,
        aggregation_strategy: str | None = None,
        ignore_labels=None,
        is_split_into_words: bool = False,
        delimiter: str = " ",
    ):
        """Per text, its words {word, label, score, start, end}; long texts in overlapping windows (tasks.tag).
        With `aggregation_strategy` (none, simple, first, average, max), the token-classification pipeline's
        entities instead ({entity_group, score, word, start, end}; "none": {entity, score, index, word, start, end}).
        With `is_split_into_words`, texts are lists of words (CoNLL's), joined by `delimiter` as the pipeline does."""
        options = (aggregation_strategy, ignore_labels, is_split_into_words, delimiter)
        return tasks.tag(self, texts, batch_size, max_length, stride, *options)

    def answer(self, question: str, context: str, top_k: int = 1, **options) -> list[dict]:
        """[{answer, score, start, end}] best first: the question-answering pipeline's answers (see qa.answer)."""
        from jaxbert.qa import answer

        return answer(self, question, context, top_k, **options)

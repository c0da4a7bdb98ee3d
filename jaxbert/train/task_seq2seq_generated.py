"""`jaxbert train --task seq2seq --predict-with-generate` (run_summarization.py through Seq2SeqTrainer): each
validation also generates for the validation sources with the parameters being trained and reports ROUGE and
gen_len beside the loss: the numbers `jaxbert evaluate --predict-with-generate` gives for the model written then
(the same search, on the same layout of the same weights, with the generation config that model will have).

The search is compiled once per shape bucket for the whole run (an EncoderDecoder built at each validation would
compile again each time). It runs on process 0, on a host copy of the weights gathered as OUT/best's are; the
scores reach the other processes, which keep the best model and stop early by them as process 0 does.
"""

from __future__ import annotations

import jax

from jaxbert import batching, decoders, distributed, generate_inputs
from jaxbert.layout import per_layer, to_compute
from jaxbert.train.config import GENERATED_METRICS

SIDES = ("encoder", "decoder")


class Generator:
    """`EncoderDecoder.generate` as task_seq2seq.generate_all calls it, on the weights last `load`ed; `tok`
    decodes what it writes."""

    def __init__(self, config, settings: dict, tok):
        self.config, self.settings, self.params = config, settings, None
        self.tok, self.pad = tok, tok.token_to_id(tok.special_tokens["pad_token"])
        self.length_buckets = batching.length_buckets(config.encoder.max_position_embeddings)  # the encoder's, as there
        self.compiles = 0
        self._search = jax.jit(self._search_impl, static_argnames=("search", "bound"))

    def _search_impl(self, params, *arrays, search, bound):
        self.compiles += 1  # runs only while tracing
        return decoders.seq2seq(params, self.config, *arrays, search=search, bound=bound)

    def load(self, params) -> None:
        """Host weights in the stored layout (a copy, consumed: its layers are emptied as they are laid out), laid
        out as EncoderDecoder lays out a float32 model's (each side's layers apart, the decoder's one subtree each):
        other layouts round otherwise, and a near-tie could then pick another token than `evaluate` does."""
        tree = {side: to_compute(params[side], getattr(self.config, side), consume=True, apart=True) for side in SIDES}
        tree["decoder"] = per_layer(tree["decoder"], self.config.decoder)
        if "enc_to_dec_proj" in params:
            tree["enc_to_dec_proj"] = params["enc_to_dec_proj"]
        self.params = jax.device_put(tree)

    def generate(self, input_ids, attention_mask=None, **given):
        req = generate_inputs.seq2seq_request(
            self.config, self.length_buckets, self.settings, input_ids, attention_mask, given
        )
        return req.assemble(*self._search(self.params, *req.arrays, search=req.search, bound=req.bound))


def generator(run, tok) -> Generator:
    """The run's Generator, its generation config that of the model the run writes: the source's
    generation_config.json (copied beside the weights), else the keys of the config.json it writes."""
    settings = generate_inputs.file_settings(run.cfg.model, run.final_config().to_dict())
    return Generator(run.config, settings, tok)


def scores(run, params) -> dict:
    """{"eval_rouge1", ..., "eval_gen_len"}: run_summarization.py's compute_metrics of the validation sources
    generated with `params` (the train state's), as `evaluate --predict-with-generate` scores them. Every process
    calls it (the gather and the scores' broadcast are collectives)."""
    from jaxbert.train.task_seq2seq import generate_all, generation_scores

    cfg, gen = run.cfg, run.generator
    host = distributed.to_primary(params)  # None but on process 0
    values = None
    if distributed.is_primary():
        gen.load(host)
        del host
        length = cfg.seq2seq_lengths(validation=True)[1][1]  # transformers' max_length: the start token counted
        options = dict(num_beams=cfg.num_beams, max_new_tokens=length - 1)
        generated = generate_all(gen, run.val, run.train.batch_size, gen.pad, **options)
        gen.params = None  # the device copy goes until the next validation
        found, _ = generation_scores(generated, run.val, gen.tok, gen.pad)
        values = [found[k] for k in GENERATED_METRICS]
    return {f"eval_{k}": v for k, v in zip(GENERATED_METRICS, distributed.from_primary(values, len(GENERATED_METRICS)))}

"""`jaxbert train --task seq2seq --predict-with-generate` (run_summarization.py through Seq2SeqTrainer): each
validation also generates for the validation sources with the parameters being trained and reports ROUGE and
gen_len beside the loss: the numbers `jaxbert evaluate --predict-with-generate` gives for the model written then
(the same EncoderDecoder search, on the same layout of the same weights, with the generation config that model
will have).

One EncoderDecoder serves the whole run: built at the first validation, then given each validation's weights
(`load_weights`), so its search is compiled once per shape bucket (one built at each validation would compile
again each time), and dropping them between validations. It runs on process 0, on a host copy of the weights
gathered as OUT/best's are; the scores reach the other processes, which keep the best model and stop early by
them as process 0 does.
"""

from __future__ import annotations

import dataclasses

from jaxbert import distributed, generate_inputs
from jaxbert.train.config import GENERATED_METRICS


@dataclasses.dataclass
class Generator:
    """What the run's validations generate with: the EncoderDecoder (None until the first), its generation
    config, and the tokenizer that decodes what it writes (`pad`: its padding id)."""

    config: object
    settings: dict
    tok: object
    model: object = None

    @property
    def pad(self) -> int:
        return self.tok.token_to_id(self.tok.special_tokens["pad_token"])

    def load(self, params):
        """The EncoderDecoder on `params` (host weights in the stored layout, a copy: consumed, its layers emptied
        as they are laid out), laid out as `evaluate`'s EncoderDecoder lays out the model written then: other
        layouts round otherwise, and a near-tie could then pick another token than `evaluate` does."""
        from jaxbert.inference_seq2seq import EncoderDecoder

        if self.model is None:
            self.model = EncoderDecoder(self.config, params, consume=True, settings=self.settings)
        else:
            self.model.load_weights(params, consume=True)
        return self.model


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
        s2s = gen.load(host)
        del host
        length = cfg.seq2seq_lengths(validation=True)[1][1]  # transformers' max_length: the start token counted
        options = dict(num_beams=cfg.num_beams, max_new_tokens=length - 1)
        try:
            generated = generate_all(s2s, run.val, run.train.batch_size, gen.pad, **options)
        finally:
            s2s.drop_weights()  # the device copy goes until the next validation
        found, _ = generation_scores(generated, run.val, gen.tok, gen.pad)
        values = [found[k] for k in GENERATED_METRICS]
    return {f"eval_{k}": v for k, v in zip(GENERATED_METRICS, distributed.from_primary(values, len(GENERATED_METRICS)))}

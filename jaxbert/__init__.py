"""jaxbert: BERT as pure JAX functions over Flax parameter trees, matching transformers' PyTorch BERT."""

from jaxbert import cache, compile_cache, cpu, layout, model
from jaxbert.cache import KVCache, init_cache
from jaxbert.config import BertConfig
from jaxbert.convert import flax_to_torch, torch_to_flax
from jaxbert.heads import HEADS, forward
from jaxbert.inference import Bert, load
from jaxbert.model import BertOutput, bert
from jaxbert.params import count_params, init_params, prune_heads

__version__ = "0.1.0"
__all__ = [
    "Bert",
    "BertConfig",
    "BertOutput",
    "HEADS",
    "KVCache",
    "bert",
    "cache",
    "compile_cache",
    "cpu",
    "count_params",
    "flax_to_torch",
    "forward",
    "init_cache",
    "init_params",
    "layout",
    "load",
    "model",
    "prune_heads",
    "torch_to_flax",
]

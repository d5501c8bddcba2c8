"""longctx: long-context LLM inference runtime (Python package).

The native part lives in longctx._core, built by CMake into
<build>/python/longctx/ next to a copy of this package; every public name of
it is re-exported here (Config, KVStore, DecodePolicy, Model, Tokenizer,
prefill_attention, read_gguf_tensors, ...). longctx.inject / uninject swap
attention modules of a PyTorch model for longctx.torch.SparseAttention
(rules in YAML, configs/inject/llama.yaml). `import longctx` does not import
torch; `import longctx.torch` does.
"""
from . import _core
from ._core import *  # noqa: F401,F403  (the native API, listed in __all__ below)
from .inject import inject, uninject

__all__ = sorted([name for name in dir(_core) if not name.startswith("_")] + ["inject", "uninject"])

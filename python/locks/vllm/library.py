"""Which `locks` functions the plugin calls: the compiled library (DecodeWrapper,
summary_update, supports, workspace_bytes), or, in CPU tests, the torch reference
(reference.ReferenceOps) set with set_ops(). One module-level slot, set once per process."""
from __future__ import annotations

import os
from typing import Any

_OPS: Any = None


def ops():
    """The `locks` library (DecodeWrapper, summary_update, supports); tests may set_ops()."""
    global _OPS
    if _OPS is None:
        import locks

        _OPS = locks
    return _OPS


def set_ops(o) -> None:
    global _OPS
    _OPS = o


def skip_prefill() -> bool:
    """Benchmark-only mode (bench_backends.py): prefill attention arithmetic skipped."""
    return os.environ.get("LOCKS_BENCH_SKIP_PREFILL_ATTENTION", "0") == "1"

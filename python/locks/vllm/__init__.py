"""LOCKS as a vLLM attention backend (docs/vllm.md). Optional part of `locks`: needs vLLM
(tested with 0.26.0). vLLM finds `register` through the `vllm.general_plugins` entry point and
calls it in every process; the user selects the backend with `--attention-backend CUSTOM`.
"""

BACKEND_PATH = "locks.vllm.backend.LocksAttentionBackend"


def register() -> None:
    """Idempotent: point AttentionBackendEnum.CUSTOM at the LOCKS backend. Imports nothing
    heavy (the backend module is imported by vLLM only when CUSTOM is selected)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    import os

    e = AttentionBackendEnum.CUSTOM
    if not (e.is_overridden() and e.get_path() == BACKEND_PATH):
        register_backend(e, BACKEND_PATH)
    if os.environ.get("LOCKS_BENCH_SKIP_PREFILL_ATTENTION", "0") == "1":
        # Benchmark-only mode (bench_backends.py): FLASH_ATTN skips prefill arithmetic like LOCKS.
        register_backend(AttentionBackendEnum.FLASH_ATTN,
                         "locks.vllm.bench_backends.SkipPrefillFlashAttentionBackend")

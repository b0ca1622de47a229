import os
import tomllib

from vllm.v1.attention.backends.registry import AttentionBackendEnum

import locks.vllm as lv

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_register_is_idempotent_and_points_custom_at_locks():
    AttentionBackendEnum.CUSTOM.clear_override()
    lv.register()
    lv.register()  # vLLM calls general plugins once per process: engine, core, every worker
    assert AttentionBackendEnum.CUSTOM.get_path() == "locks.vllm.backend.LocksAttentionBackend"
    cls = AttentionBackendEnum.CUSTOM.get_class()
    # Attention.__init__ looks the backend up again by AttentionBackendEnum[get_name()].
    assert cls.get_name() == "CUSTOM"
    assert AttentionBackendEnum[cls.get_name()] is AttentionBackendEnum.CUSTOM


def test_entry_point_declared():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        eps = tomllib.load(f)["project"]["entry-points"]["vllm.general_plugins"]
    assert eps == {"locks": "locks.vllm:register"}

"""vLLM's own Attention layer built with the LOCKS backend (CPU, no model): the impl finds
its layer name, registers the side cache beside it, and both KV-cache specs group together."""
import pytest
import torch

from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
from vllm.model_executor.layers.attention import Attention
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.core.kv_cache_utils import get_kv_cache_groups
from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs

import locks.vllm.backend as be
import locks.vllm.library as lib
from locks.vllm import reference as ref


@pytest.fixture
def vc():
    lib.set_ops(ref.ReferenceOps(8))
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # vLLM builds layers under the model dtype
    c = VllmConfig(device_config=DeviceConfig(device="cpu"))
    yield c
    torch.set_default_dtype(old)
    lib.set_ops(None)


def test_layers_register_side_caches_in_one_group(vc):
    with set_current_vllm_config(vc):
        layers = [Attention(8, 128, 128 ** -0.5, num_kv_heads=2, prefix=f"model.layers.{i}.self_attn.attn",
                            attn_backend=be.LocksAttentionBackend) for i in range(2)]
    assert layers[0].backend is AttentionBackendEnum.CUSTOM
    sfc = vc.compilation_config.static_forward_context
    assert set(sfc) == {f"model.layers.{i}.self_attn.attn{s}" for i in range(2) for s in ("", ".locks_summary")}
    specs = {name: layer.get_kv_cache_spec(vc) for name, layer in sfc.items()}
    groups = get_kv_cache_groups(vc, specs)
    assert len(groups) == 1 and isinstance(groups[0].kv_cache_spec, UniformTypeKVCacheSpecs)


def test_sliding_window_layer_refused(vc):
    with set_current_vllm_config(vc), pytest.raises(NotImplementedError, match="sliding-window"):
        Attention(8, 128, 128 ** -0.5, num_kv_heads=2, prefix="model.layers.0.self_attn.attn",
                  per_layer_sliding_window=4096, attn_backend=be.LocksAttentionBackend)

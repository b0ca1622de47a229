import pytest
import torch

from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups, get_kv_cache_groups
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec, UniformTypeKVCacheSpecs

from locks.vllm.side_cache import LocksSummaryCache, SummaryGeometry, carve, field_align, side_layer_name

from helpers import fake_config


@pytest.mark.parametrize("d,per_head", [(128, 836), (64, 516), (256, 1700)])
def test_geometry_int4_bytes_per_head(d, per_head):
    """summary_bytes_per_page of the library's layout (docs/method.md): int4 basis scales per 32
    dims at d 256 (basis_scale [H, r, d / 32]), one a row at d 64 / 128."""
    g = SummaryGeometry(num_kv_heads=2, head_dim=d, rank=8, precision="int4")
    assert g.bytes_per_block == 2 * per_head
    assert dict((n, s) for n, _, s in g.fields())["basis_scale"] == (2, 8, d // (32 if d >= 256 else d))
    # the page holds the summary and its alignment slack, rounded up to whole token slots
    assert g.bytes_per_block + g.slack <= g.page_bytes < g.bytes_per_block + g.slack + g.page_size
    assert g.page_bytes % 16 == 0


def test_side_cache_shares_the_attention_group():
    """The side cache lands in the attention layers' KV-cache group (same block ids), is
    counted per block by the allocator, and gets its own contiguous tensor per layer."""
    cfg = fake_config()
    g = SummaryGeometry(num_kv_heads=2, head_dim=128, rank=8, precision="int4")
    specs = {}
    for i in range(3):
        name = f"model.layers.{i}.self_attn.attn"
        specs[name] = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=128, dtype=torch.bfloat16)
        side = LocksSummaryCache(side_layer_name(name), g, cfg.compilation_config.static_forward_context)
        specs[side.prefix] = side.get_kv_cache_spec(cfg)
    groups = get_kv_cache_groups(cfg, dict(specs))
    assert len(groups) == 1
    assert isinstance(groups[0].kv_cache_spec, UniformTypeKVCacheSpecs)
    assert set(groups[0].layer_names) == set(specs)
    per_block = groups[0].kv_cache_spec.page_size_bytes
    assert per_block == 3 * (16 * 2 * 128 * 2 * 2) + 3 * g.page_bytes  # the profiler counts the summaries
    kvc = get_kv_cache_config_from_groups(cfg, groups, available_memory=per_block * 100)
    assert kvc.num_blocks == 100
    by_layer = {t.shared_by[0]: t for t in kvc.kv_cache_tensors}
    assert all(len(t.shared_by) == 1 for t in kvc.kv_cache_tensors)  # one tensor per layer, not packed
    assert by_layer[side_layer_name("model.layers.0.self_attn.attn")].size == 100 * g.page_bytes


class _AttnLayer:
    """What the side cache reads of an attention layer in the static forward context."""

    def __init__(self, sliding_window):
        self.sliding_window = sliding_window


def _hybrid_model(cfg, g):
    """Gemma-3's pattern in 6 layers: layers 2 and 5 full attention (LOCKS, each with its side
    cache), the others sliding-window (another backend): {layer: spec}, the side caches."""
    ctx = cfg.compilation_config.static_forward_context
    specs, sides = {}, []
    for i in range(6):
        name = f"model.layers.{i}.self_attn.attn"
        full = i % 3 == 2
        ctx[name] = _AttnLayer(None if full else 512)
        kw = dict(block_size=16, num_kv_heads=1, head_size=256, dtype=torch.bfloat16)
        specs[name] = FullAttentionSpec(**kw) if full else SlidingWindowSpec(sliding_window=512, **kw)
        if full:
            sides.append(LocksSummaryCache(side_layer_name(name), g, ctx))
    return specs, sides


def test_hybrid_model_needs_the_hybrid_manager_off():
    """With sliding-window layers and vLLM's hybrid KV-cache manager on, the side cache refuses
    with the two settings to pass; vLLM's own grouping would fail there (page sizes), which is
    why: if a vLLM release learns to group it, the second half of this test says so."""
    cfg = fake_config(kv_heads=1, head_dim=256)
    g = SummaryGeometry(num_kv_heads=1, head_dim=256, rank=8, precision="int4")
    specs, sides = _hybrid_model(cfg, g)
    with pytest.raises(ValueError, match=r"--disable-hybrid-kv-cache-manager.*backend_per_kind"):
        sides[0].get_kv_cache_spec(cfg)
    cfg.scheduler_config.disable_hybrid_kv_cache_manager = True  # to get the specs at all
    specs.update({s.prefix: s.get_kv_cache_spec(cfg) for s in sides})
    cfg.scheduler_config.disable_hybrid_kv_cache_manager = False
    with pytest.raises(NotImplementedError, match="page size"):
        get_kv_cache_groups(cfg, dict(specs))


def test_hybrid_model_with_the_manager_off_shares_one_group():
    """Manager off: vLLM turns the sliding layers' specs into full-attention ones, and every
    layer, the side caches of the full layers included, shares one group (one block table);
    the allocator counts the summaries per block and gives each layer its own tensor."""
    cfg = fake_config(kv_heads=1, head_dim=256)
    cfg.scheduler_config.disable_hybrid_kv_cache_manager = True
    g = SummaryGeometry(num_kv_heads=1, head_dim=256, rank=8, precision="int4")
    specs, sides = _hybrid_model(cfg, g)
    specs.update({s.prefix: s.get_kv_cache_spec(cfg) for s in sides})
    groups = get_kv_cache_groups(cfg, dict(specs))
    assert len(groups) == 1 and isinstance(groups[0].kv_cache_spec, UniformTypeKVCacheSpecs)
    assert set(groups[0].layer_names) == set(specs)
    assert len(sides) == 2
    kv_page = 16 * 1 * 256 * 2 * 2
    per_block = groups[0].kv_cache_spec.page_size_bytes
    assert per_block == 6 * kv_page + 2 * g.page_bytes
    kvc = get_kv_cache_config_from_groups(cfg, groups, available_memory=per_block * 50)
    assert kvc.num_blocks == 50
    by_layer = {t.shared_by[0]: t.size for t in kvc.kv_cache_tensors}
    assert by_layer[sides[1].prefix] == 50 * g.page_bytes
    assert by_layer["model.layers.0.self_attn.attn"] == 50 * kv_page


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 200])
@pytest.mark.parametrize("shift", [0, 1, 4, 13])  # the tensor's base address mod 16
@pytest.mark.parametrize("H,d,precision", [(2, 128, "int4"), (1, 64, "int4"), (3, 256, "int4"),
                                           (1, 128, "fp32"), (5, 64, "fp32")])
def test_carve_views_are_aligned_contiguous_disjoint_and_inside(n, shift, H, d, precision):
    """Any block count (vLLM's V1 runner profiles memory with a 4-block cache) and any base
    address: the per-page slack always pays for the alignment."""
    g = SummaryGeometry(num_kv_heads=H, head_dim=d, rank=8, precision=precision)
    buf = torch.zeros(n * g.page_bytes + 64, dtype=torch.uint8)
    start = (-buf.data_ptr()) % 16 + shift
    raw = buf[start:start + n * g.page_bytes].view(n, 16, g.token_bytes)
    views = carve(raw, g)
    lo, hi = raw.data_ptr(), raw.data_ptr() + raw.numel()
    spans = []
    for v, (_, dt, shape) in zip(views, g.fields()):
        assert v.dtype == dt and tuple(v.shape) == (n, *shape) and v.is_contiguous()
        assert v.data_ptr() % field_align(dt) == 0
        a = v.data_ptr()
        b = a + v.numel() * v.element_size()
        assert lo <= a and b <= hi
        spans.append((a, b))
    spans.sort()
    assert all(spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1))
    for v in views:  # writes through a view land in the side-cache tensor
        v.view(torch.uint8).fill_(7)
    assert int((raw == 7).sum()) == g.bytes_per_block * n

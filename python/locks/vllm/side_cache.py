"""The summary side cache: one extra vLLM "layer" per attention layer that owns the LOCKS page
summaries of that layer.

Why a layer: an attention backend cannot enlarge its own KV allocation (the page size comes from
the layer's KV-cache spec). vLLM's own sparse models keep per-block state the same way
(DeepseekV32IndexerCache): a module registered in compilation_config.static_forward_context with
its own KV-cache spec. Its spec is an MLAAttentionSpec (a FullAttentionSpec) with the same
block size, so the KV-cache manager puts it in the attention layers' group (one
UniformTypeKVCacheSpecs group: same block ids, one block table), the memory profiler counts its
bytes when it sizes the cache, and prefix caching / preemption / block reuse need nothing extra:
a block's summary is rebuilt whenever a step writes the block's last slot.

Storage: vLLM hands the layer one flat uint8 tensor of num_blocks * page_bytes (a single-group
UniformTypeKVCacheSpecs gets one tensor per layer, not the packed cross-layer layout). The
summary arrays are carved from it structure-of-arrays (each array contiguous over all blocks:
the layout the LOCKS operators take), each aligned as the kernels need (16 bytes for the int8 /
uint8 code arrays, the element size for the float scales). Each page carries the worst-case
alignment padding of all arrays (`slack`), so the carve fits for any number of blocks,
including the few-block caches vLLM's V1 runner allocates while profiling memory.
"""
from __future__ import annotations

import dataclasses
import math

import torch

CODE_ALIGN = 16  # the CUDA kernels' vector loads of the code arrays (decoder.cu: aligned16)


def field_align(dt: torch.dtype) -> int:
    e = torch.empty((), dtype=dt).element_size()
    return CODE_ALIGN if e == 1 else e


def fields_bytes(fields) -> int:
    """Bytes of one block's arrays, (name, dtype, per-block shape) each (alignment aside)."""
    return sum(torch.empty((), dtype=dt).element_size() * math.prod(shape) for _, dt, shape in fields)


@dataclasses.dataclass(frozen=True)
class SummaryGeometry:
    num_kv_heads: int
    head_dim: int
    page_size: int = 16
    rank: int = 8
    precision: str = "int4"
    # Two-level LOCKS: group_pages > 0 adds a super summary slot to every block (the super
    # summary of a group of S pages lives in the block of the group's last page, so a
    # sequence's group j has slot block_table[j * S + S - 1]: no allocation of its own, the
    # same lifetime, prefix-cache and reuse rules as the block). Rank super_rank, extent layout.
    group_pages: int = 0
    super_rank: int = 8

    def page_fields(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        """(name, dtype, per-block shape) of each page summary array, in the operators' order."""
        from ..ops import default_basis_group  # the plans' int4 basis scale groups

        H, d, P, r = self.num_kv_heads, self.head_dim, self.page_size, self.rank
        if self.precision == "fp32":
            return [("mu", torch.float32, (H, d)), ("basis", torch.float32, (H, r, d)),
                    ("coeff", torch.float32, (H, P, r))]
        if self.precision == "int4":
            return [("mu_q", torch.int8, (H, d)), ("mu_scale", torch.float32, (H,)),
                    ("basis_q", torch.uint8, (H, r, d // 2)),
                    ("basis_scale", torch.float32, (H, r, d // default_basis_group(d))),
                    ("coeff_q", torch.int8, (H, P, r)), ("coeff_scale", torch.float32, (H, r))]
        raise ValueError(f"precision must be 'int4' or 'fp32', got {self.precision!r}")

    def super_fields(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        """The super summary arrays per block (locks.two_level.SuperSummaries' order), or none."""
        if not self.group_pages:
            return []
        H, d, S, R = self.num_kv_heads, self.head_dim, self.group_pages, self.super_rank
        f32, i8, u8 = torch.float32, torch.int8, torch.uint8
        return [("sup_mu_q", i8, (H, d)), ("sup_mu_scale", f32, (H,)),
                ("sup_basis_q", u8, (H, R, d // 2)), ("sup_basis_scale", f32, (H, R)),
                ("sup_coord_q", i8, (H, S, R)), ("sup_coord_scale", f32, (H, R)),
                ("sup_radius_q", u8, (H, S)), ("sup_radius_scale", f32, (H,)),
                ("sup_lo_q", i8, (H, S, R)), ("sup_hi_q", i8, (H, S, R)),
                ("sup_extent_scale", f32, (H, R))]

    def fields(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        """Every array a block carries: the page summary's, then the super summary slot's."""
        return self.page_fields() + self.super_fields()

    @property
    def bytes_per_block(self) -> int:
        return fields_bytes(self.fields())

    @property
    def super_bytes_per_block(self) -> int:
        """The super summary slot's share of bytes_per_block (0 without group_pages)."""
        return fields_bytes(self.super_fields())

    @property
    def slack(self) -> int:
        """Bytes per block that pay for aligning every array, whatever the base address and
        the number of blocks: the sum of each array's worst-case padding."""
        return sum(field_align(dt) - 1 for _, dt, _ in self.fields())

    @property
    def token_bytes(self) -> int:
        """The spec's head_size (uint8 elements per token slot): page = page_size * token_bytes
        >= bytes_per_block + slack."""
        return -(-(self.bytes_per_block + self.slack) // self.page_size)

    @property
    def page_bytes(self) -> int:
        return self.page_size * self.token_bytes


def carve(raw: torch.Tensor, geom: SummaryGeometry) -> list[torch.Tensor]:
    """The summary arrays ([num_blocks, *shape] each, contiguous) viewed from the side cache's
    tensor (any shape whose first dim is num_blocks, uint8, contiguous)."""
    if raw.dtype != torch.uint8 or not raw.is_contiguous():
        raise ValueError(f"locks side cache: expected a contiguous uint8 tensor, got {raw.dtype}, "
                         f"strides {tuple(raw.stride())}")
    num_blocks = raw.shape[0]
    flat = raw.reshape(-1)
    if flat.numel() != num_blocks * geom.page_bytes:
        raise ValueError(f"locks side cache: {flat.numel()} bytes for {num_blocks} blocks of "
                         f"{geom.page_bytes}: the side-cache tensor is not the size its spec asked for")
    out, off = [], 0
    base = flat.data_ptr()
    for name, dt, shape in geom.fields():
        off += (-(base + off)) % field_align(dt)
        e = torch.empty((), dtype=dt).element_size()
        n = num_blocks
        for s in shape:
            n *= s
        nbytes = n * e
        if off + nbytes > flat.numel():
            raise ValueError(f"locks side cache: {num_blocks} blocks leave too little alignment "
                             f"slack for {name}")
        out.append(flat[off:off + nbytes].view(dt).view(num_blocks, *shape))
        off += nbytes
    return out


def sliding_layers(vllm_config) -> list[str]:
    """The model's attention layers that apply a sliding window (every layer is registered in
    the static forward context by the time vLLM asks the layers for their KV-cache specs)."""
    ctx = vllm_config.compilation_config.static_forward_context
    return [name for name, layer in ctx.items() if getattr(layer, "sliding_window", None) is not None]


def refuse_hybrid_manager(vllm_config) -> None:
    """A model with sliding-window layers (Gemma-3, Cohere2, ...) runs LOCKS on its full-attention
    layers only with vLLM's hybrid KV-cache manager off: the manager gives every layer one page
    size, by growing a smaller page's block size (the side cache would then leave its attention
    layers' group and block table) or by padding it, which vLLM allows only for attention layers
    read by the block stride. With the manager off, vLLM turns the sliding layers' specs into
    full-attention ones and every layer, the side caches included, shares one group and one
    block table, as on a model without sliding windows. Said here, before vLLM's grouping fails
    with a message about page sizes."""
    sliding = sliding_layers(vllm_config)
    if sliding and not vllm_config.scheduler_config.disable_hybrid_kv_cache_manager:
        raise ValueError(
            f"LOCKS on a model with sliding-window layers ({len(sliding)}, e.g. {sliding[0]}) needs "
            "vLLM's hybrid KV-cache manager off: pass --disable-hybrid-kv-cache-manager, and give "
            "LOCKS the full-attention layers only with --attention-config "
            "'{\"backend_per_kind\": {\"full_attention\": \"CUSTOM\"}}' (docs/vllm.md, "
            "\"Hybrid models\")")


def side_layer_name(attn_prefix: str) -> str:
    # One integer in the name (vLLM's extract_layer_index): the attention layer's index.
    return f"{attn_prefix}.locks_summary"


def _vllm():
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.v1.attention.backend import (AttentionBackend, AttentionCGSupport,
                                           AttentionMetadataBuilder)
    return AttentionLayerBase, AttentionBackend, AttentionCGSupport, AttentionMetadataBuilder


_AttentionLayerBase, _AttentionBackend, _CG, _Builder = _vllm()


class LocksSummaryMetadata:
    """The side cache needs no per-step metadata (the attention layer reads its tensor)."""


class LocksSummaryMetadataBuilder(_Builder):
    # ALWAYS: this builder must not lower the graph mode vLLM picks from the attention builders.
    _cudagraph_support = _CG.ALWAYS

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self._md = LocksSummaryMetadata()

    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        return self._md


class LocksSummaryBackend(_AttentionBackend):
    supported_dtypes = [torch.float16, torch.bfloat16, torch.float32, torch.uint8]

    @staticmethod
    def get_name() -> str:
        return "LOCKS_SUMMARY"

    @staticmethod
    def get_supported_kernel_block_sizes():
        return [16]

    @staticmethod
    def get_impl_cls():
        raise NotImplementedError("the LOCKS summary side cache has no attention impl")

    @staticmethod
    def get_builder_cls():
        return LocksSummaryMetadataBuilder

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        assert num_kv_heads == 1
        return (num_blocks, block_size, head_size)

    @staticmethod
    def get_kv_cache_stride_order(include_num_layers_dimension: bool = False):
        # Identity, layers first: no cross-layer layout (the arrays are carved per layer).
        return (0, 1, 2, 3) if include_num_layers_dimension else (0, 1, 2)


class LocksSummaryCache(torch.nn.Module, _AttentionLayerBase):
    """Owns one attention layer's summaries; vLLM binds its tensor to `.kv_cache`."""

    def __init__(self, prefix: str, geom: SummaryGeometry, static_forward_context: dict):
        super().__init__()
        self.kv_cache = torch.tensor([])
        self.prefix = prefix
        self.geom = geom
        self._views: list[torch.Tensor] | None = None
        self._views_of: int | None = None
        if prefix in static_forward_context:
            raise ValueError(f"Duplicate layer name: {prefix}")
        static_forward_context[prefix] = self

    def get_kv_cache_spec(self, vllm_config):
        from vllm.v1.kv_cache_interface import MLAAttentionSpec

        refuse_hybrid_manager(vllm_config)
        return MLAAttentionSpec(block_size=vllm_config.cache_config.block_size, num_kv_heads=1,
                                head_size=self.geom.token_bytes, dtype=torch.uint8)

    def get_attn_backend(self):
        return LocksSummaryBackend

    def forward(self):  # never called: the attention layer reads `summaries()`
        raise RuntimeError("the LOCKS summary side cache is not called directly")

    def summaries(self) -> list[torch.Tensor]:
        """The page summary arrays ([num_blocks, ...] each)."""
        return self._carved()[: len(self.geom.page_fields())]

    def supers(self) -> list[torch.Tensor]:
        """The super summary arrays (slot = block id; empty without group_pages)."""
        return self._carved()[len(self.geom.page_fields()):]

    def _carved(self) -> list[torch.Tensor]:
        kv = self.kv_cache
        if isinstance(kv, (list, tuple)):  # older vLLM: one tensor per virtual engine
            kv = kv[0]
        if self._views is None or self._views_of != kv.data_ptr():
            if kv.numel() == 0:
                raise RuntimeError(f"{self.prefix}: the side cache has no tensor bound yet")
            self._views = carve(kv, self.geom)
            self._views_of = kv.data_ptr()
        return self._views

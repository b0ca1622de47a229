"""The LOCKS attention backend for vLLM (v1 attention interface, vLLM 0.26.0).

- Prefill, chunked prefill and mixed batches: vLLM's own FlashAttention (varlen, paged) over the
  same cache, with FlashAttention's metadata (the builder subclasses FA's builder).
- Pure single-token decode batches: LOCKS (`locks.DecodeWrapper.run`: score pages from the
  summaries, select under the budget with the tail page always attended, split-K attention
  over the selected pages), capturable in full CUDA graphs (UNIFORM_SINGLE_TOKEN_DECODE).
- Every step (prefill or decode) rebuilds the summary of each block whose last slot it wrote
  (`locks.summary_update(..., slot_mapping=...)`), into the side-cache layer (side_cache.py).

KV-cache layout: [2, num_blocks, block_size, num_kv_heads, head_size], so that K = kv_cache[0] and
V = kv_cache[1] are each contiguous [num_blocks, P, H, d] (the layout the LOCKS kernels take).
vLLM 0.26's FLASH_ATTN packs K and V into the last dim ([N, P, H, 2d] physically), which gives
strided K/V; FlashAttention reads either layout, the LOCKS kernels only the contiguous one.

Graph safety: the metadata builder runs outside the graph every step and writes the persistent
buffers (int32 slot mapping, block table, seq_lens); in-graph work reads only those, the
summaries, the cache and the wrapper's workspace, all allocated once.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any, ClassVar

import torch

from vllm.config import get_current_vllm_config
from vllm.v1.attention.backend import (AttentionBackend, AttentionCGSupport, AttentionType,
                                       MultipleOf)
from vllm.v1.attention.backends.flash_attn import (FlashAttentionImpl, FlashAttentionMetadata,
                                                   FlashAttentionMetadataBuilder)
from vllm.v1.attention.backends.utils import split_decodes_and_prefills

from .settings import LocksSettings, parse_settings
from .side_cache import LocksSummaryCache, SummaryGeometry, side_layer_name

try:  # FlashAttention (CUDA builds of vLLM); CPU tests replace it
    from vllm.v1.attention.backends.fa_utils import flash_attn_varlen_func
except Exception:  # noqa: BLE001
    flash_attn_varlen_func = None

BLOCK_SIZE = 16


def _skip_prefill() -> bool:
    import os

    return os.environ.get("LOCKS_BENCH_SKIP_PREFILL_ATTENTION", "0") == "1"

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


def _dtype_name(dt: torch.dtype) -> str:
    return {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}.get(dt, str(dt))


def settings_from(vllm_config) -> LocksSettings:
    extra = getattr(vllm_config, "additional_config", None) or {}
    return parse_settings(extra if isinstance(extra, dict) else {}, block_size=BLOCK_SIZE)


def refuse_config(vllm_config) -> list[str]:
    """Whole-engine settings the backend does not serve (checked when the first layer is built)."""
    why = []
    if getattr(vllm_config, "kv_transfer_config", None) is not None:
        why.append("KV connectors (--kv-transfer-config) are not supported: the summaries live in "
                   "a side cache the connector would not move; drop --kv-transfer-config or use "
                   "--attention-backend FLASH_ATTN")
    cc = vllm_config.cache_config
    if getattr(cc, "kv_offloading_size", None):
        why.append("KV-cache offloading (--kv-offloading-size) is not supported; unset it")
    if cc.block_size is not None and cc.block_size != BLOCK_SIZE:
        why.append(f"--block-size {cc.block_size}: LOCKS pages are {BLOCK_SIZE} tokens; use --block-size 16")
    pc = vllm_config.parallel_config
    if getattr(pc, "decode_context_parallel_size", 1) > 1 or getattr(pc, "prefill_context_parallel_size", 1) > 1:
        why.append("decode/prefill context parallelism is not supported; set it to 1")
    spec = getattr(vllm_config, "speculative_config", None)
    if spec is not None:
        why.append("speculative decoding is not supported yet (decode batches of one token only); "
                   "drop --speculative-config")
    return why


class LocksAttentionBackend(AttentionBackend):
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto", "float16", "bfloat16"]
    forward_includes_kv_cache_update: bool = False  # vLLM calls impl.do_kv_cache_update first

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"  # Attention.__init__ looks up AttentionBackendEnum[get_name()]

    @staticmethod
    def get_supported_kernel_block_sizes() -> list[int | MultipleOf]:
        return [BLOCK_SIZE]

    @staticmethod
    def get_impl_cls():
        return LocksAttentionImpl

    @staticmethod
    def get_builder_cls():
        return LocksMetadataBuilder

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        return (2, num_blocks, block_size, num_kv_heads, head_size)

    @staticmethod
    def get_kv_cache_stride_order(include_num_layers_dimension: bool = False):
        # Identity (and layers first when asked): no cross-layer KV layout.
        return tuple(range(6 if include_num_layers_dimension else 5))

    @classmethod
    def supports_head_size(cls, head_size: int) -> bool:
        return head_size in (64, 128, 256)

    @classmethod
    def supports_compute_capability(cls, capability) -> bool:
        return capability.major >= 8

    @classmethod
    def validate_configuration(cls, head_size, dtype, kv_cache_dtype, block_size, use_mla, has_sink,
                               use_sparse, use_mm_prefix, use_per_head_quant_scales,
                               device_capability, attn_type, has_sliding_window=False,
                               use_non_causal=False, use_batch_invariant=False,
                               use_kv_connector=False, use_pcp=False) -> list[str]:
        """vLLM asks this before it builds a layer with the backend the user selected; each
        reason names the setting and what to do (vLLM prints them in its ValueError)."""
        r = []
        if dtype not in cls.supported_dtypes:
            r.append(f"model dtype {dtype} not supported by LOCKS: use --dtype bfloat16 or float16")
        if kv_cache_dtype not in (None, "auto", _dtype_name(dtype)):
            r.append(f"--kv-cache-dtype {kv_cache_dtype}: LOCKS reads a KV cache in the model dtype "
                     f"({_dtype_name(dtype)}); use --kv-cache-dtype auto")
        if block_size is not None and block_size != BLOCK_SIZE:
            r.append(f"--block-size {block_size}: LOCKS pages are {BLOCK_SIZE} tokens; use --block-size 16")
        if head_size not in (64, 128, 256):
            r.append(f"head size {head_size} not supported by LOCKS kernels (64, 128, 256); use "
                     "--attention-backend FLASH_ATTN for this model")
        if use_mla:
            r.append("MLA models are not supported by LOCKS; use the MLA backends")
        if has_sink:
            r.append("attention-sink layers (learned sinks) are not supported by LOCKS; use "
                     "--attention-backend FLASH_ATTN")
        if has_sliding_window:
            r.append("sliding-window layers are not supported by LOCKS (selection would ignore the "
                     "window); use --attention-backend FLASH_ATTN for this model")
        if use_sparse:
            r.append("models with their own sparse attention are not supported by LOCKS")
        if use_mm_prefix:
            r.append("prefix-LM multimodal attention is not supported by LOCKS")
        if use_per_head_quant_scales:
            r.append("per-head KV quantization scales are not supported (LOCKS reads an unquantized cache)")
        if attn_type != AttentionType.DECODER:
            r.append(f"attention type {attn_type} not supported: LOCKS serves decoder self-attention only")
        if use_non_causal:
            r.append("non-causal attention is not supported by LOCKS")
        if use_batch_invariant:
            r.append("VLLM_BATCH_INVARIANT is not supported by LOCKS; unset it")
        if use_kv_connector:
            r.append("KV connectors are not supported by LOCKS (the summary side cache would not be "
                     "transferred); drop --kv-transfer-config")
        if use_pcp:
            r.append("prefill context parallelism is not supported by LOCKS")
        if device_capability is not None and not cls.supports_compute_capability(device_capability):
            r.append(f"compute capability {device_capability} < 8.0 not supported by LOCKS")
        return r


@dataclasses.dataclass
class LocksMetadata:
    fa: FlashAttentionMetadata            # FlashAttention's metadata (prefill / mixed batches)
    pure_decode: bool                     # every request has query length 1: the LOCKS path
    dense: bool                           # LOCKS dense kernel (context below min_context, eager only)
    num_reqs: int
    slot_mapping: torch.Tensor            # int32 persistent [max_tokens]; -1 past this step's tokens
    block_table: torch.Tensor             # int32 persistent [max_batch, max_blocks]
    seq_lens: torch.Tensor                # int32 persistent [max_batch]; 1 in padded rows
    bufs: "DecodeBuffers"


class DecodeBuffers:
    """Persistent buffers shared by every layer of the group (layers run one after another):
    fp32 query/output staging (the kernels take fp32 q and write fp32 out), lse, selection,
    and the workspace of the layers' DecodeWrappers."""

    def __init__(self, *, max_batch, num_q_heads, num_kv_heads, head_dim, max_blocks, max_tokens,
                 capacity, workspace_bytes, device):
        f32, i32 = torch.float32, torch.int32
        self.q = torch.zeros(max_batch, num_q_heads, head_dim, dtype=f32, device=device)
        self.out = torch.zeros(max_batch, num_q_heads, head_dim, dtype=f32, device=device)
        self.lse = torch.zeros(max_batch, num_q_heads, dtype=f32, device=device)
        self.pages = torch.zeros(max_batch, num_kv_heads, max(capacity, 1), dtype=i32, device=device)
        self.counts = torch.zeros(max_batch, num_kv_heads, dtype=i32, device=device)
        self.slot_mapping = torch.full((max_tokens,), -1, dtype=i32, device=device)
        self.block_table = torch.zeros(max_batch, max_blocks, dtype=i32, device=device)
        self.seq_lens = torch.ones(max_batch, dtype=i32, device=device)
        self.workspace = torch.zeros(max(workspace_bytes, 1), dtype=torch.uint8, device=device)


class LocksMetadataBuilder(FlashAttentionMetadataBuilder):
    # Full graphs for pure single-token decode; prefill and mixed batches run FlashAttention
    # piecewise/eager (the Python choice between the two paths is frozen at capture, so a graph
    # may only ever see one of them).
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    supports_update_block_table: bool = False

    @classmethod
    def get_cudagraph_support(cls, vllm_config, kv_cache_spec) -> AttentionCGSupport:
        return cls._cudagraph_support

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self._init_reorder_batch_threshold(1, supports_spec_as_decode=False)  # decodes first
        self.settings = settings_from(vllm_config)
        cg = vllm_config.compilation_config.cudagraph_mode
        self.full_graphs = bool(cg is not None and cg.has_full_cudagraphs())
        if self.full_graphs and self.settings.effective_min_context > self.settings.budget:
            raise ValueError(
                f"locks setting 'min_context' = {self.settings.min_context} > budget "
                f"{self.settings.budget}: the dense/sparse switch cannot change inside a captured CUDA "
                "graph. Use min_context <= budget (below the budget decode is exact anyway), or run "
                "decode without full graphs (cudagraph_mode PIECEWISE/NONE or enforce_eager)")
        sc = vllm_config.scheduler_config
        self.max_batch = max(sc.max_num_seqs, self.max_cudagraph_size or 0)
        self.max_tokens = max(sc.max_num_batched_tokens, self.max_batch)
        self.max_blocks = -(-vllm_config.model_config.max_model_len // BLOCK_SIZE)
        self.bufs: DecodeBuffers | None = None

    def _buffers(self) -> DecodeBuffers:
        if self.bufs is None:
            s = self.settings
            o = ops()
            cap = (o.ops.select_capacity(s.budget, BLOCK_SIZE, self.max_blocks, s.sink_pages, s.recent_pages)
                   if hasattr(o, "ops") else min(-(-s.budget // BLOCK_SIZE), self.max_blocks))
            ws = 0
            if hasattr(o, "workspace_bytes"):
                ws = o.workspace_bytes(
                    num_q_heads=self.num_heads_q, num_kv_heads=self.num_heads_kv, head_dim=self.headdim,
                    page_size=BLOCK_SIZE, rank=s.rank, precision=s.precision, kv_dtype=self.kv_cache_dtype,
                    num_blocks=self._num_blocks(), max_batch=self.max_batch,
                    max_blocks_per_seq=self.max_blocks, budget_tokens=s.budget, sink_pages=s.sink_pages,
                    recent_pages=s.recent_pages, device=self.device)
            self.bufs = DecodeBuffers(max_batch=self.max_batch, num_q_heads=self.num_heads_q,
                                      num_kv_heads=self.num_heads_kv, head_dim=self.headdim,
                                      max_blocks=self.max_blocks, max_tokens=self.max_tokens,
                                      capacity=cap, workspace_bytes=ws, device=self.device)
            # Plan every layer's wrapper here, outside any graph capture (plan is host work
            # that may query the device; run() inside the graph then only launches kernels).
            sfc = self.vllm_config.compilation_config.static_forward_context
            for name in self.layer_names:
                impl = getattr(sfc.get(name), "impl", None)
                if isinstance(impl, LocksAttentionImpl):
                    impl.plan_for(self.bufs, self._num_blocks(), self.kv_cache_dtype, self.device)
        return self.bufs

    def _num_blocks(self) -> int:
        n = self.vllm_config.cache_config.num_gpu_blocks
        if not n:
            raise RuntimeError("locks: the number of KV-cache blocks is not known yet")
        return int(n)

    def use_cascade_attention(self, *args, **kwargs) -> bool:
        return False

    def build(self, common_prefix_len, common_attn_metadata, fast_build: bool = False) -> LocksMetadata:
        cm = common_attn_metadata
        fa = super().build(0, cm, fast_build)
        b = self._buffers()
        n_reqs, n_tok = cm.num_reqs, cm.num_actual_tokens
        num_decodes, num_prefills, _, _ = split_decodes_and_prefills(cm, decode_threshold=1)
        pure = num_prefills == 0 and cm.max_query_len == 1
        # Persistent int32 copies, written outside any graph. Rows/slots past this step: padding
        # (-1 slots rebuild nothing; padded rows read one valid token and are discarded).
        sm = cm.slot_mapping[:n_tok]
        b.slot_mapping[: sm.shape[0]].copy_(sm, non_blocking=True)
        b.slot_mapping[sm.shape[0]:].fill_(-1)
        bt = cm.block_table_tensor[:n_reqs]
        w = min(bt.shape[1], b.block_table.shape[1])
        b.block_table[:n_reqs, :w].copy_(bt[:, :w], non_blocking=True)
        # Graph padding rows may carry seq_len 0: clamp to 1 (one valid token, output discarded).
        torch.clamp(cm.seq_lens[:n_reqs], min=1, out=b.seq_lens[:n_reqs])
        b.seq_lens[n_reqs:].fill_(1)
        dense = (not self.full_graphs) and cm.max_seq_len < self.settings.effective_min_context
        return LocksMetadata(fa=fa, pure_decode=pure, dense=dense, num_reqs=n_reqs,
                             slot_mapping=b.slot_mapping, block_table=b.block_table,
                             seq_lens=b.seq_lens, bufs=b)


def _attention_prefix() -> str | None:
    """The prefix of the Attention layer being built: vLLM constructs the impl inside
    Attention.__init__ (which has `prefix`) and passes no layer name to the impl."""
    from vllm.model_executor.layers.attention import Attention

    f = inspect.currentframe()
    try:
        while f is not None:
            slf = f.f_locals.get("self")
            if f.f_code.co_name == "__init__" and isinstance(slf, Attention):
                p = f.f_locals.get("prefix")
                return p if isinstance(p, str) and p else None
            f = f.f_back
        return None
    finally:
        del f


class LocksAttentionImpl(FlashAttentionImpl):
    def __init__(self, num_heads, head_size, scale, num_kv_heads, alibi_slopes, sliding_window,
                 kv_cache_dtype, logits_soft_cap=None, attn_type=AttentionType.DECODER,
                 kv_sharing_target_layer_name=None, sinks=None, *, layer_name: str | None = None) -> None:
        refuse = []
        if sliding_window is not None:
            refuse.append("sliding-window layer (sliding_window set)")
        if sinks is not None:
            refuse.append("attention-sink layer (sinks)")
        if alibi_slopes is not None:
            refuse.append("ALiBi slopes")
        if logits_soft_cap:
            refuse.append("logits soft-capping")
        if kv_sharing_target_layer_name is not None:
            refuse.append("cross-layer KV sharing")
        if attn_type != AttentionType.DECODER:
            refuse.append(f"attention type {attn_type}")
        if refuse:
            raise NotImplementedError("LOCKS attention backend (--attention-backend CUSTOM) cannot serve a layer "
                                      f"with {', '.join(refuse)}; use --attention-backend FLASH_ATTN")
        super().__init__(num_heads, head_size, scale, num_kv_heads, alibi_slopes, sliding_window,
                         kv_cache_dtype, logits_soft_cap, attn_type, kv_sharing_target_layer_name, sinks)
        vc = get_current_vllm_config()
        why = refuse_config(vc)
        if why:
            raise ValueError("LOCKS attention backend: " + "; ".join(why))
        self.settings = settings_from(vc)
        s = self.settings
        dtype = vc.model_config.dtype if vc.model_config is not None else torch.bfloat16
        if kv_cache_dtype not in ("auto", _dtype_name(dtype)):
            raise ValueError(f"LOCKS attention backend: --kv-cache-dtype {kv_cache_dtype} differs from the "
                             f"model dtype {_dtype_name(dtype)}; use --kv-cache-dtype auto")
        group = num_heads // num_kv_heads
        ok, reason = ops().supports("cuda", head_dim=head_size, page_size=BLOCK_SIZE, group=group,
                                    kv_dtype=dtype, rank=s.rank, precision=s.precision)
        if not ok:
            raise NotImplementedError(f"LOCKS attention backend: this model's attention (head_size "
                                      f"{head_size}, GQA group {group} = {num_heads}/{num_kv_heads} heads, "
                                      f"{dtype}, rank {s.rank}, {s.precision}) is not supported: {reason}. "
                                      "Use --attention-backend FLASH_ATTN")
        self.model_dtype = dtype
        prefix = layer_name or _attention_prefix()
        if prefix is None:
            raise RuntimeError("LOCKS attention backend: could not find the attention layer's name")
        self.layer_prefix = prefix
        self.geom = SummaryGeometry(num_kv_heads=num_kv_heads, head_dim=head_size, page_size=BLOCK_SIZE,
                                    rank=s.rank, precision=s.precision)
        self.side = LocksSummaryCache(side_layer_name(prefix), self.geom,
                                      vc.compilation_config.static_forward_context)
        self.wrapper = None
        self._plan_key = None

    # -- cache writes ------------------------------------------------------------------------
    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping) -> None:
        k_cache, v_cache = kv_cache[0], kv_cache[1]
        if kv_cache.is_cuda:
            from vllm._custom_ops import reshape_and_cache_flash

            reshape_and_cache_flash(key, value, k_cache, v_cache, slot_mapping, self.kv_cache_dtype,
                                    layer._k_scale, layer._v_scale)
            return
        n = slot_mapping.shape[0]  # CPU (tests): a plain scatter
        sm = slot_mapping.to(torch.int64)
        keep = sm >= 0
        kf = k_cache.view(-1, self.num_kv_heads, self.head_size)
        vf = v_cache.view(-1, self.num_kv_heads, self.head_size)
        kf[sm[keep]] = key[:n][keep].to(kf.dtype)
        vf[sm[keep]] = value[:n][keep].to(vf.dtype)

    # -- attention ---------------------------------------------------------------------------
    def plan_for(self, b: "DecodeBuffers", num_blocks: int, kv_dtype: torch.dtype, device) -> None:
        """Plan this layer's DecodeWrapper over the shared workspace (host side, once per
        shape; the builder calls it before the first step, forward re-plans only if the cache
        it is handed has another number of blocks)."""
        key = (num_blocks, b.q.shape[0], b.block_table.shape[1], b.workspace.data_ptr(), kv_dtype)
        if key == self._plan_key:
            return
        s = self.settings
        w = ops().DecodeWrapper(b.workspace)
        w.plan(num_q_heads=self.num_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_size,
               page_size=BLOCK_SIZE, rank=s.rank, precision=s.precision, kv_dtype=kv_dtype,
               num_blocks=num_blocks, max_batch=b.q.shape[0], max_blocks_per_seq=b.block_table.shape[1],
               budget_tokens=s.budget, sink_pages=s.sink_pages, recent_pages=s.recent_pages,
               scale=self.scale, device=device)
        self.wrapper, self._plan_key = w, key

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output,
                output_scale=None, output_block_scale=None):
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("fused output quantization is not supported by the LOCKS backend")
        if attn_metadata is None:  # profiling run
            return output.fill_(0)
        md: LocksMetadata = attn_metadata
        k_cache, v_cache = kv_cache[0], kv_cache[1]
        summaries = self.side.summaries()
        n = query.shape[0]
        # Rebuild the summary of every block whose last slot this step wrote (decode, chunked
        # prefill, prefix-cache tails, reused blocks): graph-safe, reads the persistent slots.
        ops().summary_update(k_cache, md.block_table, md.seq_lens, summaries,
                             slot_mapping=md.slot_mapping[:n])
        if not md.pure_decode or n > md.bufs.q.shape[0]:
            return self._prefill(layer, query, k_cache, v_cache, md.fa, output)
        b = md.bufs
        self.plan_for(b, k_cache.shape[0], k_cache.dtype, k_cache.device)
        q32 = b.q[:n]
        q32.copy_(query.reshape(n, self.num_heads, self.head_size))  # bf16 -> fp32 (kernels take fp32 q)
        self.wrapper.run(q32, k_cache, v_cache, summaries, md.block_table[:n], md.seq_lens[:n],
                         out=b.out[:n], lse=b.lse[:n], pages=b.pages[:n], counts=b.counts[:n],
                         dense=md.dense)
        output.view(-1, self.num_heads, self.head_size)[:n].copy_(b.out[:n])  # fp32 -> model dtype
        return output

    def _prefill(self, layer, query, k_cache, v_cache, fa: FlashAttentionMetadata, output):
        n = fa.num_actual_tokens
        if fa.max_query_len > 1 and _skip_prefill():  # benchmark-only mode, bench_backends.py
            output[:n].zero_()
            return output
        fn = flash_attn_varlen_func
        if fn is None:
            raise RuntimeError("LOCKS backend: vLLM's FlashAttention is not available for prefill")
        descale_shape = (fa.query_start_loc.shape[0] - 1, self.num_kv_heads)
        fn(q=query[:n], k=k_cache, v=v_cache,
           out=output.view(-1, self.num_heads, self.head_size)[:n],
           cu_seqlens_q=fa.query_start_loc, max_seqlen_q=fa.max_query_len, seqused_k=fa.seq_lens,
           max_seqlen_k=fa.max_seq_len, softmax_scale=self.scale, causal=True,
           window_size=None, block_table=fa.block_table, softcap=0.0,
           scheduler_metadata=fa.scheduler_metadata, fa_version=self.vllm_flash_attn_version,
           q_descale=None, k_descale=layer._k_scale.expand(descale_shape),
           v_descale=layer._v_scale.expand(descale_shape), num_splits=fa.max_num_splits)
        return output

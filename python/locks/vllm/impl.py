"""The LOCKS attention impl: K/V writes, summary rebuilds, FlashAttention prefill, LOCKS decode."""
from __future__ import annotations

import inspect

import torch

from vllm.config import get_current_vllm_config
from vllm.v1.attention.backend import AttentionType
from vllm.v1.attention.backends.flash_attn import FlashAttentionImpl, FlashAttentionMetadata

from .builder import DecodeBuffers, LocksMetadata, batch_buckets
from .engine_config import BLOCK_SIZE, _dtype_name, refuse_config, settings_from
from .library import ops, skip_prefill
from .settings import SUPER_RANK, flat_below_groups, length_bucket_plan, two_level_plan
from .side_cache import LocksSummaryCache, SummaryGeometry, side_layer_name

try:  # FlashAttention (CUDA builds of vLLM); CPU tests replace it
    from vllm.v1.attention.backends.fa_utils import flash_attn_varlen_func
except Exception:  # noqa: BLE001
    flash_attn_varlen_func = None


def kv_layout_problem(k_cache: torch.Tensor, v_cache: torch.Tensor) -> str | None:
    """Why the LOCKS kernels cannot read this K/V pair, or None. They read blocks
    [16, H, d] that are each contiguous, any block stride >= 16 * H * d apart, the same for K
    and V: the V2 runner's [2, N, 16, H, d] cache (dense halves) and the V1 runner's, which
    interleaves K and V per block ([N, 2, 16, H, d] physically: block stride 2 * 16 * H * d)."""
    for name, t in (("K", k_cache), ("V", v_cache)):
        want = 1
        for i in (3, 2, 1):
            if t.shape[i] != 1 and t.stride(i) != want:
                return f"a {name} block [16, H, d] is not contiguous ({name} strides {tuple(t.stride())})"
            want *= t.shape[i]
        if t.shape[0] > 1 and t.stride(0) < want:
            return f"{name} blocks overlap ({name} strides {tuple(t.stride())})"
    if k_cache.shape[0] > 1 and k_cache.stride(0) != v_cache.stride(0):
        return f"K and V have different block strides ({k_cache.stride(0)}, {v_cache.stride(0)})"
    return None


def plugin_logger():
    """The plugin's logger, under vLLM's "vllm" logger: vLLM configures only that one (its
    handler, its level, no propagation), so a logger outside it, such as `locks.vllm.impl`,
    drops INFO lines from the engine's log."""
    from vllm.logger import init_logger

    return init_logger("vllm." + __name__)


_logged_layout = False


def _log_layout_once(k_cache: torch.Tensor) -> None:
    global _logged_layout
    if not _logged_layout:
        _logged_layout = True
        dense = k_cache.shape[1] * k_cache.shape[2] * k_cache.shape[3]
        plugin_logger().info("LOCKS: KV cache K half shape %s strides %s (block stride %d, "
                             "dense %d)", tuple(k_cache.shape), tuple(k_cache.stride()),
                             k_cache.stride(0), dense)


_logged_two_level = False


def _log_two_level_once(s, geom: SummaryGeometry, num_blocks: int, kv_dtype: torch.dtype) -> None:
    """Once per process: the two-level settings and what their super summary slots cost."""
    global _logged_two_level
    if _logged_two_level:
        return
    _logged_two_level = True
    sup = geom.super_bytes_per_block
    kv = 2 * geom.page_size * geom.num_kv_heads * geom.head_dim * torch.empty((), dtype=kv_dtype).element_size()
    fb = flat_below_groups(s, geom.page_size)
    plugin_logger().info(
        "LOCKS two-level: group_pages %d, alpha %g, budget %d, min_groups %d; sequences under %d tokens "
        "(%d complete groups) decode flat; a super summary slot in each of the %d blocks' side-cache rows, "
        "%d B a block a layer (%.1f%% of its K/V)", s.group_pages, s.alpha, s.budget, s.min_groups,
        fb * geom.page_size * s.group_pages, fb, num_blocks, sup, 100.0 * sup / kv)


_logged_request_off = False
_logged_request_on = False


def _log_request_selection_on_once(group: int, tokens: int) -> None:
    """Once per process: the engine log says that verification steps select once a request."""
    global _logged_request_on
    if not _logged_request_on:
        _logged_request_on = True
        plugin_logger().info(
            "LOCKS: spec_selection 'request': one selection a verification request of %d tokens "
            "(%d x %d query heads a KV head), handed to its token rows by request_rows", tokens,
            group, tokens)


def _log_request_selection_off_once(group: int, tokens: int, why: str) -> None:
    """Once per process: spec_selection "request" falls back to token rows for this model."""
    global _logged_request_off
    if not _logged_request_off:
        _logged_request_off = True
        plugin_logger().warning(
            "LOCKS: spec_selection 'request' needs the kernels to take a group of %d x %d = %d query "
            "heads a KV head (%s); verification tokens select one row each ('token')", group, tokens,
            group * tokens, why)


# The CUDA cache write's cap on tokens a call (include/locks/cuda/limits.h,
# kCacheWriteMaxTokens: its slot scans are O(n^2)); larger decode batches take the two launches.
FUSED_WRITE_MAX_TOKENS = 16384


def _step_metadata(layer_name: str):
    """This step's LocksMetadata for the layer from vLLM's forward context (what its attention
    op reads too), or None outside a model forward (direct calls in tests, profiling runs)."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if not is_forward_context_available():
        return None
    md = get_forward_context().attn_metadata
    if isinstance(md, list):  # speculative decoding: [0] is the base model's
        md = md[0] if md else None
    if isinstance(md, dict):
        md = md.get(layer_name)
    return md if isinstance(md, LocksMetadata) else None


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
        if s.group_pages and not hasattr(ops(), "two_level"):
            raise NotImplementedError("LOCKS attention backend: group_pages > 0 (two-level LOCKS) needs the "
                                      "compiled locks operators (locks.two_level)")
        self.model_dtype = dtype
        prefix = layer_name or _attention_prefix()
        if prefix is None:
            raise RuntimeError("LOCKS attention backend: could not find the attention layer's name")
        self.layer_prefix = prefix
        self.geom = SummaryGeometry(num_kv_heads=num_kv_heads, head_dim=head_size, page_size=BLOCK_SIZE,
                                    rank=s.rank, precision=s.precision, group_pages=s.group_pages,
                                    super_rank=SUPER_RANK)
        self.side = LocksSummaryCache(side_layer_name(prefix), self.geom,
                                      vc.compilation_config.static_forward_context)
        self.wrapper = None
        self.wrappers: list = []
        self.req_wrappers: list = []  # spec_selection "request": (bucket, wrapper) of G (1 + k) heads
        self._plan_key = None

    # -- cache writes ------------------------------------------------------------------------
    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping) -> None:
        k_cache, v_cache = kv_cache[0], kv_cache[1]
        md = _step_metadata(self.layer_prefix)
        if (md is not None and md.pure_decode and self.kv_cache_dtype == "auto" and self.settings.fused_write
                and key.shape[0] <= FUSED_WRITE_MAX_TOKENS):
            # A decode step: the K/V write and the rebuild of the blocks it completes in one
            # launch (locks.cache_write; one token a row, so its O(n^2) slot scan is the batch's)
            # instead of reshape_and_cache_flash + a summary_update launch in forward.
            n = key.shape[0]
            ops().cache_write(key, value, k_cache, v_cache, md.slot_mapping[:n], self.side.summaries())
            md.fused_writes.add(self.layer_prefix)
            return
        if kv_cache.is_cuda:
            from vllm._custom_ops import reshape_and_cache_flash

            reshape_and_cache_flash(key, value, k_cache, v_cache, slot_mapping, self.kv_cache_dtype,
                                    layer._k_scale, layer._v_scale)
            return
        n = slot_mapping.shape[0]  # CPU (tests): a plain scatter (K/V may be strided: V1 runner)
        sm = slot_mapping.to(torch.int64)
        keep = sm >= 0
        P = k_cache.shape[1]
        blk, off = sm[keep] // P, sm[keep] % P
        k_cache[blk, off] = key[:n][keep].to(k_cache.dtype)
        v_cache[blk, off] = value[:n][keep].to(v_cache.dtype)

    # -- attention ---------------------------------------------------------------------------
    def plan_for(self, b: "DecodeBuffers", num_blocks: int, kv_dtype: torch.dtype, device) -> None:
        """Plan this layer's DecodeWrapper over the shared workspace (host side, once per
        shape; the builder calls it before the first step, forward re-plans only if the cache
        it is handed has another number of blocks)."""
        key = (num_blocks, b.max_batch, b.block_table.shape[1], b.workspace.data_ptr(), kv_dtype)
        if key == self._plan_key:
            return
        s = self.settings

        def plan_buckets(num_q_heads: int, max_batch: int, **extra) -> list:
            """(bucket, wrapper) for each batch bucket up to max_batch, over the one workspace."""
            out = []
            for mb in batch_buckets(max_batch):
                w = ops().DecodeWrapper(b.workspace)
                w.plan(num_q_heads=num_q_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_size,
                       page_size=BLOCK_SIZE, rank=s.rank, precision=s.precision, kv_dtype=kv_dtype,
                       num_blocks=num_blocks, max_batch=mb, max_blocks_per_seq=b.block_table.shape[1],
                       budget_tokens=s.budget, sink_pages=s.sink_pages, recent_pages=s.recent_pages,
                       dense_below=s.effective_min_context, scale=self.scale, device=device,
                       **length_bucket_plan(s), **extra)
                out.append((mb, w))
            return out

        # One plan per batch bucket (builder.batch_buckets) over the one shared workspace: a
        # step of n sequences runs the kernels chosen for the smallest bucket >= n.
        self.wrappers = plan_buckets(self.num_heads, b.max_batch, **two_level_plan(s, num_blocks))
        self.wrapper, self._plan_key = self.wrappers[-1][1], key
        self.req_wrappers = []
        T = b.request_tokens
        if T:  # spec_selection "request": a request's T tokens as G T heads of one row
            G = self.num_heads // self.num_kv_heads
            ok, why = ops().supports("cuda", head_dim=self.head_size, page_size=BLOCK_SIZE, group=G * T,
                                     kv_dtype=kv_dtype, rank=s.rank, precision=s.precision)
            if ok:
                self.req_wrappers = plan_buckets(self.num_heads * T, b.max_requests)
                _log_request_selection_on_once(G, T)
            else:
                _log_request_selection_off_once(G, T, why)
        if s.group_pages:
            _log_two_level_once(s, self.geom, num_blocks, kv_dtype)

    def wrapper_for(self, n: int):
        """The wrapper planned for the smallest batch bucket that holds n sequences."""
        return next(w for mb, w in self.wrappers if mb >= n)

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output,
                output_scale=None, output_block_scale=None):
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("fused output quantization is not supported by the LOCKS backend")
        if attn_metadata is None:  # profiling run
            return output.fill_(0)
        md: LocksMetadata = attn_metadata
        k_cache, v_cache = kv_cache[0], kv_cache[1]
        why = kv_layout_problem(k_cache, v_cache)
        if why:
            raise NotImplementedError(
                f"LOCKS: vLLM laid this layer's KV cache out in a way the LOCKS kernels do not read: "
                f"{why}. They read contiguous [16, H, d] blocks at any block stride (the V2 "
                "runner's [2, N, 16, H, d], the V1 runner's K/V interleaved per block); use "
                "--attention-backend FLASH_ATTN for this configuration")
        _log_layout_once(k_cache)
        summaries = self.side.summaries()
        n = query.shape[0]
        # Rebuild the summary of every block whose last slot this step wrote (decode, chunked
        # prefill, prefix-cache tails, reused blocks): graph-safe, reads the persistent slots.
        # Decode steps did it in do_kv_cache_update (the fused write).
        if self.layer_prefix not in md.fused_writes:
            ops().summary_update(k_cache, md.block_table, md.seq_lens, summaries,
                                 slot_mapping=md.slot_mapping[:n])
        if self.geom.group_pages:
            self._update_supers(md, k_cache, n)
        if md.mixed_decodes:
            # The decode tokens [0, nt) sparse (one row each), the prefill / extend requests
            # after them on FlashAttention.
            nt = md.num_decode_tokens
            self._decode(md, query, k_cache, v_cache, summaries, output, nt, dense=False)
            return self._prefill(layer, query, k_cache, v_cache, md.fa, output, first=md.num_decodes,
                                 first_token=nt, num_reqs=md.num_reqs)
        if not md.pure_decode or n > md.bufs.max_batch:
            return self._prefill(layer, query, k_cache, v_cache, md.fa, output)
        return self._decode(md, query, k_cache, v_cache, summaries, output, n, dense=md.dense)

    def _update_supers(self, md, k_cache, n: int) -> None:
        """Build the super summary of every group this step completed (after its K write), into
        the slot of the group's last block. Pure decode steps (graph-safe, one token a row):
        the group each row's token completed. Other steps (eager): the builder's list of every
        group completed by the step's tokens (a prefill chunk completes several)."""
        tl = ops().two_level
        supers = self.side.supers()
        if md.super_jobs is None:
            tl.super_update(k_cache, md.block_table[:n], md.seq_lens[:n], md.super_table[:n], supers)
        elif md.super_jobs[1].numel():
            tl.super_build(k_cache, md.super_jobs[0], md.super_jobs[1], supers)

    def _decode(self, md, query, k_cache, v_cache, summaries, output, n: int, dense: bool):
        """The LOCKS step over the decode rows [0, n): tokens [0, n), one row each (the
        builder's block table and seq_lens rows; a request's rows under speculative decoding
        share its table, each with its own causal length)."""
        b = md.bufs
        self.plan_for(b, k_cache.shape[0], k_cache.dtype, k_cache.device)
        # vLLM's query (a strided view of the QKV projection, model dtype) and output buffer go
        # to the kernels as they are: they read and write the model dtype (no copies).
        q = query[:n].reshape(n, self.num_heads, self.head_size)  # a view where the layout allows
        out = output.view(-1, self.num_heads, self.head_size)[:n]
        w = self.wrapper_for(n)
        T = md.request_tokens
        if T and self.req_wrappers and not dense and n % T == 0:
            return self._decode_by_request(md, q, k_cache, v_cache, summaries, out, output, n, T)
        if self.geom.group_pages and not dense:
            w.run_two_level(q, k_cache, v_cache, summaries, self.side.supers(), md.super_table[:n],
                            md.block_table[:n], md.seq_lens[:n], out=out, lse=b.lse[:n],
                            pages=b.pages[:n], counts=b.counts[:n])
            return output
        w.run(q, k_cache, v_cache, summaries, md.block_table[:n], md.seq_lens[:n], out=out,
              lse=b.lse[:n], pages=b.pages[:n], counts=b.counts[:n], dense=dense)
        return output

    def _decode_by_request(self, md, q, k_cache, v_cache, summaries, out, output, n: int, T: int):
        """spec_selection "request" on a uniform verification batch (rows [0, n) = n / T
        requests x T tokens): one selection a request from all its tokens' queries (the T
        tokens as G T heads of the request's row, share-averaged as a GQA group is), handed to
        its T token rows by request_rows (include/locks/request_rows.h: a row whose own last
        page precedes the request's, its tokens straddling a page end, drops the request's last
        page and attends its own instead); then each token attends over its row's pages up to
        its own length. The request row's length is its last token's, less one where that
        completes a page (builder: so that the page, partial for the request's other rows, is
        the list's tail). Graph-safe: device ops only, into the persistent buffers."""
        b = md.bufs
        S, H, d = n // T, self.num_kv_heads, self.head_size
        G = self.num_heads // H
        # [S, T, H, G, d] -> [S, H, G, T, d]: request-row head i serves KV head i // (G T).
        qr = q.view(S, T, H, G, d).permute(0, 2, 3, 1, 4).reshape(S, H * G * T, d)
        wr = next(w for mb, w in self.req_wrappers if mb >= S)
        pr, cr = wr.select(qr, summaries, b.req_block_table[:S], b.req_seq_lens[:S],
                           pages=b.req_pages[:S], counts=b.req_counts[:S])
        # each token row: the request's pages up to its own last page, and that page (one op)
        pages, counts = wr.request_rows(pr, cr, b.req_seq_lens[:S], md.seq_lens[:n], T,
                                        pages=b.pages[:n], counts=b.counts[:n])
        self.wrapper_for(n).attend(q, k_cache, v_cache, md.block_table[:n], md.seq_lens[:n], pages=pages,
                                   counts=counts, out=out, lse=b.lse[:n])
        return output

    def _prefill(self, layer, query, k_cache, v_cache, fa: FlashAttentionMetadata, output,
                 first: int = 0, num_reqs: int | None = None, first_token: int | None = None):
        """FlashAttention over requests [first, num_reqs) (all of them by default): with first > 0
        the decode requests before them went through the LOCKS step, and FlashAttention gets the
        requests after them, whose tokens start at `first_token` (first: one token a decode)."""
        n = fa.num_actual_tokens
        ft = first if first_token is None else first_token
        if fa.max_query_len > 1 and skip_prefill():  # benchmark-only mode, bench_backends.py
            output[ft:n].zero_()
            return output
        fn = flash_attn_varlen_func
        if fn is None:
            raise RuntimeError("LOCKS backend: vLLM's FlashAttention is not available for prefill")
        qsl, seq_lens, block_table, sched = (fa.query_start_loc, fa.seq_lens, fa.block_table,
                                             fa.scheduler_metadata)
        if first > 0:  # the requests after the decodes; FlashAttention's precomputed schedule
            # was made for the whole batch, so it plans this call itself
            qsl = qsl[first:num_reqs + 1] - ft
            seq_lens, block_table, sched = seq_lens[first:num_reqs], block_table[first:num_reqs], None
        descale_shape = (qsl.shape[0] - 1, self.num_kv_heads)
        fn(q=query[ft:n], k=k_cache, v=v_cache,
           out=output.view(-1, self.num_heads, self.head_size)[ft:n],
           cu_seqlens_q=qsl, max_seqlen_q=fa.max_query_len, seqused_k=seq_lens,
           max_seqlen_k=fa.max_seq_len, softmax_scale=self.scale, causal=True,
           window_size=None, block_table=block_table, softcap=0.0,
           scheduler_metadata=sched, fa_version=self.vllm_flash_attn_version,
           q_descale=None, k_descale=layer._k_scale.expand(descale_shape),
           v_descale=layer._v_scale.expand(descale_shape), num_splits=fa.max_num_splits)
        return output

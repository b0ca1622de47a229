"""Per-step metadata of the LOCKS backend: FlashAttention's own (prefill / mixed batches) plus
the decode path's persistent buffers, written outside any CUDA graph every step."""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch

from vllm.v1.attention.backend import AttentionCGSupport
from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadata, FlashAttentionMetadataBuilder
from vllm.v1.attention.backends.utils import split_decodes_and_prefills

from .engine_config import BLOCK_SIZE, settings_from
from .settings import length_bucket_plan, two_level_plan
from .library import ops


@dataclasses.dataclass
class LocksMetadata:
    fa: FlashAttentionMetadata            # FlashAttention's metadata (prefill / mixed batches)
    pure_decode: bool                     # every request is a decode (query length 1, or up to
                                          # 1 + the speculative tokens): the LOCKS path
    num_decodes: int                      # leading decode requests (decodes first)
    mixed_decodes: bool                   # a mixed batch whose decode rows take the LOCKS path (the
                                          # rest FlashAttention): some sequence reaches min_context
    dense: bool                           # LOCKS dense kernel for the whole batch (eager only: every
                                          # sequence below min_context; in graphs the plan's
                                          # dense_below keeps each short sequence exact)
    num_reqs: int
    slot_mapping: torch.Tensor            # int32 persistent [max_tokens]; -1 past this step's tokens
    # The decode rows, one per decode token (token_rows below): persistent int32 copies.
    block_table: torch.Tensor             # [max_batch, max_blocks]: the row's request's table
    seq_lens: torch.Tensor                # [max_batch]: the row's context (its token included);
                                          # 1 in padded rows
    bufs: "DecodeBuffers"
    # Two-level LOCKS (group_pages > 0), else None. super_table: int32 persistent [max_batch,
    # max_groups], group j's slot = its last block, block_table[:, j * S + S - 1].
    # super_jobs: on steps that are not pure decode, the groups the step's tokens completed
    # (group_blocks [n, S], slots [n]; on CUDA slot -1 marks a candidate that completed
    # nothing, which the build skips; on the CPU those are dropped); None on pure decode steps
    # (the impl's super_update finds the group each row's one token completed, graph-safe).
    super_table: torch.Tensor | None = None
    super_jobs: tuple[torch.Tensor, torch.Tensor] | None = None
    # The layers whose cache write this step already rebuilt their summaries (the impl's fused
    # decode write, impl.do_kv_cache_update): their forward skips summary_update. Host-side
    # bookkeeping of one step (a captured graph holds whichever launches capture made).
    fused_writes: set = dataclasses.field(default_factory=set)
    # Decode tokens of this step (the rows of the LOCKS step): num_decodes unless speculative
    # decoding gives decode requests several query tokens.
    num_decode_tokens: int = 0
    # spec_selection "request" on a uniform verification batch (every decode request 1 + k
    # tokens, padding requests none): the request-level rows (bufs.req_*) of its num_decodes
    # requests are written, and the impl selects once a request (request_tokens = 1 + k).
    request_tokens: int = 0


def batch_buckets(max_batch: int) -> list[int]:
    """The batch sizes each layer plans for: the powers of two below max_batch, and max_batch.
    A step of n sequences runs the plan of the smallest bucket >= n (vLLM pads a graph's batch
    to its capture size, so each captured graph keeps one plan). Plans made for the largest
    batch choose the kernels of large grids (e.g. the two-stage selection instead of the
    one-launch cluster kernel of batch 1); the results are the same bits either way."""
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    return out + [max_batch]


class DecodeBuffers:
    """Persistent buffers shared by every layer of the group (layers run one after another):
    lse, selection and the workspace of the layers' DecodeWrappers. The kernels read vLLM's
    query (model dtype, a strided view of the QKV output) and write its output buffer
    directly: no staging copies. max_batch counts decode rows: one per decode token (a
    request's 1 + k tokens under speculative decoding are k + 1 rows, token_rows)."""

    def __init__(self, *, max_batch, num_q_heads, num_kv_heads, head_dim, max_blocks, max_tokens,
                 capacity, workspace_bytes, device, group_pages=0, max_requests=0, request_tokens=0):
        f32, i32 = torch.float32, torch.int32
        self.max_batch = max_batch
        self.lse = torch.zeros(max_batch, num_q_heads, dtype=f32, device=device)
        self.pages = torch.zeros(max_batch, num_kv_heads, max(capacity, 1), dtype=i32, device=device)
        self.counts = torch.zeros(max_batch, num_kv_heads, dtype=i32, device=device)
        self.slot_mapping = torch.full((max_tokens,), -1, dtype=i32, device=device)
        self.block_table = torch.zeros(max_batch, max_blocks, dtype=i32, device=device)
        self.seq_lens = torch.ones(max_batch, dtype=i32, device=device)
        self.workspace = torch.zeros(max(workspace_bytes, 1), dtype=torch.uint8, device=device)
        # ceil(max_blocks / S) columns: the plan's max_groups (the last group may be partial).
        self.super_table = (torch.zeros(max_batch, max(-(-max_blocks // group_pages), 1), dtype=i32,
                                        device=device) if group_pages else None)
        # spec_selection "request": one row a verification request (its table and full length)
        # and its selection, before the selection is copied to the request's token rows.
        self.max_requests, self.request_tokens = max_requests, request_tokens
        if max_requests:
            self.req_block_table = torch.zeros(max_requests, max_blocks, dtype=i32, device=device)
            self.req_seq_lens = torch.ones(max_requests, dtype=i32, device=device)
            self.req_pages = torch.zeros(max_requests, num_kv_heads, max(capacity, 1), dtype=i32, device=device)
            self.req_counts = torch.zeros(max_requests, num_kv_heads, dtype=i32, device=device)


def completed_groups(query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor,
                     group_pages: int, page_size: int, max_query_len: int, drop: bool | None = None):
    """The groups of S pages each request's tokens of this step completed, on the device and
    without a host sync: (group_blocks [n, S] int32, slots [n] int32), slot = the group's last
    block. A request whose q tokens end at length L completes the groups j with
    (L - q) // (S P) <= j < L // (S P): at most q // (S P) + 1 of them, so every request gets
    that many candidates (max_query_len's count) and the ones past its range get slot -1 (the
    CUDA build skips them; on the CPU, where a mask costs no sync, they are dropped; `drop`
    overrides that choice)."""
    S, GT = group_pages, group_pages * page_size
    n = seq_lens.shape[0]
    K = max_query_len // GT + 1
    dev = seq_lens.device
    seq = seq_lens.to(torch.int64)
    q = (query_start_loc[1: n + 1] - query_start_loc[:n]).to(torch.int64)
    first = (seq - q).clamp(min=0) // GT
    cand = first[:, None] + torch.arange(K, device=dev)[None, :]              # [n, K]
    valid = cand < (seq // GT)[:, None]
    cols = cand[:, :, None] * S + torch.arange(S, device=dev)[None, None, :]  # [n, K, S]
    cols = cols.clamp(max=block_table.shape[1] - 1)  # candidates past the range: any column
    blocks = block_table.gather(1, cols.view(n, K * S)).view(n * K, S).to(torch.int32)
    slots = torch.where(valid.view(-1), blocks[:, S - 1], torch.full_like(blocks[:, S - 1], -1))
    if dev.type == "cpu" if drop is None else drop:
        keep = valid.view(-1)
        return blocks[keep].contiguous(), slots[keep].contiguous()
    return blocks, slots


def token_rows(query_start_loc: torch.Tensor, seq_lens: torch.Tensor, num_tokens: int):
    """The decode rows of a step whose decode requests have several query tokens (speculative
    decoding: the last token plus k drafts): row t is token t, attending causally, so its
    context ends at its own position. Returns (request [num_tokens] int64, row_len
    [num_tokens] int32): the request a token belongs to and its context length, seq_len minus
    the request's tokens after it. On the device, no host sync (query_start_loc is
    non-decreasing; padding requests of query length 0 own no token)."""
    dev = seq_lens.device
    n_req = seq_lens.shape[0]
    t = torch.arange(num_tokens, device=dev, dtype=query_start_loc.dtype)
    req = torch.searchsorted(query_start_loc[1: n_req + 1].contiguous(), t, right=True)
    req = req.clamp(max=max(n_req - 1, 0))
    after = query_start_loc[req + 1] - 1 - t          # the request's tokens after this one
    return req, (seq_lens[req] - after).to(torch.int32)


class LocksMetadataBuilder(FlashAttentionMetadataBuilder):
    # Full graphs for pure decode batches of one query length (1, or 1 + k speculative tokens:
    # UNIFORM_BATCH); prefill and mixed batches run FlashAttention piecewise/eager (the Python
    # choice between the two paths is frozen at capture, so a graph may only ever see one).
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH
    supports_update_block_table: bool = False

    @classmethod
    def get_cudagraph_support(cls, vllm_config, kv_cache_spec) -> AttentionCGSupport:
        return cls._cudagraph_support

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        # Decodes first; with speculative decoding a decode is a request of up to 1 + k query
        # tokens (vLLM sets the threshold from the speculative config), each token a row of
        # the LOCKS step.
        self._init_reorder_batch_threshold(1, supports_spec_as_decode=True)
        self.decode_threshold = int(self.reorder_batch_threshold or 1)
        self.settings = settings_from(vllm_config)
        cg = vllm_config.compilation_config.cudagraph_mode
        self.full_graphs = bool(cg is not None and cg.has_full_cudagraphs())
        sc = vllm_config.scheduler_config
        self.max_batch = max(sc.max_num_seqs * self.decode_threshold, self.max_cudagraph_size or 0)
        self.max_tokens = max(sc.max_num_batched_tokens, self.max_batch)
        self.max_blocks = -(-vllm_config.model_config.max_model_len // BLOCK_SIZE)
        # spec_selection "request" (settings.py): request-level rows for uniform verification
        # batches, where the impl can serve them (flat LOCKS, 1 + k <= the block size; the
        # impl falls back to token rows where its kernels do not take G (1 + k) heads).
        T = self.decode_threshold
        self.request_tokens = (T if self.settings.spec_selection == "request" and 1 < T <= BLOCK_SIZE
                               and not self.settings.group_pages else 0)
        self.max_requests = -(-self.max_batch // T) if self.request_tokens else 0
        self.bufs: DecodeBuffers | None = None

    def _buffers(self) -> DecodeBuffers:
        if self.bufs is None:
            s = self.settings
            o = ops()
            cap = (o.ops.select_capacity(s.budget, BLOCK_SIZE, self.max_blocks, s.sink_pages,
                                         s.recent_pages, s.effective_min_context)
                   if hasattr(o, "ops") else o.select_capacity(s.budget, BLOCK_SIZE, self.max_blocks,
                                                               s.effective_min_context))
            ws = 0
            if hasattr(o, "workspace_bytes"):  # one workspace that every bucket's plan fits
                plans = [(self.num_heads_q, mb) for mb in batch_buckets(self.max_batch)]
                plans += [(self.num_heads_q * self.request_tokens, mb)  # request-level selection
                          for mb in (batch_buckets(self.max_requests) if self.max_requests else [])]
                ws = max(o.workspace_bytes(
                    num_q_heads=hq, num_kv_heads=self.num_heads_kv, head_dim=self.headdim,
                    page_size=BLOCK_SIZE, rank=s.rank, precision=s.precision, kv_dtype=self.kv_cache_dtype,
                    num_blocks=self._num_blocks(), max_batch=mb,
                    max_blocks_per_seq=self.max_blocks, budget_tokens=s.budget, sink_pages=s.sink_pages,
                    recent_pages=s.recent_pages, dense_below=s.effective_min_context,
                    device=self.device, **two_level_plan(s, self._num_blocks()),
                    **length_bucket_plan(s))
                    for hq, mb in plans)
            self.bufs = DecodeBuffers(max_batch=self.max_batch, num_q_heads=self.num_heads_q,
                                      num_kv_heads=self.num_heads_kv, head_dim=self.headdim,
                                      max_blocks=self.max_blocks, max_tokens=self.max_tokens,
                                      capacity=cap, workspace_bytes=ws, device=self.device,
                                      group_pages=s.group_pages, max_requests=self.max_requests,
                                      request_tokens=self.request_tokens)
            # Plan every layer's wrapper here, outside any graph capture (plan is host work
            # that may query the device; run() inside the graph then only launches kernels).
            sfc = self.vllm_config.compilation_config.static_forward_context
            for name in self.layer_names:
                impl = getattr(sfc.get(name), "impl", None)
                if hasattr(impl, "plan_for"):  # a LocksAttentionImpl
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
        num_decodes, num_prefills, nd_tok, _ = split_decodes_and_prefills(
            cm, decode_threshold=self.decode_threshold)
        pure = num_prefills == 0
        # Persistent int32 copies, written outside any graph. Rows/slots past this step: padding
        # (-1 slots rebuild nothing; padded rows read one valid token and are discarded).
        sm = cm.slot_mapping[:n_tok]
        b.slot_mapping[: sm.shape[0]].copy_(sm, non_blocking=True)
        b.slot_mapping[sm.shape[0]:].fill_(-1)
        bt = cm.block_table_tensor[:n_reqs]
        w = min(bt.shape[1], b.block_table.shape[1])
        # One row per decode token. With one token a request (no speculative decoding, or no
        # drafts this step) the rows are the requests; otherwise token_rows maps each token to
        # its request's table and its own causal length.
        multi = cm.max_query_len > 1 and nd_tok > num_decodes
        rows = nd_tok if multi else n_reqs
        req = None
        if multi and rows <= b.max_batch:
            req, row_len = token_rows(cm.query_start_loc[: num_decodes + 1], cm.seq_lens[:num_decodes], rows)
            b.block_table[:rows, :w].copy_(bt[req, :w], non_blocking=True)
            torch.clamp(row_len, min=1, out=b.seq_lens[:rows])
        elif not multi:
            b.block_table[:n_reqs, :w].copy_(bt[:, :w], non_blocking=True)
            # Graph padding rows may carry seq_len 0: clamp to 1 (one valid token, output discarded).
            torch.clamp(cm.seq_lens[:n_reqs], min=1, out=b.seq_lens[:n_reqs])
        b.seq_lens[min(rows, b.max_batch):].fill_(1)
        # Every sequence below the minimum context (eager only: a graph cannot switch paths; there
        # and in mixed batches the plan's dense_below keeps each short sequence exact).
        dense = (not self.full_graphs) and cm.max_seq_len < self.settings.effective_min_context
        # A mixed batch (decodes first, then prefills / extends; attention runs outside graphs
        # there): its decode rows take the LOCKS path too, unless no sequence of the batch reaches
        # min_context (then the whole batch stays on FlashAttention, as short decodes are
        # cheaper there; a decode row shorter than min_context is exact through dense_below).
        mixed = (not pure and 0 < nd_tok <= b.max_batch
                 and cm.max_seq_len >= self.settings.effective_min_context)
        # Request-level rows for a shared selection: a uniform verification batch (every decode
        # request 1 + k tokens, graph padding requests none; decided on the host copy of
        # query_start_loc, no sync).
        req_tokens = 0
        if self.request_tokens and pure and multi and num_decodes <= b.max_requests:
            qsl = cm.query_start_loc_cpu[: num_decodes + 1]
            ql = qsl[1:] - qsl[:-1]
            T = self.request_tokens
            if bool(((ql == T) | (ql == 0)).all()) and bool((ql[:-1] >= ql[1:]).all()):
                # every request T tokens or none, the real ones first, then the padding
                req_tokens = T
                b.req_block_table[:num_decodes, :w].copy_(bt[:num_decodes, :w], non_blocking=True)
                r = b.req_seq_lens[:num_decodes]
                torch.clamp(cm.seq_lens[:num_decodes], min=1, out=r)
                # The request selects at its last token's length, less one where that token
                # completes a page: the page is partial for the request's other rows, so it
                # must be in every row's list, as the selection's tail always is (at the full
                # length it would only be a scored page, possibly left out).
                r.sub_((r % BLOCK_SIZE == 0).to(r.dtype))
                b.req_seq_lens[num_decodes:].fill_(1)
        jobs = None
        if b.super_table is not None:
            S = self.settings.group_pages
            g = min(w // S, b.super_table.shape[1])
            st = bt[:, S - 1: g * S: S]
            if req is not None:  # token rows (written above)
                b.super_table[:rows, :g].copy_(st[req], non_blocking=True)
            elif not multi:
                b.super_table[:n_reqs, :g].copy_(st, non_blocking=True)
            if not pure:
                jobs = completed_groups(cm.query_start_loc[: n_reqs + 1], cm.seq_lens[:n_reqs], bt,
                                        S, BLOCK_SIZE, cm.max_query_len)
        return LocksMetadata(fa=fa, pure_decode=pure, num_decodes=num_decodes, mixed_decodes=mixed,
                             dense=dense, num_reqs=n_reqs, slot_mapping=b.slot_mapping,
                             block_table=b.block_table, seq_lens=b.seq_lens, bufs=b,
                             super_table=b.super_table, super_jobs=jobs,
                             num_decode_tokens=nd_tok if multi else num_decodes, request_tokens=req_tokens)

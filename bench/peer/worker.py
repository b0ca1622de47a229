"""The process that times FA3 (one per invocation, restarted after a row that hangs or dies).

Protocol (the parent, run.py, enforces the time limits; a hung CUDA call cannot be interrupted
from inside the process): stdin carries one JSON object {"rows": [...], "opts": {...}}; stdout
carries lines 'PEER-READY {json}', then per row 'PEER-START {index}' and 'PEER-ROW {json}'.
Anything else on stdout/stderr (warnings) is passed through to the log.

Timing is the C++ bench's: each call captured once in a CUDA graph, replayed after an L2 flush
(a 256 MiB memset), median of reps_for(bytes) replays after 2 warm-ups, CUDA events around the
replay only. Before every replay, outside the timed span, the scheduler metadata is recomputed
into the persistent buffer, as vLLM's metadata builder does once per step: FA3's persistent
scheduler counts tiles on a semaphore in that buffer, which only the metadata call resets.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from . import fa3_call, grid


# Output check of every timed graph: bf16 output against an fp32 reference, relative to the
# largest reference value (bf16 keeps 8 bits; FA3 rounds P to bf16 before P V).
CHECK_ABS, CHECK_REL = 1e-3, 2e-2


def emit(tag: str, payload: Any) -> None:
    sys.stdout.write(f"{tag} {json.dumps(payload)}\n")
    sys.stdout.flush()


# -- fake backend: the parent's plumbing (timeouts, restarts, joins) tested without a GPU ------
def _fake_row(row: grid.Row, opts: dict) -> dict:
    hang = os.environ.get("LOCKS_PEER_FAKE_HANG", "")
    crash = os.environ.get("LOCKS_PEER_FAKE_CRASH", "")
    if hang and row.label() == hang:
        time.sleep(3600)
    if crash and row.label() == crash:
        os._exit(3)
    s = grid.sizes(row)
    fits = s.kv_bytes <= 100e9  # a pretend 100 GB device
    if not fits:
        return {"status": "skipped", "reason": f"needs {s.kv_bytes / 2**30:.1f} GiB (fake)"}
    ms = s.kv_bytes / 4.0e12 * 1e3
    return {"status": "ok", "reps": 3, "fa3_free_ms": ms * 1.05, "fa3_cap32_ms": ms * 1.10,
            "fa3_free_err": 0.0, "fa3_cap32_err": 0.0, "fa3_free_ok": True, "fa3_cap32_ok": True}


# -- the real backend ---------------------------------------------------------------------------
class Fa3Timer:
    def __init__(self, opts: dict):
        import torch
        from vllm.vllm_flash_attn import flash_attn_varlen_func, get_scheduler_metadata

        try:  # forward's fix of size-1 strides (TMA wants 16-byte aligned strides)
            from vllm.utils.torch_utils import canonicalize_singleton_dim_strides as canon
        except ImportError:
            canon = None
        self.torch, self.fa, self.meta_fn, self.canon = torch, flash_attn_varlen_func, \
            get_scheduler_metadata, canon
        self.opts = opts
        self.dev = torch.device("cuda")
        self.flush = torch.empty(grid.FLUSH_BYTES, dtype=torch.uint8, device=self.dev)
        self.stream = torch.cuda.Stream()

    def info(self) -> dict:
        import vllm

        t = self.torch
        p = t.cuda.get_device_properties(0)
        free, total = t.cuda.mem_get_info()
        return {"device": p.name, "sms": p.multi_processor_count, "memory_GiB": total / 2**30,
                "free_GiB": free / 2**30, "torch": t.__version__, "cuda": t.version.cuda,
                "vllm": vllm.__version__, "canonicalize_strides": self.canon is not None}

    def median_ms(self, replay, refresh, reps: int) -> float:
        t = self.torch
        a, b = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
        v = []
        for i in range(reps + 2):
            refresh()
            self.flush.zero_()
            a.record()
            replay()
            b.record()
            b.synchronize()
            if i >= 2:
                v.append(a.elapsed_time(b))
        v.sort()
        return v[len(v) // 2]

    def reference(self, q, k, v, bt, ctx: int, scale: float, seq: int, hkv_i: int, g: int):
        """fp32 softmax(q K^T) V for one sequence and one KV head's query group, streamed
        over the sequence's pages in chunks (the cache may fill the device)."""
        t = self.torch
        qg = q[seq, hkv_i * g:(hkv_i + 1) * g].float()  # [g, d]
        m = t.full((g, 1), -float("inf"), device=self.dev)
        l = t.zeros((g, 1), device=self.dev)
        acc = t.zeros((g, q.shape[-1]), device=self.dev)
        pages = ctx // grid.PAGE
        for p0 in range(0, pages, 8192):
            ids = bt[seq, p0:min(pages, p0 + 8192)].long()
            kc = k[ids, :, hkv_i, :].reshape(-1, k.shape[-1]).float()
            vc = v[ids, :, hkv_i, :].reshape(-1, v.shape[-1]).float()
            s = (qg @ kc.t()) * scale
            m_new = t.maximum(m, s.amax(dim=1, keepdim=True))
            p = t.exp(s - m_new)
            c = t.exp(m - m_new)
            l = l * c + p.sum(dim=1, keepdim=True)
            acc = acc * c + p @ vc
            m = m_new
        return acc / l

    def row(self, row: grid.Row) -> dict:
        t = self.torch
        o = self.opts
        s = grid.sizes(row)
        B, ctx = row.batch, row.context
        free, total = t.cuda.mem_get_info()
        why = grid.fit_reason(row, free, total)
        if why:
            return {"status": "skipped", "reason": why}
        mk = fa3_call.packed_cache if o["layout"] == "packed" else fa3_call.split_cache
        raw, k, v = mk(t, s.blocks, s.hkv, s.d, self.dev)
        gen = t.Generator(device=self.dev).manual_seed(1)
        raw.uniform_(-1.5, 1.5, generator=gen)  # the bench's fill range
        if self.canon is not None:
            k, v = self.canon(k), self.canon(v)
        bt = fa3_call.block_table(t, B, s.pages, o["block_table"], 7, self.dev)
        seq_lens = t.full((B,), ctx, dtype=t.int32, device=self.dev)
        cu_q = t.arange(B + 1, dtype=t.int32, device=self.dev)
        q = (t.rand((B, s.hq, s.d), generator=gen, device=self.dev) * 2 - 1).to(t.bfloat16)
        out = t.empty_like(q)
        descale = t.ones((), dtype=t.float32, device=self.dev).expand(B, s.hkv)
        scale = s.d ** -0.5
        meta_buf = t.zeros(fa3_call.metadata_buffer_len(B), dtype=t.int32, device=self.dev)
        reps = grid.reps_for(s.kv_bytes, o["quick"])
        res: dict[str, Any] = {"status": "ok", "reps": reps}
        g = s.hq // s.hkv
        refs = {seq: self.reference(q, k, v, bt, ctx, scale, seq, 0, g)
                for seq in sorted({0, B - 1})}
        for label, splits in fa3_call.SPLIT_SETTINGS:
            skw = fa3_call.scheduler_kwargs(batch=B, context=ctx, hq=s.hq, hkv=s.hkv, d=s.d,
                                            seq_lens=seq_lens, cu_seqlens_q=cu_q,
                                            qkv_dtype=t.bfloat16, num_splits=splits)
            n = self.meta_fn(**skw).shape[0]

            def refresh(skw=skw, n=n):  # the builder's per-step copy into its buffer
                meta_buf[:n] = self.meta_fn(**skw)
                meta_buf[n:] = 0

            kw = fa3_call.varlen_kwargs(q=q, k_cache=k, v_cache=v, out=out, cu_seqlens_q=cu_q,
                                        seq_lens=seq_lens, context=ctx, block_table=bt,
                                        softmax_scale=scale, scheduler_metadata=meta_buf[:n],
                                        descale=descale, num_splits=splits)
            refresh()
            self.stream.wait_stream(t.cuda.current_stream())
            with t.cuda.stream(self.stream):  # warm-up outside capture (lazy init, workspace)
                self.fa(**kw)
            t.cuda.current_stream().wait_stream(self.stream)
            refresh()
            graph = t.cuda.CUDAGraph()
            with t.cuda.graph(graph):
                self.fa(**kw)
            ms = self.median_ms(graph.replay, refresh, reps)
            # One more replay into a NaN-filled output, checked against the fp32 reference: a
            # replay that skipped its work (e.g. a stale scheduler semaphore) shows as NaN here
            # instead of as a fast time.
            out.fill_(float("nan"))
            refresh()
            graph.replay()
            t.cuda.synchronize()
            err = max(float((out[seq, 0:g].float() - ref).abs().max()) for seq, ref in refs.items())
            mag = max(float(ref.abs().max()) for ref in refs.values())
            res[f"fa3_{label}_ms"] = ms
            res[f"fa3_{label}_err"] = err
            res[f"fa3_{label}_ok"] = bool(err <= CHECK_ABS + CHECK_REL * mag)  # NaN fails
            del graph
        res["ref_max_abs"] = mag
        return res  # the row's tensors die with this frame; main() then empties the cache


def main() -> int:
    job = json.loads(sys.stdin.read())
    rows = [grid.Row(*r) for r in job["rows"]]
    opts = job["opts"]
    if opts.get("fake"):
        emit("PEER-READY", {"device": "fake", "fake": True})
        run = lambda r: _fake_row(r, opts)  # noqa: E731
    else:
        try:
            timer = Fa3Timer(opts)
            emit("PEER-READY", timer.info())
        except Exception as e:  # no CUDA, no vLLM, FA3 missing: every row says so
            emit("PEER-FATAL", {"reason": f"{type(e).__name__}: {e}"})
            return 2
        run = timer.row
    for i, r in enumerate(rows):
        emit("PEER-START", i)
        t0 = time.time()
        try:
            res = run(r)
        except Exception as e:  # one row's failure (e.g. FA3 refusing a shape) is that row's
            res = {"status": "error", "reason": f"{type(e).__name__}: {e}"[:400]}
        if not opts.get("fake"):  # after the except block: its traceback held the row's tensors
            timer.torch.cuda.empty_cache()
        res["seconds"] = round(time.time() - t0, 2)
        emit("PEER-ROW", {"index": i, **res})
    return 0

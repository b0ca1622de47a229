"""SmolLM2-135M-Instruct (bf16) on the CUDA operators: a left-padded batch of 4 passkey prompts
(LOCKS retrieves every key FullKV retrieves), and the model's one-token decode step with a
LocksCache captured in one CUDA graph and replayed: logits bit for bit equal to eager."""
import copy

import pytest
import torch

from gpu_util import needs_cuda

pytestmark = [pytest.mark.gpu, needs_cuda]
transformers = pytest.importorskip("transformers")

from locks import hf  # noqa: E402
from locks.model import load_smollm2  # noqa: E402
from locks_lab import evaluate, tasks  # noqa: E402


@pytest.fixture(scope="module")
def smol():
    model, tok = load_smollm2(device="cuda", dtype=torch.bfloat16)
    tok.padding_side = "left"
    return model, tok


def test_batch_of_4_passkeys_retrieved(smol):
    model, tok = smol
    ts = [tasks.passkey(tok, n, depth=0.3 + 0.1 * i, seed=i) for i, n in enumerate((1000, 2000, 3000, 4000))]
    r = evaluate.side_by_side(model, tok, [t.prompt for t in ts], max_new_tokens=16, budget=512)
    full = [t.score(x) for t, x in zip(ts, r.full_text)]
    got = [t.score(x) for t, x in zip(ts, r.locks_text)]
    print("FullKV", full, "LOCKS b=512", got, r.locks_text)
    assert sum(full) >= 3, f"FullKV itself misses passkeys: {r.full_text}"
    assert all(g >= f for f, g in zip(full, got)), f"LOCKS misses a key FullKV finds: {r.locks_text}"


def test_decode_step_in_a_cuda_graph_equals_eager(smol, steps=16):
    model, tok = smol
    hf.register()
    dense_impl = model.config._attn_implementation
    model.set_attn_implementation(hf.ATTN_NAME)
    try:
        kw = hf.cache_kwarg(model)
        prompts = [tasks.passkey(tok, n, seed=i).prompt for i, n in enumerate((1000, 2000, 3000, 4000))]
        enc = tok(prompts, return_tensors="pt", padding=True).to("cuda")
        cache = hf.LocksCache(model.config, hf.LocksConfig(budget=512, reserve_tokens=steps + 64))
        with torch.inference_mode():
            pos0 = (enc.attention_mask.long().cumsum(-1) - 1).clamp(min=0)
            out = model(**enc, position_ids=pos0, use_cache=True, **{kw: cache})
        first = out.logits[:, -1].argmax(-1, keepdim=True)
        eager_c, graph_c, warm_c = copy.deepcopy(cache), copy.deepcopy(cache), copy.deepcopy(cache)

        def fwd(c, ids):
            pos = c.layers[0].seq_lens.long().unsqueeze(1)  # real-token position of the new token
            return model(input_ids=ids, position_ids=pos, use_cache=True, **{kw: c}).logits[:, -1]

        static_ids = first.clone()
        with torch.inference_mode():
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                fwd(warm_c, static_ids)  # warm cuBLAS (plans were made at the prefill)
            torch.cuda.current_stream().wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):  # records graph_c's step; runs nothing yet
                static_logits = fwd(graph_c, static_ids)
            ids_e = first.clone()
            for t in range(steps):
                le = fwd(eager_c, ids_e)
                graph.replay()
                assert torch.equal(le, static_logits), f"step {t}: max |diff| {float((le.float() - static_logits.float()).abs().max())}"
                ids_e = le.argmax(-1, keepdim=True)
                static_ids.copy_(static_logits.argmax(-1, keepdim=True))
    finally:
        model.set_attn_implementation(dense_impl)

"""The HF drop-in beyond Llama: the architectures its docstring names serve exactly when the
budget covers the context (tiny random models, 2 layers, GQA 4/2, head_dim 32), and attention
that is not plain softmax over the cached keys is refused instead of silently changed: logit
soft-capping (Gemma-2), ALiBi and classes that declare SDPA unsupported at enable(), learned
attention sinks (gpt-oss) at the first attention call."""
import pytest
import torch

transformers = pytest.importorskip("transformers")
from locks import hf  # noqa: E402

SMALL = dict(vocab_size=256, hidden_size=128, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, max_position_embeddings=1024, pad_token_id=0)


def tiny(config_cls, model_cls, **extra):
    torch.manual_seed(0)
    return getattr(transformers, model_cls)(getattr(transformers, config_cls)(**dict(SMALL, **extra))).eval()


@pytest.mark.parametrize("config_cls, model_cls, extra", [
    ("Qwen2Config", "Qwen2ForCausalLM", {}),
    ("Qwen3Config", "Qwen3ForCausalLM", {}),
    ("MistralConfig", "MistralForCausalLM", {"sliding_window": None}),
    ("Olmo2Config", "Olmo2ForCausalLM", {}),
    ("GraniteConfig", "GraniteForCausalLM", {"attention_multiplier": 0.05}),
    ("Phi3Config", "Phi3ForCausalLM", {}),
    ("GemmaConfig", "GemmaForCausalLM", {}),
    # hybrid: 3 sliding-window layers (transformers' own) + 1 full-attention layer (LOCKS)
    ("Cohere2Config", "Cohere2ForCausalLM", {"num_hidden_layers": 4}),
    # head dims outside the CUDA kernels' 64 / 128 / 256, served by the CPU path: Phi-2's 80
    # (partial rotary), and 48
    ("PhiConfig", "PhiForCausalLM", {"hidden_size": 320, "head_dim": 80}),
    ("Qwen2Config", "Qwen2ForCausalLM", {"head_dim": 48}),
], ids=["qwen2", "qwen3", "mistral", "olmo2", "granite", "phi3", "gemma", "cohere2", "phi2_d80", "qwen2_d48"])
def test_named_architectures_are_exact_when_the_budget_covers(config_cls, model_cls, extra):
    model = tiny(config_cls, model_cls, **extra)
    ids = torch.randint(1, 256, (1, 300), generator=torch.Generator().manual_seed(1))
    # an explicit mask as well (pad_token_id 0 is kept out of the prompt)
    gen = dict(attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False)
    want = model.generate(ids, **gen)
    try:
        hf.enable(model, budget=1024, precision="fp32")
        assert torch.equal(model.generate(ids, **gen), want)
        hf.enable(model, budget=64, precision="fp32")  # sparse: runs, 4 pages a step
        kw = hf.cache_kwarg(model)
        cache = hf.LocksCache(model.config, model.locks_config)
        assert model.generate(ids, **gen, **{kw: cache}).shape == want.shape
        served = [layer for layer in cache.layers if isinstance(layer, hf.LocksLayer)]
        assert served and all(int(layer.last_counts.max()) == 64 // 16 for layer in served)
    finally:
        hf.disable(model)


def test_linear_attention_layers_are_refused():
    cfg = transformers.Qwen3NextConfig(**dict(SMALL, num_hidden_layers=4))  # 3 linear + 1 full
    with pytest.raises(ValueError, match="linear_attention"):
        hf.check_model_config(cfg)


def test_softcapping_and_alibi_configs_are_refused_at_enable():
    gemma2 = tiny("Gemma2Config", "Gemma2ForCausalLM")
    with pytest.raises(ValueError, match="soft-capping"):
        hf.enable(gemma2, budget=512)
    falcon_cfg = transformers.FalconConfig(vocab_size=256, hidden_size=128, num_hidden_layers=1,
                                           num_attention_heads=4, alibi=True)
    with pytest.raises(ValueError, match="ALiBi"):
        hf.check_model_config(falcon_cfg)
    assert not hasattr(gemma2, "locks_config")  # nothing changed on the model


def test_learned_sinks_are_refused_at_enable_and_at_the_first_attention_call():
    model = tiny("GptOssConfig", "GptOssForCausalLM", num_local_experts=2, num_experts_per_tok=1,
                 sliding_window=32)
    with pytest.raises(ValueError, match="does not support SDPA"):  # the class says so
        hf.enable(model, budget=64)
    # A model that claimed SDPA support but passed its sinks: refused at the call itself.
    model._supports_sdpa = True
    ids = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(2))
    try:
        hf.enable(model, budget=64)  # the config names no sinks: the call carries them
        with pytest.raises(NotImplementedError, match="learned attention sinks"):
            model.generate(ids, max_new_tokens=2, do_sample=False)
    finally:
        hf.disable(model)


def test_unserved_attention_arguments_are_named():
    assert hf.unserved_attention_features({"softcap": None, "sliding_window": None, "dropout": 0.0}) == []
    got = hf.unserved_attention_features({"s_aux": torch.zeros(4), "softcap": 30.0, "position_bias": None})
    assert got == ["softcap (attention-logit soft-capping)", "s_aux (learned attention sinks)"]
    # the sliding-window layers go to transformers' SDPA, which applies position_bias and
    # refuses softcap itself: only the arguments it would ignore are checked there
    assert hf.unserved_attention_features({"softcap": 30.0, "sinks": 1}, hf.SDPA_IGNORES) == [
        "sinks (learned attention sinks)"]

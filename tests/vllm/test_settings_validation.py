import pytest
import torch

from vllm.platforms.interface import DeviceCapability

from locks.vllm.backend import LocksAttentionBackend
from locks.vllm.engine_config import refuse_config
from locks.vllm.settings import LocksSettings, parse_settings

from helpers import fake_config, fake_spec

H200 = DeviceCapability(9, 0)


def validate(**kw):
    args = dict(head_size=128, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=16, use_mla=False,
                has_sink=False, use_sparse=False, use_mm_prefix=False, use_per_head_quant_scales=False,
                device_capability=H200, attn_type="decoder")
    args.update(kw)
    return LocksAttentionBackend.validate_configuration(**args)


def test_settings_defaults_and_sources():
    assert parse_settings({}, environ={}) == LocksSettings()
    s = parse_settings({"locks": {"budget": 512, "rank": 4, "precision": "fp32"}}, environ={})
    assert (s.budget, s.rank, s.precision) == (512, 4, "fp32")
    assert s.effective_min_context == 512
    s = parse_settings({"locks": {"budget": 512}}, environ={"LOCKS_BUDGET": "1024", "LOCKS_MIN_CONTEXT": "4096"})
    assert s.budget == 1024 and s.effective_min_context == 4096  # the environment wins
    assert LocksSettings().fused_write
    for v, want in ((False, False), ("false", False), ("0", False), (1, True), ("True", True)):
        assert parse_settings({"locks": {"fused_write": v}}, environ={}).fused_write is want
    assert not parse_settings({"locks": {"fused_write": True}}, environ={"LOCKS_FUSED_WRITE": "0"}).fused_write
    assert LocksSettings().spec_selection == "token"
    assert parse_settings({"locks": {"spec_selection": "request"}}, environ={}).spec_selection == "request"
    assert parse_settings({}, environ={"LOCKS_SPEC_SELECTION": "request"}).spec_selection == "request"
    assert LocksSettings().length_buckets == 1  # off (docs/vllm.md "Length buckets")
    assert parse_settings({}, environ={"LOCKS_LENGTH_BUCKETS": "4"}).length_buckets == 4


def test_length_bucket_plan_arguments():
    from locks.vllm.settings import BUCKET_MIN_PAGES, length_bucket_plan
    assert length_bucket_plan(LocksSettings(length_buckets=4)) == dict(length_buckets=4,
                                                                       bucket_min_pages=BUCKET_MIN_PAGES)
    assert length_bucket_plan(LocksSettings()) == {}  # off by default
    assert length_bucket_plan(LocksSettings(length_buckets=4, group_pages=32)) == {}  # no two-level buckets


@pytest.mark.parametrize("cfg,msg", [
    ({"budget": 15}, "budget"), ({"rank": 16}, "rank"), ({"rank": 0}, "rank"),
    ({"precision": "int8"}, "precision"), ({"budgett": 1}, "unknown locks setting"),
    ({"budget": "lots"}, "integer"), ({"budget": 32, "sink_pages": 1, "recent_pages": 1}, "budget"),
    ({"sink_pages": -1}, "sink_pages"), ({"budget": True}, "integer"),
    ({"fused_write": "sometimes"}, "fused_write"), ({"fused_write": 2}, "fused_write"),
    ({"spec_selection": "shared"}, "spec_selection"), ({"spec_selection": 1}, "spec_selection"),
    ({"length_buckets": 0}, "length_buckets"), ({"length_buckets": 9}, "length_buckets"),
])
def test_settings_refused_with_the_setting_named(cfg, msg):
    with pytest.raises(ValueError, match=msg):
        parse_settings({"locks": cfg}, environ={})


def test_validate_accepts_a_plain_decoder():
    assert validate() == []
    assert validate(dtype=torch.float16, kv_cache_dtype="float16") == []
    assert validate(kv_cache_dtype="bfloat16") == []


@pytest.mark.parametrize("kw,msg", [
    ({"has_sliding_window": True}, "sliding-window"),
    ({"has_sink": True}, "attention-sink"),
    ({"kv_cache_dtype": "fp8"}, "--kv-cache-dtype fp8"),
    ({"kv_cache_dtype": "float16"}, "--kv-cache-dtype float16"),   # bf16 model, fp16 cache
    ({"use_kv_connector": True}, "KV connectors"),
    ({"block_size": 32}, "--block-size 32"),
    ({"head_size": 80}, "head size 80"),
    ({"use_mla": True}, "MLA"),
    ({"dtype": torch.float32}, "model dtype"),
    ({"attn_type": "encoder_only"}, "attention type"),
    ({"device_capability": DeviceCapability(7, 5)}, "compute capability"),
])
def test_validate_refusals_name_the_setting(kw, msg):
    r = validate(**kw)
    assert len(r) == 1 and msg in r[0], r


@pytest.mark.parametrize("head_size", [48, 64, 80, 96, 128, 256, 512])
def test_head_sizes_follow_the_capability_query(head_size):
    # One table (the kernels', include/locks/cuda/limits.h through locks.supports): the
    # backend's early answers must not drift from what the layer's constructor checks.
    from locks.vllm.library import ops
    ok, why = ops().supports("cuda", head_dim=head_size, page_size=16)
    assert LocksAttentionBackend.supports_head_size(head_size) == ok
    r = validate(head_size=head_size)
    assert r == [] if ok else (len(r) == 1 and f"head size {head_size}" in r[0] and why in r[0]), r
    assert ok == (head_size in (64, 128, 256))


def test_engine_level_refusals():
    assert refuse_config(fake_config()) == []
    assert "--kv-transfer-config" in refuse_config(fake_config(kv_transfer_config=object()))[0]
    assert "--kv-offloading-size" in refuse_config(fake_config(kv_offloading_size=4.0))[0]
    assert "--block-size 32" in refuse_config(fake_config(block_size=32))[0]


@pytest.mark.parametrize("method", ["ngram", "ngram_gpu", "suffix", "medusa", "mlp_speculator"])
def test_speculative_decoding_without_draft_attention_is_served(method):
    assert refuse_config(fake_config(speculative_config=fake_spec(method=method))) == []


@pytest.mark.parametrize("method", ["eagle", "eagle3", "draft_model", "deepseek_mtp", "custom_class", None])
def test_speculative_decoding_with_a_draft_model_is_refused_by_name(method):
    why = refuse_config(fake_config(speculative_config=fake_spec(method=method)))
    assert len(why) == 1 and repr(method) in why[0] and "ngram_gpu" in why[0], why


def test_validate_accepts_both_model_runners(monkeypatch):
    # The V1 runner's KV cache has a strided K half (K/V interleaved per block); the kernels
    # read it with a block stride (docs/vllm.md), so neither runner is refused.
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    assert validate() == []
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    assert validate() == []
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER")
    assert validate() == []

"""`python -m locks_lab demo` (the second half of scripts/demo.sh): the byte model it prints,
and a short run of the whole demo on the embedded model."""
import types

import pytest

from locks_lab import demo


def test_bytes_per_step_counts_summaries_and_selected_pages():
    cfg = types.SimpleNamespace(num_hidden_layers=30, num_key_value_heads=3, head_dim=64,
                                hidden_size=576, num_attention_heads=9)
    s = demo.summary_bytes_per_page(64, 16, 8, "int4")
    # int8 centroid (64) + its scale (4) + int4 basis (8 x 32) + scales (8 x 4) + int8 coeff (16 x 8) + scales (8 x 4)
    assert s == 64 + 4 + 256 + 32 + 128 + 32
    dense, lk = demo.bytes_per_step(cfg, 4000, 512)
    assert dense == 30 * 3 * 4000 * 2 * 64 * 2
    assert lk == 30 * 3 * (250 * s + 512 * 2 * 64 * 2)
    assert demo.bytes_per_step(cfg, 300, 512)[1] == 30 * 3 * (19 * s + 300 * 256)  # budget > context
    assert demo.bytes_per_step(cfg, 4000, None) == (dense, dense)


def test_demo_runs_end_to_end():
    pytest.importorskip("transformers")
    lines = []
    r = demo.run(tokens=700, budget=256, new_tokens=6, forced_steps=8, out=lines.append)
    assert [t["task"] for t in r["tasks"]] == ["passkey", "manpage_qa"]
    assert any(l.startswith("[4/4]") for l in lines) and lines[-1].startswith("done in")
    for t in r["tasks"]:
        assert t["bytes_full"] > t["bytes_locks"] > 0 and t["prompt_tokens"] <= 700
    assert r["tasks"][0]["full_score"] == 1.0  # FullKV finds a passkey in 700 tokens
    assert 0 <= r["teacher_forced"]["top1_agreement"] <= 1 and r["teacher_forced"]["steps"] == 8

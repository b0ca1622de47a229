"""The task suite (locks_lab/suite.py) on the embedded model, a small fixed subset for CI:
passkey and multi-key needles at 800 tokens, LOCKS and the oracle at budget 128, with
thresholds from measurement (2026-12-02, this CPU: FullKV, LOCKS and the oracle all 1.00
on both tasks at 1,500 tokens, budgets 128 and 512; Quest 0.00 on mk_needle at 128)."""
import pytest

from locks_lab import suite


def test_table_means_per_task_method_budget():
    rows = [dict(task="t", length=10, method="fullkv", budget=None, score=1.0),
            dict(task="t", length=10, method="locks", budget=64, score=1.0),
            dict(task="t", length=10, method="locks", budget=64, score=0.0)]
    t = suite.table(rows)
    assert "| t | 10 | 1.00 | 0.50 |" in t and "locks b=64" in t


@pytest.fixture(scope="module")
def model_tok():
    pytest.importorskip("transformers")
    from locks.model import load_smollm2

    return load_smollm2()


def test_small_suite_locks_and_oracle_answer_like_fullkv(model_tok):
    model, tok = model_tok
    rows = suite.run(model, tok, lengths=[800], budgets=[128], selectors=["locks", "oracle"],
                     task_names=["passkey", "mk_needle"], seeds=1, progress=lambda s: None)
    assert len(rows) == 2 * 3
    by = {(r["task"], r["method"]): r["score"] for r in rows}
    for task in ("passkey", "mk_needle"):
        assert by[(task, "fullkv")] == 1.0, rows
        assert by[(task, "locks")] == 1.0 and by[(task, "oracle")] == 1.0, rows


def test_plot_draws_a_png_with_gnuplot(tmp_path):
    import shutil

    if shutil.which("gnuplot") is None:
        pytest.skip("gnuplot not installed")
    rows = [dict(task="t", length=10, method="fullkv", budget=None, score=1.0)]
    rows += [dict(task="t", length=10, method=m, budget=b, score=s)
             for m, s in (("locks", 1.0), ("quest", 0.5)) for b in (64, 256)]
    png = tmp_path / "accuracy.png"
    assert suite.plot(rows, str(png)) and png.read_bytes()[:4] == b"\x89PNG"
    budgets, ys, full = suite.curves(rows)
    assert budgets == [64, 256] and ys == {"locks": [1.0, 1.0], "quest": [0.5, 0.5]} and full == 1.0

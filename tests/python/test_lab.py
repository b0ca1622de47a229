"""The lab package `locks_lab` (studies, tasks, capture, the generate/capture CLI) is apart from
the library `locks`: the library never imports it, and the lab's CLI still runs."""
import subprocess
import sys

import pytest


def test_library_does_not_import_the_lab():
    # One interpreter (importing torch costs seconds): the library alone loads no locks_lab
    # module, and the lab's modules are not importable as locks.<name>.
    code = """
import importlib, sys
import locks, locks.ops
print(any(m.startswith("locks_lab") for m in sys.modules))
for name in ("study", "tasks", "capture", "corpus", "evaluate", "cli"):
    try:
        importlib.import_module("locks." + name)
        print("importable", name)
    except ImportError:
        pass
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.split() == ["False"], f"lab modules loaded or living in locks: {r.stdout}"


def test_lab_cli_help_lists_its_jobs():
    r = subprocess.run([sys.executable, "-m", "locks_lab", "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    assert "generate" in r.stdout and "capture" in r.stdout


def test_lab_cli_generate_runs_on_the_default_model(capsys):
    pytest.importorskip("transformers")
    from locks_lab import cli

    rc = cli.main(["generate", "--task", "passkey", "--tokens", "300", "--budget", "64",
                   "--max-new-tokens", "2"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "LOCKS b=64" in out and "generated-token agreement" in out


def test_lab_cli_bad_budget_is_exit_2(capsys):
    pytest.importorskip("transformers")
    from locks_lab import cli

    rc = cli.main(["generate", "--tokens", "300", "--budget", "8", "--max-new-tokens", "1"])
    assert rc == 2
    assert "budget" in capsys.readouterr().err


def _results(path, rows, tau=0.0):
    import json

    path.mkdir()
    (path / "results.json").write_text(json.dumps({"config": {"tau": tau}, "results": rows}))
    return str(path)


def test_adaptive_study_compares_at_equal_tokens(tmp_path):
    from locks_lab import adaptive_study as a

    row = lambda b, att, rec, err: dict(method="locks_quant", budget=b, attended_mean=att,  # noqa: E731
                                        recall_mean=rec, recall_p5=rec - 0.1, err_mean=err)
    fixed = _results(tmp_path / "fixed", [row(64, 64, 0.5, 0.4), row(256, 256, 0.9, 0.1)])
    tau = _results(tmp_path / "tau", [row(1024, 128, 0.8, 0.3), row(2048, 4000, 0.99, 0.01)], tau=0.9)
    # 128 tokens: halfway between 64 and 256 in log2, so the fixed curve gives 0.7 there
    assert a.interpolate([(64, 0.5), (256, 0.9)], 128) == pytest.approx(0.7)
    assert a.interpolate([(64, 0.5), (256, 0.9)], 300) is None  # no extrapolation
    lines = a.compare(fixed, [tau]).splitlines()
    assert "| 0.8000 | 0.7000 | +0.1000 |" in lines[2]
    assert "n/a" in lines[3]
    # the bracketing budgets: the multiples of 16 at or below 128 and 4000, and the next ones
    assert a.bracket([tau]).split(",") == [str(b) for b in
                                           (16, 32, 64, 128, 144, 256, 512, 1024, 2048, 4000, 4016, 4096)]

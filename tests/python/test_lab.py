"""The lab package `locks_lab` (studies, tasks, capture, the generate/capture CLI) is apart from
the library `locks`: the library never imports it, and the lab's CLI still runs."""
import subprocess
import sys

import pytest


def test_library_does_not_import_the_lab():
    code = "import sys, locks, locks.ops; print(any(m.startswith('locks_lab') for m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False"
    for name in ("study", "tasks", "capture", "corpus", "evaluate", "gpu_check", "cli"):
        r = subprocess.run([sys.executable, "-c", f"import locks.{name}"], capture_output=True)
        assert r.returncode != 0, f"locks.{name} should live in locks_lab"


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

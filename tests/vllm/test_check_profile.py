"""The kernel profile of `locks.vllm.check latency --kernel-profile`: which run is profiled,
and the per-kernel sums written from the torch profiler's averages (device kernels only,
largest first)."""
import csv
import types

import torch

from locks.vllm.check import _kernel_profiler, _write_kernel_sums


def test_only_the_named_run_is_profiled():
    spec = {"profile_run": ":long2"}
    assert _kernel_profiler(spec, {"name": "131072x1:long"}) is None
    assert _kernel_profiler({}, {"name": "131072x1:long2"}) is None
    assert isinstance(_kernel_profiler(spec, {"name": "131072x1:long2"}), torch.profiler.profile)


def test_kernel_sums_keep_device_events_largest_first(tmp_path, capsys):
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
    ev = lambda key, n, t, dev: types.SimpleNamespace(key=key, count=n, device_type=dev,  # noqa: E731
                                                      self_device_time_total=t)
    prof = types.SimpleNamespace(key_averages=lambda: [
        ev("small_kernel", 4, 10.0, cuda), ev("aten::mm", 2, 500.0, cpu),
        ev("score_mma", 64, 1600.0, cuda)])
    spec = {"result": str(tmp_path / "lat-llama-custom.json"), "tag": "lat-llama-custom"}
    _write_kernel_sums(prof, spec, {"name": "131072x1:long2"})
    rows = list(csv.DictReader(open(tmp_path / "lat-llama-custom_131072x1_long2_kernels.csv")))
    assert [r["name"] for r in rows] == ["score_mma", "small_kernel"]  # the CPU op is left out
    assert rows[0]["instances"] == "64" and float(rows[0]["avg_us"]) == 25.0
    out = capsys.readouterr().out
    assert "1.61 ms on the device" in out and out.index("score_mma") < out.index("small_kernel")

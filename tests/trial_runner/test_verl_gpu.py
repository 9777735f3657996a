"""The NVML probe: the no-GPU path here, and the arithmetic with a fake NVML module."""

from __future__ import annotations

import contextlib
import sys
import time
import types

import pytest

from mart.trial_runner import gpu


def _fake_nvml(used_gb: list[float], total_gb: float = 80.0) -> types.ModuleType:
    state = {"used": list(used_gb)}
    m = types.ModuleType("pynvml")
    m.nvmlInit = lambda: None
    m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: len(state["used"])
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetName = lambda h: b"NVIDIA H200"
    m.nvmlDeviceGetUUID = lambda h: f"GPU-{h}"
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(
        total=int(total_gb * gpu.GIB), used=int(state["used"][h] * gpu.GIB),
        free=int((total_gb - state["used"][h]) * gpu.GIB))
    m.nvmlDeviceGetComputeRunningProcesses = lambda h: [types.SimpleNamespace(pid=100 + h, usedGpuMemory=gpu.GIB)]
    m.state = state
    return m


def _wait_samples(sampler, n: int, timeout_s: float = 30.0) -> None:
    """Wait for ``n`` more samples (by count, not by sleeping: a loaded box may not schedule the thread)."""
    target = sampler.samples + n
    deadline = time.monotonic() + timeout_s
    while sampler.samples < target:
        assert time.monotonic() < deadline, f"the sampler took fewer than {n} samples in {timeout_s} s"
        time.sleep(0.005)


def test_no_gpu_path_is_quiet(monkeypatch):
    monkeypatch.setattr(gpu, "_nvml", lambda: contextlib.nullcontext(None))
    assert gpu.probe() == []
    assert gpu.memory_capacity_gb() is None
    assert gpu.wait_gpu_memory_free(0.0, timeout_s=0.1) is True
    with gpu.PeakSampler(0.01) as s:
        time.sleep(0.05)
    assert s.peaks_gb == {} and s.max_peak_gb is None
    assert gpu.gpu_processes() == []


def test_probe_on_this_machine_never_raises():
    gpus = gpu.probe()
    assert isinstance(gpus, list)
    for g in gpus:
        assert g.total_gb > 0 and 0 <= g.used_gb <= g.total_gb


def test_probe_capacity_peaks_and_wait_with_fake_nvml(monkeypatch):
    fake = _fake_nvml([10.0, 30.0], total_gb=141.0)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    gpus = gpu.probe()
    assert [g.name for g in gpus] == ["NVIDIA H200", "NVIDIA H200"]
    assert gpus[1].used_gb == pytest.approx(30.0) and gpus[1].free_gb == pytest.approx(111.0)
    assert gpu.memory_capacity_gb() == pytest.approx(141.0)
    s = gpu.PeakSampler(0.01).start()
    _wait_samples(s, 1)
    fake.state["used"] = [50.0, 20.0]
    _wait_samples(s, 2)  # two more samples: at least one whole sample saw the new state
    fake.state["used"] = [5.0, 5.0]
    _wait_samples(s, 2)
    peaks = s.stop()
    assert peaks[0] == pytest.approx(50.0) and peaks[1] == pytest.approx(30.0)
    assert gpu.wait_gpu_memory_free(6.0, timeout_s=0.2, poll_s=0.05) is True
    assert gpu.wait_gpu_memory_free(1.0, timeout_s=0.2, poll_s=0.05) is False
    assert gpu.gpu_processes()[0]["pid"] == 100


def test_cuda_visible_devices_limits_probe_processes_and_waits(monkeypatch):
    # NVML lists every GPU of the node; mart must only count the ones CUDA_VISIBLE_DEVICES gives it
    fake = _fake_nvml([1.0, 70.0, 2.0], total_gb=80.0)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,2")
    assert [g.index for g in gpu.probe()] == [0, 2]
    assert [p["gpu"] for p in gpu.gpu_processes()] == [0, 2]
    # GPU 1 is busy with someone else's job: the "GPUs free before launch" wait does not look at it
    assert gpu.wait_gpu_memory_free(3.0, timeout_s=0.1, poll_s=0.05) is True
    assert len(gpu.probe(all_devices=True)) == 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1")  # UUIDs (prefixes) work too
    assert [g.index for g in gpu.probe()] == [1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,foo,0")  # CUDA stops at the first invalid entry
    assert [g.index for g in gpu.probe()] == [2]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpu.probe() == [] and gpu.memory_capacity_gb() is None


def test_job_peak_subtracts_memory_held_before_launch(monkeypatch):
    from mart.trial_runner.verl.runner import job_peak_gb

    fake = _fake_nvml([10.0, 1.0])  # another process holds 10 GB on GPU 0 before the trial starts
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    s = gpu.PeakSampler(0.01)
    s.sample_once()
    s.start()
    fake.state["used"] = [40.0, 35.0]
    time.sleep(0.05)
    s.stop()
    assert s.before_gb == {0: pytest.approx(10.0), 1: pytest.approx(1.0)}
    data = {"peaks_gb": {str(k): v for k, v in s.peaks_gb.items()},
            "before_gb": {str(k): v for k, v in s.before_gb.items()}}
    assert job_peak_gb(data) == pytest.approx(34.0)  # max(40 - 10, 35 - 1)
    assert job_peak_gb(None) is None and job_peak_gb({"peaks_gb": {}}) is None

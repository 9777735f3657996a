"""Parallel trials on one GPU machine (issue 22): each slot gets its own block of GPUs by UUID in the trial's
``CUDA_VISIBLE_DEVICES``, two trials at once never share a GPU, and the "GPUs free before launch" wait looks at
the trial's own GPUs only (the other slot's are busy with its trial)."""

from __future__ import annotations

import json
import sys
import time
import types
from pathlib import Path

import pytest

from mart.graph.session import tune
from mart.state.ledger import Ledger
from mart.state.options import TuneOptions
from mart.state.trials import TrialSpec
from mart.trial_runner import gpu
from mart.trial_runner.registry import load_backend
from tests.support.paths import FAKE_VERL


def _fake_nvml(n: int, used: dict[int, float] | None = None) -> types.ModuleType:
    used = used or {}
    m = types.ModuleType("pynvml")
    m.nvmlInit = m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: n
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetName = lambda h: b"NVIDIA H100 80GB HBM3"
    m.nvmlDeviceGetUUID = lambda h: f"GPU-{h:02d}aa"
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(
        total=int(80 * gpu.GIB), used=int(used.get(h, 0.0) * gpu.GIB), free=int((80 - used.get(h, 0.0)) * gpu.GIB))
    m.nvmlDeviceGetComputeRunningProcesses = lambda h: []
    return m


def _backend(per_trial: int, **kw):
    return load_backend("verl", entrypoint=f"{sys.executable} {FAKE_VERL}", prevalidate=False,
                        base_config={"trainer.n_gpus_per_node": per_trial, "fake.step_s": 0.02}, **kw)


def test_each_slot_gets_its_own_block_of_gpus_by_uuid(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(8))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    b = _backend(4)
    assert b.max_parallel_trials() == 2
    assert b.trial_devices(0) == "GPU-00aa,GPU-01aa,GPU-02aa,GPU-03aa"
    assert b.trial_devices(1) == "GPU-04aa,GPU-05aa,GPU-06aa,GPU-07aa"
    assert _backend(8).trial_devices(0) is None  # one trial holds the machine: its environment is left alone
    assert _backend(4, ray_address="127.0.0.1:6379").trial_devices(0) is None  # Ray gives a job its GPUs
    # the user's own CUDA_VISIBLE_DEVICES is the pool the slots share
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3,5,7")
    b = _backend(2)
    assert (b.trial_devices(0), b.trial_devices(1)) == ("GPU-01aa,GPU-03aa", "GPU-05aa,GPU-07aa")


def test_the_free_gpu_wait_looks_at_the_trials_own_gpus(monkeypatch):
    # GPU 5 is busy (the other slot's trial): slot 0's launch does not wait for it, slot 1's would
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(8, used={5: 30.0}))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    b = _backend(4)
    slot0, slot1 = ({"CUDA_VISIBLE_DEVICES": b.trial_devices(k)} for k in (0, 1))
    assert gpu.wait_gpu_memory_free(1.0, timeout_s=0.1, poll_s=0.02, env=slot0) is True
    assert gpu.wait_gpu_memory_free(1.0, timeout_s=0.1, poll_s=0.02, env=slot1) is False
    assert gpu.gpu_processes(slot0) == []


# The trainer stand-in: it writes the CUDA_VISIBLE_DEVICES its own process got, then stays up until told to end,
# so both slots' processes are alive at once (hydra overrides in argv are ignored).
_REPORT_DEVICES = """
import os, pathlib, sys, time
d = pathlib.Path(os.environ["MART_TRIAL_DIR"])
(d / "seen_devices.tmp").write_text(os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"))
(d / "seen_devices.tmp").replace(d / "seen_devices")
end = time.time() + 30
while not (d.parent / "release").exists() and time.time() < end:
    time.sleep(0.02)
"""


def test_each_parallel_trial_process_gets_its_own_slots_gpus(tmp_path, monkeypatch):
    # what the trial's own process sees, not what mart meant to give it: the slow end-to-end test below reads
    # launch.json, which only the slow run reaches
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(8))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    script = tmp_path / "report_devices.py"
    script.write_text(_REPORT_DEVICES)
    b = load_backend("verl", entrypoint=f"{sys.executable} {script}", prevalidate=False,
                     base_config={"trainer.n_gpus_per_node": 4})
    specs = [TrialSpec(trial_id=f"t{slot}", config={}, steps=2, trial_dir=str(tmp_path / "trials" / f"t{slot}"),
                       devices=b.trial_devices(slot)) for slot in (0, 1)]
    runner = b.make_runner()
    handles = []
    try:
        handles = [runner.launch(s) for s in specs]
        seen = [Path(s.trial_dir) / "seen_devices" for s in specs]
        deadline = time.monotonic() + 20
        while not all(f.exists() for f in seen) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [runner.poll(h).status for h in handles] == ["running", "running"]  # both at once
        assert [f.read_text() for f in seen] == ["GPU-00aa,GPU-01aa,GPU-02aa,GPU-03aa",
                                                 "GPU-04aa,GPU-05aa,GPU-06aa,GPU-07aa"]
    finally:
        (tmp_path / "trials" / "release").parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "trials" / "release").touch()
        for h in handles:
            runner.stop(h, grace_s=2.0)


@pytest.mark.slow
def test_two_verl_trials_at_once_never_share_a_gpu(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(8))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    opts = TuneOptions(backend="verl", approve="auto", runs_dir=str(tmp_path), stages=["system"], system_trials=4,
                       system_horizon=6, parallel=2, watch_interval_s=0.05, quiet=True,
                       backend_options={"entrypoint": f"{sys.executable} {FAKE_VERL}", "prevalidate": False,
                                        "base_config": {"trainer.n_gpus_per_node": 4, "fake.step_s": 0.15}})
    summary = tune(opts)
    assert summary["status"] == "completed"
    run = Path(tmp_path) / summary["run_id"]
    trials = Ledger.open(run).trials()
    assert len(trials) >= 3
    devices = {}
    for t in trials:
        env = json.loads((Path(t["trial_dir"]) / "attempt-1" / "launch.json").read_text())["env"]
        devices[t["trial_id"]] = (t["slot"], env["CUDA_VISIBLE_DEVICES"])
    blocks = {"GPU-00aa,GPU-01aa,GPU-02aa,GPU-03aa": 0, "GPU-04aa,GPU-05aa,GPU-06aa,GPU-07aa": 1}
    for tid, (slot, dev) in devices.items():
        assert blocks[dev] == slot, (tid, slot, dev)  # a trial uses its slot's GPUs, whichever slot it got
    # trials that overlapped in time held different slots, hence disjoint GPUs
    spans = [(t["started_at"], t["ended_at"], t["slot"]) for t in trials]
    overlapping = [(a, b) for i, a in enumerate(spans) for b in spans[i + 1:] if a[0] < b[1] and b[0] < a[1]]
    assert overlapping, "the two slots never ran at once"
    assert all(a[2] != b[2] for a, b in overlapping)

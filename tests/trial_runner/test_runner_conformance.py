"""One conformance suite every trial runner passes (local, sim, verl stand-in): launch, poll, metrics, stop,
re-attach from a fresh runner (as a resumed tuner would). The Ray runner has its own test (needs a head).
"""

from __future__ import annotations

import sys
import time

import pytest

from mart.state.models import TrialStatus
from mart.state.trials import TrialHandle, TrialSpec
from mart.trial_runner.base import read_status
from mart.trial_runner.registry import load_backend
from tests.support.paths import FAKE_VERL
from tests.support.paths import REPO as REPO_ROOT

REPO = REPO_ROOT
FAKE_VERL = f"{sys.executable} {FAKE_VERL}"


@pytest.fixture(params=["local", "sim", "verl-standin"])
def backend_case(request, local_tiny_config, monkeypatch):
    """(backend factory, config overrides, short horizon, long horizon)."""
    name = request.param
    if name == "local":
        return (lambda: load_backend("local")), local_tiny_config, 3, 400
    if name == "sim":
        return (lambda: load_backend("sim", scenario="qwen3-0.6b-1x8", seed=1)), {}, 3, 5000
    monkeypatch.setenv("FAKE_VERL_MODE", "normal")
    return (lambda: load_backend("verl", entrypoint=FAKE_VERL)), {}, 3, 2000


def _spec(backend, overrides, steps, tmp_path, name):
    config = {**backend.base_config(), **overrides}
    assert backend.validate_config(config) == []
    trial_dir = tmp_path / name
    trial_dir.mkdir()
    return TrialSpec(trial_id=name, config=config, steps=steps, trial_dir=str(trial_dir),
                     memory_capacity_gb=backend.memory_capacity_gb(), seed=0)


def _wait(runner, handle, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        poll = runner.poll(handle)
        if poll.status.is_finished():
            return poll
        time.sleep(0.1)
    raise AssertionError("trial did not finish in time")


def test_completes_with_verl_metrics_read_incrementally(backend_case, tmp_path):
    make, overrides, short, _ = backend_case
    backend = make()
    runner = backend.make_runner()
    handle = runner.launch(_spec(backend, overrides, short, tmp_path, "t-short"))
    assert TrialHandle.model_validate_json(handle.model_dump_json()) == handle  # serialisable
    tail = runner.metrics(handle)
    seen = []
    deadline = time.monotonic() + 120
    while not runner.poll(handle).status.is_finished() and time.monotonic() < deadline:
        seen += tail.read_new()
        time.sleep(0.05)
    poll = runner.poll(handle)
    seen += tail.read_new()
    assert poll.status is TrialStatus.COMPLETED, poll.reason
    steps = [r.step for r in seen]
    assert steps == sorted(set(steps)) and steps[-1] == short  # each line once, in order
    last = seen[-1].data
    for key in ("perf/throughput", "timing_s/step", "timing_s/gen", "actor/entropy", "critic/score/mean"):
        assert key in last, key
    assert any(k.startswith("val-core/") for k in last)
    assert read_status(handle.trial_dir).status is TrialStatus.COMPLETED
    # a fresh runner (a resumed tuner) sees the same final status through the handle
    assert make().make_runner().poll(handle).status is TrialStatus.COMPLETED


def test_stop_is_prompt_and_final_and_works_from_a_fresh_runner(backend_case, tmp_path):
    make, overrides, _, long = backend_case
    backend = make()
    runner = backend.make_runner()
    handle = runner.launch(_spec(backend, overrides, long, tmp_path, "t-long"))
    tail = runner.metrics(handle)
    deadline = time.monotonic() + 120
    while not [r for r in tail.read_new() if r.step >= 1]:
        assert runner.poll(handle).status is TrialStatus.RUNNING
        assert time.monotonic() < deadline, "no step reported"
        time.sleep(0.05)
    other = make().make_runner()  # stop from another runner instance, as after a tuner restart
    assert other.poll(handle).status is TrialStatus.RUNNING
    t0 = time.monotonic()
    poll = other.stop(handle, reason="conformance stop", grace_s=2.0)
    assert time.monotonic() - t0 < 5.0
    assert poll.status is TrialStatus.STOPPED
    final = _wait(runner, handle, timeout=10)
    assert final.status is TrialStatus.STOPPED
    assert read_status(handle.trial_dir).status is TrialStatus.STOPPED

"""MartiRunner driven for real against the MARTI stand-in (tests/support/fake_marti.py): the conformance suite,
OOM / crash / hang handling, stop semantics, MARTI's own start-up failures, and a restarted tuner's view."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from mart.state.models import TrialStatus
from mart.state.trials import TrialSpec
from mart.trial_runner.base import read_status
from mart.trial_runner.marti.backend import MartiBackend
from mart.trial_runner.registry import load_backend
from mart.trial_runner.testing import RunnerConformance
from mart.trial_runner.verl.runner import WatchdogConfig
from tests.support.paths import REPO

FAKE_CMD = f"{sys.executable} {REPO / 'tests' / 'support' / 'fake_marti.py'}"
BASE = {"eval_dataset": "data/MATH"}
#: what the MARTI parser derives every step (entropy only with an entropy coefficient)
MARTI_METRICS = ("perf/throughput", "timing_s/step", "timing_s/gen", "timing_s/update_actor", "critic/score/mean",
                 "agent0/critic/rewards/mean", "agent1/critic/rewards/mean", "response_length/mean")


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setenv("FAKE_MARTI_STEP_S", "0.03")
    monkeypatch.setenv("FAKE_MARTI_MODE", "normal")
    monkeypatch.delenv("FAKE_MARTI_IGNORE_SIGTERM", raising=False)
    return monkeypatch


def backend(**runner_options) -> MartiBackend:
    opts = {"kill_grace_s": 2.0, "oom_exit_grace_s": 1.0, **runner_options}
    return load_backend("marti", entrypoint=FAKE_CMD, base_config=dict(BASE), memory_capacity_gb=80.0,
                        runner_options=opts)


def test_conformance_suite(fake, tmp_path):
    suite = RunnerConformance(lambda: backend(), long_steps=3000, expected_metrics=MARTI_METRICS, timeout_s=60)
    assert suite.run_all(tmp_path) == ["backend", "completes", "stop", "two at once"]


def run(runner, spec: TrialSpec, timeout: float = 60.0):
    handle = runner.launch(spec)
    deadline = time.monotonic() + timeout
    while not (poll := runner.poll(handle)).status.is_finished():
        assert time.monotonic() < deadline, "the trial did not end"
        time.sleep(0.05)
    return handle, poll


def spec_for(b: MartiBackend, tmp_path: Path, name: str, steps: int = 5, stage: str | None = None, **changes):
    d = tmp_path / name
    d.mkdir()
    return TrialSpec(trial_id=name, config={**b.base_config(), **changes}, steps=steps, trial_dir=str(d), stage=stage)


def test_oom_is_classified_from_the_log(fake, tmp_path):
    fake.setenv("FAKE_MARTI_MODE", "oom_at_3")
    b = backend()
    handle, poll = run(b.make_runner(), spec_for(b, tmp_path, "oom"))
    assert poll.status is TrialStatus.OOM and "CUDA out of memory" in poll.reason
    assert poll.last_step == 2 and read_status(handle.trial_dir).status is TrialStatus.OOM


def test_oom_then_hang_is_killed_after_the_grace(fake, tmp_path):
    fake.setenv("FAKE_MARTI_MODE", "oom_hang")
    b = backend()
    handle, poll = run(b.make_runner(), spec_for(b, tmp_path, "oomhang"))
    assert poll.status is TrialStatus.OOM and "killed: it did not exit" in poll.reason


def test_a_config_that_does_not_fit_dies_with_oom(fake, tmp_path):
    b = backend()
    handle, poll = run(b.make_runner(), spec_for(b, tmp_path, "big", vllm_gpu_memory_utilization=0.95))
    assert poll.status is TrialStatus.OOM and poll.last_step == 0


def test_crash_is_failed_with_the_error_line(fake, tmp_path):
    fake.setenv("FAKE_MARTI_MODE", "crash")
    b = backend()
    handle, poll = run(b.make_runner(), spec_for(b, tmp_path, "crash"))
    assert poll.status is TrialStatus.FAILED and "RuntimeError" in poll.reason and poll.last_step == 2
    mirrored = (Path(handle.trial_dir) / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in mirrored] == [1, 2]


def test_hang_is_stopped_by_the_watchdog(fake, tmp_path):
    fake.setenv("FAKE_MARTI_MODE", "hang")
    b = backend()
    b.watchdog = WatchdogConfig(stall_timeout_s=1.5)
    handle, poll = run(b.make_runner(), spec_for(b, tmp_path, "hang"))
    assert poll.status is TrialStatus.STOPPED and "watchdog" in poll.reason and poll.last_step == 2


def test_marti_assert_at_start_up_fails_the_trial(fake, tmp_path):
    """A layout MARTI refuses (here smuggled past mart's own check) fails with MARTI's assertion message."""
    b = backend()
    spec = spec_for(b, tmp_path, "layout", vllm_tensor_parallel_size=2)
    assert any("colocate" in e for e in b.validate_config(spec.config))  # mart refuses it up front
    handle, poll = run(b.make_runner(), spec)
    assert poll.status is TrialStatus.FAILED and "AssertionError" in poll.reason and poll.last_step == 0


def test_stop_ignoring_sigterm_is_killed(fake, tmp_path):
    fake.setenv("FAKE_MARTI_IGNORE_SIGTERM", "1")
    b = backend()
    runner = b.make_runner()
    handle = runner.launch(spec_for(b, tmp_path, "stubborn", steps=5000))
    deadline = time.monotonic() + 30
    while (runner.poll(handle).last_step or 0) < 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    t0 = time.monotonic()
    poll = runner.stop(handle, reason="enough", grace_s=0.5)
    assert poll.status is TrialStatus.STOPPED and poll.reason == "enough" and time.monotonic() - t0 < 15
    assert not runner._group_alive(handle)


def test_system_trials_never_evaluate_learning_trials_at_the_horizon(fake, tmp_path):
    b = backend()
    runner = b.make_runner()
    handle, poll = run(runner, spec_for(b, tmp_path, "sys", steps=3, stage="system"))
    assert poll.status is TrialStatus.COMPLETED
    assert "--eval_steps=-1" in json.loads((tmp_path / "sys" / "attempt-1" / "launch.json").read_text())["argv"]
    assert not any(k.startswith("val-core/") for r in runner.read_all_metrics(handle) for k in r.data)
    handle, poll = run(runner, spec_for(b, tmp_path, "lea", steps=3, stage="learning"))
    recs = runner.read_all_metrics(handle)
    assert [r.step for r in recs] == [1, 2, 3]
    assert not any(k.startswith("val-core/") for r in recs[:-1] for k in r.data)
    assert recs[-1].get("val-core/MATH/pass1") > 0 and "agent1/val-core/MATH/pass1" in recs[-1].data


def test_a_fresh_runner_reattaches_and_finishes(fake, tmp_path):
    b = backend()
    first = b.make_runner()
    spec = spec_for(b, tmp_path, "resume", steps=40)
    handle = first.launch(spec)
    again = backend().make_runner().launch(spec)  # a resumed tuner launching the same trial: re-attached
    assert again.pid == handle.pid and again.extra.get("reattached")
    _, poll = run(backend().make_runner(), spec, timeout=60)
    assert poll.status is TrialStatus.COMPLETED and poll.last_step == 40

"""Issue 45: a stored handle (a ledger row, a ``launch.json``) proves nothing; the process itself must."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil

from mart.state.trials import TrialSpec
from mart.trial_runner.process import LAUNCH_TOKEN_ENV, unproven_launch
from mart.trial_runner.verl.runner import VerlRunner
from tests.support.paths import FAKE_VERL

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def _spawn(argv, env=None):
    proc = subprocess.Popen(argv, env=env, start_new_session=True)
    for _ in range(100):  # until its environment is the exec'd one
        try:
            if psutil.Process(proc.pid).cmdline() == list(argv):
                break
        except psutil.Error:
            pass
        time.sleep(0.02)
    return proc, psutil.Process(proc.pid).create_time()


def test_a_process_without_the_launch_token_is_not_proven():
    victim, created = _spawn(["sleep", "60"])
    try:
        why = unproven_launch(victim.pid, created, "0123456789abcdef", 0.0)
        assert why is not None and f"pid {victim.pid}" in why and "launch token" in why
        assert unproven_launch(victim.pid, None, None) is not None  # no create time, any token: still refused
    finally:
        victim.kill()
        victim.wait()


def test_the_token_the_module_and_the_start_time_each_count():
    proc, created = _spawn(SLEEPER, env={"PATH": "/usr/bin:/bin", LAUNCH_TOKEN_ENV: "tok"})
    try:
        assert unproven_launch(proc.pid, created, "tok", created - 5) is None
        assert unproven_launch(proc.pid, created, None) is None  # any mart launch
        assert "launch token" in unproven_launch(proc.pid, created, "other")
        assert "not a mart supervisor" in unproven_launch(proc.pid, created, "tok", None, ("mart.trial_runner.local",))
        assert "before the trial was launched" in unproven_launch(proc.pid, created, "tok", created + 60)
    finally:
        proc.kill()
        proc.wait()


def test_nothing_running_under_the_pid_needs_no_proof():
    proc, created = _spawn(["true"])
    proc.wait()
    assert unproven_launch(proc.pid, created, "tok") is None  # ended: there is nothing to signal


def test_verl_does_not_reattach_a_pid_planted_in_launch_json(tmp_path):
    victim, created = _spawn(["sleep", "60"])
    try:
        adir = tmp_path / "t1" / "attempt-1"
        adir.mkdir(parents=True)
        (adir / "launch.json").write_text(json.dumps({"pid": victim.pid, "pid_create_time": created, "at": 0}))
        runner = VerlRunner(f"{sys.executable} {FAKE_VERL}", sample_gpu=False,
                            gpu_free_threshold_gb=None)
        spec = TrialSpec(trial_id="t1", config={}, steps=2, trial_dir=str(tmp_path / "t1"), launch_token="tok")
        assert runner.adopt(spec) is None
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def test_runners_never_signal_a_group_they_cannot_prove_they_started(tmp_path):
    """A handle from a checkpoint or any other stored place (not only the ledger row): stop and poll leave it be."""
    from mart.state.trials import TrialHandle
    from mart.trial_runner.local.runner import LocalRunner

    victim, created = _spawn(["sleep", "60"])
    try:
        (tmp_path / "t1").mkdir()
        for runner in (LocalRunner(), VerlRunner(f"{sys.executable} {FAKE_VERL}", sample_gpu=False,
                                                 gpu_free_threshold_gb=None)):
            handle = TrialHandle(trial_id="t1", backend=runner.name, trial_dir=str(tmp_path / "t1"), pid=victim.pid,
                                 pid_create_time=created, extra={"attempt_dir": str(tmp_path / "t1")})
            assert runner.attach(handle) is None
            runner.stop(handle, grace_s=0.2)
            runner.poll(handle)
            assert victim.poll() is None, f"{runner.name} signalled a process it did not start"
    finally:
        victim.kill()
        victim.wait()


def test_a_process_proves_itself_right_after_its_spawn():
    """The spawner resumes inside the child's execve, before /proc shows its arguments and environment: a resumed
    tuner that looks at once (a re-launch that re-attaches) must wait for them, not refuse the process."""
    from mart.trial_runner.process import ProcessGroup

    for _ in range(20):
        group = ProcessGroup.spawn(SLEEPER, env={"PATH": "/usr/bin:/bin", LAUNCH_TOKEN_ENV: "tok"})
        try:
            assert unproven_launch(group.pid, group.created, "tok") is None
        finally:
            group.popen.kill()
            group.popen.wait()

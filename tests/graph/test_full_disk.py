"""Issue 26 item 12 (part): a full disk is named as the cause, on a small tmpfs (root only; skipped elsewhere).

A trial killed by a full disk read "ended without writing a status (killed?)"; ``mart resume`` on a full disk
could show "database is locked" (the failure could not be recorded) instead of the cause.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from mart.state.trials import TrialSpec

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24M", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        yield mnt
    finally:
        import gc

        gc.collect()
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(disk: Path) -> Path:
    path = disk / "filler"
    with open(path, "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 16))
                f.flush()
        except OSError:
            pass
    return path


def test_a_trial_killed_by_a_full_disk_says_so(small_disk, local_tiny_config):
    from mart.trial_runner.local.runner import LocalRunner

    runner = LocalRunner()
    d = small_disk / "t1"
    handle = runner.launch(TrialSpec(trial_id="t1", config=local_tiny_config, steps=400, trial_dir=str(d)))
    deadline = time.monotonic() + 60
    while not (d / "metrics.jsonl").exists() or not (d / "metrics.jsonl").read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    fill(small_disk)
    while not (poll := runner.poll(handle)).status.is_finished():
        assert time.monotonic() < deadline + 60, "the trial did not end on a full disk"
        time.sleep(0.1)
    assert poll.status.value == "failed"
    assert "disk" in poll.reason and "full" in poll.reason and "killed?" not in poll.reason, poll.reason


def test_resume_on_a_full_disk_names_the_cause_and_continues_after(small_disk):
    from tests.graph.test_hardening import cli, paused_run

    run = paused_run(small_disk, system_trials=3)
    filler = fill(small_disk)
    out = cli("review", run, "--runs-dir", str(small_disk), "--approve")
    assert out.exit_code != 0 and out.stderr.startswith("error:"), out.stderr
    assert "No space left" in out.stderr or ("disk" in out.stderr and "full" in out.stderr), out.stderr
    assert "database is locked" not in out.stderr and "Traceback" not in out.stderr
    filler.unlink()
    out = cli("status", run, "--runs-dir", str(small_disk))
    assert out.exit_code == 0 and ": running" not in out.stdout, out.stdout
    out = cli("review", run, "--runs-dir", str(small_disk), "--approve", "-q", "--detach")
    assert out.exit_code == 0, out.stderr


def test_a_trial_killed_by_a_full_disk_is_named_so_after_a_resume_that_freed_space(small_disk, local_tiny_config):
    """Issue 45: the tuner that polls the trial after the space was freed (a resume: another process, no exit code)
    still names the disk, not "killed?"."""
    from mart.trial_runner.local.runner import LocalRunner

    d = small_disk / "t1"
    handle = LocalRunner().launch(TrialSpec(trial_id="t1", config=local_tiny_config, steps=400, trial_dir=str(d)))
    deadline = time.monotonic() + 60
    while not (d / "metrics.jsonl").exists() or not (d / "metrics.jsonl").read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    filler = fill(small_disk)
    from mart.trial_runner.process import ProcessGroup

    assert ProcessGroup(handle.pid, handle.pid_create_time).wait(60), "the trial did not end on a full disk"
    filler.unlink()  # space freed, then `mart resume`: a new runner, which never saw the trial's exit code
    poll = LocalRunner().poll(handle)
    assert poll.status.value == "failed"
    assert "disk" in poll.reason and "was full" in poll.reason and "killed?" not in poll.reason, poll.reason

"""The leftover-process cleanup ends only its own trial's processes: the same trial id in another run (the same
job tuned twice on one machine names its baseline alike) is matched by its folder too, and left alone."""

from __future__ import annotations

import os
import subprocess
import sys

from mart.trial_runner.verl.cleanup import end_trial_processes, trial_processes


def _marked_sleeper(trial_dir: str) -> subprocess.Popen:
    env = {**os.environ, "MART_TRIAL_ID": "sys-01-same", "MART_ATTEMPT": "1", "MART_TRIAL_DIR": trial_dir}
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)


def test_the_same_trial_id_in_another_run_is_left_alone(tmp_path):
    mine, theirs = str(tmp_path / "run-a" / "sys-01-same"), str(tmp_path / "run-b" / "sys-01-same")
    other = _marked_sleeper(theirs)
    own = _marked_sleeper(mine)
    try:
        assert [p.pid for p in trial_processes("sys-01-same", 1, mine)] == [own.pid]
        ended = end_trial_processes("sys-01-same", 1, grace_s=2.0, trial_dir=mine)
        assert [d["pid"] for d in ended] == [own.pid]
        assert own.wait(10) is not None
        assert other.poll() is None  # the other run's trial runs on
        # without a folder (an older mart's processes carry none) the id and attempt still decide
        assert [p.pid for p in trial_processes("sys-01-same", 1)] == [other.pid]
    finally:
        for p in (own, other):
            p.kill()
            p.wait(10)

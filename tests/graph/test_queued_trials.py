"""A launched trial that waits for its resources (``TrialPoll.queued``: a Ray job held PENDING) is queued, not failed
or hung: the progress output says so, the ledger keeps when it waited, and the first-step watchdog starts its clock
only once the trial leaves the queue. Any backend: here the toy plugin's streaming trials wait ``queued_s`` seconds
of wall clock first (the Ray case, with a real head: tests/trial_runner/test_ray_parallel.py).
"""

from __future__ import annotations

import json
import subprocess
import sys

from mart.state.ledger import Ledger
from tests.support.paths import REPO
from tests.support.toy_backend import QUEUED

TOY = "tests.support.toy_backend:make_backend"


def test_a_queued_trial_is_not_timed_out_and_the_session_says_it_waited(tmp_path):
    # every trial waits 1.5 s of wall clock for its resources; the first-step watchdog allows 0.5 s
    queued_s, first_step_s = 1.5, 0.5
    runs = tmp_path / "runs"
    out = subprocess.run(
        [sys.executable, "-m", "mart.graph.cli", "tune", "--backend", TOY, "--backend-option", "stream=true",
         "--backend-option", f"queued_s={queued_s}", "--approve", "auto", "--parallel", "2", "--stages", "learning",
         "--learning-trials", "3", "--learning-horizon", "4", "--learning-confirm-trials", "0",
         "--first-step-timeout-s", str(first_step_s), "--watch-interval-s", "0.01", "--runs-dir", str(runs), "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout)
    assert summary["status"] == "completed" and summary["trials"]["failed"] == 0
    # the CLI's JSON keeps how the slots were used (it once printed only the fixed keys)
    par = summary["parallel"]
    assert par["slots"] == 2 and par["asked"] == 2 and par["wall_s"] > 0 and 0 < par["busy_fraction"] <= 1
    ledger = Ledger.open(runs / summary["run_id"])
    trials = ledger.trials()
    assert len(trials) == 3
    for t in trials:
        # each ran to its horizon: the watchdog did not count its time in the queue
        assert t["status"] == "completed" and not t["early_stopped"] and t["steps_done"] == 4, t
        assert t["waiting"] is None  # it left the queue
        assert t["running_at"] - t["waiting_since"] >= queued_s - 0.2  # the wait, measured from outside the toy
        assert t["running_at"] - t["started_at"] > first_step_s  # what the watchdog would have held against it
    ledger.close()


def test_the_queue_is_announced_once_per_trial_and_its_end_too(tmp_path, monkeypatch):
    from mart.graph.reviewers.base import AutoReviewer
    from mart.graph.session import tune
    from mart.nodes.progress import TrialQueued, TrialStarted
    from mart.state.options import TuneOptions
    from mart.tools import watch

    monkeypatch.setattr(watch, "QUEUED_NOTICE_S", 0.2)
    events = []

    class Watching(AutoReviewer):  # approves everything; sees the progress a channel is sent
        def on_progress(self, event, text):
            events.append(event)

    opts = TuneOptions(backend=TOY, backend_options={"stream": True, "queued_s": 2.0}, approve="auto", parallel=2,
                       stages=["learning"], learning_trials=3, learning_horizon=4, learning_confirm_trials=0,
                       watch_interval_s=0.01, runs_dir=str(tmp_path), quiet=True, report=False)
    summary = tune(opts, reviewer=Watching())
    assert summary["status"] == "completed"
    ids = [t["trial_id"] for t in Ledger.open(tmp_path / summary["run_id"]).trials()]
    queued = [e for e in events if isinstance(e, TrialQueued)]
    started = [e for e in events if isinstance(e, TrialStarted)]
    # the watch node runs again after every collect: still, one line per trial for each
    assert sorted(e.trial_id for e in queued) == sorted(ids) and {e.reason for e in queued} == {QUEUED}
    assert sorted(e.trial_id for e in started) == sorted(ids)
    assert all(e.waited_s >= 1.9 for e in started)

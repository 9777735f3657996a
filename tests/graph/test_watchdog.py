"""The progress watchdog, one rule for every backend (issue 26 item 10): a trial frozen by SIGSTOP (or hung) is
stopped once no new step came for ``--stall-timeout-s``, the session goes on, and its figures are never results."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from mart.graph.session import tune
from mart.state.ledger import Ledger
from mart.state.options import TuneOptions
from mart.trial_runner.watchdog import Progress, WatchdogConfig


def test_a_frozen_local_trial_is_stopped_by_the_watchdog_and_the_session_completes(tmp_path, local_tiny_config):
    opts = TuneOptions(backend="local", approve="auto", stages=["learning"], learning_trials=1, learning_horizon=40,
                       learning_confirm_trials=0, start_overrides=local_tiny_config, stall_timeout_s=3.0,
                       watch_interval_s=0.05, quiet=True, report=False, runs_dir=str(tmp_path))
    frozen: list[int] = []
    created: list[float | None] = []
    quit_spy: list[bool] = []

    def freeze_the_trial() -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not frozen and not quit_spy:
            for run in Path(tmp_path).glob("*/mart.sqlite"):
                if run.parent.name.startswith("."):
                    continue
                try:
                    ledger = Ledger(run, readonly=True)
                    rows = [r for r in ledger.trials() if r["status"] == "running" and r.get("handle")
                            and len(ledger.metric_records(r["trial_id"])) >= 2]
                    ledger.close()
                except Exception:  # noqa: BLE001 - the run is being written; look again
                    rows = []
                if rows:
                    pid = rows[0]["handle"]["pid"]
                    created.append(rows[0]["handle"].get("pid_create_time"))
                    frozen.append(pid)  # first: the test's `finally` ends what it froze, whenever it fails
                    os.killpg(pid, signal.SIGSTOP)  # the whole trial, as `kill -STOP -PGID`
                    return
            time.sleep(0.1)

    spy = threading.Thread(target=freeze_the_trial, daemon=True)
    spy.start()
    try:
        t0 = time.monotonic()
        summary = tune(opts)
        spy.join(5)
        assert frozen, "the test never saw the trial run"
        assert summary["status"] == "completed" and time.monotonic() - t0 < 200
        trials = Ledger.open(Path(tmp_path) / summary["run_id"]).trials()
        # the frozen trial is the baseline: the session retries a killed baseline once, so look it up by its process
        [trial] = [t for t in trials if (t.get("handle") or {}).get("pid") == frozen[0]]
        assert trial["status"] == "stopped" and trial["early_stopped"]
        assert "watchdog: no new step" in trial["reason"]
        assert trial["score"] is None  # a stopped trial is never a result
        # nothing of the frozen trial is left behind (it was killed, stopped or not)
        with pytest.raises(ProcessLookupError):
            os.killpg(frozen[0], 0)
    finally:  # a failed assertion leaves no frozen trial behind (a stopped process never ends by itself)
        quit_spy.append(True)
        if frozen:
            from mart.trial_runner.process import ProcessGroup

            group = ProcessGroup(frozen[0], created[0])  # the trial's own group, never a recycled pid
            group.signal(signal.SIGCONT)
            group.terminate(grace_s=2.0)

def test_the_stall_limit_follows_the_measured_step_time_unless_set():
    wd = WatchdogConfig(min_step_timeout_s=1.0, k=5.0)
    p = Progress()
    from mart.state.metrics import StepRecord

    p.observe([StepRecord(step=s, data={"timing_s/step": 0.5}) for s in range(1, 4)], now=100.0)
    assert p.expired(wd, started_at=90.0, now=102.0) is None  # 2 s idle < max(1, 5 x 0.5)
    assert "no new step for 3.0 s" in p.expired(wd, started_at=90.0, now=103.0)
    assert p.expired(WatchdogConfig(stall_timeout_s=10.0), started_at=90.0, now=105.0) is None
    assert p.expired(WatchdogConfig(enabled=False), started_at=90.0, now=10_000.0) is None


def test_the_stall_limit_is_five_times_the_median_step_not_the_slowest_step():
    # one slow step (a validation, a checkpoint save) among fast ones must not stretch the limit: a trial that
    # then hangs is stopped after 5 x the typical step, not after 5 x its one slow step
    from mart.state.metrics import StepRecord

    wd = WatchdogConfig(min_step_timeout_s=0.0)
    assert wd.k == 5.0  # the documented factor
    p = Progress()
    times = [2.0, 2.0, 60.0, 2.0, 2.0, 3.0]
    p.observe([StepRecord(step=s, data={"timing_s/step": t}) for s, t in enumerate(times, 1)], now=1000.0)
    assert p.expired(wd, started_at=900.0, now=1009.0) is None  # 9 s idle < 5 x median 2 s
    reason = p.expired(wd, started_at=900.0, now=1011.0)  # 11 s idle > 10 s; the slowest step would allow 300 s
    assert reason is not None and "5 x expected 2.00 s" in reason, reason
